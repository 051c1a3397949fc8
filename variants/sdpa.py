"""torch.nn.functional.scaled_dot_product_attention: PyTorch's own dispatch, and one entry
per backend pinned with torch.nn.attention.sdpa_kernel (a pinned backend never falls
back to another: when it cannot take the case it is unavailable with PyTorch's reason)."""

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench import masks
from bench.probe import run_probe
from bench.registry import variant

BACKENDS = {
    "sdpa": (None, "scaled_dot_product_attention with PyTorch's own backend choice"),
    "sdpa.math": (SDPBackend.MATH, "SDPA pinned to the math backend (composite ATen ops)"),
    "sdpa.flash": (SDPBackend.FLASH_ATTENTION, "SDPA pinned to the FlashAttention backend"),
    "sdpa.efficient": (SDPBackend.EFFICIENT_ATTENTION,
                       "SDPA pinned to the memory-efficient (cutlass) backend"),
    "sdpa.cudnn": (SDPBackend.CUDNN_ATTENTION, "SDPA pinned to the cuDNN backend"),
}


def _make_factory(backend):
    def factory(case):
        kwargs = {"scale": case.scale}
        if case.mask == "causal":
            kwargs["is_causal"] = True  # top-left aligned, as bench.masks defines
        elif case.mask != "none":
            kwargs["attn_mask"] = masks.dense_keep(case, case.device)  # (B|1, 1, Lq, Lk)
        if case.is_gqa:
            kwargs["enable_gqa"] = True

        if backend is None:
            def attention(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            def attention(q, k, v):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, k, v, **kwargs)
        return attention

    return factory


def _check(factory, backend, case):
    if backend is SDPBackend.CUDNN_ATTENTION and case.device == "cuda":
        if not torch.backends.cudnn.is_available():
            return "cuDNN is not available in this PyTorch build"
    why = run_probe(factory, case)
    if why and backend is not None:
        why = f"PyTorch: {why} (backend {backend.name} pinned, device {case.device})"
    return why


for _name, (_backend, _desc) in BACKENDS.items():
    _factory = _make_factory(_backend)
    variant(_name, description=_desc, check=functools.partial(_check, _factory, _backend))(_factory)
