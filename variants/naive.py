"""The textbook form: Q @ K^T, scale by 1/sqrt(d), score mods, mask with -inf, softmax, @ V."""

from bench import masks
from bench.registry import variant


@variant("naive", baseline=True, masks=(masks.ANY,), score_mods=(masks.ANY,),
         description="textbook QK^T/sqrt(d) -> -inf mask -> softmax -> @V; materialises the scores")
def naive(case):
    bound = masks.bind(case)
    keep = bound.keep(case.device)  # (B|1, H|1, Lq, Lk) or None
    empty = masks.has_empty_rows(case)
    mod = bound.score_mod(case.device)  # None without score mods
    idx = masks.indices(case, case.device) if mod is not None else None
    group = case.heads // case.kv_heads
    scale = case.scale

    def attention(q, k, v):  # q (B, H, Lq, D); k, v (B, KvH, Lk, D)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Lq, Lk)
        if mod is not None:
            scores = mod(scores, *idx).to(scores.dtype)
        p = masks.masked_softmax(scores, keep, empty)
        return p @ v  # (B, H, Lq, D)

    return attention
