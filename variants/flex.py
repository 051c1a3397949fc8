"""FlexAttention (torch.nn.attention.flex_attention) with a block mask built from a
mask_mod.  The block mask and the compilation happen in setup, once per shape; the
compile time is reported as its own figure (info['compile_ms'])."""

import functools
import time
import warnings

import torch

from bench import masks
from bench.inputs import make_grad_out, make_inputs, probe_case
from bench.registry import Prepared, variant

_COMPILED = None


def _compiled_flex():
    global _COMPILED
    if _COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


def mask_mod_for(case):
    """The bench.masks definition written as a FlexAttention mask_mod, named by its kind."""
    if case.mask == "causal":
        def causal(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx
        return causal
    if case.mask == "window":
        w = case.window

        def sliding_window(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (q_idx - kv_idx < w)
        return sliding_window
    if case.mask == "padding":
        lens = torch.tensor(masks.kv_lengths(case), device=case.device)

        def key_padding(b, h, q_idx, kv_idx):
            return kv_idx < lens[b]
        return key_padding
    raise ValueError(f"no mask_mod for mask {case.mask!r}")


def _check(case):
    """PyTorch's refusal of a backward (on the CPU), from its input validation.  A forward is
    not probed: an eager flex_attention call costs ~3 s the first time, and a refusal there
    still becomes the row's status and reason in the worker."""
    if not case.needs_grad:
        return None
    # the refusal depends on the device, dtype and GQA, not on the lengths or the mask
    return _eager_refusal(probe_case(case).replace(mask="none", window=None))


@functools.cache
def _eager_refusal(small):
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = make_inputs(small)
    try:  # eager validation only: PyTorch's own refusals (device, backward, shapes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flex_attention(q, k, v, enable_gqa=small.is_gqa)
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        return f"PyTorch: {str(exc).strip().splitlines()[0]}"
    return None


def _factory(case):
    from torch.nn.attention.flex_attention import create_block_mask

    batch = case.batch if case.mask == "padding" else None
    block_mask = create_block_mask(mask_mod_for(case), batch, None, case.q_len, case.kv_len,
                                   device=case.device)
    flex = _compiled_flex()
    gqa, scale = case.is_gqa, case.scale

    def attention(q, k, v):
        return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)

    # compile (forward, and backward when the case has one) outside the timed call
    t0 = time.perf_counter()
    q, k, v = make_inputs(case)
    out = attention(q, k, v)
    if case.needs_grad:
        out.backward(make_grad_out(case))
    if case.device == "cuda":
        torch.cuda.synchronize()
    compile_ms = (time.perf_counter() - t0) * 1e3
    return Prepared(attention, {"compile_ms": compile_ms})


for _mask in ("causal", "window", "padding"):
    variant(f"flex.{_mask}", masks=(_mask,), check=_check,
            description=f"FlexAttention, {_mask} block mask from a mask_mod, torch.compile'd "
                        "once per shape")(_factory)
