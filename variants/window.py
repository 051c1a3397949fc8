"""Sliding-window attention in plain PyTorch, blocked so that memory grows as O(n * window).

Queries are cut into blocks of C = window rows; block b attends to the C + window - 1
keys that any of its rows can see, taken as an overlapping view (Tensor.unfold) of the
left-padded keys.  Scores are (B, H, n/C, C, C + window - 1): linear in n.
"""

import math

import torch
import torch.nn.functional as F

from bench import masks
from bench.registry import variant


@variant("window.chunked", masks=("window",), work="kept", rates={"cpu": 0.2}, colour=8, checks=("scaling-window",),
         description="blocked sliding window in plain PyTorch; O(n*window) memory, no compile")
def window_chunked(case):
    W, Lq, Lk, D = case.window, case.q_len, case.kv_len, case.head_dim
    C = min(W, Lq)
    nb = math.ceil(Lq / C)
    S = C + W - 1  # keys one query block can see
    Lk_used = min(Lk, nb * C)  # no query reaches keys past nb * C
    right = nb * C - Lk_used
    group = case.heads // case.kv_heads
    scale = case.scale

    # keep[b, r, s]: query i = b*C + r sees key j = b*C + s - (W - 1)
    i = (torch.arange(nb) * C).view(nb, 1, 1) + torch.arange(C).view(1, C, 1)
    j = (torch.arange(nb) * C).view(nb, 1, 1) + torch.arange(S).view(1, 1, S) - (W - 1)
    keep = (j <= i) & (j > i - W) & (j >= 0) & (j < Lk_used)  # (nb, C, S)
    empty = bool((~keep.any(-1)).any())
    keep = keep.to(case.device)

    def blocks(t):  # (B, KvH, Lk, D) -> (B, KvH, 1, nb, S, D), an overlapping view
        t = F.pad(t[:, :, :Lk_used], (0, 0, W - 1, right))
        return t.unfold(2, S, C).transpose(-1, -2).unsqueeze(2)

    def attention(q, k, v):  # q (B, H, Lq, D); k, v (B, KvH, Lk, D)
        B, H = q.shape[:2]
        qb = F.pad(q, (0, 0, 0, nb * C - Lq)).view(B, H // group, group, nb, C, D)
        scores = (qb @ blocks(k).transpose(-1, -2)) * scale  # (B, KvH, G, nb, C, S)
        p = masks.masked_softmax(scores, keep, empty)
        out = p @ blocks(v)  # (B, KvH, G, nb, C, D)
        return out.reshape(B, H, nb * C, D)[:, :, :Lq]

    return attention
