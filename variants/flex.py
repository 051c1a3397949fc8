"""FlexAttention (torch.nn.attention.flex_attention): every mask of bench.masks as a block mask
built from its mask_mod, every score mod as its score_mod.  The block mask and the compilation
happen in setup, once per shape; the compile time (info['compile_ms']) and the share of blocks
the block mask skips (info['block_sparsity'], percent) are reported as their own figures."""

import contextlib
import functools
import math
import time
import warnings

import torch

from bench import masks
from bench.case import DTYPES, FP8
from bench.inputs import make_grad_out, make_inputs, probe_case
from bench.registry import Prepared, compile_dynamic, prep, variant

CACHE_SIZE_LIMIT = 256  # compiled shapes kept per function: a sweep compiles one per case
LAYER_ENTRIES = 2  # a layer's setup stores two: its recording and its float64-checked call differ in grad mode


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


@contextlib.contextmanager
def no_donated_buffers():
    """AOTAutograd's donated buffers off (``torch._functorch.config.donated_buffer``, on by default
    since torch 2.6): a compiled backward that donates its saved buffers may run once, with
    retain_graph=False, and the timed backward (bench.measure.timing.timed_call) goes through the
    retained graph on every repetition, as CUDA-graph capture and the kernel-naming call do.  Set
    around the compile (it is decided there, eagerly under --dynamic) and around every call."""
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "donated_buffer"):
        yield
        return
    with functorch_config.patch(donated_buffer=False):
        yield


@contextlib.contextmanager
def flex_scope():
    """What flex's compile and calls run under: dynamo's limits and no donated buffers."""
    with _dynamo_limits(), no_donated_buffers():
        yield


FP8_CPU = ("PyTorch: FlexAttention's CPU kernels (inductor's C++ template) take float32, float16 and bfloat16, "
           f"not {FP8} (its lowering raises NotImplementedError)")


LSE_CPU = ("PyTorch: torch.compile on CPU only supports inference and `return_lse` is not supported yet "
           "(flex_cpu's lowering); flex takes a learned sink from the log-sum-exp it returns")


DECODE_ROWS = 128  # flex_decoding serves q_len below this; its BLOCK_M (q_len x the GQA group, a power of two) must
# divide 128 in torch 2.11, or no config is left (NoValidChoicesError; fixed upstream after 2.11)
MAX_CUDA_QK_DIM = 256  # the QK head dim rounds up to a power of two; beyond 256 the Q tile outgrows shared memory


def rounded_dim(d: int) -> int:
    """A head dim as flex's kernels tile it: the next power of two (576 -> 1024)."""
    return 1 << max(0, int(d) - 1).bit_length()


def kernel_options(case, kv_block: int | None = None) -> dict | None:
    """Flex's kernel_options for a CUDA case: the plain flex kernel where torch 2.11's decode
    kernel has no valid config (fewer than 128 queries whose GQA group makes more than 128 rows),
    and, for a paged cache, a KV tile the size of its block when that is under 128 (the H100/H200
    default for bf16 at d = 64 is BLOCK_N = 128, which must divide the page).  None on the CPU."""
    if case.device != "cuda":
        return None
    shape = case.packed()  # a ragged or mixed batch goes in packed
    options = {}
    group = case.heads // case.kv_heads if case.is_gqa else 1
    if shape.q_len < DECODE_ROWS and shape.q_len * group > DECODE_ROWS:
        options["FORCE_USE_FLEX_ATTENTION"] = True
    if kv_block is not None and kv_block < 128:
        options["BLOCK_N"] = kv_block
    return options or None


def _check(case):
    """PyTorch's refusal of a backward (on the CPU), from its input validation, and of fp8 on
    the CPU (seen in its compile: an eager probe would not show it).  A forward is not probed
    otherwise: an eager flex_attention call costs ~3 s the first time, and a refusal there
    still becomes the row's status and reason in the worker."""
    if case.dtype == FP8 and case.device == "cpu":
        return FP8_CPU
    if case.device == "cuda" and rounded_dim(case.head_dim) > MAX_CUDA_QK_DIM:
        return (f"flex tiles the QK head dim {case.head_dim} as {rounded_dim(case.head_dim)} (the next power of "
                f"two): beyond {MAX_CUDA_QK_DIM} its Q tile alone exceeds the GPU's shared memory (Triton: out of "
                f"resource)")
    if case.device == "cpu" and masks.bind(case).sinks:
        return LSE_CPU
    if case.paged and case.device == "cuda" and case.page_size % 16:
        return (f"flex reads a paged cache in KV blocks that divide the page, and on a GPU its kernel's smallest "
                f"tile is 16 keys: a page of {case.page_size} tokens cannot be tiled (use a multiple of 16)")
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
        self._compiled, self._dynamic = None, False
        self.compiles = 0  # dynamo cache entries stored since the last reset
        self.resets = 0

    def compiled(self, entries: int = 1):
        """The compiled flex_attention for a setup that stores ``entries`` dynamo cache entries (a
        layer's: two, its recording and its check run under different grad modes)."""
        dynamic = compile_dynamic()  # --dynamic: one graph for every length
        if self.compiles + entries >= CACHE_SIZE_LIMIT:  # this setup's entries would reach dynamo's limit
            torch._dynamo.reset()
            self._compiled, self.compiles = None, 0
            self.resets += 1
        if self._compiled is None or dynamic != self._dynamic:
            from torch.nn.attention.flex_attention import flex_attention

            self._compiled = torch.compile(flex_attention, dynamic=dynamic, fullgraph=True)
            self._dynamic = dynamic
        self.compiles += entries
        return self._compiled

    def __call__(self, case):
        with flex_scope():
            prepared = _prepare(case, self.compiled(LAYER_ENTRIES if case.scope != "core" else 1))
        prepared.info["compiled"] = (f"torch.compile fullgraph{', dynamic shapes' if self._dynamic else ''}; "
                                     f"{self.compiles} dynamo cache entries since reset {self.resets}")
        return prepared


def _dynamic_blocks(block_mask) -> None:
    """Mark the block mask's block-count dims dynamic, so that a compile with dynamic shapes does
    not guard on them at its first call (it would recompile at the first new length)."""
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
                 "full_q_num_blocks", "full_q_indices"):
        t = getattr(block_mask, name, None)
        for dim in range(2, t.dim()) if t is not None else ():
            torch._dynamo.maybe_mark_dynamic(t, dim)


def block_sparsity(block_mask) -> float:
    """The % of a block mask's blocks that are skipped, counted in blocks.  (BlockMask.sparsity
    counts whole blocks against the elements of the shape, so a length shorter than a block,
    as a decode step's 16 queries against 128-row blocks, gave -700 %.)"""
    _, _, q, kv = block_mask.shape
    bq, bkv = block_mask.BLOCK_SIZE
    rows = block_mask.kv_num_blocks.shape[0] * block_mask.kv_num_blocks.shape[1]  # (B|1) x (H|1) block rows
    total = rows * -(-q // bq) * -(-kv // bkv)
    computed = int(block_mask.kv_num_blocks.sum())
    if block_mask.full_kv_num_blocks is not None:
        computed += int(block_mask.full_kv_num_blocks.sum())
    return round(100 * (1 - computed / total), 2)


def _sunk(out_lse, sink):
    """A learned sink from the log-sum-exp flex returns: out x 1 / (1 + exp(s_h - lse)), that is
    out x sigmoid(lse - s_h) (an empty row's lse is -inf: zeros, as without the sink)."""
    out, lse = out_lse
    return out * torch.sigmoid(lse - sink.view(1, -1, 1)).unsqueeze(-1).to(out.dtype)


PAGED_Q_BLOCK = 128  # the query block of the paged block mask (flex's default)


def _paged(case, flex):
    """A paged cache read in place (attention-gym's paged attention): the block mask is built
    per sequence over its logical positions, then mapped through the block table onto the pool,
    so that each query block visits only its own sequence's pages.  The pool is one key sequence
    (1, KvH, pages x PAGE, D) shared by the batch, and a KV block never straddles two pages: its
    size divides the page (the page size, or 128 when the page is a multiple of 128).  Partial
    blocks evaluate the mask at the logical position of each pool slot."""
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask

    plain = case.replace(kv_layout="contiguous")
    bound = masks.bind(plain)
    inner, mod = bound.mask_mod(case.device), bound.score_mod(case.device)
    dev, page, kv_len = case.device, case.page_size, case.kv_len
    table = torch.tensor(case.page_table(), device=dev)  # (B, pages): the pool page of each logical page
    B, Lq, pages = case.batch, case.q_len, table.shape[1]
    kv_block = math.gcd(page, 128)
    per_page = page // kv_block
    # the pool block holding logical block j of sequence b, (B, pages x per_page)
    pool_block = (table.repeat_interleave(per_page, dim=1) * per_page
                  + torch.arange(per_page, device=dev).repeat(pages))
    owner = torch.empty(B * pages, dtype=torch.long, device=dev)  # pool page -> its sequence, its logical page
    logical = torch.empty_like(owner)
    owner[table.flatten()] = torch.arange(B, device=dev).repeat_interleave(pages)
    logical[table.flatten()] = torch.arange(pages, device=dev).repeat(B)

    def logical_mask(b, h, q_idx, kv_idx):
        keep = kv_idx < kv_len  # the last page is filled only to kv_len
        return keep & inner(b, h, q_idx, kv_idx) if inner is not None else keep

    per_head = bound.depends[1]
    heads = case.heads if per_head else None  # a mask that depends on the head gets every head
    logical_bm = create_block_mask(logical_mask, B, heads, Lq, pages * page, device=dev,
                                   BLOCK_SIZE=(PAGED_Q_BLOCK, kv_block))

    def to_pool(idx):  # logical block indices (B, H|1, rows, cols) -> pool block indices, padded to the pool
        out = pool_block.gather(1, idx.long().flatten(1)).view(idx.shape).to(idx.dtype)
        pad = B * pages * per_page - out.shape[-1]
        return torch.nn.functional.pad(out, (0, pad)) if pad > 0 else out

    def mask_mod(b, h, q_idx, kv_idx):  # a pool slot's logical position, in its owner's sequence
        slot = kv_idx // page
        kpos = logical[slot] * page + kv_idx % page
        keep = (owner[slot] == b) & (kpos < kv_len)
        return keep & inner(b, h, q_idx, kpos) if inner is not None else keep

    def score_mod(score, b, h, q_idx, kv_idx):
        slot = kv_idx // page
        return mod(score, b, h, q_idx, logical[slot] * page + kv_idx % page)

    full = logical_bm.full_kv_num_blocks is not None
    block_mask = BlockMask.from_kv_blocks(
        logical_bm.kv_num_blocks, to_pool(logical_bm.kv_indices),
        logical_bm.full_kv_num_blocks if full else None, to_pool(logical_bm.full_kv_indices) if full else None,
        BLOCK_SIZE=(PAGED_Q_BLOCK, kv_block), mask_mod=mask_mod, seq_lengths=(Lq, B * pages * page))
    gqa, scale = case.is_gqa, case.scale
    score = score_mod if mod is not None else None
    # on a GPU the kernel's own KV tile must divide the block (flex's default tile is 64 or 128)
    options = kernel_options(case, kv_block)

    sink = bound.sink_logits(dev)

    def attention(q, k, v):  # q (B, H, Lq, D); k, v page pools (KvH, B x pages, PAGE, D)
        keys, values = (t.view(1, t.shape[0], -1, t.shape[-1]) for t in (k, v))  # views: the pool is not copied
        out = flex(q, keys, values, score_mod=score, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                   kernel_options=options, return_lse=sink is not None)
        return out if sink is None else _sunk(out, sink)

    visited = (block_mask.kv_num_blocks + (block_mask.full_kv_num_blocks if full else 0)).float().mean()
    return attention, {"kv_read": "pages in place", "kv_block": kv_block,
                       "kv_blocks_visited": round(float(visited) / (B * pages * per_page), 4)}


def _prepare(case, flex):
    from torch.nn.attention.flex_attention import create_block_mask

    if case.paged:
        prepared = {}
        with prep(prepared, case.device):  # the per-sequence block mask mapped through the block table
            attention, info = _paged(case, flex)
        info |= prepared
        t0 = time.perf_counter()
        attention(*make_inputs(case))
        if case.device == "cuda":
            torch.cuda.synchronize()
        info["compile_ms"] = (time.perf_counter() - t0) * 1e3
        return Prepared(attention, info, scope=flex_scope)

    block_mask, info = None, {}
    with prep(info, case.device):  # the block mask: rebuilt whenever the lengths or the documents change
        bound = masks.bind(case)  # the one definition of the mask and score mods, from bench.masks
        mask_mod, score_mod = bound.mask_mod(case.device), bound.score_mod(case.device)
        if mask_mod is not None:
            per_batch, per_head = bound.depends
            shape = case.packed()  # a ragged or mixed batch: one packed sequence under a document-like block mask
            block_mask = create_block_mask(mask_mod, shape.batch if per_batch else None,
                                           case.heads if per_head else None, shape.q_len, shape.kv_len,
                                           device=case.device)
    if block_mask is not None:
        info["block_sparsity"] = block_sparsity(block_mask)  # % of blocks skipped
        if compile_dynamic():  # the block counts vary with the length too: dynamic from the first compile
            _dynamic_blocks(block_mask)
    gqa, scale = case.is_gqa, case.scale
    if case.ragged or case.mixed:
        info["layout"] = "packed"
    sink = bound.sink_logits(case.device)  # (H,) float32, or None

    options = kernel_options(case)
    if options:
        info["kernel_options"] = ", ".join(f"{k}={v}" for k, v in options.items())

    def attention(q, k, v):
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                    kernel_options=options)

    if sink is not None:
        def attention(q, k, v):
            return _sunk(flex(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                              return_lse=True, kernel_options=options), sink)
        info["sink"] = "from the returned log-sum-exp"

    # compile (forward, and backward when the case has one) outside the timed call
    t0 = time.perf_counter()
    q, k, v = make_inputs(case)
    out = attention(q, k, v)
    if case.needs_grad:
        out.backward(make_grad_out(case))
    if case.device == "cuda":
        torch.cuda.synchronize()
    info["compile_ms"] = (time.perf_counter() - t0) * 1e3
    return Prepared(attention, info, scope=flex_scope)


variant("flex", masks=(masks.ANY,), score_mods=(masks.ANY,), check=_check, compiles=True, ragged=True, mix=True,
        paged=True, bottom_right=True, sinks=True, value_dim=True,
        dtypes=(*DTYPES, FP8),
        work="kept", rates={"cpu": 0.7}, colour=0,  # its block mask skips what the mask drops
        checks=("scaling-window", "paged", "sinks", "mla", "mix", "decode-gqa", "paged-64"),
        description="FlexAttention: any mask as a block mask from its mask_mod, any score mod; torch.compile'd "
                    "once per shape")(FlexFactory())
