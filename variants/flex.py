"""FlexAttention (torch.nn.attention.flex_attention): every mask of bench.masks as a block mask
built from its mask_mod, every score mod as its score_mod.  The block mask and the compilation
happen in setup, once per shape; the compile time (info['compile_ms']) and the share of blocks
the block mask skips (info['block_sparsity'], percent) are reported as their own figures."""

import functools
import time
import warnings

import torch

from bench import masks
from bench.case import DTYPES, FP8
from bench.measure.inputs import make_grad_out, make_inputs, probe_case
from bench.registry import Prepared, variant

CACHE_SIZE_LIMIT = 256  # compiled shapes kept per function: a sweep compiles one per case


def _dynamo_limits():
    """Dynamo's settings for flex's calls, set around them and restored after (a scope), not
    changed for the whole process: room for a compile per case, and an error, never a silent
    fall-back to unfused eager code, should a limit be hit anyway."""
    cfg = torch._dynamo.config
    names = [n for n in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                         "accumulated_cache_size_limit") if hasattr(cfg, n)]
    changes = {n: max(getattr(cfg, n), CACHE_SIZE_LIMIT) for n in names}
    if hasattr(cfg, "fail_on_recompile_limit_hit"):
        changes["fail_on_recompile_limit_hit"] = True
    return cfg.patch(**changes)


FP8_CPU = ("PyTorch: FlexAttention's CPU kernels (inductor's C++ template) take float32, float16 and bfloat16, "
           f"not {FP8} (its lowering raises NotImplementedError)")


def _check(case):
    """PyTorch's refusal of a backward (on the CPU), from its input validation, and of fp8 on
    the CPU (seen in its compile: an eager probe would not show it).  A forward is not probed
    otherwise: an eager flex_attention call costs ~3 s the first time, and a refusal there
    still becomes the row's status and reason in the worker."""
    if case.dtype == FP8 and case.device == "cpu":
        return FP8_CPU
    if not case.needs_grad:
        return None
    # the refusal depends on the device, dtype and GQA, not on the lengths or the mask
    return _eager_refusal(probe_case(case).replace(mask="none", window=None))


@functools.cache
def _eager_refusal(small):
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = make_inputs(small)
    try:  # eager validation only: PyTorch's own refusals (device, backward, shapes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            flex_attention(q, k, v, enable_gqa=small.is_gqa)
    except (RuntimeError, NotImplementedError, ValueError) as exc:
        return f"PyTorch: {str(exc).strip().splitlines()[0]}"
    return None


class FlexFactory:
    """The factory of the ``flex`` variant.  It owns its compiled flex_attention, built on
    first use with ``fullgraph=True`` (a graph break is an error, not eager code); one
    compilation per case is then cached by dynamo with it.  Dynamo's recompile limits hold
    for the life of a worker, and a full sweep can give one worker more flex cases than
    that: before the limit is reached, the factory resets dynamo and compiles afresh, so no
    case ever runs the unfused fall-back."""

    def __init__(self):
        self._compiled = None
        self.compiles = 0  # cases compiled since the last reset
        self.resets = 0

    def compiled(self):
        if self.compiles >= CACHE_SIZE_LIMIT - 1:  # one more would reach dynamo's limit
            torch._dynamo.reset()
            self._compiled, self.compiles = None, 0
            self.resets += 1
        if self._compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            self._compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
        self.compiles += 1
        return self._compiled

    def __call__(self, case):
        with _dynamo_limits():
            prepared = _prepare(case, self.compiled())
        prepared.info["compiled"] = f"torch.compile fullgraph; case {self.compiles} since reset {self.resets}"
        return prepared


def _paged(case, flex):
    """A paged cache read in place: the queries of every sequence packed into one row, the
    pool viewed as one key sequence (KvH, pages x PAGE), and a block mask that keeps a
    (query, pool slot) pair only when the slot's page belongs to the query's sequence (through
    the block table) and the mask keeps the logical positions; the blocks of other sequences'
    pages are skipped, so each query reads only its own pages (attention-gym's paged attention)."""
    from torch.nn.attention.flex_attention import create_block_mask

    plain = case.replace(kv_layout="contiguous")
    bound = masks.bind(plain)
    inner, mod = bound.mask_mod(case.device), bound.score_mod(case.device)
    page, table = case.page_size, torch.tensor(case.page_table(), device=case.device)
    B, Lq, pages = case.batch, case.q_len, table.shape[1]
    owner = torch.empty(B * pages, dtype=torch.long, device=case.device)
    logical = torch.empty_like(owner)
    owner[table.flatten()] = torch.arange(B, device=case.device).repeat_interleave(pages)
    logical[table.flatten()] = torch.arange(pages, device=case.device).repeat(B)

    def where(q_idx, kv_idx):  # (sequence, query position) and (its owner, key position)
        slot = kv_idx // page
        return q_idx // Lq, q_idx % Lq, owner[slot], logical[slot] * page + kv_idx % page

    def mask_mod(b, h, q_idx, kv_idx):
        seq, qpos, own, kpos = where(q_idx, kv_idx)
        keep = (own == seq) & (kpos < case.kv_len)
        return keep & inner(seq, h, qpos, kpos) if inner is not None else keep

    def score_mod(score, b, h, q_idx, kv_idx):
        seq, qpos, _, kpos = where(q_idx, kv_idx)
        return mod(score, seq, h, qpos, kpos)

    block_mask = create_block_mask(mask_mod, None, None, B * Lq, B * pages * page, device=case.device)
    gqa, scale, H, D = case.is_gqa, case.scale, case.heads, case.head_dim
    score = score_mod if mod is not None else None

    def attention(q, k, v):  # q (B, H, Lq, D); k, v page pools (KvH, B x pages, PAGE, D)
        rows = q.transpose(0, 1).reshape(1, H, B * Lq, D)
        keys, values = (t.view(1, t.shape[0], -1, D) for t in (k, v))  # views: the pool is not copied
        out = flex(rows, keys, values, score_mod=score, block_mask=block_mask, scale=scale, enable_gqa=gqa)
        return out.view(H, B, Lq, D).transpose(0, 1)

    return attention, {"kv_read": "pages in place"}


def _prepare(case, flex):
    from torch.nn.attention.flex_attention import create_block_mask

    if case.paged:
        attention, info = _paged(case, flex)
        t0 = time.perf_counter()
        attention(*make_inputs(case))
        info["compile_ms"] = (time.perf_counter() - t0) * 1e3
        return Prepared(attention, info, scope=_dynamo_limits)

    bound = masks.bind(case)  # the one definition of the mask and score mods, from bench.masks
    mask_mod, score_mod = bound.mask_mod(case.device), bound.score_mod(case.device)
    block_mask, info = None, {}
    if mask_mod is not None:
        per_batch, per_head = bound.depends
        shape = case.packed()  # a ragged batch: one packed sequence under a document block mask
        block_mask = create_block_mask(mask_mod, shape.batch if per_batch else None, case.heads if per_head else None,
                                       shape.q_len, shape.kv_len, device=case.device)
        info["block_sparsity"] = round(float(block_mask.sparsity()), 2)  # % of blocks skipped
    gqa, scale = case.is_gqa, case.scale
    if case.ragged:
        info["layout"] = "packed"

    def attention(q, k, v):
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)

    # compile (forward, and backward when the case has one) outside the timed call
    t0 = time.perf_counter()
    q, k, v = make_inputs(case)
    out = attention(q, k, v)
    if case.needs_grad:
        out.backward(make_grad_out(case))
    if case.device == "cuda":
        torch.cuda.synchronize()
    info["compile_ms"] = (time.perf_counter() - t0) * 1e3
    return Prepared(attention, info, scope=_dynamo_limits)


variant("flex", masks=(masks.ANY,), score_mods=(masks.ANY,), check=_check, compiles=True, ragged=True, paged=True,
        dtypes=(*DTYPES, FP8),
        description="FlexAttention: any mask as a block mask from its mask_mod, any score mod; torch.compile'd "
                    "once per shape")(FlexFactory())
