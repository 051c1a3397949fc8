"""The float64 reference and the correctness check every cell passes before timing.

The reference is attention written from the definition in ``bench.model.masks`` (the score mods
applied to the scaled scores, then the mask, then the softmax), computed on
the CPU in float64 from the very tensors a variant was given, query block by query
block so that memory stays bounded at long sequence lengths.  Past FULL_CHECK_LIMIT
score elements it covers an exact slice (first and last batch element, first key/value
head and its query heads) so that a GPU sweep at n = 16k is not bound by the CPU.

An exact variant passes three criteria, each against the float64 reference, for the
output and for each gradient (dq, dk, dv):

1. elementwise, ``|x - ref| <= atol + rtol * |ref|`` everywhere;
2. the relative Frobenius error ``||x - ref|| / ||ref||`` at most ``rel``;
3. the cosine similarity of x and ref (flattened) at least ``cos``.

The elementwise check alone has no power where values are small: at bf16, n = 8192, every
|dq| is below the gradient atol, so a kernel that returns all-zero gradients passes it, and
at decode lengths (kv = 131072) so does an all-zero output.  The two norm criteria do not
depend on the scale of the values: answering zeros has a relative error of exactly 1 and a
cosine of 0, a dropped 1/sqrt(d) or a transposed mask moves both far off.  The relative
error catches a wrong scale (cosine 1, error large), the cosine a wrong direction.

Their limits come from the unit roundoff u of the dtype.  A correct kernel's relative error
is about u for the output (its rounding to the dtype, u / sqrt(3), plus the probabilities
rounded before P @ V in a fused kernel) and grows slowly with n for the gradients (measured
on the CPU at n = 256 to 2048, none and causal masks, naive, sdpa.math and chunked.online:
bf16 output 1.6e-3 to 4.7e-3, gradients 1.7e-3 to 7.8e-3; fp16 output 2.0e-4 to 5.9e-4,
gradients 2.1e-4 to 9.7e-4; fp32 below 6e-7; ``python tests/benchmarks/reference_errors.py``).
``rel`` leaves a margin above that (2.6u for a bf16 output, about 8u for its gradients,
~10u and ~20u for fp16) for GPU kernels, longer reductions and longer sequences.  Within its
``rel`` limit a tensor is within its ``cos`` limit too (for any error of relative size
rel, 1 - cos <= rel**2 / 2, and 0.999 allows 4.5%): the cosine is checked and reported as
the figure kernels are often compared by, and never fails a tensor the relative error
passes.

=========  ==================  =================  =======  ========  ========  ========
dtype      out (atol, rtol)    grad (atol, rtol)  out rel  out cos   grad rel  grad cos
=========  ==================  =================  =======  ========  ========  ========
float32    1e-4, 1e-4          1e-3, 1e-3         1e-4     0.99999   1e-3      0.9999
float16    5e-3, 5e-3          3e-2, 3e-2         5e-3     0.999     1e-2      0.999
bfloat16   3e-2, 3e-2          1.5e-1, 5e-2       1e-2     0.999     3e-2      0.998
fp8 e4m3   1.25e-1, 1.25e-1    (forward only)     6.25e-2  0.998     -         -
=========  ==================  =================  =======  ========  ========  ========

The elementwise atol is for logits (scaled scores) up to LOGIT_REF = 10, about what i.i.d. normal
inputs give.  A correct kernel's elementwise error grows with the size of the logits (a
probability's error is about u times its logit), so for larger ones (outlier channels,
clustered inputs) atol is multiplied by max |logit| / 10, which the reference measures and the
row records (``max_logit``).  The norm criteria are not scaled: answering zeros still fails.

Gradients are looser: they sum over the whole sequence.  float8_e4m3fn has 3 mantissa bits,
u = 2**-4: an exact output rounded once to fp8 is off by 2.5 % in relative Frobenius error
(measured: b = 2, h = 2, n = 256, d = 32, causal; tests/model/test_workload.py), so its limit is u
(6.25 %) and its elementwise limit 2u; the reference is
computed from the same fp8 inputs, so their own rounding is not counted against a kernel.

An approximate variant (``approximate=True``) is held to its ``error_budget`` (the output's
relative error), and without one to the error of answering zeros: a relative error at or
above 1 is ``mismatch``, "worse than returning zeros".  Its gradients' errors are reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from bench.model import masks
from bench.model.case import Case

TOLERANCES = {  # dtype: ((out atol, out rtol), (grad atol, grad rtol)), elementwise
    "float32": ((1e-4, 1e-4), (1e-3, 1e-3)),
    "float16": ((5e-3, 5e-3), (3e-2, 3e-2)),
    "bfloat16": ((3e-2, 3e-2), (1.5e-1, 5e-2)),
    "float8_e4m3fn": ((1.25e-1, 1.25e-1), (1.25e-1, 1.25e-1)),  # 2u; fp8 is forward only
}
NORM_TOLERANCES = {  # dtype: ((out max rel_err, out min cosine), (grad max rel_err, grad min cosine))
    "float32": ((1e-4, 0.99999), (1e-3, 0.9999)),
    "float16": ((5e-3, 0.999), (1e-2, 0.999)),
    "bfloat16": ((1e-2, 0.999), (3e-2, 0.998)),
    "float8_e4m3fn": ((6.25e-2, 0.998), (6.25e-2, 0.998)),  # u = 2**-4: the output's own rounding is u / sqrt(3)
}
ZEROS_REL_ERR = 1.0  # the relative error of answering zeros: no approximation may reach it
# the elementwise atol holds for logits (scaled scores) up to this size, about what i.i.d. normal inputs
# give (their largest |logit| is near 5); beyond it a correct kernel's elementwise error grows with the
# logits (a probability's error is about u x its logit's size), so atol grows in proportion.  The norm
# criteria do not scale: an all-zero output still has a relative error of 1
LOGIT_REF = 10.0
BLOCK_ELEMENTS = 1 << 25  # float64 scores per query block (256 MiB)


FULL_CHECK_LIMIT = 1 << 28  # batch * heads * q_len * kv_len above which a slice is checked
KV_BYTES_LIMIT = 1 << 30  # float64 bytes of K and V together above which a slice is checked (decode: long caches)


@dataclass
class Reference:
    """The reference output (and gradients) for ``batches`` x query heads ``heads`` (and
    key/value heads ``kv_heads``) of the case: all of it, or a slice for large cases."""
    out: torch.Tensor
    grads: tuple | None
    batches: list[int]
    heads: slice
    kv_heads: slice
    max_logit: float = 0.0  # the largest |scaled score| (score mods applied) the reference met

    @property
    def atol_scale(self) -> float:
        """How much the elementwise atol grows for these inputs' logits (1 up to LOGIT_REF)."""
        return max(1.0, self.max_logit / LOGIT_REF)

    def select(self, out, grads=None):
        """The same slice of a variant's output (and gradients of q, k, v)."""
        sel_out = out[self.batches][:, self.heads]
        if grads is None:
            return sel_out, None
        dq, dk, dv = grads
        pick = lambda g, h: None if g is None else g[self.batches][:, h]
        return sel_out, (pick(dq, self.heads), pick(dk, self.kv_heads), pick(dv, self.kv_heads))


def check_slice(case: Case) -> tuple[list[int], slice, slice]:
    """All of the case, or -- when it is larger than FULL_CHECK_LIMIT score elements -- the
    first and last batch elements and the first key/value head with its group of query
    heads.  The slice is exact: those query heads see only that key/value head.  A case whose
    K and V in float64 pass KV_BYTES_LIMIT is sliced too (decode over a long cache: few
    scores, but K and V of 8.6 GB each at b = 8, 8 KV heads, 128k, d = 128)."""
    case = case.packed()  # a ragged batch: its packed sequence, the mask within each one
    kv_bytes = case.batch * case.kv_heads * case.kv_len * (case.head_dim + case.dv) * 8
    if case.batch * case.heads * case.q_len * case.kv_len <= FULL_CHECK_LIMIT and kv_bytes <= KV_BYTES_LIMIT:
        return list(range(case.batch)), slice(None), slice(None)
    group = case.heads // case.kv_heads
    return sorted({0, case.batch - 1}), slice(0, group), slice(0, 1)


def reference(case: Case, q, k, v, grad_out=None) -> Reference:
    """float64 CPU attention from the definition in bench.model.masks, query block by block."""
    case = case.packed()  # a ragged batch: its packed sequence, the mask within each one
    if case.paged:  # the cache read back from its pages, in each sequence's order
        from bench.measure.inputs import from_pages

        k, v = from_pages(case, k.detach()), from_pages(case, v.detach())
    batches, hs, kvs = check_slice(case)
    q, k, v = (t.detach()[batches] for t in (q, k, v))
    q, k, v = q[:, hs], k[:, kvs], v[:, kvs]
    q, k, v = (t.to("cpu", torch.float64) for t in (q, k, v))
    B, H, Lk = q.shape[0], q.shape[1], k.shape[2]
    group = H // k.shape[1]
    bound = masks.bind(case)
    with_grad = grad_out is not None
    if with_grad:
        grad_out = grad_out.detach()[batches][:, hs].to("cpu", torch.float64)
        k.requires_grad_(True)
        v.requires_grad_(True)
    sink = bound.sink_logits("cpu", torch.float64)
    sink = sink[hs] if sink is not None else None
    rows = max(1, BLOCK_ELEMENTS // max(1, B * H * Lk))
    outs, dqs, max_logit = [], [], 0.0
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    KvH = k.shape[1]
    for s in range(0, case.q_len, rows):
        e = min(case.q_len, s + rows)
        r = e - s
        qc = q[:, :, s:e].clone().requires_grad_(with_grad)  # (B, H, r, D)
        keep = bound.keep("cpu", (s, e), batches=batches, heads=hs)  # (B|1, H|1, r, Lk) or None
        empty = keep is not None and bool((~keep.any(-1)).any())
        with torch.set_grad_enabled(with_grad):
            # GQA without copying K and V per query head: query head h = j * group + g reads key/value
            # head j, so the group's queries stack as rows, (B, KvH, group * r, D) against (B, KvH, Lk, D)
            grouped = qc.reshape(B, KvH, group * r, -1)
            scores = (grouped @ k.transpose(-2, -1)).view(B, H, r, Lk) * case.scale
            scores = bound.apply_mods(scores, (s, e), batches=batches, heads=hs)
            if scores.numel():
                max_logit = max(max_logit, float(scores.detach().abs().max()))
            probs = masks.masked_softmax(scores, keep, empty, sink)
            oc = (probs.reshape(B, KvH, group * r, Lk) @ v).view(B, H, r, -1)
        if with_grad:
            gq, gk, gv = torch.autograd.grad(oc, (qc, k, v), grad_out[:, :, s:e])
            dqs.append(gq)
            dk += gk
            dv += gv
        outs.append(oc.detach())
    out = torch.cat(outs, dim=2)
    grads = (torch.cat(dqs, dim=2), dk, dv) if with_grad else None
    return Reference(out, grads, batches, hs, kvs, max_logit)


@dataclass
class CheckResult:
    ok: bool
    max_abs_err: float  # output
    max_err_over_max_ref: float  # output: max |out - ref| / max |ref|
    grad_max_abs_err: float | None = None  # worst of dq, dk, dv
    grad_errors: dict | None = None
    reason: str = ""
    rel_err: float | None = None  # ||out - ref||_F / ||ref||_F
    cosine: float | None = None  # cosine similarity of out and ref, flattened
    grad_rel_err: float | None = None  # worst of dq, dk, dv
    grad_cosine: float | None = None  # worst of dq, dk, dv
    kind: str = "mismatch-values"  # or mismatch-shape: the wrong dtype, device, layout or shape (a ReasonKind)
    max_logit: float | None = None  # the reference's largest |logit| (the elementwise atol scales past LOGIT_REF)
    outputs: tuple | None = field(default=None, repr=False)  # the checked call's (output, grads): determinism's base

    def columns(self) -> dict:
        """The row's accuracy columns."""
        return {"max_abs_err": self.max_abs_err, "max_err_over_max_ref": self.max_err_over_max_ref,
                "grad_max_abs_err": self.grad_max_abs_err, "rel_err": self.rel_err, "cosine": self.cosine,
                "grad_rel_err": self.grad_rel_err, "grad_cosine": self.grad_cosine, "max_logit": self.max_logit}

    def fail(self, reason: str, kind: str = "mismatch-values") -> None:
        """The first failed criterion is the reason; later ones do not replace it."""
        if self.ok:
            self.ok, self.reason, self.kind = False, reason, kind


def relative_errors(x, ref) -> tuple[float, float]:
    """(relative Frobenius error, cosine similarity) of ``x`` against ``ref``, in float64."""
    x = x.detach().to("cpu", torch.float64).flatten()
    ref = ref.flatten()
    if x.shape != ref.shape or not torch.isfinite(x).all():
        return float("inf"), float("nan")
    norm = float(ref.norm())
    rel = float((x - ref).norm()) / norm if norm else float((x - ref).norm())
    denom = float(x.norm()) * norm
    cos = float(x @ ref) / denom if denom else (1.0 if rel == 0 else 0.0)
    return rel, cos


@dataclass(frozen=True)
class Compared:
    """One tensor against its reference: why it cannot be compared (shape, non-finite), the
    elementwise verdict and the worst absolute error, and the two norm figures."""
    broken: str  # "" when comparable
    within: bool  # every element within atol + rtol * |ref|
    max_abs: float
    rel: float
    cos: float


def _compare(x, ref, atol, rtol) -> Compared:
    x = x.detach().to("cpu", torch.float64)
    if x.shape != ref.shape:
        return Compared(f"shape {tuple(x.shape)} != expected {tuple(ref.shape)}", False, float("inf"),
                        float("inf"), float("nan"))
    if not torch.isfinite(x).all():
        return Compared("non-finite values", False, float("inf"), float("inf"), float("nan"))
    err = (x - ref).abs()
    within = not bool((err > atol + rtol * ref.abs()).any())
    rel, cos = relative_errors(x, ref)
    return Compared("", within, float(err.max()) if err.numel() else 0.0, rel, cos)


def _exact_verdict(name: str, c: Compared, atol: float, rtol: float, rel: float, cos: float, dtype: str) -> str:
    """Why an exact variant's tensor fails, naming the criterion and the figures; '' when it passes."""
    if not c.within:
        return f"{name} max abs err {c.max_abs:.3g} > tolerance (atol {atol:.3g}, rtol {rtol:g})"
    if not c.rel <= rel:
        return f"{name} relative error {c.rel:.3g} > {rel:g} ({dtype})"
    if not c.cos >= cos:
        return f"{name} cosine {c.cos:.6g} < {cos:g} ({dtype})"
    return ""


def check(case: Case, out, ref_out, grads=None, ref_grads=None, error_budget: float | None = None,
          approximate: bool = False, atol_scale: float = 1.0) -> CheckResult:
    """Compare a variant's output (and gradients of q, k, v) with the reference.

    An exact variant passes when the output and every gradient pass all three criteria of
    the module doc (elementwise, relative error, cosine).  An approximate one
    (``approximate=True``) passes when its output and gradients are finite and of the right
    shape and the relative error of its output is within ``error_budget``, or, without a
    budget, below that of answering zeros; its gradients' errors are reported, not held to
    tolerances.  A mismatch's reason names the first criterion that failed, with its figures.
    ``atol_scale`` (``Reference.atol_scale``) widens the elementwise atol for large logits."""
    (oa, orr), (ga, gr) = TOLERANCES[case.dtype]
    oa, ga = oa * atol_scale, ga * atol_scale
    (o_rel, o_cos), (g_rel, g_cos) = NORM_TOLERANCES[case.dtype]
    c = _compare(out, ref_out, oa, orr)
    scale = float(ref_out.abs().max()) or 1.0
    result = CheckResult(True, c.max_abs, c.max_abs / scale, rel_err=c.rel, cosine=c.cos)
    if c.broken:
        result.fail(f"output: {c.broken}", "mismatch-shape")
    elif approximate:
        if error_budget is not None and not c.rel <= error_budget:
            result.fail(f"output relative error {c.rel:.3g} > the variant's error budget {error_budget:g}")
        elif error_budget is None and not c.rel < ZEROS_REL_ERR:
            result.fail(f"worse than returning zeros: output relative error {c.rel:.3g} >= {ZEROS_REL_ERR:g}, "
                        f"the error of an all-zero answer")
    else:
        why = _exact_verdict("output", c, oa, orr, o_rel, o_cos, case.dtype)
        if why:
            result.fail(why)
    if ref_grads is not None:
        result.grad_errors, rels, coss = {}, [], []
        for name, g, rg in zip("qkv", grads, ref_grads):
            if g is None:
                result.fail(f"d{name}: no gradient", "mismatch-shape")
                result.grad_errors[f"d{name}"] = float("inf")
                rels.append(float("inf"))
                coss.append(float("nan"))
                continue
            gc = _compare(g, rg, ga, gr)
            result.grad_errors[f"d{name}"] = gc.max_abs
            rels.append(gc.rel)
            coss.append(gc.cos)
            if gc.broken:
                result.fail(f"d{name}: {gc.broken}", "mismatch-shape")
            elif not approximate:  # an approximation's gradients: reported, the budget is the output's
                why = _exact_verdict(f"d{name}", gc, ga, gr, g_rel, g_cos, case.dtype)
                if why:
                    result.fail(why)
        result.grad_max_abs_err = max(result.grad_errors.values())
        result.grad_rel_err = max(rels)
        result.grad_cosine = min(coss, key=lambda x: -1.0 if x != x else x)  # nan (no gradient) is the worst
    return result


def check_form(case: Case, out) -> CheckResult:
    """The output's dtype, device, layout, shape and finiteness: what can be checked without
    a reference (a cell whose reference was skipped is held to this alone)."""
    case = case.packed()  # a ragged batch: its packed sequence, the mask within each one
    if not isinstance(out, torch.Tensor):  # the variant's bug, said before anything reads the output
        return CheckResult(False, float("inf"), float("inf"),
                           reason=f"the variant returned {_what(out)}; it returns one tensor shaped like q, "
                                  f"{(case.batch, case.heads, case.q_len, case.dv)} ({case.dtype})",
                           kind="mismatch-shape")
    wrong = [f"{what} {got}, expected {want}" for what, got, want in (
        ("dtype", out.dtype, case.torch_dtype), ("device", out.device.type, case.device),
        ("layout", out.layout, torch.strided)) if got != want]
    if wrong:
        return CheckResult(False, float("inf"), float("inf"), reason="output " + "; ".join(wrong),
                           kind="mismatch-shape")
    if out.shape != (case.batch, case.heads, case.q_len, case.dv):
        return CheckResult(False, float("inf"), float("inf"),
                           reason=f"output shape {tuple(out.shape)} != expected "
                                  f"{(case.batch, case.heads, case.q_len, case.dv)}", kind="mismatch-shape")
    if not bool(torch.isfinite(out.float() if out.element_size() == 1 else out).all()):  # fp8 has no isfinite
        return CheckResult(False, float("inf"), float("inf"), reason="output: non-finite values",
                           kind="mismatch-shape")
    return CheckResult(True, float("nan"), float("nan"))


def _what(value) -> str:
    """What a variant returned, in words: ``a tuple of 2 (Tensor, NoneType)``, ``None``."""
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        kinds = ", ".join(type(x).__name__ for x in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"a {type(value).__name__} of {len(value)} ({kinds})"
    return f"a {type(value).__name__}"


class InputGuard:
    """The tensors a variant is handed (q, k and v, the upstream gradient; in a layer its x, memory
    and weights), copied to the host before its checked call and held against it after: ``changed()``
    names those it wrote to in place, and ``restore()`` puts their values back, so that the next
    variant of the case runs on the inputs its reference was computed from.  A variant that changes
    its inputs corrupts what a real model's next layer reads, and every later timed call runs on
    other inputs than the checked one: its cell is ``mismatch``, naming them."""

    def __init__(self, named: dict):
        self.named = {k: t for k, t in named.items() if isinstance(t, torch.Tensor)}
        self.copies = {k: t.detach().to("cpu", copy=True) for k, t in self.named.items()}

    @staticmethod
    def _bits(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to("cpu")
        return t.view(torch.uint8) if t.dtype.is_floating_point and t.element_size() == 1 else t  # fp8: no equal

    def changed(self) -> list[str]:
        """The names of the tensors whose values differ from their copies (bitwise)."""
        return [k for k, t in self.named.items() if not torch.equal(self._bits(t), self._bits(self.copies[k]))]

    def restore(self, names) -> None:
        with torch.no_grad():
            for k in names:
                self.named[k].copy_(self.copies[k].to(self.named[k].device))

    def verdict(self, result: CheckResult, what: str = "the variant") -> CheckResult:
        """``result``, failed when an input was changed (and the inputs restored)."""
        changed = self.changed()
        if changed:
            self.restore(changed)
            names = ", ".join(changed)
            # this reason comes before any other: the output's own figures may have been computed on other inputs
            result.ok, result.kind, result.outputs = False, "mismatch-values", None
            result.reason = (f"{what} changed its input{'s' if len(changed) > 1 else ''} {names} in place (it "
                             f"must leave every input as it got it: a model's next layer reads them, and each later "
                             f"call would run on other inputs than the checked one)")
        return result


def guarded(case: Case, q, k, v, grad_out=None) -> InputGuard:
    """An InputGuard over a core cell's inputs: q, k, v and, with a backward, the upstream gradient."""
    return InputGuard({"q": q, "k": k, "v": v, "grad_out": grad_out})


def run_and_check(case: Case, fn, q, k, v, grad_out=None, ref: Reference | None = None,
                  error_budget: float | None = None, approximate: bool = False) -> CheckResult:
    """Run ``fn`` once (with backward when ``grad_out`` is given) and check it.

    ``ref`` may carry a precomputed ``reference(...)`` for these inputs; ``approximate`` and
    ``error_budget`` are the variant's (see ``check``).
    """
    ref = ref if ref is not None else reference(case, q, k, v, grad_out)
    guard = guarded(case, q, k, v, grad_out)
    out = fn(q, k, v)
    if not isinstance(out, torch.Tensor) or guard.changed():  # said before a backward trips over the change
        return guard.verdict(check_form(case, out))
    grads = None
    if grad_out is not None:
        grads = torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)
    outputs = (out.detach(), tuple(None if g is None else g.detach() for g in grads) if grads is not None else None)
    form = check_form(case, out)
    if not form.ok:
        return guard.verdict(form)
    out, grads = ref.select(out, grads)
    result = check(case, out, ref.out, grads, ref.grads, error_budget, approximate, ref.atol_scale)
    result.max_logit = ref.max_logit
    result.outputs = outputs
    return guard.verdict(result)


def same_bits(case: Case, first, timed_outputs) -> tuple[bool, float]:
    """(bitwise equal, the largest absolute difference) between ``first`` (the checked call's
    output and gradients: ``CheckResult.outputs``) and the outputs of timed calls on the same
    inputs (a CPU timer's first and latest, ``CpuTimer.keep_outputs``): the output of a forward,
    the gradients of a backward or of a forward and backward.  None among them: not taken."""
    out0, grads0 = first
    equal, worst = True, 0.0
    for got in timed_outputs:
        if got is None:
            continue
        pairs = [(got, out0)] if case.direction == "fwd" else \
            [(g, g0) for g, g0 in zip(got, grads0 or ()) if g is not None and g0 is not None]
        for x, x0 in pairs:
            x = x.detach()
            if x.shape != x0.shape or not torch.equal(x, x0):
                equal = False
                worst = max(worst, float((x.double() - x0.double()).abs().max()) if x.shape == x0.shape
                            else float("inf"))
    return equal, worst


def determinism(case: Case, fn, q, k, v, grad_out, first, runs: int = 2) -> tuple[bool, float]:
    """(bitwise equal, the largest absolute difference) between ``first`` (the output and the
    gradients of the checked call: ``CheckResult.outputs``) and ``runs`` more calls on the same
    inputs.  Atomics in a backward and split-KV reductions make some kernels differ run to run."""
    out0, grads0 = first
    equal, worst = True, 0.0
    for _ in range(runs):
        out = fn(q, k, v)
        tensors = [(out.detach(), out0)]
        if grad_out is not None:
            grads = torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)
            tensors += [(g, g0) for g, g0 in zip(grads, grads0) if g is not None and g0 is not None]
        for x, x0 in tensors:
            if not torch.equal(x, x0):
                equal = False
                worst = max(worst, float((x.double() - x0.double()).abs().max()))
        del out, tensors  # one call's output (and its graph) alive at a time
    return equal, worst
