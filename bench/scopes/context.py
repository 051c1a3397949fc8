"""Context parallelism: a core cell whose sequence is split over ``case.ranks`` processes.

A cell of P ranks runs in P processes of one torch.distributed group (gloo on the CPU, NCCL on
CUDA; the engine starts them: bench.engine.group).  Every rank makes the case's whole q, k, v and
upstream gradient (the same seeded tensors the worker's float64 reference is computed from),
keeps its shard (``shard_spans``: zigzag or contiguous, as the variant declares), and calls the
variant's factory with its place in the group (``RankContext``).  The rank's checked call, its
output shard and gradients, go back to the worker, which puts the shards in their places and
checks the whole against the float64 reference of the whole sequence (``gather``).  Then each
rank times its step, all ranks starting each sample at a barrier: its own time, the time inside
its collectives (``RankContext``'s timed collectives: on the CPU a clock around each; on CUDA
events around each, on the stream that waits for it) and the bytes it sent; then one step under
torch.profiler gives its time inside the collectives themselves (NCCL's kernels, gloo's ops),
hidden behind the compute or not.  ``reduce`` makes
one measurement of the ranks': the step's time is the slowest rank's, sample by sample, and each
rank's own figures are kept beside it (bench.model.row.RANKS); the statistics are computed on
read (bench.measure.stats.rank_figures).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from bench.model.shards import shard_spans

SAMPLES = (10, 200)  # a rank's timed samples: as many as the budget holds at the warm-up's pace, within these
# (at least enough for a 95% interval of the median, bench.measure.settings.INTERVAL_SAMPLES, with room to spare)
WARMUP = 2  # untimed steps before the timing, every rank together


def take(x, spans, dim: int = 2):
    """The positions ``spans`` of ``x`` along ``dim``, in order."""
    import torch

    return torch.cat([x.narrow(dim, a, b - a) for a, b in spans], dim=dim) if len(spans) > 1 else \
        x.narrow(dim, spans[0][0], spans[0][1] - spans[0][0])


def gather(shards: list, n: int, layout: str, dim: int = 2):
    """The whole tensor from each rank's shard (rank order), each put back at its positions."""
    import torch

    world = len(shards)
    out = torch.empty(shards[0].shape[:dim] + (n,) + shards[0].shape[dim + 1:], dtype=shards[0].dtype)
    for rank, part in enumerate(shards):
        at = 0
        for a, b in shard_spans(n, world, rank, layout):
            out.narrow(dim, a, b - a).copy_(part.narrow(dim, at, b - a))
            at += b - a
    return out


@dataclass
class Comms:
    """What one rank's collectives took in one step: their time and the bytes it sent."""
    device: str
    seconds: float = 0.0
    bytes_sent: int = 0
    calls: int = 0  # collectives (and the timing's barriers) since the rank took its job: 0, and a fault
    # every rank raised leaves the group in step
    _events: list = field(default_factory=list)

    def reset(self) -> None:
        self.seconds, self.bytes_sent, self._events = 0.0, 0, []

    def timed(self, fn, sent: int):
        self.bytes_sent += int(sent)
        self.calls += 1
        if self.device == "cuda":
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            self._events.append((start, end))
            return out
        t0 = time.perf_counter()
        out = fn()
        self.seconds += time.perf_counter() - t0
        return out

    def ms(self) -> float:
        """The step's time in collectives (on CUDA, once the step has been synchronised)."""
        return self.seconds * 1e3 + sum(s.elapsed_time(e) for s, e in self._events)


class RankContext:
    """A rank's place in its cell's group, as a context-parallel variant's factory gets it
    (``factory(case, ctx)``): ``group`` (the torch.distributed process group), ``rank``,
    ``world``, ``device`` (this rank's: cuda:R on a GPU node), ``layout`` (how the sequence is split),
    ``q_positions`` and ``kv_positions`` (the positions of the rank's queries and keys in the whole
    sequence, a LongTensor each: a mask over the shards is a mask over these), and the collectives,
    timed and counted: ``ring_pass`` (tensors to the next rank, the previous rank's back),
    ``all_to_all`` (dim 0 split over the ranks), ``seq_to_heads`` and ``heads_to_seq`` (Ulysses's
    pair) and ``all_gather``.  Each is differentiable: a backward through them sends the gradients
    back the way the tensors came."""

    def __init__(self, case, group, rank: int, world: int, device, layout: str):

        self.case, self.group, self.rank, self.world, self.device, self.layout = \
            case, group, rank, world, device, layout
        self.comms = Comms("cuda" if str(device).startswith("cuda") else "cpu")

        self.q_positions, self.kv_positions = self.positions(case.q_len), self.positions(case.kv_len)
        self.registry = None  # the sweep's variants, plugins included (the rank sets it): ``local`` looks in it

    def local(self, name: str, **changes):
        """Variant ``name`` (a one-process variant of the sweep's, plugins included) bound to this
        rank's local case, for a context-parallel variant to wrap: the cell's case with ``changes``
        (Ulysses: ``heads=case.heads // world``) at ranks 1: (its ``Prepared``, "") or (None, why it
        cannot run the local case), for the variant to refuse the cell with (``raise
        NotImplementedError(why)``: the cell's ``unsupported``)."""
        import dataclasses

        from bench.model.registry import available

        if self.registry is None or name not in self.registry:
            return None, f"no variant {name!r} in this sweep to run each rank's local attention"
        var = self.registry[name]
        case = dataclasses.replace(self.case, ranks=1, **changes)
        ok, why = available(var, case)
        return (var.prepare(case), "") if ok else (None, f"the local {name}: {why}")

    def positions(self, n: int, rank: int | None = None):
        """The positions of a sequence of ``n`` that ``rank`` (this one by default) holds, in its order."""
        import torch

        rank = self.rank if rank is None else rank
        return torch.cat([torch.arange(a, b, device=self.device)
                          for a, b in shard_spans(n, self.world, rank, self.layout)])

    # -- raw exchanges (timed); the autograd functions below call them ---------------------------------
    def _ring(self, tensors, forward: bool = True) -> tuple:
        import torch
        import torch.distributed as dist

        if self.world == 1:
            return tuple(tensors)
        to, frm = ((self.rank + 1) % self.world, (self.rank - 1) % self.world) if forward else \
            ((self.rank - 1) % self.world, (self.rank + 1) % self.world)
        sent = [t.contiguous() for t in tensors]
        got = [torch.empty_like(t) for t in sent]

        def exchange():
            ops = [dist.P2POp(dist.isend, t, to, self.group) for t in sent] + \
                  [dist.P2POp(dist.irecv, g, frm, self.group) for g in got]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            return tuple(got)

        return self.comms.timed(exchange, sum(t.numel() * t.element_size() for t in sent))

    def _a2a(self, x):
        import torch
        import torch.distributed as dist

        if self.world == 1:
            return x
        x = x.contiguous()
        out = torch.empty_like(x)

        def exchange():
            dist.all_to_all_single(out, x, group=self.group)
            return out

        return self.comms.timed(exchange, x.numel() * x.element_size() * (self.world - 1) // self.world)

    def _gather(self, x, dim: int):
        import torch
        import torch.distributed as dist

        if self.world == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]

        def exchange():
            dist.all_gather(parts, x, group=self.group)
            return torch.cat(parts, dim=dim)

        return self.comms.timed(exchange, x.numel() * x.element_size() * (self.world - 1))

    # -- the collectives a variant calls ---------------------------------------------------------------
    def ring_pass(self, *tensors) -> tuple:
        """Each tensor to the next rank; the previous rank's come back (differentiable)."""
        return _RingPass.apply(self, *tensors)

    def ring_start(self, *tensors) -> _Pending:
        """``ring_pass`` begun and not waited for: the exchange runs while the caller computes on
        what it holds, and ``ring_finish`` gives the previous rank's tensors (differentiable: the
        backward sends the gradients back, waiting for them).  Its time in ``comms`` is the wait,
        the communication the compute did not hide."""
        import torch
        import torch.distributed as dist

        if self.world == 1:
            return _Pending(tuple(tensors), tuple(tensors), [])
        to, frm = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        sent = [t.detach().contiguous() for t in tensors]
        got = [torch.empty_like(t) for t in sent]
        ops = [dist.P2POp(dist.isend, t, to, self.group) for t in sent] + \
              [dist.P2POp(dist.irecv, g, frm, self.group) for g in got]
        self.comms.bytes_sent += sum(t.numel() * t.element_size() for t in sent)
        self.comms.calls += 1
        return _Pending(tuple(tensors), tuple(got), dist.batch_isend_irecv(ops), sent)

    def ring_finish(self, pending: _Pending) -> tuple:
        """The tensors of ``ring_start``'s exchange, once they have come."""
        if not pending.requests:
            return pending.got
        return _RingArrive.apply(self, pending, *pending.sources)

    def all_to_all(self, x):
        """``x``'s dim 0 split into ``world`` chunks, chunk j to rank j; rank i's chunk for this rank
        comes back as chunk i (differentiable)."""
        return _AllToAll.apply(self, x)

    def seq_to_heads(self, x):
        """(B, H, n / world, D), this rank's positions of every head, to (B, H / world, n, D): every
        position of this rank's heads, in ``layout``'s rank order (contiguous: the sequence's)."""
        b, h, m, d = x.shape
        y = self.all_to_all(x.reshape(b, self.world, h // self.world, m, d).transpose(0, 1))
        return y.permute(1, 2, 0, 3, 4).reshape(b, h // self.world, self.world * m, d)

    def heads_to_seq(self, y):
        """The inverse of ``seq_to_heads``: (B, H / world, n, D) to (B, H, n / world, D)."""
        b, hl, n, d = y.shape
        m = n // self.world
        x = self.all_to_all(y.reshape(b, hl, self.world, m, d).permute(2, 0, 1, 3, 4))
        return x.transpose(0, 1).reshape(b, hl * self.world, m, d)

    def all_gather(self, x, dim: int = 2):
        """Every rank's ``x``, concatenated along ``dim`` in rank order (differentiable)."""
        return _AllGather.apply(self, x, dim)


def _autograd():
    import torch

    class RingPass(torch.autograd.Function):
        @staticmethod
        def forward(fctx, ctx, *tensors):
            fctx.ctx, fctx.like = ctx, [(t.shape, t.dtype, t.device) for t in tensors]
            return ctx._ring(tensors, forward=True)

        @staticmethod
        def backward(fctx, *grads):
            grads = [g if g is not None else torch.zeros(s, dtype=d, device=dev)
                     for g, (s, d, dev) in zip(grads, fctx.like)]
            return (None, *fctx.ctx._ring(grads, forward=False))

    class RingArrive(torch.autograd.Function):
        @staticmethod
        def forward(fctx, ctx, pending, *sources):
            fctx.ctx, fctx.like = ctx, [(s.shape, s.dtype, s.device) for s in sources]
            ctx.comms.timed(lambda: [r.wait() for r in pending.requests], 0)
            ctx.comms.calls -= 1  # (counted once, at its start)
            return pending.got

        @staticmethod
        def backward(fctx, *grads):
            grads = [g if g is not None else torch.zeros(s, dtype=d, device=dev)
                     for g, (s, d, dev) in zip(grads, fctx.like)]
            return (None, None, *fctx.ctx._ring(grads, forward=False))

    class AllToAll(torch.autograd.Function):
        @staticmethod
        def forward(fctx, ctx, x):
            fctx.ctx = ctx
            return ctx._a2a(x)

        @staticmethod
        def backward(fctx, grad):
            return None, fctx.ctx._a2a(grad)

    class AllGather(torch.autograd.Function):
        @staticmethod
        def forward(fctx, ctx, x, dim):
            fctx.ctx, fctx.dim, fctx.size = ctx, dim, x.shape[dim]
            return ctx._gather(x, dim)

        @staticmethod
        def backward(fctx, grad):
            import torch.distributed as dist

            ctx = fctx.ctx
            if ctx.world > 1:  # the sum of every rank's gradient of this rank's part
                grad = grad.contiguous()
                ctx.comms.timed(lambda: dist.all_reduce(grad, group=ctx.group),
                                grad.numel() * grad.element_size())
            return None, grad.narrow(fctx.dim, ctx.rank * fctx.size, fctx.size), None

    return RingPass, AllToAll, AllGather, RingArrive


class _Lazy:
    """The autograd functions, made at first use (this module is read without torch)."""

    def __init__(self, index: int):
        self.index = index

    def apply(self, *args):
        return _autograd_cached()[self.index].apply(*args)


_CACHE: list = []


def _autograd_cached():
    if not _CACHE:
        _CACHE.extend(_autograd())
    return _CACHE


_RingPass, _AllToAll, _AllGather, _RingArrive = _Lazy(0), _Lazy(1), _Lazy(2), _Lazy(3)


@dataclass
class _Pending:
    """A ring exchange begun (``RankContext.ring_start``): what was sent, where the previous rank's
    tensors arrive, and the requests to wait for (the sent buffers held until they complete)."""
    sources: tuple
    got: tuple
    requests: list
    sent: list = field(default_factory=list)


# -- a rank's part of a cell ---------------------------------------------------------------------------


@dataclass
class RankMeasured:
    """What one rank measured: its checked call's output and gradient shards (CPU tensors), its
    setup, its own step times and its time in collectives per sample, the bytes it sent per step,
    its peak memory and the factory's figures (``Prepared.info``)."""
    rank: int
    out: object = None
    grads: tuple | None = None
    setup_ms: float = 0.0
    samples_ms: list = field(default_factory=list)
    comm_ms: list = field(default_factory=list)
    bytes_sent: int = 0
    peak_mem_bytes: int | None = None
    warmup_calls: int = 0
    timer: str = ""
    info: dict = field(default_factory=dict)
    collective_ms: float | None = None  # its time inside collectives over one profiled step (``collectives_ms``)
    collective_wait_ms: float | None = None  # and the time that step waited for them (its timed collectives)


COLLECTIVE_PREFIXES = ("gloo:", "nccl")  # the profiler's names for a collective: gloo's ops on the CPU
# (gloo:all_reduce, gloo:send, ...), NCCL's kernels on a GPU (ncclDevKernel_..., ncclKernel_...)
STEP_MARK = "attnbench.rank_step"  # the profiled step's span (torch.profiler.record_function)


def collectives_ms(events, cuda: bool, window: tuple | None = None) -> float:
    """The time spent inside collectives, from the profiler's own events (``prof.events()``),
    counted within ``window`` (start, end in the events' microseconds; None: all of them): on a
    GPU NCCL's kernels, on the CPU gloo's ops, each from its start to its end (a collective
    begun before a block's compute and waited for after it counts the whole time it was in
    flight), the union of their spans.  Unlike the timed collectives (the step's wait for them), it counts the
    communication that ran beside the compute too: the two give how much of it the compute hid."""
    spans = []
    for e in events:
        name = str(e.name).lower()
        if not name.startswith(COLLECTIVE_PREFIXES):
            continue
        on_device = "cuda" in str(getattr(e, "device_type", "")).lower()
        if not ((cuda and on_device and name.startswith("nccl")) or
                (not cuda and not on_device and name.startswith("gloo:"))):
            continue
        a, b = e.time_range.start, e.time_range.end
        if window is not None:
            a, b = max(a, window[0]), min(b, window[1])
        if b > a:
            spans.append((a, b))
    total, reach = 0.0, None  # their union: a send and a receive in flight together count once
    for a, b in sorted(spans):
        if reach is None or a > reach:
            total, reach = total + (b - a), b
        elif b > reach:
            total, reach = total + (b - reach), b
    return total / 1e3


def _profiled_collectives(call, sync, ctx) -> tuple:
    """One step under torch.profiler, every rank's profiler started before it (a barrier): its
    time inside collectives and the time it waited for them (its timed collectives), both None
    where the profiler cannot run."""
    import torch
    import torch.distributed as dist

    cuda = ctx.comms.device == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    try:
        with torch.profiler.profile(activities=activities) as prof:
            dist.barrier(group=ctx.group)
            sync()
            ctx.comms.reset()
            with torch.profiler.record_function(STEP_MARK):
                call()
                sync()
    except RuntimeError:  # another profiler active, or CUPTI unavailable
        return None, None
    events = prof.events()
    step = next((e for e in events if e.name == STEP_MARK), None)
    inside = collectives_ms(events, cuda, (step.time_range.start, step.time_range.end) if step else None)
    return inside, ctx.comms.ms()


def run_rank(variant, case, ctx: RankContext, settings) -> RankMeasured:
    """Rank ``ctx.rank``'s part of a cell: its shard, the variant bound to it, the checked call (its
    output and gradients sent back for the worker's check), then its timed steps, every rank's
    sample starting at a barrier, and its peak memory."""
    import torch
    import torch.distributed as dist

    from bench.measure.bound import case_inputs
    from bench.measure.memory import peak_bytes
    from bench.measure.timing import direction_call

    (q, k, v), grad_out = case_inputs(case)
    needs_grad = grad_out is not None
    qs, ks, vs = (take(t, shard_spans(t.shape[2], ctx.world, ctx.rank, ctx.layout)).detach().clone()
                  .requires_grad_(needs_grad) for t in (q, k, v))
    go = take(grad_out, shard_spans(grad_out.shape[2], ctx.world, ctx.rank, ctx.layout)).contiguous() \
        if needs_grad else None
    del q, k, v, grad_out
    measured = RankMeasured(ctx.rank)
    t0 = time.perf_counter()
    prepared = variant.prepare(case, ctx)
    measured.setup_ms, measured.info = (time.perf_counter() - t0) * 1e3, dict(prepared.info)
    fn = prepared.fn
    with prepared.scope():
        out = fn(qs, ks, vs)
        grads = torch.autograd.grad(out, (qs, ks, vs), go, allow_unused=True) if needs_grad else None
        measured.out = out.detach().cpu() if isinstance(out, torch.Tensor) else out
        measured.grads = tuple(None if g is None else g.detach().cpu() for g in grads) if grads else None
        del out, grads
        call = direction_call(case.direction, lambda: fn(qs, ks, vs), (qs, ks, vs), go, allow_unused=True)
        sync = torch.cuda.synchronize if ctx.comms.device == "cuda" else (lambda: None)
        pace = []
        ctx.comms.calls += 1  # the timing's barriers from here: a fault now leaves the ranks out of step
        for _ in range(WARMUP):
            dist.barrier(group=ctx.group)
            t0 = time.perf_counter()
            call()
            sync()
            pace.append(time.perf_counter() - t0)
        slowest = torch.tensor([max(pace)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=_cpu_group(ctx))
        count = int(min(SAMPLES[1], max(SAMPLES[0], settings.budget_ms / 1e3 / max(float(slowest), 1e-6))))
        for _ in range(count):
            dist.barrier(group=ctx.group)
            ctx.comms.reset()
            sync()
            t0 = time.perf_counter()
            call()
            sync()
            measured.samples_ms.append((time.perf_counter() - t0) * 1e3)
            measured.comm_ms.append(ctx.comms.ms())
        measured.bytes_sent = ctx.comms.bytes_sent  # the last step's: every step sends the same
        measured.warmup_calls = WARMUP
        measured.timer = "cuda-sync-perf-counter" if ctx.comms.device == "cuda" else "cpu-perf-counter"
        dist.barrier(group=ctx.group)
        measured.collective_ms, measured.collective_wait_ms = _profiled_collectives(call, sync, ctx)
        dist.barrier(group=ctx.group)
        measured.peak_mem_bytes = peak_bytes(ctx.comms.device, call)
        dist.barrier(group=ctx.group)
    return measured


def _cpu_group(ctx):
    """The group a CPU tensor's collective goes over: the cell's own on the CPU (gloo); on CUDA
    (NCCL takes device tensors only) the gloo group the engine makes beside it."""
    return getattr(ctx, "cpu_group", None) or ctx.group


def reduce(measured: list[RankMeasured], case, layout: str) -> dict:
    """One measurement of the ranks' (rank order): the checked output and gradients put together
    (``layout``: how the sequence was split), the step's samples (the slowest rank's, sample by
    sample), and each rank's figures as the row's RANKS columns."""
    grads = None
    if all(m.grads for m in measured):
        grads = tuple(None if any(m.grads[i] is None for m in measured) else
                      gather([m.grads[i] for m in measured], n, layout)
                      for i, n in enumerate((case.q_len, case.kv_len, case.kv_len)))
    outs = [m.out for m in measured]
    out = gather(outs, case.q_len, layout) if all(hasattr(o, "shape") for o in outs) else \
        next((o for o in outs if not hasattr(o, "shape")), outs[0])
    steps = min(len(m.samples_ms) for m in measured)
    peaks = [m.peak_mem_bytes for m in measured]
    return {"out": out, "grads": grads, "samples_ms": [max(m.samples_ms[i] for m in measured) for i in range(steps)],
            "setup_ms": max(m.setup_ms for m in measured), "info": measured[0].info,
            "warmup_calls": measured[0].warmup_calls, "timer": measured[0].timer,
            "peak_mem_bytes": max((p for p in peaks if p is not None), default=None),
            "columns": {"rank_samples_ms": [m.samples_ms[:steps] for m in measured],
                        "rank_comm_ms": [m.comm_ms[:steps] for m in measured],
                        "rank_bytes_sent": [m.bytes_sent for m in measured],
                        "rank_peak_mem_bytes": peaks,
                        "rank_collective_ms": [m.collective_ms for m in measured],
                        "rank_collective_wait_ms": [m.collective_wait_ms for m in measured]}}
