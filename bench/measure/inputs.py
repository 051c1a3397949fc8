"""Deterministic random inputs for a case."""

from __future__ import annotations

import hashlib
import math

import torch

from bench.model.case import Case


def case_seed(case: Case, seed: int = 0) -> int:
    """A seed derived from the case's shape (not its variant), stable across processes."""
    key = repr((case.batch, case.heads, case.kv_heads, case.q_len, case.kv_len, case.head_dim, seed))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:6], "little")


def make_inputs(case: Case, seed: int = 0, requires_grad: bool | None = None):
    """q (B, H, Lq, D), k and v (B, KvH, Lk, D), standard normal, in the case's dtype/device.

    Values are drawn in float32 on the CPU, so every device and dtype sees the same numbers
    up to rounding.
    """
    g = torch.Generator().manual_seed(case_seed(case, seed))
    shapes = [(case.batch, case.heads, case.q_len, case.head_dim),
              (case.batch, case.kv_heads, case.kv_len, case.head_dim),
              (case.batch, case.kv_heads, case.kv_len, case.head_dim)]
    grad = case.needs_grad if requires_grad is None else requires_grad
    out = []
    for shape in shapes:
        t = torch.randn(shape, generator=g).to(device=case.device, dtype=case.torch_dtype)
        out.append(t.requires_grad_(grad))
    return tuple(out)


def make_grad_out(case: Case, seed: int = 0) -> torch.Tensor:
    """The upstream gradient dO (B, H, Lq, D) used for backward passes."""
    g = torch.Generator().manual_seed(case_seed(case, seed) ^ 0x5EED)
    t = torch.randn((case.batch, case.heads, case.q_len, case.head_dim), generator=g)
    return t.to(device=case.device, dtype=case.torch_dtype)


def probe_case(case: Case, largest: int = 64) -> Case:
    """A small case with the same dims, dtype, mask kind and length relation, for probing."""
    f = min(1.0, largest / max(case.q_len, case.kv_len))
    q = max(1, math.ceil(case.q_len * f))
    kv = max(1, math.ceil(case.kv_len * f))
    if case.is_cross and q == kv:
        if case.kv_len > case.q_len:
            kv += 1
        else:
            q += 1
    window = None if case.window is None else max(1, min(case.window, kv))
    small = case.replace(batch=1, q_len=q, kv_len=kv, window=window)
    from bench.model import masks

    try:
        masks.bind(small)
    except masks.MaskError:  # parameters too large for the probe's lengths: a mask of the same form
        mods = masks.parse(case.mask, case.window)[1]
        small = small.replace(mask="+".join(["sink:1"] + [t.text() for t in mods]), window=None)
    return small
