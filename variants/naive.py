"""The textbook form: Q @ K^T, scale by 1/sqrt(d), score mods, mask with -inf, softmax, @ V."""

from bench import masks
from bench.inputs import gather_pages
from bench.registry import Prepared, prep, variant


@variant("naive", baseline=True, masks=(masks.ANY,), score_mods=(masks.ANY,), ragged=True, mix=True, paged=True,
         bottom_right=True, sinks=True, value_dim=True,
         rates={"cpu": 0.4}, colour=11,  # near-black: the default baseline
         memory_exponents={"cuda": (1.8, 2.2), "cpu": (1.8, 2.2)},  # it materialises the n x n scores
         selfcheck={"cpu": dict(q_len=1024, kv_len=1024), "cuda": dict(q_len=2048, kv_len=2048)},
         checks=("scaling-causal", "profile", "timer", "trace", "layers", "layer-graph", "ab"),
         description="textbook QK^T/sqrt(d) -> -inf mask -> softmax -> @V; materialises the scores "
                     "(a ragged or mixed batch: one sequence at a time; a paged cache: gathered first)")
def naive(case):
    if case.ragged or case.mixed:
        fn = masks.per_sequence(case, naive)
        return Prepared(fn, {"layout": "packed", "prep_ms": fn.prep_ms})
    if case.paged:
        return gather_pages(case, naive)
    info = {}
    with prep(info, case.device):  # the dense mask and the index grids: redone when the structure changes
        bound = masks.bind(case)
        keep = bound.keep(case.device)  # (B|1, H|1, Lq, Lk) or None
        empty = masks.has_empty_rows(case)
        mod = bound.score_mod(case.device)  # None without score mods
        sink = bound.sink_logits(case.device, case.torch_dtype)  # (H,) learned sinks, or None
        idx = masks.indices(case, case.device) if mod is not None else None
    group = case.heads // case.kv_heads
    scale = case.scale

    # the scores it materialises, in bytes moved beyond q, k, v and the output (the roofline's
    # intensity adds them to the minimum traffic, scaled for a backward): written by QK^T, read and
    # written by the scaling, the score mods, the mask and the softmax, read by @V (and, with GQA,
    # the copies of k and v that repeat_interleave writes and the matmuls read)
    e = case.torch_dtype.itemsize
    passes = 6 + 2 * (keep is not None) + 2 * (mod is not None) + 4 * (sink is not None)
    scores = case.batch * case.heads * case.q_len * case.kv_len * e
    copies = 2 * case.batch * case.heads * case.kv_len * (case.head_dim + case.dv) * e if group > 1 else 0

    def attention(q, k, v):  # q (B, H, Lq, D); k, v (B, KvH, Lk, D)
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Lq, Lk)
        if mod is not None:
            scores = mod(scores, *idx).to(scores.dtype)
        p = masks.masked_softmax(scores, keep, empty, sink)  # a sink: one more column, dropped after
        return p @ v  # (B, H, Lq, D)

    return Prepared(attention, {"materialised_bytes": passes * scores + copies, **info})
