"""torch.nn.functional.scaled_dot_product_attention: PyTorch's own dispatch, and one entry
per backend pinned with torch.nn.attention.sdpa_kernel (a pinned backend never falls
back to another: when it cannot take the case it is unavailable with PyTorch's reason).
Every mask goes in as a dense bool attn_mask (causal as is_causal); score mods that add a
bias (ALiBi, relative bias) as a float attn_mask; others (softcap) are unsupported.  A
ragged batch, and a mixed one without a mask, go in as nested jagged tensors; a mixed batch
under a mask as its block-diagonal bool mask over the packed tokens.

Entering sdpa_kernel costs about 18 us, as much as a small GPU kernel, so the harness
holds it open around the timed calls (Prepared.scope) instead of entering it per call."""

import functools
import itertools
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench import masks
from bench.case import DTYPES, FP8
from bench.inputs import gather_pages, make_inputs
from bench.probe import run_probe
from bench.registry import Prepared, prep, variant

BACKENDS = {
    "sdpa": (None, "scaled_dot_product_attention with PyTorch's own backend choice"),
    "sdpa.math": (SDPBackend.MATH, "SDPA pinned to the math backend (composite ATen ops)"),
    "sdpa.flash": (SDPBackend.FLASH_ATTENTION, "SDPA pinned to the FlashAttention backend"),
    "sdpa.efficient": (SDPBackend.EFFICIENT_ATTENTION,
                       "SDPA pinned to the memory-efficient (cutlass) backend"),
    "sdpa.cudnn": (SDPBackend.CUDNN_ATTENTION, "SDPA pinned to the cuDNN backend"),
}


DECLARED = {  # backend: the kernels' family it must run (bench.features.gpu_state.kernels checks it on a GPU)
    SDPBackend.MATH: "math", SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
    SDPBackend.CUDNN_ATTENTION: "cudnn",
}

_FLAGS = {  # backend: the torch.backends.cuda query for it (these govern CPU dispatch too)
    SDPBackend.MATH: torch.backends.cuda.math_sdp_enabled,
    SDPBackend.FLASH_ATTENTION: torch.backends.cuda.flash_sdp_enabled,
    SDPBackend.EFFICIENT_ATTENTION: torch.backends.cuda.mem_efficient_sdp_enabled,
    SDPBackend.CUDNN_ATTENTION: torch.backends.cuda.cudnn_sdp_enabled,
}


def _pinned(backend) -> bool:
    """True when ``backend`` is the only SDPA backend enabled (about 0.3 us to ask)."""
    return all(query() == (b is backend) for b, query in _FLAGS.items())


LAYOUT_CHANGE = ("in the timed call: the packed (1, heads, tokens, D) q, k and v made contiguous (tokens, heads, D) "
                 "for nested tensors{gqa}; its own cost is layout_ms")


def _nested(case, backend):
    """A ragged batch, or a mixed one without a mask, as nested jagged tensors (torch.nested,
    layout=torch.jagged): each sequence its own length, no padding, q and k ragged apart for a
    mix; causal as is_causal, within each sequence (a ragged batch only: q_len == kv_len there,
    where top-left and bottom-right agree).

    The extreme lengths are passed in (``min_seqlen``/``max_seqlen``), so no call asks the
    device for them (an ``.item()`` host sync, and illegal in a CUDA-graph capture).  The
    layout change from the harness's packed tensors (three contiguous copies, and the key and
    value heads repeated for GQA: nested SDPA takes no enable_gqa) stays inside the call, as
    the gradients must flow through it; its cost is timed on its own here, as ``layout_ms``,
    and the row says so (``layout_change``)."""
    segments, prepared = case.segments(), {}
    q_lens, kv_lens = [q for q, _ in segments], [kv for _, kv in segments]
    with prep(prepared, case.device):  # the offsets of the sequences: new with every batch's lengths
        q_offsets = torch.tensor([0, *itertools.accumulate(q_lens)], device=case.device)
        kv_offsets = q_offsets if q_lens == kv_lens else torch.tensor([0, *itertools.accumulate(kv_lens)],
                                                                      device=case.device)
    q_side = (q_offsets, {"min_seqlen": min(q_lens), "max_seqlen": max(q_lens)})
    kv_side = (kv_offsets, {"min_seqlen": min(kv_lens), "max_seqlen": max(kv_lens)})
    group = case.heads // case.kv_heads
    kwargs = {"scale": case.scale, "is_causal": case.mask == "causal"}

    def jagged(t, side):  # (1, heads, total, D) -> nested (batch, heads, j, D)
        values = t[0].transpose(0, 1).contiguous()
        return torch.nested.nested_tensor_from_jagged(values, side[0], **side[1]).transpose(1, 2)

    def layout(q, k, v):
        if group > 1:  # nested tensors take no enable_gqa: the key/value heads repeated
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return jagged(q, q_side), jagged(k, kv_side), jagged(v, kv_side)

    def call(q, k, v):
        out = F.scaled_dot_product_attention(*layout(q, k, v), **kwargs)
        return out.transpose(1, 2).values().transpose(0, 1).unsqueeze(0)  # back to (1, heads, total, D)

    info = {"layout": "nested", "layout_ms": _layout_ms(case, layout), **prepared,
            "layout_change": LAYOUT_CHANGE.format(gqa=", k and v repeated per query head (GQA)" if group > 1 else "")}
    if backend is None:
        return Prepared(call, info)

    def attention(q, k, v):
        if _pinned(backend):
            return call(q, k, v)
        with sdpa_kernel([backend]):
            return call(q, k, v)

    return Prepared(attention, {"backend": DECLARED[backend], **info}, scope=lambda: sdpa_kernel([backend]))


def _layout_ms(case, layout, reps: int = 5) -> float:
    """The median time of the layout change alone, on inputs of the case's shape."""
    q, k, v = make_inputs(case.replace(direction="fwd"))
    sync = torch.cuda.synchronize if case.device == "cuda" else (lambda: None)
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        sync()
        t0 = time.perf_counter()
        layout(q, k, v)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def _make_factory(backend):
    def factory(case):
        if case.ragged or (case.mixed and case.mask == "none"):
            return _nested(case, backend)
        if case.paged:  # SDPA has no paged form: the pages gathered into a contiguous cache first
            return gather_pages(case, factory)
        kwargs, info = {"scale": case.scale}, {}
        # a mix under a mask: its block-diagonal bool mask over the packed tokens (nested SDPA refuses is_causal
        # on the CPU and gives the memory-efficient kernel its top-left mask type: neither places each
        # sequence's queries at its end)
        causal = case.mask == "causal" and not case.mixed
        if case.mixed:
            info["layout"] = "dense mask"
        if causal and case.offset:  # imports dynamo (1.8 s), so only when a case asks it
            from torch.nn.attention.bias import causal_lower_right
        with prep(info, case.device):  # the bias or bool mask: rebuilt whenever the structure changes
            bound = masks.bind(case)
            if bound.mods:  # additive score mods: one float bias, masked pairs at -inf
                kwargs["attn_mask"] = bound.bias(case.device, case.torch_dtype)  # (B|1, H|1, Lq, Lk)
            elif causal and case.offset:  # bottom-right: PyTorch's own lower-right causal bias
                kwargs["attn_mask"] = causal_lower_right(case.q_len, case.kv_len)
            elif causal:
                kwargs["is_causal"] = True  # top-left aligned
            elif not bound.is_full:
                kwargs["attn_mask"] = bound.keep(case.device)  # bool (B|1, H|1, Lq, Lk)
        if case.is_gqa:
            kwargs["enable_gqa"] = True

        if backend is None:
            def attention(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
            return Prepared(attention, info)

        def attention(q, k, v):
            if _pinned(backend):  # inside the harness's scope: no per-call context switch
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
            with sdpa_kernel([backend]):  # called on its own: still never another backend
                return F.scaled_dot_product_attention(q, k, v, **kwargs)

        return Prepared(attention, {"backend": DECLARED[backend], **info}, scope=lambda: sdpa_kernel([backend]))

    return factory


def _check(factory, backend, case):
    if case.ragged and case.mask not in ("none", "causal"):
        return (f"a ragged batch goes in as nested tensors, which take no attn_mask: {case.mask} within each "
                f"sequence cannot be expressed (is_causal only)")
    if backend is SDPBackend.CUDNN_ATTENTION and case.device == "cuda":
        if not torch.backends.cudnn.is_available():
            return "cuDNN is not available in this PyTorch build"
    why = run_probe(factory, case)
    if why and backend is not None:
        why = f"PyTorch: {why} (backend {backend.name} pinned, device {case.device})"
    return why


# What the harness knows of each backend beyond what it runs (bench.registry.Traits): the fused ones skip the
# masked half of a causal mask (work); their rate against the plan's default on a CPU (the median over the
# default sweep's cells at n >= 1024); their palette slot; the share of the measured matmul peak gpu-check holds each to
# (cuDNN's attention runs near the GEMM rate on Hopper; FlashAttention-2 in torch 2.11 reaches about 350 to 400
# TFLOP/s of the H200's ~790, the memory-efficient kernel less); flash's peak memory exponent under causal
# (on the CPU its per-thread scratch buffers are a fixed cost that the output only outgrows at larger sizes);
# the cases selfcheck times; and the gpu-check steps each takes part in
_FUSED_CHECKS = ("scaling-causal", "mix", "cross-gqa", "ragged")
TRAITS = {
    "sdpa": dict(work="causal", rates={"cpu": 1.6}, colour=4, peak_share=0.35, checks=("tiny", "mix", "cross-gqa",
                                                                                          "mla", "layers", "anchor")),
    "sdpa.math": dict(rates={"cpu": 0.45}, colour=6, checks=("profile",),
                      selfcheck={"cpu": dict(q_len=512, kv_len=512, mask="causal"),
                                 "cuda": dict(q_len=1024, kv_len=1024, mask="causal")}),
    "sdpa.flash": dict(work="causal", rates={"cpu": 1.5}, colour=7, peak_share=0.35,
                       memory_exponents={"cuda": (0.85, 1.15), "cpu": (0.3, 1.15)},
                       selfcheck={"cpu": dict(q_len=2048, kv_len=2048), "cuda": dict(q_len=4096, kv_len=4096)},
                       checks=(*_FUSED_CHECKS, "profile", "timer", "trace")),
    "sdpa.efficient": dict(work="causal", colour=5, peak_share=0.2, checks=_FUSED_CHECKS),
    "sdpa.cudnn": dict(work="causal", colour=3, peak_share=0.6, checks=(*_FUSED_CHECKS, "mla")),
}

for _name, (_backend, _desc) in BACKENDS.items():
    _factory = _make_factory(_backend)
    variant(_name, description=_desc, masks=(masks.ANY,), score_mods=(masks.ADDITIVE,), ragged=True, mix=True,
            paged=True, bottom_right=True, value_dim=True,
            dtypes=(*DTYPES, FP8),
            check=functools.partial(_check, _factory, _backend), **TRAITS[_name])(_factory)
