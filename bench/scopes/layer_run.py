"""A variant's core inside the seeds' layer (``--scope``, bench.scopes.layer_shapes): the tensors, the
whole call and each part as a callable of its own, and the check of the whole against a
float64 layer with the same weights.

The layer is written once (``Layer.forward``) and every part goes through ``run(part, fn,
args, weights)``.  Timing the whole calls it straight through; ``part_calls`` runs it once
with a recorder and turns each part's recorded calls into a callable on those inputs, so
the parts are timed as separate callables, interleaved in the same rounds as the whole, and
their sum is held against it.  On the GPU a forward is also timed from the inside
(``in_call_parts``): CUDA events recorded around each part in whole calls, whose sum is held
against the same calls' whole time.  A backward is the parts' and the whole's with the weights'
gradients (the training step), through a graph built once outside the timed call (``bwd``)
or inside it (``fwd+bwd``).

No variant needs code for this: its core is ``variant.prepare(core case)``, the same call
a core cell times, on q, k and v shaped as a core cell's (heads split off and contiguous).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from bench.measure.cellsteps import Step, Timed
from bench.measure.correctness import CheckResult, InputGuard, check_form, relative_errors
from bench.measure.stats import median_ci, quantile
from bench.measure.timing import direction_call
from bench.model import masks
from bench.model.case import Case
from bench.model.registry import Prepared, Variant
from bench.scopes import layer_shapes as shapes

EPS = 1e-5
# the whole layer's output (and its gradients) against the float64 layer: relative Frobenius error and cosine.
# The layer's matmuls round in the case's dtype as the core's do; its errors add up over the sublayers. A
# weight's gradient behind the seeds' ReLU is the widest: a pre-activation within rounding of 0 flips its unit
# on or off (2.8e-3 measured on a float32 decoder's first FFN map; a wrong core is off by 1e-1 and more)
LAYER_TOLERANCES = {  # dtype: ((out max rel_err, out min cosine), (grad max rel_err, grad min cosine))
    "float32": ((1e-4, 0.99999), (1e-2, 0.9995)),
    "float16": ((1e-2, 0.999), (5e-2, 0.998)),
    "bfloat16": ((3e-2, 0.999), (1e-1, 0.995)),
}
CHECK_ELEMENTS = 1 << 26  # float64 scores of the check above which it takes the first batch element alone, and
# above which, for that element, the last queries alone that stay within it (the float64 layer's time: rows x n)


def _normal(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def weights(case: Case, seed: int = 0) -> dict[str, torch.Tensor]:
    """The layer's weights in float32 on the CPU, seeded by the case's shape: linear maps
    drawn as nn.Linear's scale (1/sqrt(fan_in)), norm gains near 1."""
    from bench.measure.inputs import case_seed

    g = torch.Generator().manual_seed(case_seed(case, seed + 7))
    w = shapes.widths(case)
    d = w["d"]

    def lin(out, inp):
        return _normal(g, out, inp, scale=inp ** -0.5)

    out = {}
    sublayers = ("self", "cross") if case.scope == "decoder" else ("self",)
    for s in sublayers:
        out |= {f"{s}.wq": lin(w["q"], d), f"{s}.wk": lin(w["k"], d), f"{s}.wv": lin(w["v"], d),
                f"{s}.wo": lin(d, w["o"])}
    if case.scope in ("encoder", "decoder"):
        kind, d_ff = shapes.parse_ffn(case.ffn)
        out |= {"ffn.w1": lin(d_ff, d), "ffn.w2": lin(d, d_ff)}
        if kind == "swiglu":
            out["ffn.w3"] = lin(d_ff, d)
        for i in range(len(sublayers) + 1):
            out[f"norm{i}.g"] = 1 + _normal(g, d, scale=0.1)
            if kind == "mlp":
                out[f"norm{i}.b"] = _normal(g, d, scale=0.1)
    return out


def layer_inputs(case: Case, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x (B, n, d_model), and the memory (B, m, d_model) the block's or decoder's K and V come
    from (None when they come from x), in float32 on the CPU."""
    from bench.measure.inputs import case_seed

    g = torch.Generator().manual_seed(case_seed(case, seed + 11))
    d = shapes.d_model(case)
    x = _normal(g, case.batch, case.q_len, d)
    memory = case.scope == "decoder" or (case.scope == "block" and case.kv_len != case.q_len)
    return x, (_normal(g, case.batch, case.kv_len, d) if memory else None)


def _direct(part, fn, args, used):
    return fn(*args)


@dataclass
class Layer:
    """The layer of ``case`` on weights ``w``, with ``cores`` {"core": fn, "core_cross": fn}."""
    case: Case
    w: dict
    cores: dict

    def forward(self, x, memory=None, run: Callable = _direct, rows: slice | None = None):
        """The layer's output; ``rows``: at those query positions alone (every position's keys and
        values still made: a row of a layer's output depends on its own query and on every key)."""
        c, w = self.case, self.w
        pick = (lambda t: t) if rows is None else (lambda t: t[:, rows])
        kind = shapes.parse_ffn(c.ffn)[0] if c.ffn != "none" else None
        pre = kind == "swiglu"  # llama: RMSNorm before each sublayer, a plain residual after
        h, kvh, dq, dv = c.heads, c.kv_heads, c.head_dim, c.dv

        def split(t, heads, dim):
            return t.view(t.shape[0], t.shape[1], heads, dim).transpose(1, 2).contiguous()

        def attention(sub, core, xq, xkv):
            wq, wk, wv, wo = (w[f"{sub}.{n}"] for n in ("wq", "wk", "wv", "wo"))

            def qkv(a, b):
                return split(a @ wq.T, h, dq), split(b @ wk.T, kvh, dq), split(b @ wv.T, kvh, dv)

            def out(o):
                return o.transpose(1, 2).reshape(o.shape[0], o.shape[2], h * dv) @ wo.T

            q, k, v = run("qkv", qkv, (xq, xkv), (wq, wk, wv))
            o = run(core, self.cores[core], (q, k, v), ())
            return run("out", out, (o,), (wo,))

        def norm(i, t):
            g = w[f"norm{i}.g"]
            if pre:
                return F.rms_norm(t, (t.shape[-1],), g, EPS)
            return F.layer_norm(t, (t.shape[-1],), g, w[f"norm{i}.b"], EPS)

        def add_norm(i, a, b):  # the seeds' Add & Norm
            return run("norms", lambda s, t: norm(i, s + t), (a, b), _norm_weights(w, i))

        def prenorm(i, a):
            return run("norms", lambda s: norm(i, s), (a,), _norm_weights(w, i))

        def add(a, b):
            return run("norms", torch.add, (a, b), ())

        def ffn(t):
            if kind == "swiglu":
                used = (w["ffn.w1"], w["ffn.w3"], w["ffn.w2"])
                return run("ffn", lambda s: (F.silu(s @ used[0].T) * (s @ used[1].T)) @ used[2].T, (t,), used)
            used = (w["ffn.w1"], w["ffn.w2"])
            return run("ffn", lambda s: F.relu(s @ used[0].T) @ used[1].T, (t,), used)

        if c.scope == "block":
            return attention("self", "core", pick(x), x if memory is None else memory)
        sublayers = [("self", "core", None)] + ([("cross", "core_cross", memory)] if c.scope == "decoder" else [])
        if pre:
            for i, (sub, core, mem) in enumerate(sublayers):
                a = prenorm(i, x)  # (the first sublayer's keys: every row of it)
                q_rows = pick(a) if i == 0 else a
                x = add(pick(x) if i == 0 else x, attention(sub, core, q_rows, a if mem is None else mem))
            return add(x, ffn(prenorm(len(sublayers), x)))
        for i, (sub, core, mem) in enumerate(sublayers):
            q_rows = pick(x) if i == 0 else x
            x = add_norm(i, q_rows, attention(sub, core, q_rows, x if mem is None else mem))
        return add_norm(len(sublayers), x, ffn(x))


def _norm_weights(w: dict, i: int) -> tuple:
    return tuple(w[k] for k in (f"norm{i}.g", f"norm{i}.b") if k in w)


@dataclass
class _Recorded:
    fn: Callable
    args: tuple
    used: tuple


def _flat(out) -> list:
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def _call_with_grads(direction: str, make_outputs: Callable[[], list], leaves: list, seed: int = 3) -> Callable:
    """The timed call of a part or the whole for ``direction`` (``direction_call``), the gradients
    of its leaves (inputs and weights) from an upstream gradient drawn once, shaped as its outputs."""
    if direction == "fwd":
        return make_outputs
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        shapes = [(t.shape, t.device, t.dtype) for t in make_outputs()]
    grads = [torch.randn(shape, generator=g).to(device, dtype) for shape, device, dtype in shapes]
    return direction_call(direction, make_outputs, leaves, grads, allow_unused=True)


@dataclass
class LayerBound:
    """A variant bound to a layer case: the same interface as ``bench.measure.bound.BoundVariant``
    (``scope()``, ``timed(direction)``, ``prepared``, ``setup_ms``) over the whole layer, and
    ``part_calls()`` for its parts."""
    variant: Variant
    case: Case
    prepared: Prepared  # the self-attention core's (its info is the row's extra)
    cores: dict  # name -> Prepared
    layer: Layer
    x: torch.Tensor
    memory: torch.Tensor | None
    setup_ms: float
    _parts: dict = field(default_factory=dict, repr=False)

    def scope(self):
        stack = contextlib.ExitStack()
        for p in self.cores.values():
            stack.enter_context(p.scope())
        return stack

    @property
    def fn(self) -> Callable:
        return lambda *_: self.layer.forward(self.x, self.memory)

    def _leaves(self, grad: bool) -> list:
        if not grad:
            return []
        return [t for t in (self.x, self.memory) if t is not None] + list(self.layer.w.values())

    def timed(self, direction: str | None = None) -> Callable[[], object]:
        """The whole layer's call for the case's direction (or ``direction``)."""
        direction = direction or self.case.direction
        return _call_with_grads(direction, lambda: _flat(self.layer.forward(self.x, self.memory)),
                                self._leaves(direction != "fwd"))

    def part_calls(self, direction: str | None = None, only: str | None = None) -> dict[str, Callable]:
        """Each part's call on the inputs it gets in the whole layer (recorded from one forward),
        for the case's direction: {part: call}, in PARTS order (``only``: that part's alone, so
        that a backward builds one part's graph)."""
        direction = direction or self.case.direction
        grad = direction != "fwd"
        recorded: dict[str, list[_Recorded]] = {}

        def record(part, fn, args, used):
            out = fn(*args)
            leaf_args = tuple(a.detach().requires_grad_(grad) if isinstance(a, torch.Tensor) else a for a in args)
            recorded.setdefault(part, []).append(_Recorded(fn, leaf_args, tuple(used)))
            return out

        with torch.no_grad():
            self.layer.forward(self.x, self.memory, run=record)
        calls = {}
        for part in shapes.parts(self.case):
            if only is not None and part != only:
                continue
            recs = recorded.get(part, [])

            def outputs(recs=recs):
                return [t for r in recs for t in _flat(r.fn(*r.args))]
            leaves = [a for r in recs for a in r.args if isinstance(a, torch.Tensor)] + \
                [u for r in recs for u in r.used] if grad else []
            calls[part] = _call_with_grads(direction, outputs, leaves)
        return calls

    def in_call_parts(self, calls: int = 20, event: Callable | None = None,
                      sync: Callable[[], None] | None = None) -> dict[str, list[float]]:
        """GPU, forward: each part's time inside ``calls`` whole calls, from events recorded around
        it, and each call's whole time from events around the call: {"whole": [ms], part: [ms]},
        one figure a call (a part called twice in a layer, its two summed).  ``event`` makes a
        timing event (default a CUDA event), ``sync`` waits for the device."""
        event = event or (lambda: torch.cuda.Event(enable_timing=True))
        sync = sync or torch.cuda.synchronize
        names = shapes.parts(self.case)
        out: dict[str, list[float]] = {"whole": [], **{p: [] for p in names}}
        for _ in range(calls):
            marks = []

            def run(part, fn, args, used, marks=marks):
                a, b = event(), event()
                a.record()
                result = fn(*args)
                b.record()
                marks.append((part, a, b))
                return result
            start, end = event(), event()
            with torch.no_grad():
                start.record()
                self.layer.forward(self.x, self.memory, run=run)
                end.record()
            sync()
            for p in names:
                out[p].append(sum(a.elapsed_time(b) for part, a, b in marks if part == p))
            out["whole"].append(start.elapsed_time(end))
        return out

    def determinism(self, runs: int = 2) -> tuple[bool, float | None]:
        """(bitwise equal, the largest difference) of ``runs`` more whole calls against a first one,
        outputs and gradients alike."""
        call = self.timed()
        first = [t.detach().clone() for t in _flat(call()) if t is not None]
        equal, worst = True, 0.0
        for _ in range(runs):
            for a, b in zip(first, [t for t in _flat(call()) if t is not None]):
                if not torch.equal(a, b):
                    equal = False
                    worst = max(worst, float((a.double() - b.double()).abs().max()))
        return equal, (None if equal else worst)

    # -- the check --------------------------------------------------------------------------------
    def check(self, approximate: bool = False) -> CheckResult:
        """The whole layer (and, with a backward, the gradients of x, the memory and every weight)
        against a float64 layer on the same weights whose cores are the masks' definition (an
        approximation's errors are reported, not held to the tolerances: its own budget is its
        core's, checked in scope core).  A case
        too large for a float64 layer whole is checked on its first batch element (batch elements
        are independent through a layer; the weights' gradients, summed over the batch, are then
        left out)."""
        case = self.case
        whole = case.batch * case.heads * case.q_len * case.kv_len <= CHECK_ELEMENTS
        batches = list(range(case.batch)) if whole else [0]
        rows = check_rows(case)  # None: every query; else the last ones a float64 layer of bounded time holds
        first = 0 if rows is None else rows.start
        grad = case.needs_grad
        x, memory = (None if t is None else t.detach().requires_grad_(grad) for t in (self.x, self.memory))
        w = {k: t.detach().requires_grad_(grad) for k, t in self.layer.w.items()}
        try:
            out = Layer(case, w, self.layer.cores).forward(x, memory, run=_checked_cores(case))
        except _CoreRefused as refused:  # the variant's own bug, said before the harness uses what it returned
            return refused.result
        ref_layer = Layer(case, {k: t.detach().double().cpu().requires_grad_(grad) for k, t in w.items()},
                          {name: exact_core(c, batches, first) for name, c in shapes.core_cases(case).items()})
        ref_in = [None if t is None else t.detach()[batches].double().cpu().requires_grad_(grad) for t in (x, memory)]
        ref = ref_layer.forward(*ref_in, rows=rows)
        (o_rel, o_cos), (g_rel, g_cos) = LAYER_TOLERANCES[case.dtype]
        mine = out.detach()[batches] if rows is None else out.detach()[batches][:, rows]
        rel, cos = relative_errors(mine, ref.detach())
        err = (mine.double().cpu() - ref.detach()).abs()
        scale = float(ref.detach().abs().max()) or 1.0
        result = CheckResult(True, float(err.max()), float(err.max()) / scale, rel_err=rel, cosine=cos)
        if not torch.isfinite(mine).all():
            result.fail("the layer's output: non-finite values", "mismatch-shape")
        elif approximate:  # an approximation's errors in the layer are reported; its budget is its core's
            pass
        elif not rel <= o_rel:
            result.fail(f"the layer's output: relative error {rel:.3g} > {o_rel:g} ({case.dtype}) against the float64 "
                        f"layer with the same weights")
        elif not cos >= o_cos:
            result.fail(f"the layer's output: cosine {cos:.6g} < {o_cos:g} ({case.dtype})")
        if grad:
            up = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
            if rows is not None:  # the gradients of the checked rows' output alone, on both sides
                kept = torch.zeros_like(up)
                kept[:, rows] = up[:, rows]
                up = kept
            inputs = [(n, t, r) for n, t, r in zip(("x", "memory"), (x, memory), ref_in) if t is not None]
            weights_too = whole
            names = [n for n, _, _ in inputs] + (list(w) if weights_too else [])
            got = torch.autograd.grad(out, [t for _, t, _ in inputs] + (list(w.values()) if weights_too else []),
                                      up.to(out.device, out.dtype), allow_unused=True)
            want = torch.autograd.grad(ref, [r for _, _, r in inputs] +
                                       (list(ref_layer.w.values()) if weights_too else []),
                                       (up[batches] if rows is None else up[batches][:, rows]).double(),
                                       allow_unused=True)
            rels, coss = {}, {}
            for i, (name, a, b) in enumerate(zip(names, got, want)):
                a = a[batches] if a is not None and i < len(inputs) else a
                rels[name], coss[name] = relative_errors(a, b) if a is not None else (float("inf"), float("nan"))
            worst = max(rels, key=rels.get)
            result.grad_rel_err, result.grad_cosine = rels[worst], min(coss.values())
            result.grad_errors = {f"d{k}": v for k, v in rels.items()}
            if approximate:
                pass
            elif not rels[worst] <= g_rel:
                result.fail(f"the layer's gradient d{worst}: relative error {rels[worst]:.3g} > {g_rel:g} "
                            f"({case.dtype})")
            elif not result.grad_cosine >= g_cos:
                result.fail(f"the layer's gradients: cosine {result.grad_cosine:.6g} < {g_cos:g} ({case.dtype})")
        return result


class _CoreRefused(Exception):
    def __init__(self, result: CheckResult):
        super().__init__(result.reason)
        self.result = result


def _checked_cores(case: Case) -> Callable:
    """The layer's ``run`` for its check: each core's call held to what a core cell's is before the
    layer reads its output (one tensor shaped like q, in the case's dtype and device, finite), and
    its q, k and v held to what it got (InputGuard); _CoreRefused with the mismatch where not."""
    cores = shapes.core_cases(case)

    def run(part, fn, args, used):
        if part not in cores:
            return fn(*args)
        guard = InputGuard(dict(zip("qkv", args)))
        out = fn(*args)
        result = guard.verdict(check_form(cores[part], out))
        if not result.ok:
            core = "cross-attention" if part == "core_cross" else \
                "self-attention" if case.scope == "decoder" else "attention"
            result.reason = f"{result.reason} (in the {case.scope}'s {core} core)"
            raise _CoreRefused(result)
        return out
    return run


SUM_AGREES = 0.15  # the parts' medians sum to the whole's within this share, or the row says they do not


def layer_figures(case: Case, whole, parts: dict) -> dict:
    """A layer row's ``layer`` column from the whole's timing and each part's (TimingSummary):
    each part's median, 95% interval and FLOPs; their sum against the whole; the attention
    cores' time, the rest of the layer's, and the cores' share of the parts' sum."""
    flops = shapes.part_flops(case)
    out = {p: {"median_ms": t.median_ms, "ci_lo_ms": t.ci_lo_ms, "ci_hi_ms": t.ci_hi_ms, "flops": flops.get(p)}
           for p, t in parts.items()}
    total = sum(t.median_ms for t in parts.values())
    core = sum(t.median_ms for p, t in parts.items() if p.startswith("core"))
    ratio = total / whole.median_ms if whole.median_ms else None
    kind, d_ff = shapes.parse_ffn(case.ffn) if case.ffn != "none" else (None, None)
    return {"parts": out, "whole_ms": whole.median_ms, "sum_ms": total, "sum_ratio": ratio,
            "sum_agrees": ratio is not None and abs(ratio - 1) <= SUM_AGREES, "core_ms": core, "rest_ms": total - core,
            "core_share": core / total if total else None, "d_model": shapes.d_model(case), "d_ff": d_ff,
            "ffn": kind, "method": "parts timed as separate calls, interleaved in the whole's rounds"}


def in_call_figures(samples: dict[str, list[float]]) -> dict:
    """A layer row's ``layer["in_call"]`` from ``LayerBound.in_call_parts``: each part's median and
    95% interval inside the whole calls, the whole's median, and the median over the calls of the
    parts' sum over that call's whole (below 1 by what runs between the parts: the reshapes the
    parts do not hold, the launches)."""
    whole = samples["whole"]
    parts = {p: xs for p, xs in samples.items() if p != "whole"}

    def summary(xs):
        ci = median_ci(xs)
        return {"median_ms": quantile(sorted(xs), 0.5), "ci_lo_ms": ci[0] if ci else None,
                "ci_hi_ms": ci[1] if ci else None}
    ratios = sorted(sum(xs[i] for xs in parts.values()) / w for i, w in enumerate(whole) if w > 0)
    ratio = quantile(ratios, 0.5) if ratios else None
    return {"parts": {p: summary(xs) for p, xs in parts.items()}, "whole_ms": quantile(sorted(whole), 0.5),
            "calls": len(whole), "sum_ratio": ratio,
            "sum_agrees": ratio is not None and abs(ratio - 1) <= SUM_AGREES,
            "method": "CUDA events around each part inside whole forward calls"}


BLOCK_ELEMENTS = 1 << 23  # float64 scores one query block of the layer's check holds (64 MiB): host memory bound


def check_rows(case: Case) -> slice | None:
    """The query rows the layer's float64 check computes: every one (None) while one batch
    element's scores stay within CHECK_ELEMENTS, else the last rows that do (at least one; under a
    causal mask the rows that see the most keys).  The check's time is then bounded as its memory
    is: rows x kv_len scores per head, not q_len x kv_len (16 heads at n = 16384: 256 rows)."""
    per_row = case.heads * max(case.q_len, case.kv_len)  # a decoder's self-attention has q_len keys
    if case.heads * case.q_len * case.kv_len <= CHECK_ELEMENTS:
        return None
    count = max(1, min(case.q_len, CHECK_ELEMENTS // per_row))
    return slice(case.q_len - count, case.q_len)


def exact_core(case: Case, batches: list[int], first_row: int = 0) -> Callable:
    """float64 attention from the mask's definition for the batch elements ``batches``, its queries
    the rows from ``first_row`` on (the layer's check of its last rows: ``check_rows``),
    differentiable (the layer's check: its gradients flow through to the weights).  It runs in
    blocks of queries of at most BLOCK_ELEMENTS scores, each block checkpointed (its scores
    computed again in the backward, not kept), so that the host holds one block's scores at a
    time, forward and backward, whatever n (16 heads at n = 16384: 64 MiB, not 32 GiB a tensor)."""
    from torch.utils.checkpoint import checkpoint

    bound = masks.bind(case)
    sink = bound.sink_logits("cpu", torch.float64)

    def block(q, k, v, s: int, e: int):
        s, e = first_row + s, first_row + e  # the queries' positions in the sequence
        scores = (q @ k.transpose(-2, -1)) * case.scale
        scores = bound.apply_mods(scores, (s, e), batches=batches)
        keep = bound.keep("cpu", (s, e), batches=batches)
        empty = keep is not None and bool((~keep.any(-1)).any())
        return masks.masked_softmax(scores, keep, empty, sink) @ v

    def fn(q, k, v):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        n = q.shape[2]
        rows = max(1, BLOCK_ELEMENTS // max(1, q.shape[0] * q.shape[1] * k.shape[2]))
        if rows >= n:
            return block(q, k, v, 0, n)
        return torch.cat([checkpoint(block, q[:, :, s:min(n, s + rows)], k, v, s, min(n, s + rows), use_reentrant=False)
                          for s in range(0, n, rows)], dim=2)
    return fn


def bind_layer(variant: Variant, case: Case) -> LayerBound:
    """``variant``'s cores prepared for the layer of ``case`` (the setup timed), its weights and
    inputs made in the case's dtype and device."""
    t0 = time.perf_counter()
    cores = {name: variant.prepare(c) for name, c in shapes.core_cases(case).items()}
    cores = {name: p if isinstance(p, Prepared) else Prepared(p) for name, p in cores.items()}
    setup_ms = (time.perf_counter() - t0) * 1e3
    dtype, device = case.torch_dtype, case.device
    grad = case.needs_grad  # a training step: the weights' gradients, and x's (and the memory's) for the layer below
    w = {k: t.to(device, dtype).requires_grad_(grad) for k, t in weights(case).items()}
    x, memory = (None if t is None else t.to(device, dtype).requires_grad_(grad) for t in layer_inputs(case))
    layer = Layer(case, w, {name: p.fn for name, p in cores.items()})
    return LayerBound(variant, case, cores["core"], cores, layer, x, memory, setup_ms)


__all__ = ["LAYER_TOLERANCES", "Layer", "LayerBound", "bind_layer", "check_rows", "exact_core", "layer_inputs",
           "weights"]


IN_CALL_CALLS = 20  # GPU layer cells, forward: whole calls timed with events around each part (after the timing)


def _layer_parts(t: Timed) -> None:
    """A layer's parts (``--scope``), and on a GPU, forward, the parts inside whole calls."""
    item, case, result = t.item, t.case, t.result
    result.layer = layer_figures(case, t.timing, {p: tm.result().summary() for p, tm in item.parts.items()})
    if case.device == "cuda" and case.direction == "fwd":
        try:
            with item.bound.scope():
                result.layer["in_call"] = in_call_figures(item.bound.in_call_parts(IN_CALL_CALLS))
        except Exception as exc:  # a check after the timing: the timing stays, the row says why
            result.layer["in_call_error"] = f"{type(exc).__name__}: {exc}"[:300]


STEP = Step("layer parts", 20, lambda t: bool(t.item.parts), _layer_parts)
