"""The float64 reference and the correctness check every cell passes before timing.

The reference is attention written from the definition in ``bench.model.masks`` (the score mods
applied to the scaled scores, then the mask, then the softmax), computed on
the CPU in float64 from the very tensors a variant was given, query block by query
block so that memory stays bounded at long sequence lengths.  Past FULL_CHECK_LIMIT
score elements it covers an exact slice (first and last batch element, first key/value
head and its query heads) so that a GPU sweep at n = 16k is not bound by the CPU.

Tolerances (elementwise, ``|x - ref| <= atol + rtol * |ref|``), chosen from the unit
roundoff of each dtype and the length of the reductions involved:

=========  ==========  ==========  ===================
dtype      output      gradients   unit roundoff
=========  ==========  ==========  ===================
float32    1e-4, 1e-4  1e-3, 1e-3  6e-8
float16    5e-3, 5e-3  3e-2, 3e-2  4.9e-4
bfloat16   3e-2, 3e-2  1.5e-1, 5e-2 3.9e-3
=========  ==========  ==========  ===================
(atol, rtol).  Gradients are looser: they sum over the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bench.model import masks
from bench.model.case import Case

TOLERANCES = {  # dtype: ((out atol, out rtol), (grad atol, grad rtol))
    "float32": ((1e-4, 1e-4), (1e-3, 1e-3)),
    "float16": ((5e-3, 5e-3), (3e-2, 3e-2)),
    "bfloat16": ((3e-2, 3e-2), (1.5e-1, 5e-2)),
}
BLOCK_ELEMENTS = 1 << 25  # float64 scores per query block (256 MiB)


FULL_CHECK_LIMIT = 1 << 28  # batch * heads * q_len * kv_len above which a slice is checked


@dataclass
class Reference:
    """The reference output (and gradients) for ``batches`` x query heads ``heads`` (and
    key/value heads ``kv_heads``) of the case: all of it, or a slice for large cases."""
    out: torch.Tensor
    grads: tuple | None
    batches: list[int]
    heads: slice
    kv_heads: slice

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
    heads.  The slice is exact: those query heads see only that key/value head."""
    if case.batch * case.heads * case.q_len * case.kv_len <= FULL_CHECK_LIMIT:
        return list(range(case.batch)), slice(None), slice(None)
    group = case.heads // case.kv_heads
    return sorted({0, case.batch - 1}), slice(0, group), slice(0, 1)


def reference(case: Case, q, k, v, grad_out=None) -> Reference:
    """float64 CPU attention from the definition in bench.model.masks, query block by block."""
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
    rows = max(1, BLOCK_ELEMENTS // max(1, B * H * Lk))
    outs, dqs = [], []
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for s in range(0, case.q_len, rows):
        e = min(case.q_len, s + rows)
        qc = q[:, :, s:e].clone().requires_grad_(with_grad)
        keep = bound.keep("cpu", (s, e), batches=batches, heads=hs)  # (B|1, H|1, rows, Lk) or None
        empty = keep is not None and bool((~keep.any(-1)).any())
        with torch.set_grad_enabled(with_grad):
            kk = k.repeat_interleave(group, dim=1)
            vv = v.repeat_interleave(group, dim=1)
            scores = (qc @ kk.transpose(-2, -1)) * case.scale
            scores = bound.apply_mods(scores, (s, e), batches=batches, heads=hs)
            oc = masks.masked_softmax(scores, keep, empty) @ vv
        if with_grad:
            gq, gk, gv = torch.autograd.grad(oc, (qc, k, v), grad_out[:, :, s:e])
            dqs.append(gq)
            dk += gk
            dv += gv
        outs.append(oc.detach())
    out = torch.cat(outs, dim=2)
    grads = (torch.cat(dqs, dim=2), dk, dv) if with_grad else None
    return Reference(out, grads, batches, hs, kvs)


@dataclass
class CheckResult:
    ok: bool
    max_abs_err: float  # output
    max_rel_err: float  # output, relative to max |ref|
    grad_max_abs_err: float | None = None  # worst of dq, dk, dv
    grad_errors: dict | None = None
    reason: str = ""
    rel_err: float | None = None  # ||out - ref||_F / ||ref||_F
    cosine: float | None = None  # cosine similarity of out and ref, flattened
    grad_rel_err: float | None = None  # worst of dq, dk, dv
    grad_cosine: float | None = None  # worst of dq, dk, dv
    kind: str = "mismatch-values"  # or mismatch-shape: the wrong dtype, device, layout or shape (a ReasonKind)

    def to_row(self) -> dict:
        return {"max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "grad_max_abs_err": self.grad_max_abs_err, "rel_err": self.rel_err, "cosine": self.cosine,
                "grad_rel_err": self.grad_rel_err, "grad_cosine": self.grad_cosine}


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


def _compare(x, ref, atol, rtol):
    x = x.detach().to("cpu", torch.float64)
    if x.shape != ref.shape:
        return False, float("inf"), f"shape {tuple(x.shape)} != expected {tuple(ref.shape)}"
    if not torch.isfinite(x).all():
        return False, float("inf"), "non-finite values"
    err = (x - ref).abs()
    bad = err > atol + rtol * ref.abs()
    return not bool(bad.any()), float(err.max()) if err.numel() else 0.0, ""


def check(case: Case, out, ref_out, grads=None, ref_grads=None, error_budget: float | None = None,
          approximate: bool = False) -> CheckResult:
    """Compare a variant's output (and gradients of q, k, v) with the reference.

    An exact variant passes when every element is within the dtype's tolerance.  An
    approximate one (``approximate=True``) passes when the relative Frobenius error of its
    output is within ``error_budget`` (always, without a budget) and its output and
    gradients are finite and of the right shape: its errors, the gradients' too, are
    reported, not held to elementwise tolerances."""
    (oa, orr), (ga, gr) = TOLERANCES[case.dtype]
    ok, err, why = _compare(out, ref_out, oa, orr)
    scale = float(ref_out.abs().max()) or 1.0
    rel, cos = relative_errors(out, ref_out)
    if approximate and not why:
        ok = error_budget is None or rel <= error_budget
        why = "" if ok else f"output relative error {rel:.3g} > the variant's error budget {error_budget:g}"
    result = CheckResult(ok, err, err / scale, rel_err=rel, cosine=cos,
                         reason=why or ("" if ok else f"output max abs err {err:.3g} > tolerance "
                                                      f"(atol {oa:g}, rtol {orr:g})"))
    if ref_grads is not None:
        result.grad_errors, rels, coss = {}, [], []
        for name, g, rg in zip("qkv", grads, ref_grads):
            if g is None:
                ok, gerr, why = False, float("inf"), "no gradient"
                grel, gcos = float("inf"), float("nan")
            else:
                ok, gerr, why = _compare(g, rg, ga, gr)
                grel, gcos = relative_errors(g, rg)
                if approximate and not why:
                    ok = True  # the gradients of an approximation: reported, the budget is the output's
            result.grad_errors[f"d{name}"] = gerr
            rels.append(grel)
            coss.append(gcos)
            if not ok and result.ok:
                result.ok = False
                result.reason = f"d{name}: {why}" if why else (f"d{name} max abs err {gerr:.3g} > tolerance "
                                        f"(atol {ga:g}, rtol {gr:g})")
        result.grad_max_abs_err = max(result.grad_errors.values())
        result.grad_rel_err = max(rels)
        result.grad_cosine = min(coss)
    return result


def run_and_check(case: Case, fn, q, k, v, grad_out=None, ref: Reference | None = None,
                  error_budget: float | None = None, approximate: bool = False) -> CheckResult:
    """Run ``fn`` once (with backward when ``grad_out`` is given) and check it.

    ``ref`` may carry a precomputed ``reference(...)`` for these inputs; ``approximate`` and
    ``error_budget`` are the variant's (see ``check``).
    """
    out = fn(q, k, v)
    grads = None
    if grad_out is not None:
        grads = torch.autograd.grad(out, (q, k, v), grad_out, allow_unused=True)
    ref = ref if ref is not None else reference(case, q, k, v, grad_out)
    wrong = [f"{what} {got}, expected {want}" for what, got, want in (
        ("dtype", out.dtype, case.torch_dtype), ("device", out.device.type, case.device),
        ("layout", out.layout, torch.strided)) if got != want]
    if wrong:
        return CheckResult(False, float("inf"), float("inf"), reason="output " + "; ".join(wrong),
                           kind="mismatch-shape")
    if out.shape != (case.batch, case.heads, case.q_len, case.head_dim):
        return CheckResult(False, float("inf"), float("inf"),
                           reason=f"output shape {tuple(out.shape)} != expected "
                                  f"{(case.batch, case.heads, case.q_len, case.head_dim)}", kind="mismatch-shape")
    out, grads = ref.select(out, grads)
    return check(case, out, ref.out, grads, ref.grads, error_budget, approximate)
