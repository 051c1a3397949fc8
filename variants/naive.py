"""The textbook form: Q @ K^T, scale by 1/sqrt(d), mask with -inf, softmax, @ V."""

from bench import masks
from bench.registry import variant


@variant("naive", baseline=True,
         description="textbook QK^T/sqrt(d) -> -inf mask -> softmax -> @V; materialises the scores")
def naive(case):
    keep = masks.dense_keep(case, case.device)  # (B|1, 1, Lq, Lk) or None
    empty = masks.has_empty_rows(case)
    group = case.heads // case.kv_heads
    scale = case.scale

    def attention(q, k, v):  # q (B, H, Lq, D); k, v (B, KvH, Lk, D)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Lq, Lk)
        p = masks.masked_softmax(scores, keep, empty)
        return p @ v  # (B, H, Lq, D)

    return attention
