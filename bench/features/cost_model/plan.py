"""A sweep's cost before it runs, and how its cells are split over shards and workers.

The unit of work is a case group: every variant of one case, which one worker times in
interleaved rounds against one reference.  A group's predicted cost is

    per variant: setup (a compile for variants declared ``compiles``) + the reference check
                 and the memory pass (two calls) + the timing (the calls the timer takes)
    per group:   the float64 reference, and a little IPC

with a call's time taken as the work it does over a rate (``work_flops``): the FLOPs of every
(query, key) pair for a variant that computes them all whatever its mask, of the kept pairs for
one that skips what its mask drops (or only a causal mask's upper triangle), and about those of
APPROX_KEYS keys for an approximation (the variant declares which: ``work``).  A variant's rate with
no earlier run is the share of the device's default it declares (``rates``), or the default.  The timing
takes the calls the timer takes (``timing_s``): each round its share of the budget, or the calls
the rounds need for a 95% interval of the median while its share of the ceiling lasts; a short
call stops at its precision.  A compiled variant compiles a case cold unless an earlier run here
set it up (then from the compiler's cache).

Shards use these static figures, so that ``--shard i/N`` gives every invocation the same split
of a spec, whatever ran before.  The projection printed before a sweep refines the rates and
setup times with the rows of earlier runs on this machine, when there are any (a cached
compile's time from the runs that found a case set up before, and no cost for a case a probe
refused), and scales the cells' cost but their setups by the median ratio of measured to
modelled time of the earlier sweeps on this device (env.json records both for each
invocation): what the model leaves out, the harness's own cost per cell on this machine, is
learnt rather than guessed.  Only clean sweeps teach it: one that started beside other
processes, or whose cells were mostly contended, measured the load, not the model's error; and
only sweeps this model priced (``MODEL``, recorded with each): an older model's error is not
this one's.

On a busy machine (other processes using cores when the sweep starts, measured as the
contention check measures, with the others' runnable threads where they outnumber what they
got) the projection says so and scales: the scheduler shares the cores among the runnable
threads, so the sweep's T threads get cores x T / (T + others) of them when there are not
enough for all (``--threads auto`` takes the free cores, and a long call on fewer threads
takes longer), and its contended cells (the share of its threads left without a core) are
timed again (``--remeasure``: in place, and at its end one look at the load when its threads
still have no core of their own), assuming the load stays.

The split is longest-processing-time first: groups in decreasing cost (ties by their order
in the spec), each to the least loaded bin.  It is deterministic, and no bin exceeds the
mean load by more than its largest group.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine.passes import Pass, PassResult, SweepSoFar
from bench.engine.prepare import Prep, Prepared
from bench.measure import cpuload
from bench.measure import flops as flopcount
from bench.measure.settings import DEFAULT_CEILING_MS, DEFAULT_ROUNDS, INTERVAL_SAMPLES, MeasureSettings
from bench.model.case import CASE_DEFAULTS, CASE_FIELDS, Case

# achieved FLOP/s of an attention call, by device, when no earlier run says better; the CPU's is set so that
# the variants' declared shares of it are what the default preset's exact variants reach at n >= 1024 on two
# cores (tests/benchmarks/first_sweep.py prints the projection beside the wall time)
DEFAULT_RATE = {"cpu": 1.5e11, "cuda": 1e14}
# The pairs a variant's work follows under a mask and its rate of that work against DEFAULT_RATE are
# declared on the variant (``variant(..., work=, rates=)``, bench.model.registry.Traits); one that
# declares none computes every pair at the default rate
MODEL = 2  # this cost model's version, recorded with each sweep's times: a plan learns only from its own
APPROX_KEYS = 256  # an approximate variant's call costs about what exact attention over this many keys does
REFERENCE_RATE = 1e10  # the float64 reference: on the CPU whatever the device (its slice of a large case)
COMPILE_S = {"cpu": 0.6, "cuda": 8.0}  # a variant that compiles, per case (torch.compile, a warm compiler)
COMPILE_COLD_S = {"cpu": 4.0, "cuda": 8.0}  # per forward case it has not compiled before here (no compiler cache;
# the CPU's from tests/benchmarks/first_sweep.py --cold against a warm run: 3.5 s a case over its 20 flex cases)
COMPILE_COLD_BACKWARD_S = {"cpu": 4.0, "cuda": 28.0}  # the same with a backward (bwd, fwd+bwd): on a GPU a cold
# forward and backward compile of flex takes 20-35 s (Inductor's backward kernels, autotuned); the CPU has none
COMPILE_FIRST_S = {"cpu": 2.0, "cuda": 20.0}  # once per worker: the compiler's own start (on the CPU with its
# vector-ISA probe, 1.3 s, until this machine has learnt it: bench.engine.vecisa)
SETUP_S = 0.01  # any other variant's setup
GROUP_OVERHEAD_S = 0.05  # inputs, IPC, bookkeeping per case
MIN_TIMING_S = 0.01  # a cell's timing never costs less than this
SAMPLES_WANTED = 200  # calls a timer takes when the budget allows many (it stops at its precision)
RANK_GROUP_START_S = {"cpu": 1.5, "cuda": 10.0}  # a worker's process group of P ranks (bench.engine.group), once per
# world size: P interpreters importing torch (and on a GPU each its CUDA context and NCCL: as a worker start), met at
# the rendezvous
WORKER_START_S = {"cpu": 3.0, "cuda": 10.0}  # the interpreter, torch and the first worker (a one-cell sweep: 3 s)
VISIT_WARM_S = 0.005  # a later visit's call before its timing, per variant (bench.engine.revisit.WARM_CALLS)
VISIT_START_S = {"cpu": 0.4, "cuda": 10.0}  # a later visit's fresh worker: on the CPU forked from the fork server
# (its imports done: 0.1-0.2 s) and its first variant warmed (bench.engine.revisit.FIRST_WARM_S); a GPU's starts anew
VISIT_COMPILE_FIRST_S = {"cpu": 0.7, "cuda": 20.0}  # its first compile beyond a warm case's (--trace-spans, quick
# preset: a visit's 8 flex setups took 3.0 s, 0.3 s a warm case)
PEAK_MEASURE_S = 1.5  # per dtype, at the start and at the end
REPORT_S = 3.0  # a report of the default preset or the quick one: 2.3-4 s (--trace-spans, `bench report`)
MIN_CALLS = 3  # a timer takes at least a few calls, whatever its budget
MAX_FACTOR = 10.0  # the learnt correction of the cells' cost is kept within 1/10x to 10x
PARALLEL_CALL_S = 0.005  # a call this long speeds up with more threads; a shorter one hardly does
BUSY_CORES = 0.5  # other processes using this many cores' worth at the start: a busy machine
CLEAN_SHARE = 0.1  # a sweep with more of its ok cells contended than this teaches no correction


@dataclass(frozen=True)
class CaseCost:
    case: Case
    variants: tuple[str, ...]
    index: int  # its place in the spec's order (ties, and the order a bin runs them in)
    cost_s: float
    setup_s: float = 0.0  # of cost_s, the variants' setup (compiles)


@dataclass
class History:
    """What earlier runs on this machine measured: per (variant, device) the setup time, per
    (variant, device, dtype, direction) the achieved rate of the work it does (``work_flops``),
    and the cases each variant set up (``seen``: a compiled one finds them in the compiler's cache)."""
    setup_s: dict
    rate: dict
    wall_factor: float = 1.0  # measured / projected wall time of the cells, over earlier sweeps here
    factor_runs: int = 0  # how many earlier sweeps that factor comes from
    seen: frozenset = frozenset()  # (variant, case_key) of every ok row
    warm_s: dict = field(default_factory=dict)  # per (variant, device) the setup of a case set up before here
    unsupported: frozenset = frozenset()  # (variant, case_key) its probe found unsupported here (not launched)

    @classmethod
    def empty(cls) -> History:
        return cls({}, {})


def case_key(fields: dict) -> str:
    """A case as a row or ``Case.to_dict`` spells it, but its device: what a compiler's cache is keyed by."""
    def value(f):
        v = fields.get(f)
        return CASE_DEFAULTS[f] if v is None else v  # a field a row lacks, or read back empty: its default

    return repr(tuple(str(value(f)) for f in CASE_FIELDS if f != "device"))


def compiled_pairs(rows, registry, device: str) -> list[tuple[str, str]]:
    """(variant, case key) of the ok rows of ``device`` whose variant compiles: what the compiler's
    cache now holds (bench.features.cost_model.compiled)."""
    return [(r["variant"], case_key(r)) for r in rows
            if r.get("status") == "ok" and r.get("device") == device and r.get("variant") in registry
            and registry[r["variant"]].compiles]


def refused_pairs(rows, device: str) -> list[tuple[str, str]]:
    """(variant, case key) of the rows of ``device`` a variant's own probe refused (``unsupported``
    for a library's reason, found in the worker): what a plan need not price again here."""
    return [(r["variant"], case_key(r)) for r in rows
            if r.get("status") == "unsupported" and r.get("reason_kind") == "library" and r.get("device") == device]


def _learn(s: SweepSoFar) -> PassResult:
    """What a sweep's rows teach the later plans of this machine: the cases a compiled variant set up
    (its compiler's cache holds them now) and those a library refused (bench.features.cost_model.compiled)."""
    from bench.features.cost_model import compiled
    from bench.runs import store

    rows = store.read_rows(s.run_dir)
    compiled.record(compiled_pairs(rows, s.pool.registry, s.spec.device), s.spec.device)
    compiled.record_refused(refused_pairs(rows, s.spec.device), s.spec.device)
    return PassResult()


PASS = Pass("the cost model's record", 40, _learn)  # reads the rows, measures nothing


def _price(p: Prepared) -> None:
    """Each case's cost, for the order in which several workers take them (largest first); one
    worker takes them in the spec's order."""
    if p.workers > 1:
        rounds, ceiling_ms = timing_of(p.spec)
        p.costs = {g.case: g.cost_s for g in groups(p.cells, p.registry, p.spec.budget_ms, rounds=rounds,
                                                    ceiling_ms=ceiling_ms)}


def _project(p: Prepared) -> None:
    """The projected wall time of the cells left, learnt from this machine's earlier sweeps."""
    from bench.engine import peaks
    from bench.runs import store

    history = load_history(store.DEFAULT_ROOT, p.spec.device, registry=p.registry, machine=True)
    p.projection = project(p.todo, p.registry, p.spec, workers=p.workers, history=history, report=p.report,
                           peaks_cached=peaks.all_cached(p.spec), others=p.others)


PRICE = Prep("the cases' costs", 10, _price)
PROJECT = Prep("the projection", 60, _project)


def work_flops(variant, case: Case) -> float:
    """The FLOPs a call of ``variant`` (a registry Variant) on ``case`` is priced by (module doc)."""
    from bench.model import masks

    return _work(variant.traits.work, variant.approximate, case.mask, flopcount.flops(case), masks.density(case),
                 case.kv_len)


def _work(follows: str, approximate: bool, mask: str, kept: float, density: float, kv_len: int) -> float:
    """``follows``: the pairs the variant's work follows (Traits.work: all, kept or causal)."""
    if follows == "kept" or (follows == "causal" and mask == "causal"):
        return kept
    dense = kept / max(density, 1e-9)
    return dense * min(1.0, APPROX_KEYS / max(1, kv_len)) if approximate else dense


def default_rate(variant, device: str) -> float:
    """``variant``'s rate on ``device`` when no earlier run here says better: the device's default
    times the rate it declares (Traits.rates; 1 without one)."""
    return DEFAULT_RATE[device] * (variant.traits.rate(device) or 1.0)


def load_history(root: Path, device: str, limit: int = 30, registry=None, machine: bool = False) -> History:
    """What up to ``limit`` newest run folders under ``root`` teach (ok rows of ``device``): the
    median achieved rate per variant, dtype and direction; per variant the setup time of its
    fastest folder (the lowest of the folders' medians), the cases it set up, and the setup of
    a case an older folder had set up already (a compile from the compiler's cache); and the
    correction of the cost model's non-setup part, the median of the earlier sweeps' measured
    over modelled time (env.json's history).  ``registry``: the variants, whose declarations say
    which are approximations.  ``machine``: also the cases compiled on this machine into run folders
    elsewhere, while the compiler's cache holds them (bench.features.cost_model.compiled)."""
    from bench.runs import store

    setups: dict = {}
    warm: dict = {}
    rates: dict = {}
    seen: set = set()
    refused: set = set()
    folders = sorted((p for p in Path(root).glob("*") if (p / store.RESULTS).is_file() and not p.is_symlink()),
                     key=lambda p: p.stat().st_mtime, reverse=True)[:limit]
    factors = []
    for folder in reversed(folders):  # oldest first: a case an older folder set up is in the compiler's cache
        try:
            invocations = store.read_env(folder).get("history") or []
        except Exception:  # an unreadable env.json: its rows still teach the rates
            invocations = []
        for h in invocations:  # what each earlier clean sweep modelled for its cells, and what they took
            if isinstance(h, dict) and (h.get("spec") or {}).get("device") == device and clean(h) and \
                    h.get("model") == MODEL and (h.get("model_rest_s") or 0) > 0 and \
                    (h.get("measured_rest_s") or 0) > 0:
                factors.append(h["measured_rest_s"] / h["model_rest_s"])
        mine: dict = {}
        again: dict = {}
        keys = set()
        for r in store.read_current(folder, quiet=True):  # another folder's bad lines are its own business
            if r.get("device") != device:
                continue
            key = (r["variant"], case_key(r))
            if r.get("status") == "unsupported":
                refused.add(key)
            if r.get("status") != "ok":
                continue
            refused.discard(key)
            keys.add(key)
            if r.get("setup_ms") is not None:
                mine.setdefault((r["variant"], device), []).append(r["setup_ms"] / 1e3)
                if key in seen:
                    again.setdefault((r["variant"], device), []).append(r["setup_ms"] / 1e3)
            if r.get("median_ms") and r.get("flops"):
                rate_key = (r["variant"], device, r.get("dtype"), r.get("direction"))
                rates.setdefault(rate_key, []).append(_row_work(r, registry) / (r["median_ms"] / 1e3))
        seen |= keys
        for into, found in ((setups, mine), (warm, again)):
            for k, values in found.items():
                into.setdefault(k, []).append(statistics.median(values))
    if machine:
        from bench.features.cost_model import compiled

        seen |= compiled.seen(device)
        refused |= compiled.refused(device)
    factor = min(MAX_FACTOR, max(1 / MAX_FACTOR, statistics.median(factors))) if factors else 1.0
    return History({k: min(v) for k, v in setups.items()},
                   {k: statistics.median(v) for k, v in rates.items()}, factor, len(factors), frozenset(seen),
                   {k: min(v) for k, v in warm.items()}, frozenset(refused))


def _row_work(row: dict, registry) -> float:
    """A row's work (``work_flops``) from what it recorded: its kept pairs' FLOPs and density."""
    known = registry[row["variant"]] if registry is not None and row["variant"] in registry else None
    follows, approximate = (known.traits.work, known.approximate) if known else ("all", False)
    return _work(follows, approximate, row.get("mask") or "none", row["flops"], row.get("density") or 1.0,
                 int(row.get("kv_len") or 1))


def clean(invocation: dict) -> bool:
    """Whether an invocation of env.json's history ran on a quiet machine: it started with other
    processes using under BUSY_CORES and at most CLEAN_SHARE of its ok cells were contended.  One
    that did not record both is not known to be clean."""
    others, share = invocation.get("others_cores_start"), invocation.get("contended_share")
    return others is not None and share is not None and others < BUSY_CORES and share <= CLEAN_SHARE


@dataclass(frozen=True)
class Busy:
    """A busy start: what other processes use, and what it does to the sweep."""
    others: float  # cores' worth of CPU other processes used at the start
    cores: int  # of the cores this process may use
    threads: int  # each worker's threads under that load (--threads auto takes the free cores)
    slowdown: float  # the cells' time against a quiet machine's
    contended_share: float = 0.0  # of the sweep's threads, those without a core: its cells flagged contended
    waits_for_quiet: bool = False  # the sweep's threads have no core of their own: the end pass finds no quiet
    fewer_threads: float = 1.0  # a quiet sweep's threads per worker over these: a long call's slowdown


def busy(others: float | None, cores: int, threads: int | None, workers: int = 1) -> Busy | None:
    """The load ``others`` (cores' worth of other processes' CPU) as it bears on a sweep of
    ``workers`` workers of ``threads`` threads (None: auto) on ``cores`` cores, or None on a
    quiet machine.  Under the load the sweep's threads get their share of the cores the
    runnable threads divide among them, and --threads auto runs fewer threads than a quiet
    sweep would: a long call (PARALLEL_CALL_S or more) takes that much longer, while a short
    one hardly speeds up with a second thread."""
    if others is None or others < BUSY_CORES or cores < 1:
        return None
    w = max(1, workers)
    quiet = threads or max(1, cores // w)
    mine_each = quiet if threads or w > 1 else max(1, min(cores, int(cores - others + 0.5)))
    mine = mine_each * w
    share = mine if mine + others <= cores else cores * mine / (mine + others)  # cores the sweep's threads get
    excess = mine + others - cores  # threads, the sweep's and the others', beyond the cores
    return Busy(others, cores, mine_each, max(1.0, mine / share),
                min(1.0, max(0.0, excess) / mine) if excess > cpuload.OTHER_CPU_MARGIN else 0.0,
                others > cores - mine_each + cpuload.OTHER_CPU_MARGIN, quiet / mine_each)


def cell_setup_s(variant, case: Case, history: History | None = None) -> float:
    """A cell's predicted setup: a compiled variant's from the compiler's cache when it set this
    case up before here (what such setups took here, else COMPILE_S), cold otherwise
    (COMPILE_COLD_S: a first run here cannot tell a cold compile from a cached one); any other's
    from earlier runs here, else a little."""
    history = history or History.empty()
    if variant.compiles:
        if (variant.name, case_key(case.to_dict())) not in history.seen:
            return (COMPILE_COLD_BACKWARD_S if case.needs_grad else COMPILE_COLD_S)[case.device]
        return history.warm_s.get((variant.name, case.device), COMPILE_S[case.device])
    return history.setup_s.get((variant.name, case.device), SETUP_S)


def later_visit_s(g: CaseCost, registry, history: History | None = None, rounds: int = DEFAULT_ROUNDS) -> float:
    """A case in a later visit: the variants that can run it set up again, a compiled one from the
    compiler's cache its first visit filled (what such setups took here, else COMPILE_S), warmed,
    and timed for one round of the first visit's timing."""
    h = history or History.empty()
    device = g.case.device
    able = [registry[name] for name in g.variants if registry[name].static_reason(g.case) is None
            and (name, case_key(g.case.to_dict())) not in h.unsupported]  # a probe's refusal is not visited
    runs = [v for v in able if not v.shard]  # a context-parallel cell is measured at its one visit
    if able and not runs:
        return 0.0
    setup = sum(h.warm_s.get((v.name, device), COMPILE_S[device]) if v.compiles else
                h.setup_s.get((v.name, device), SETUP_S) for v in runs)
    timing = max(0.0, g.cost_s - g.setup_s) * (len(runs) / len(able) if able else 1.0)  # the visited ones' share
    return setup + GROUP_OVERHEAD_S + len(runs) * VISIT_WARM_S + timing / max(1, rounds)


def timing_of(spec) -> tuple[int, float]:
    """A spec's rounds and per-cell ceiling in ms, as the workers take them (MeasureSettings; a
    GPU's timer keeps to its budget)."""
    how = MeasureSettings.from_spec(spec)
    return how.rounds, (how.ceiling_ms if spec.device == "cpu" else how.budget_ms)


def timing_s(call_s: float, budget_ms: float, rounds: int = DEFAULT_ROUNDS,
             ceiling_ms: float = DEFAULT_CEILING_MS) -> float:
    """The seconds a timer takes with calls of ``call_s`` (bench.measure.timing.interleave): each of
    ``rounds`` rounds takes its share of the budget, or the calls the rounds need for a 95% interval
    of the median, until its share of the ceiling is spent; a call short enough stops earlier, at
    its precision (SAMPLES_WANTED calls)."""
    if call_s <= 0:
        return MIN_TIMING_S
    rounds = max(1, rounds)
    per_round = budget_ms / 1e3 / rounds
    ceiling = max(per_round, ceiling_ms / 1e3 / rounds)
    floor = -(-INTERVAL_SAMPLES // rounds)  # calls a round, for an interval over the rounds
    calls = max(1, math.ceil(per_round / call_s), min(floor, math.ceil(ceiling / call_s)))
    spent = rounds * calls * call_s
    if SAMPLES_WANTED * call_s < budget_ms / 1e3:  # short calls: the timer stops at its precision
        spent = min(spent, max(MIN_TIMING_S, SAMPLES_WANTED * call_s))
    return max(spent, MIN_CALLS * call_s)


def cell_cost_s(variant, case: Case, budget_ms: float, history: History | None = None,
                fewer_threads: float = 1.0, rounds: int = DEFAULT_ROUNDS,
                ceiling_ms: float = DEFAULT_CEILING_MS) -> float:
    """A cell's predicted seconds (module doc); ``variant`` is a registry Variant.  ``fewer_threads``:
    the quiet thread count over the one the cell runs with; a call of PARALLEL_CALL_S or more takes
    that much longer (a shorter one hardly speeds up with more threads)."""
    history = history or History.empty()
    rate = history.rate.get((variant.name, case.device, case.dtype, case.direction)) or \
        default_rate(variant, case.device)
    call_s = work_flops(variant, case) / rate
    if call_s >= PARALLEL_CALL_S:
        call_s *= fewer_threads
    return cell_setup_s(variant, case, history) + 2 * call_s + timing_s(call_s, budget_ms, rounds, ceiling_ms)


def group_cost_s(variants, case: Case, budget_ms: float, history: History | None = None,
                 fewer_threads: float = 1.0, rounds: int = DEFAULT_ROUNDS,
                 ceiling_ms: float = DEFAULT_CEILING_MS) -> float:
    from bench.measure.correctness import check_slice

    batches, heads, _ = check_slice(case)  # the reference covers this much of the case, on the CPU
    share = len(batches) / case.batch * (len(range(case.heads)[heads]) / case.heads)
    reference = share * flopcount.flops(case.replace(direction="fwd")) / REFERENCE_RATE
    if case.needs_grad:
        reference *= 3
    return GROUP_OVERHEAD_S + reference + sum(cell_cost_s(v, case, budget_ms, history, fewer_threads, rounds,
                                                          ceiling_ms) for v in variants)


def groups(cells, registry, budget_ms: float, history: History | None = None, factor: float = 1.0,
           fewer_threads: float = 1.0, rounds: int = DEFAULT_ROUNDS,
           ceiling_ms: float = DEFAULT_CEILING_MS) -> list[CaseCost]:
    """``cells`` ((variant name, case) in spec order) as case groups with their costs; a
    variant that cannot run here by its declared capabilities, or whose probe found the case
    unsupported in an earlier run here, costs nothing (it is not launched, or not timed).
    ``factor`` scales each group's cost but its setup (the correction learnt from earlier sweeps)."""
    by_case: dict = {}
    for name, case in cells:
        by_case.setdefault(case, []).append(name)
    out = []
    for i, (case, names) in enumerate(by_case.items()):
        skip = (history or History.empty()).unsupported
        runs = [registry[n] for n in names if registry[n].static_reason(case) is None
                and (n, case_key(case.to_dict())) not in skip]
        if not runs:
            out.append(CaseCost(case, tuple(names), i, 0.001, 0.0))
            continue
        setup = sum(cell_setup_s(v, case, history) for v in runs)
        cost = group_cost_s(runs, case, budget_ms, history, fewer_threads, rounds, ceiling_ms)
        out.append(CaseCost(case, tuple(names), i, setup + factor * (cost - setup), setup))
    return out


def split(items: list[CaseCost], n: int) -> list[list[CaseCost]]:
    """``items`` in ``n`` bins of near-equal cost (longest first, to the least loaded bin);
    each bin keeps the spec's order."""
    bins: list[list[CaseCost]] = [[] for _ in range(n)]
    loads = [0.0] * n
    for g in sorted(items, key=lambda g: (-g.cost_s, g.index)):
        i = min(range(n), key=lambda b: (loads[b], b))
        bins[i].append(g)
        loads[i] += g.cost_s
    return [sorted(b, key=lambda g: g.index) for b in bins]


def shard_cells(cells, registry, budget_ms: float, shard: tuple[int, int]):
    """The cells of shard ``(i, N)``: the static split of the spec's groups (module doc)."""
    i, n = shard
    mine = split(groups(cells, registry, budget_ms), n)[i - 1]
    keep = {(name, g.case) for g in mine for name in g.variants}
    return [(name, case) for name, case in cells if (name, case) in keep]


@dataclass(frozen=True)
class Projection:
    cells: int
    groups: int
    cells_s: float  # the cells' own cost, all of them
    per_shard_s: list  # wall time of each shard: its fixed costs and its busiest worker
    per_worker_s: list  # within one shard (the first), each worker's cells
    fixed_s: float  # a shard's start (worker, peaks) and end (peaks again, report)
    calibrated: bool  # earlier runs refined the rates
    factor: float = 1.0  # the correction learnt from earlier sweeps' modelled and measured times
    factor_runs: int = 0
    setup_s: float = 0.0  # of the cells' time, the setups (compiles), per worker
    busy: Busy | None = None  # the load at the start, when the machine was busy
    remeasure_s: float = 0.0  # of the wall time, the end-of-sweep re-measurement of contended cells
    visits_s: float = 0.0  # of the wall time, the later visits (--visits; measured with the cells, so modelled so)
    idle: int = 0  # cells that cannot run here by what their variants declare: rows in the report, never swept
    idle_why: str = ""  # the most frequent reason, with its variants

    @property
    def wall_s(self) -> float:
        return max(self.per_shard_s, default=0.0)

    @property
    def model(self) -> int:
        """This cost model's version (env.json's history records it beside ``model_rest_s``)."""
        return MODEL

    @property
    def model_rest_s(self) -> float:
        """The cells' time less their setup, as the cost model gives it before the learnt
        correction: what a measured sweep is compared with (``load_history``)."""
        slowdown = self.busy.slowdown if self.busy else 1.0
        return max(0.0, (self.wall_s - self.remeasure_s - self.fixed_s) / slowdown - self.setup_s) / self.factor

    def lines(self) -> list[str]:
        learnt = (f"; x{self.factor:.2f} learnt from {self.factor_runs} earlier sweep(s)" if self.factor_runs else "")
        out = [f"{self.cells - self.idle} cells in {self.groups} cases: about {_fmt(self.cells_s)} of measuring"
               + (f" (rates from earlier runs here{learnt})" if self.calibrated or self.factor_runs
                  else " (default rates: no earlier run here)")
               + (f"; {self.idle} more cannot run here: rows in the report, not swept ({self.idle_why})"
                  if self.idle else "")]
        if len(self.per_shard_s) > 1:
            out.append("per shard: " + ", ".join(f"{i + 1}: {_fmt(s)}" for i, s in enumerate(self.per_shard_s)))
        if len(self.per_worker_s) > 1:
            out.append("per worker: " + ", ".join(f"{i}: {_fmt(s)}" for i, s in enumerate(self.per_worker_s)))
        if self.busy:
            b = self.busy
            out.append(f"busy machine: other processes use {b.others:.1f} of the {b.cores} cores, so the cells are "
                       f"projected {b.slowdown:.1f}x slower than on a quiet machine ({b.threads} thread(s) per worker"
                       + (f"; the end-of-sweep re-measurement of contended cells adds {_fmt(self.remeasure_s)}"
                          if self.remeasure_s else "") + "), assuming the load stays")
        out.append(f"projected wall time: {_fmt(max(self.per_shard_s))}"
                   + (" per shard, shards running side by side" if len(self.per_shard_s) > 1 else "")
                   + f" (of it {_fmt(self.fixed_s)} start-up, peaks and report"
                   + (f", {_fmt(self.visits_s)} the later visits to each cell (--visits)" if self.visits_s else "")
                   + ")")
        return out


def project(cells, registry, spec, workers: int = 1, shards: int = 1, history: History | None = None,
            report: bool = True, peaks_cached: bool = False, others: float | None = None,
            started: bool = False, compiler_started: bool = False) -> Projection:
    """The projected wall time of running ``cells`` of ``spec`` over ``shards`` shards of
    ``workers`` workers each (``peaks_cached``: the machine's peaks are in the cache,
    bench.engine.peaks, and are not measured; ``others``: cores' worth of CPU that other
    processes used at the start, for the CPU; ``started``: its worker was kept from an earlier
    sweep of the same process, and ``compiler_started``: that worker has compiled already)."""
    load = busy(others, len(cpuload.usable_cpus()), spec.threads, workers) if spec.device == "cpu" else None
    slowdown = load.slowdown if load else 1.0
    factor = history.wall_factor if history else 1.0  # what the model missed in earlier sweeps here
    rounds, ceiling_ms = timing_of(spec)
    gs = groups(cells, registry, spec.budget_ms, history, factor, load.fewer_threads if load else 1.0, rounds,
                ceiling_ms)
    compiles = any(registry[n].compiles for n in spec.variants)
    peak_s = 0.0 if peaks_cached else 2 * PEAK_MEASURE_S * len(spec.dtypes)
    worlds = {c.ranks for n, c in cells if registry[n].shard}  # each worker starts a group per world size
    fixed = ((0.0 if started else WORKER_START_S[spec.device]) + peak_s + (REPORT_S if report else 0.0)
             + len(worlds) * RANK_GROUP_START_S[spec.device]
             + (COMPILE_FIRST_S[spec.device] if compiles and gs and not compiler_started else 0.0))
    shard_bins = split(groups(cells, registry, spec.budget_ms), shards) if shards > 1 else [gs]
    cost = {g.index: g.cost_s for g in gs}  # the calibrated cost of each group, in whichever split
    per_shard, first_workers = [], []
    for k, b in enumerate(shard_bins):
        worker_bins = split([CaseCost(g.case, g.variants, g.index, cost[g.index], g.setup_s) for g in b], workers)
        loads = [slowdown * sum(g.cost_s for g in w) for w in worker_bins]
        per_shard.append(fixed + max(loads, default=0.0))
        if k == 0:
            first_workers = loads
    visits_s = 0.0
    if getattr(spec, "visits", 1) > 1:  # each later visit: a fresh worker, then every case set up and timed one round
        worker = VISIT_START_S[spec.device] + (VISIT_COMPILE_FIRST_S[spec.device] if compiles and gs else 0.0)
        per_visit = [worker + sum(later_visit_s(g, registry, history, rounds) for g in w) for w in split(gs, workers)]
        visits_s = (spec.visits - 1) * slowdown * max(per_visit, default=0.0)
        per_shard = [s + visits_s / max(1, len(per_shard)) for s in per_shard]
    remeasure_s = 0.0
    if load and load.contended_share and spec.remeasure:  # the contended cells timed again, and a look at the load
        quiet_cells = max(first_workers, default=0.0) / slowdown
        remeasure_s = (cpuload.QUIET_LOOK_S if load.waits_for_quiet else 0.0) + load.contended_share * quiet_cells
        per_shard = [s + remeasure_s for s in per_shard]
    setup = sum(g.setup_s for g in gs) / max(1, workers)
    idle, idle_why = cannot_run(cells, registry)
    return Projection(len(cells), len(gs), sum(cost.values()), per_shard, first_workers, fixed,
                      bool(history and (history.rate or history.setup_s)), factor,
                      history.factor_runs if history else 0, setup, load, remeasure_s, visits_s, idle, idle_why)


def cannot_run(cells, registry) -> tuple[int, str]:
    """How many of ``cells`` their variants' declarations rule out here (a device, a mask, a
    capability), and the most frequent reason with the variants it covers, e.g. 'xformers,
    sdpa.efficient: not on cpu'."""
    why: dict = {}
    for name, case in cells:
        reason = registry[name].static_reason(case)
        if reason is not None:
            why.setdefault(_short(reason), []).append(name)
    if not why:
        return 0, ""
    reason, names = max(why.items(), key=lambda kv: len(kv[1]))
    names = list(dict.fromkeys(names))
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return sum(len(v) for v in why.values()), f"most: {shown}: {reason}"


def _short(reason: str) -> str:
    return reason.split(";")[0].split(" (")[0].strip()[:80]


def _fmt(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
