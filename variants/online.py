"""Online-softmax attention in plain PyTorch: the FlashAttention algorithm without a fused kernel.

Keys are taken in blocks of BLOCK; each query row keeps a running maximum m, a running
sum l of exp(score - m) and a running output, rescaled by exp(m_old - m_new) whenever the
maximum grows (Milakov & Gimelshein 2018; Dao et al. 2022).  The scores of one block,
(B, H, Lq, BLOCK), are the largest tensor: memory grows as O(n * BLOCK), not O(n^2).
Softmax statistics are kept in float32 whatever the input dtype.  Any mask and score mod
of bench.masks, evaluated per key block; blocks no query keeps are skipped.  A paged KV
cache is read natively: the key blocks are its pages, each fetched from the pool through the
block table (one page per sequence per step), never gathered into a contiguous copy.
"""

import torch

from bench import masks
from bench.registry import Prepared, prep, variant

BLOCK = 128  # keys per block


@variant("chunked.online", masks=(masks.ANY,), score_mods=(masks.ANY,), ragged=True, mix=True, paged=True,
         bottom_right=True, sinks=True, value_dim=True, rates={"cpu": 0.55}, colour=1,
         description="online softmax over key blocks (FlashAttention's algorithm) in plain PyTorch; "
                     "O(n * block) memory, exact (a ragged or mixed batch: one sequence at a time)")
def chunked_online(case):
    if case.ragged or case.mixed:
        fn = masks.per_sequence(case, chunked_online)
        return Prepared(fn, {"layout": "packed", "prep_ms": fn.prep_ms})
    info = {}
    with prep(info, case.device):  # each key block's mask, built once per structure
        bound = masks.bind(case)
        mod = bound.score_mod(case.device)
        sink = bound.sink_logits(case.device)  # (H,) float32, or None
        group, scale, dev = case.heads // case.kv_heads, case.scale, case.device
        step = case.page_size or BLOCK  # a paged cache: one page a block
        table = torch.tensor(case.page_table(), device=dev) if case.paged else None
        blocks = []
        for s in range(0, case.kv_len, step):
            e = min(case.kv_len, s + step)
            keep = bound.keep(dev, kv=(s, e))  # (B|1, H|1, Lq, e - s) or None
            if keep is not None and not bool(keep.any()):
                continue  # no query keeps a key of this block
            if keep is not None and bool(keep.all()):
                keep = None
            idx = masks.indices(case, dev, kv=(s, e)) if mod is not None else None
            blocks.append((s, e, keep, idx))

    def block(t, s, e):  # keys s..e of every sequence: a slice, or a page fetched from the pool
        if table is None:
            t = t[:, :, s:e]
        else:
            t = t[:, table[:, s // step], :e - s].transpose(0, 1)  # (KvH, pages, PAGE, D) -> (B, KvH, e-s, D)
        return t.repeat_interleave(group, dim=1) if group > 1 else t

    def attention(q, k, v):  # q (B, H, Lq, D); k, v (B, KvH, Lk, D), or page pools (KvH, B x pages, PAGE, D)
        B, H, Lq, D = q.shape
        if sink is None:
            m = torch.full((B, H, Lq, 1), float("-inf"), device=q.device)
            l = torch.zeros((B, H, Lq, 1), device=q.device)  # noqa: E741
        else:  # a learned sink is a key seen first: its logit the running maximum, exp(0) = 1 the sum
            m = sink.view(1, H, 1, 1).expand(B, H, Lq, 1)
            l = torch.ones((B, H, Lq, 1), device=q.device)  # noqa: E741
        acc = torch.zeros((B, H, Lq, v.shape[-1]), device=q.device)  # v's head dim (MLA: apart from q's)
        for s, e, keep, idx in blocks:
            scores = ((q @ block(k, s, e).transpose(-1, -2)) * scale).float()
            if mod is not None:
                scores = mod(scores, *idx)
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
            m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
            base = torch.where(torch.isinf(m_new), 0.0, m_new)  # rows that have kept no key yet
            p = torch.exp(scores - base)
            alpha = torch.exp(m - base)
            l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
            acc = acc * alpha + (p.to(v.dtype) @ block(v, s, e)).float()
            m = m_new
        out = acc / torch.where(l > 0, l, 1.0)  # a row that kept no key: zeros, as SDPA
        return out.to(q.dtype)

    return Prepared(attention, info)
