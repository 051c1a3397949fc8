"""Deterministic random inputs for a case: i.i.d. normal, or with the structure ``--inputs``
asks for (bench.model.workload says what each kind is and why), packed for a ragged batch."""

from __future__ import annotations

import hashlib
import math

import torch

from bench.model.case import Case


def case_seed(case: Case, seed: int = 0) -> int:
    """A seed derived from the case's shape (not its variant), stable across processes."""
    key = repr((case.batch, case.heads, case.kv_heads, case.q_len, case.kv_len, case.head_dim, seed)
               + tuple(v for v in (case.lengths, case.inputs) if v not in ("fixed", "normal"))
               + ((case.head_dim_v,) if case.head_dim_v else ()))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:6], "little")


def tensor_shape(case: Case) -> tuple[int, int, int]:
    """(batch, q_len, kv_len) of the tensors: a ragged batch is packed into one sequence of
    all its tokens, (1, batch x n)."""
    if case.ragged:
        return 1, case.batch * case.q_len, case.batch * case.kv_len
    return case.batch, case.q_len, case.kv_len


def make_inputs(case: Case, seed: int = 0, requires_grad: bool | None = None):
    """q (B, H, Lq, D), k and v (B, KvH, Lk, D) in the case's dtype/device; B, Lq, Lk from
    ``tensor_shape``.  Standard normal, or structured by ``case.inputs``.

    Values are drawn in float32 on the CPU, so every device and dtype sees the same numbers
    up to rounding.
    """
    from bench.model.workload import parse_inputs

    g = torch.Generator().manual_seed(case_seed(case, seed))
    b, lq, lk = tensor_shape(case)
    shapes = [(b, case.heads, lq, case.head_dim), (b, case.kv_heads, lk, case.head_dim),
              (b, case.kv_heads, lk, case.dv)]
    grad = case.needs_grad if requires_grad is None else requires_grad
    kind = parse_inputs(case.inputs)
    if kind.kind == "normal":
        raw = [torch.randn(shape, generator=g) for shape in shapes]
    else:
        raw = STRUCTURED[kind.kind](case, shapes, g, kind.param)
    if case.paged:  # the same numbers, written into the pages of a shuffled block table
        raw = [raw[0], to_pages(case, raw[1]), to_pages(case, raw[2])]
    return tuple(t.to(device=case.device, dtype=case.torch_dtype).requires_grad_(grad) for t in raw)


def to_pages(case: Case, t: torch.Tensor) -> torch.Tensor:
    """A contiguous (B, KvH, kv_len, D) cache as a page pool (KvH, B x pages, PAGE, D), heads
    first so that the pool is one (1, KvH, pages x PAGE, D) sequence as a view: page i of
    sequence b sits in pool page ``case.page_table()[b][i]``; the last page is zero past kv_len."""
    page, table = case.page_size, torch.tensor(case.page_table())
    b, kvh, n, d = t.shape
    pages = table.shape[1]
    padded = torch.zeros(b, kvh, pages * page, d, dtype=t.dtype, device=t.device)
    padded[:, :, :n] = t
    blocks = padded.view(b, kvh, pages, page, d).permute(1, 0, 2, 3, 4).reshape(kvh, b * pages, page, d)
    pool = torch.empty_like(blocks)
    pool[:, table.flatten().to(t.device)] = blocks
    return pool


def gather_pages(case: Case, make):
    """A paged cache read the simple way: ``make`` (a factory for a contiguous cache) on the
    pages gathered into one contiguous copy, the gather inside the timed call."""
    from bench.model.registry import Prepared, prep

    inner = make(case.replace(kv_layout="contiguous"))
    inner = inner if isinstance(inner, Prepared) else Prepared(inner)
    info = dict(inner.info)
    with prep(info, case.device):  # the block table: once, not in the timed call
        table = torch.tensor(case.page_table(), device=case.device)

    def attention(q, k, v):
        return inner.fn(q, from_pages(case, k, table), from_pages(case, v, table))
    return Prepared(attention, info | {"kv_read": "gathered"}, scope=inner.scope)


def from_pages(case: Case, pool: torch.Tensor, table: torch.Tensor | None = None) -> torch.Tensor:
    """The page pool read back in each sequence's order: (B, KvH, kv_len, D), a gather
    (``table``: the block table as a tensor on the pool's device, when the caller holds one)."""
    if table is None:
        table = torch.tensor(case.page_table(), device=pool.device)  # (B, pages)
    b, pages = table.shape
    kvh, _, page, d = pool.shape
    blocks = pool[:, table.flatten()].view(kvh, b, pages, page, d).permute(1, 0, 2, 3, 4)
    return blocks.reshape(b, kvh, pages * page, d)[:, :, :case.kv_len]


def _per_query_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """A per-kv-head tensor (B, KvH, ...) repeated for the query heads that share each one."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _clustered(case, shapes, g, topics):
    """Tokens in ``topics`` contiguous runs; a query and the keys of its topic share the topic's
    centroid (weight 0.9, the rest noise), so each query attends sharply to its topic's keys."""
    (b, h, lq, d), (_, kvh, lk, _), vshape = shapes
    k_topics = min(int(topics), lk)
    centroids = torch.randn((b, kvh, k_topics, d), generator=g)
    q_topic = (torch.arange(lq) * k_topics) // lq
    k_topic = (torch.arange(lk) * k_topics) // lk
    a = 0.9
    q = a * _per_query_head(centroids, h)[:, :, q_topic] + math.sqrt(1 - a * a) * torch.randn(shapes[0], generator=g)
    k = a * centroids[:, :, k_topic] + math.sqrt(1 - a * a) * torch.randn(shapes[1], generator=g)
    return q, k, torch.randn(vshape, generator=g)


def _lowrank(case, shapes, g, rank):
    """q and k in one ``rank``-dimensional subspace per kv head, scaled so that the scores
    q.k / sqrt(d) spread as much as normal inputs give (standard deviation 1)."""
    (b, h, lq, d), (_, kvh, lk, _), vshape = shapes
    r = min(int(rank), d)
    basis = torch.linalg.qr(torch.randn((b, kvh, d, r), generator=g)).Q.transpose(-1, -2)  # (B, KvH, r, d) orthonormal
    scale = (d / r) ** 0.25
    q = torch.randn((b, h, lq, r), generator=g) @ _per_query_head(basis, h) * scale
    k = torch.randn((b, kvh, lk, r), generator=g) @ basis * scale
    return q, k, torch.randn(vshape, generator=g)


def _outliers(case, shapes, g, scale):
    """Standard normal, with one channel in 16 of q and k scaled by ``scale``."""
    q, k, v = (torch.randn(shape, generator=g) for shape in shapes)
    loud = torch.arange(q.shape[-1]) % 16 == 0
    return q * torch.where(loud, float(scale), 1.0), k * torch.where(loud, float(scale), 1.0), v


STRUCTURED = {"clustered": _clustered, "lowrank": _lowrank, "outliers": _outliers}


def make_grad_out(case: Case, seed: int = 0) -> torch.Tensor:
    """The upstream gradient dO (B, H, Lq, Dv) used for backward passes."""
    g = torch.Generator().manual_seed(case_seed(case, seed) ^ 0x5EED)
    b, lq, _ = tensor_shape(case)
    t = torch.randn((b, case.heads, lq, case.dv), generator=g)
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
    if case.mixed:  # one small sequence of each phase the mix holds, in its order
        from bench.model.workload import phase

        small = {"prefill": "1x(8/8)", "chunked_prefill": "1x(4/12)", "decode": "1x(1/9)"}
        phases = dict.fromkeys(phase(q, kv) for q, kv in case.segments())
        return case.replace(mix="+".join(small[p] for p in phases), window=window and min(window, 8))
    if case.ragged:  # two sequences of different lengths averaging q
        short = max(1, q // 2)
        return case.replace(batch=2, q_len=q, kv_len=q, lengths=f"{short}/{2 * q - short}")
    small = case.replace(batch=1, q_len=q, kv_len=kv, window=window)
    from bench.model import masks

    try:
        masks.bind(small)
    except masks.MaskError:  # parameters too large for the probe's lengths: a mask of the same form
        mods = masks.parse(case.mask, case.window)[1]
        small = small.replace(mask="+".join(["sink:1"] + [t.text() for t in mods]), window=None)
    return small
