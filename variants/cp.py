"""Context-parallel attention: the sequence split over a cell's ranks (``--ranks``).

- cp.ring: ring attention.  Each rank keeps its queries and passes its K and V block around the
  ring; at each of the P steps it sends on the block it holds while it attends to it (the
  exchange overlapped with the block's compute), and merges the result into its running output by
  the blocks' maxima and sums (the online softmax).  Its backward sends the gradients back round
  the ring, each exchange waited for.  Causal with the zigzag
  split, so that each rank has as many unmasked pairs as the next; a block every pair of which
  the mask drops is skipped.
- cp.alltoall: Ulysses.  Two all-to-alls swap the sequence split for a head split around a local
  attention over the whole sequence (SDPA here; ``ulysses(local)`` wraps any other).
- cp.torch: PyTorch's own ``torch.distributed.tensor.experimental.context_parallel`` (ring SDPA over
  the ranks, on its head-tail load-balanced shards, which are the zigzag split).  On CUDA torch's
  own handlers take the flash, efficient and cuDNN kernels; on the CPU, where torch registers
  none, the CPU's fused kernel is routed to the same ring templates.  Its exchanges are counted
  and timed by wrapping torch's rotater.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from bench.registry import Prepared, variant


def _expand(x, heads: int):
    """K or V of fewer heads (GQA) as many as the queries' (each KV head serves a group)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def ring_attention(case, ctx, rescale: bool = True):
    """Ring attention over ``ctx``'s ranks.  ``rescale=False`` leaves out the rescaling of the
    running output by its old maximum: a wrong merge, there for tests to catch."""
    causal = case.mask == "causal"
    scale = 1.0 / math.sqrt(case.head_dim)
    key_positions = [ctx.positions(case.kv_len, r) for r in range(ctx.world)]  # the ring's blocks, by source
    q_positions = ctx.q_positions

    def attention(q, k, v):
        qf = q.float() * scale
        m = torch.full(q.shape[:-1] + (1,), -math.inf, device=q.device)
        denom = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-1] + (v.shape[-1],), device=q.device)
        kb, vb = k, v
        for step in range(ctx.world):
            source = (ctx.rank - step) % ctx.world
            nxt = ctx.ring_start(kb, vb) if step + 1 < ctx.world else None  # in flight while this block computes
            keep = q_positions[:, None] >= key_positions[source][None, :] if causal else None
            if keep is None or bool(keep.any()):
                s = qf @ _expand(kb, q.shape[1]).float().transpose(-1, -2)
                if keep is not None:
                    s = s.masked_fill(~keep, -math.inf)
                m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
                safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
                p = torch.exp(s - safe)
                corr = torch.exp(m - safe) if rescale else torch.ones_like(m)
                denom = denom * corr + p.sum(dim=-1, keepdim=True)
                acc = acc * corr + p @ _expand(vb, q.shape[1]).float()
                m = m_new
            if nxt is not None:
                kb, vb = ctx.ring_finish(nxt)
        return (acc / denom).to(q.dtype)

    return attention


@variant("cp.ring", description="ring attention: K and V passed around the ranks, each block merged by the "
         "online softmax; causal on the zigzag split", devices=("cpu", "cuda"),
         masks=("none", "causal"), cross=False, gqa=True, shard="zigzag", checks=("ranks",))
def cp_ring(case, ctx):
    return ring_attention(case, ctx)


def heads_reason(case) -> str | None:
    """Why Ulysses cannot split ``case``'s heads over its ranks (None when it can)."""
    for name, heads in (("heads", case.heads), ("kv_heads", case.kv_heads)):
        if heads % case.ranks:
            return (f"{name} {heads} do not split over {case.ranks} ranks: Ulysses gives each rank heads / ranks "
                    f"heads (give heads divisible by the ranks)")
    return None


def ulysses(case, ctx, local):
    """Ulysses around ``local(q, k, v)`` (a rank's heads over the whole sequence): the sequence split
    swapped for a head split, and back."""
    def attention(q, k, v):
        out = local(ctx.seq_to_heads(q), ctx.seq_to_heads(k), ctx.seq_to_heads(v))
        return ctx.heads_to_seq(out)

    return attention


def ulysses_around(name: str):
    """The factory of a Ulysses variant around any one-process variant ``name`` (registered in the
    sweep, a plugin's too), each rank running it on its heads over the whole sequence::

        variant("cp.alltoall.mine", description="Ulysses around mine", shard="contiguous",
                masks=("none", "causal"), cross=False, check=heads_reason)(ulysses_around("mine"))
    """
    def factory(case, ctx):
        local, why = ctx.local(name, heads=case.heads // ctx.world, kv_heads=case.kv_heads // ctx.world)
        if local is None:
            raise NotImplementedError(why)
        return Prepared(ulysses(case, ctx, local.fn), info=dict(local.info), scope=local.scope)

    return factory


@variant("cp.alltoall", description="Ulysses: two all-to-alls swap the sequence split for a head split around "
         "a local SDPA over the whole sequence", devices=("cpu", "cuda"), masks=("none", "causal"), cross=False,
         gqa=True, shard="contiguous", check=heads_reason)
def cp_alltoall(case, ctx):
    causal = case.mask == "causal"
    gqa = case.kv_heads != case.heads

    def local(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)

    return ulysses(case, ctx, local)


variant("cp.alltoall.flex", description="Ulysses around FlexAttention: the two all-to-alls around the flex variant "
        "on each rank's heads over the whole sequence", devices=("cpu", "cuda"), masks=("none", "causal"),
        cross=False, gqa=True, shard="contiguous", check=heads_reason, checks=("ranks",), compiles=True)(
    ulysses_around("flex"))


def _torch_cp():
    """torch's context-parallel dispatcher, which ``context_parallel`` enters once it has sharded its
    buffers: entered here on shards the harness made (the zigzag split is its head-tail one)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention

    for name in ("_enable_context_parallel_dispatcher_impl", "_disable_context_parallel_dispatcher_impl",
                 "_DispatchMode", "_cp_options", "_create_rotater", "_templated_ring_attention",
                 "_templated_ring_attention_backward", "_AllGatherRotater"):
        getattr(_attention, name)
    return _attention


def _torch_cp_reason(case) -> str | None:
    try:
        _torch_cp()
    except (ImportError, AttributeError) as exc:
        return f"this torch's context_parallel cannot be entered on given shards ({type(exc).__name__}: {exc})"
    return None


class _CountedRotater:
    """torch's K/V rotater with its exchanges counted and timed in the rank's ``comms``: the bytes
    each sends (an all-gather's, once, to every other rank; a permute's to the next), and the time
    spent starting it and waiting for its buffer (the communication the compute did not hide)."""

    def __init__(self, inner, ctx, cp):
        self.inner, self.ctx, self.gathers = inner, ctx, isinstance(inner, cp._AllGatherRotater)

    def exchange_buffers(self, buffer):
        fresh = self.ctx.world > 1 and (not self.gathers or self.inner._aggregated_buffer is None)
        sent = buffer.numel() * buffer.element_size() * ((self.ctx.world - 1) if self.gathers else 1) if fresh else 0
        self.ctx.comms.timed(lambda: self.inner.exchange_buffers(buffer), sent)

    def next_buffer(self):
        return self.ctx.comms.timed(self.inner.next_buffer, 0)


def _cpu_handlers(cp, mesh):
    """The CPU's fused SDPA (``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward)
    routed to torch's ring templates, as torch routes the CUDA kernels: torch registers no handler
    for it, and without one its DTensor has no sharding strategy."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    aten = torch.ops.aten

    def local(x):
        return x.to_local() if isinstance(x, DTensor) else x

    def wrap(tensors):
        return tuple(DTensor.from_local(t, mesh, [Shard(2)], run_check=False) if isinstance(t, torch.Tensor)
                     else t for t in tensors)

    def forward(op_call, args, kwargs):
        names = ("query", "key", "value", "dropout_p", "is_causal")
        given = {**dict(zip(names, map(local, args))), **{k: local(v) for k, v in kwargs.items()}}
        if given.get("attn_mask") is not None:
            raise NotImplementedError("context parallelism takes no attention mask")
        q, k, v = given.pop("query"), given.pop("key"), given.pop("value")
        return wrap(cp._templated_ring_attention(mesh.get_group(), 2, aten._scaled_dot_product_flash_attention_for_cpu
                                                 .default, q, k, v, is_causal=given.pop("is_causal", False),
                                                 **given))

    def backward(op_call, args, kwargs):
        names = ("grad_out", "query", "key", "value", "out", "logsumexp", "dropout_p", "is_causal")
        given = {**dict(zip(names, map(local, args))), **{k: local(v) for k, v in kwargs.items()}}
        return wrap(cp._templated_ring_attention_backward(
            mesh.get_group(), 2, aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            grad_out_name="grad_out", **given))

    return {aten._scaled_dot_product_flash_attention_for_cpu.default: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default: backward}


@variant("cp.torch", description="PyTorch's context_parallel: its ring SDPA over the ranks on its load-balanced "
         "(head-tail) shards, K and V all-gathered (its default rotation)", devices=("cpu", "cuda"),
         masks=("none", "causal"), cross=False, gqa=False, shard="zigzag", check=_torch_cp_reason,
         checks=("ranks",))
def cp_torch(case, ctx):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    cp = _torch_cp()
    mesh = init_device_mesh(ctx.device.type, (ctx.world,))
    causal = case.mask == "causal"
    handlers = _cpu_handlers(cp, mesh) if ctx.device.type == "cpu" else {}

    @contextlib.contextmanager
    def dispatching():
        saved = cp._dispatch_mode, cp._cp_options.enable_load_balance, cp._create_rotater
        create = cp._create_rotater
        cp._dispatch_mode, cp._cp_options.enable_load_balance = cp._DispatchMode.MONKEY_PATCH, causal
        cp._create_rotater = lambda *a, **k: _CountedRotater(create(*a, **k), ctx, cp)
        cp._enable_context_parallel_dispatcher_impl(seq_dim=2, mesh=mesh)
        DTensor._op_dispatcher._custom_op_handlers = {**DTensor._op_dispatcher._custom_op_handlers, **handlers}
        try:
            yield
        finally:
            cp._disable_context_parallel_dispatcher_impl()  # (puts torch's own handlers back)
            cp._dispatch_mode, cp._cp_options.enable_load_balance, cp._create_rotater = saved

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return Prepared(attention, scope=dispatching)
