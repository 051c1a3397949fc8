"""Exact work per case.

FLOPs count the two matmuls over the (query, key) pairs the mask keeps, counted exactly
from the mask's definition (bench.model.masks):
forward = 4 * batch * heads * pairs * head_dim (2 for QK^T, 2 for PV, multiply-add = 2);
backward = 2.5x forward (five matmuls against the forward's two); fwd+bwd = 3.5x.
Softmax and masking are not counted.  Bytes are the minimum traffic: each input read
once and each output written once (forward: q, k, v in, o out; backward: q, k, v, o, dO
in, dq, dk, dv out).
"""

from __future__ import annotations

from bench.model import masks
from bench.model.case import Case

DIRECTION_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


def kept_pairs(case: Case) -> int:
    """(query, key) pairs the mask keeps, summed over the batch, for one head (exact)."""
    return masks.kept_pairs(case)


def flops(case: Case) -> float:
    fwd = 4 * masks.bind(case).counts[0] * case.head_dim  # pairs summed over batch and heads
    return fwd * DIRECTION_FACTOR[case.direction]


def min_bytes(case: Case) -> int:
    """The minimum traffic; a paged cache is read in whole pages, with its block table."""
    e = ELEMENT_BYTES[case.dtype]
    q = case.batch * case.heads * case.q_len * case.head_dim  # also o, dO, dq
    kv = case.batch * case.kv_heads * case.kv_len * case.head_dim  # each of k, v, dk, dv
    if case.paged:
        pages = -(-case.kv_len // case.page_size)
        kv = case.batch * case.kv_heads * pages * case.page_size * case.head_dim
        return e * (2 * q + 2 * kv) + 8 * case.batch * pages  # and the int64 block table
    fwd = 2 * q + 2 * kv
    bwd = 4 * q + 4 * kv
    return e * {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[case.direction]
