"""Exact work per case.

FLOPs count the two matmuls over the (query, key) pairs the mask keeps, counted exactly
from the mask's definition (bench.model.masks):
forward = 2 * batch * heads * pairs * (head_dim + head_dim_v) (QK^T over the query/key head dim,
PV over the value head dim, a multiply-add 2 each; 4 * pairs * head_dim when they are one);
backward = 2.5x forward (five matmuls against the forward's two); fwd+bwd = 3.5x.
Softmax and masking are not counted.  Bytes are the minimum traffic: each input read
once and each output written once (forward: q, k, v in, o out; backward: q, k, v, o, dO
in, dq, dk, dv out).
"""

from __future__ import annotations

from bench.model.case import Case

DIRECTION_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


def kept_pairs(case: Case) -> int:
    """(query, key) pairs the mask keeps, summed over the batch, for one head (exact)."""
    from bench.model import masks  # torch, on first use: reading the constants needs none (the report)

    return masks.kept_pairs(case)


def flops(case: Case) -> float:
    """The case's FLOPs, as its scope counts them (bench.model.scope): the core's (``core_flops``),
    or a layer's counted whole."""
    from bench.model import scope

    return scope.of(case).flops(case)


def core_flops(case: Case) -> float:
    """The attention call's FLOPs: 2 x the kept pairs x (head_dim + head_dim_v), by direction."""
    from bench.model import masks

    fwd = 2 * masks.bind(case).counts[0] * (case.head_dim + case.dv)  # pairs summed over batch and heads
    return fwd * DIRECTION_FACTOR[case.direction]


def min_bytes(case: Case) -> int:
    """The minimum traffic; a paged cache is read in whole pages, with its block table."""
    e = ELEMENT_BYTES[case.dtype]
    rows = case.batch * case.heads * case.q_len  # q and dq at head_dim; o and dO at head_dim_v
    keys = case.batch * case.kv_heads * case.kv_len  # k and dk at head_dim; v and dv at head_dim_v
    q, o = rows * case.head_dim, rows * case.dv
    kv = keys * (case.head_dim + case.dv)  # k and v (dk and dv)
    if case.paged:
        pages = -(-case.kv_len // case.page_size)
        kv = case.batch * case.kv_heads * pages * case.page_size * (case.head_dim + case.dv)
        return e * (q + o + kv) + 8 * case.batch * pages  # and the int64 block table
    fwd = q + o + kv
    bwd = 2 * q + 2 * o + 2 * kv  # q, k, v, o, dO in; dq, dk, dv out
    return e * {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[case.direction]


def kv_bytes(case: Case) -> int:
    """The key and value bytes a forward reads at least: every key and value once."""
    return ELEMENT_BYTES[case.dtype] * case.batch * case.kv_heads * case.kv_len * (case.head_dim + case.dv)


def mix_phases(case: Case) -> dict:
    """A mixed batch's work per phase (prefill, chunked_prefill, decode: ``workload.phase``):
    its sequences, query and key tokens, FLOPs, minimum bytes and KV bytes read, each phase
    counted as the batch of its sequences alone (the phases add up to the whole)."""
    from collections import Counter

    from bench.model.workload import PHASES, phase

    out: dict = {}
    for (q, kv), count in Counter(case.segments()).items():
        sub = case.replace(mix="none", batch=count, q_len=q, kv_len=kv)  # bottom-right, as within the mix
        d = out.setdefault(phase(q, kv), dict.fromkeys(("sequences", "q_tokens", "kv_tokens", "flops", "bytes",
                                                        "kv_bytes"), 0))
        for key, value in (("sequences", count), ("q_tokens", count * q), ("kv_tokens", count * kv),
                           ("flops", flops(sub)), ("bytes", min_bytes(sub)), ("kv_bytes", kv_bytes(sub))):
            d[key] += value
    return {p: out[p] for p in PHASES if p in out}
