"""xformers.ops.memory_efficient_attention with xformers' own bias types (no dense masks).

xformers takes (B, M, H, K) tensors; our (B, H, L, D) inputs are transposed as views,
GQA uses its 5-D (B, M, G, H/G, K) form with expanded keys, and padding packs the batch
into one row of blocks (BlockDiagonalPaddedKeysMask), which costs a copy of q; document
packs it too, one block per document (BlockDiagonalMask, or BlockDiagonalCausalMask for
document:causal=1), exact for q_len == kv_len.  A ragged batch (--lengths) is that packed
document case: one block per sequence.  A mixed batch (--batch-mix) packs q and k apart, one
block per sequence of its own query and key lengths, aligned bottom-right within it
(BlockDiagonalMask, BlockDiagonalCausalFromBottomRightMask and its local-attention form).
"""

import logging

import torch

from bench import masks
from bench.probe import run_probe
from bench.registry import Prepared, prep, variant


def _xops():
    logging.getLogger("xformers").setLevel(logging.ERROR)
    import xformers.ops as xops

    return xops


def mix_bias(ab, segments, mask, window, device="cpu"):
    """The attn_bias of a mixed batch: one block per sequence, (q_len, kv_len) each, the queries
    at the end of their keys."""
    q, kv = [s[0] for s in segments], [s[1] for s in segments]
    device = torch.device(device)  # (xformers pins host memory unless it is handed the CPU as a torch.device)
    if mask == "none":
        return ab.BlockDiagonalMask.from_seqlens(q, kv, device=device)
    causal = ab.BlockDiagonalCausalFromBottomRightMask.from_seqlens(q, kv, device=device)
    if mask == "causal":
        return causal
    # (make_local_attention would return the top-left local form: the bottom-right one is built from its parts)
    return ab.BlockDiagonalCausalLocalAttentionFromBottomRightMask(
        q_seqinfo=causal.q_seqinfo, k_seqinfo=causal.k_seqinfo, _batch_sizes=causal._batch_sizes,
        _window_size=window)


def _bias(case, fmha):
    ab = fmha.attn_bias
    if case.mask == "causal":  # top-left, or the queries at the end of the keys (--align bottom-right)
        return ab.LowerTriangularFromBottomRightMask() if case.offset else ab.LowerTriangularMask()
    if case.mask == "window":
        # xformers' local attention is aligned bottom-right, which is top-left for q_len == kv_len (checked below)
        return ab.LowerTriangularFromBottomRightLocalAttentionMask(case.window)
    if case.mask == "padding":
        return ab.BlockDiagonalPaddedKeysMask.from_seqlens(
            q_seqlen=[case.q_len] * case.batch, kv_padding=case.kv_len,
            kv_seqlen=masks.kv_lengths(case), device=case.device)
    if _is_document(case):  # packed sequences: one block per document of every batch element
        term, kw = masks.bind(case).masks[0]
        sizes = [int(x) for x in kw["doc"][:case.q_len].bincount() if x > 0] * case.batch
        if kw.get("window"):  # a window within each document: i - window < j <= i
            return ab.BlockDiagonalCausalMask.from_seqlens(sizes, sizes, device=case.device).make_local_attention(
                kw["window"])
        cls = ab.BlockDiagonalCausalMask if kw["causal"] else ab.BlockDiagonalMask
        return cls.from_seqlens(sizes, sizes, device=case.device)
    return None


def _is_document(case):
    return case.mask.split(":")[0] == "document"


def _check(case):
    if case.mixed:
        return run_probe(xformers_mea, case)
    case = case.packed()
    if "+" in case.mask:
        return "xformers takes one mask at a time (one attn_bias), not a union"
    if _is_document(case) and case.is_cross:
        return "xformers' block-diagonal masks pair each query block with a key block of its length: q_len == kv_len"
    if case.mask == "window" and case.is_cross and not case.offset:
        return ("xformers' local-attention masks are aligned bottom-right: a top-left window with q_len != kv_len "
                "is not one of them (--align bottom-right is)")
    return run_probe(xformers_mea, case)


@variant("xformers", requires=("xformers",), check=_check, devices=("cuda",), ragged=True, mix=True,
         work="causal", colour=9, checks=("scaling-causal",),
         bottom_right=True, masks=("none", "causal", "window", "padding", "document"),
         description="xformers.ops.memory_efficient_attention with xformers attn_bias types (CUDA kernels only)")
def xformers_mea(case):
    xops = _xops()
    info = {}
    with prep(info, case.device):  # the attn_bias object: new with every batch's lengths or documents
        mixed = case.mixed
        if mixed:
            bias = mix_bias(xops.fmha.attn_bias, case.segments(), case.mask, case.window, case.device)
        case = case.packed()  # a ragged batch: its sequences packed, one block each (BlockDiagonalMask)
        if not mixed:
            bias = _bias(case, xops.fmha)
    if mixed:
        info["layout"] = "packed"
    group = case.heads // case.kv_heads
    packed = case.mask == "padding" or _is_document(case)
    B, H, KvH, Lq, Lk, D = case.batch, case.heads, case.kv_heads, case.q_len, case.kv_len, case.head_dim

    def to_xf(t, length, kv):  # (B, heads, L, D) -> (B, L, KvH, G, D)
        t = t.transpose(1, 2)
        t = t.unsqueeze(3).expand(B, length, KvH, group, D) if kv else t.unflatten(2, (KvH, group))
        if group == 1:
            t = t.squeeze(3)  # (B, L, H, D)
        if packed:
            t = t.reshape(1, B * length, *t.shape[2:])
        return t

    def attention(q, k, v):
        out = xops.memory_efficient_attention(
            to_xf(q, Lq, False), to_xf(k, Lk, True), to_xf(v, Lk, True),
            attn_bias=bias, scale=case.scale)
        return out.reshape(B, Lq, H, D).transpose(1, 2)  # (B, H, Lq, D)

    return Prepared(attention, info)
