"""How the cells of a sweep are measured: one frozen object, derived once from the Spec,
handed to every worker, and stamped on every row by one function.

Units: ``precision`` is a fraction here and in rows (0.02 is +-2 %); the Spec and the
command line give it in percent (``--precision 2``), converted in ``from_spec`` only.
No torch here: a worker unpickles this before it imports torch (its CUDA_VISIBLE_DEVICES is set first).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

DEFAULT_PRECISION = 0.02  # stop when the median's 95% CI is within +-2% of it
DEFAULT_ROUNDS = 3
DEFAULT_CEILING_MS = 2000.0  # a cell's timing may run past its budget up to this, to get an interval's samples
INTERVAL_SAMPLES = 6  # the fewest samples whose order statistics give a 95% interval of the median


@dataclass(frozen=True)
class MeasureSettings:
    budget_ms: float = 1000.0
    precision: float = DEFAULT_PRECISION  # CPU timer: the 95% CI of the median within +-precision (a fraction)
    rounds: int = DEFAULT_ROUNDS  # interleaved rounds per case (A B C A B C ...)
    timer: str = "events"  # the GPU timer: events, or graph (bench.measure.timing.GraphTimer)
    threads: int | None = None  # torch threads in the worker; None: torch's default (resolved in the worker)
    # CPU timer: a cell gets the samples a 95% interval of its median needs (6) even past its budget,
    # while its timing stays under this many ms; past it, it keeps what it has and says what they support
    ceiling_ms: float = DEFAULT_CEILING_MS
    deterministic: bool = False  # torch.use_deterministic_algorithms(True) in the worker (--deterministic)
    steps: int = 0  # after its timing, an ok cell runs this many steps of fresh batches (--steps; bench.features.steps)
    dynamic: bool = False  # variants that compile do so with dynamic shapes (--dynamic)
    retime: bool = True  # a contended case is timed again in place (contention.retime.Held); --remeasure 0: not
    peak_age_h: float = 24.0  # a memory peak recorded this many hours ago is still taken (bench.engine.memcache)
    heap: str = "fixed"  # the worker's C heap: fixed (bench.engine.runner.steady_heap) or system (--heap)

    @classmethod
    def from_spec(cls, spec, threads: int | None = None) -> MeasureSettings:
        """The settings of ``spec`` (a ``bench.model.spec.Spec``); ``threads`` is the worker's own
        count where placement chose one (several workers share the cores)."""
        ceiling = getattr(spec, "ceiling_s", None)
        return cls(budget_ms=float(spec.budget_ms), precision=spec.precision / 100.0, rounds=int(spec.rounds),
                   timer=spec.timer or "events", threads=threads if threads is not None else spec.threads,
                   ceiling_ms=max(float(spec.budget_ms), 1e3 * ceiling if ceiling is not None else DEFAULT_CEILING_MS),
                   deterministic=bool(getattr(spec, "deterministic", False)), steps=int(getattr(spec, "steps", 0) or 0),
                   dynamic=bool(getattr(spec, "dynamic", False)), retime=int(getattr(spec, "remeasure", 1) or 0) > 0,
                   peak_age_h=float(getattr(spec, "peak_age", 24.0)), heap=getattr(spec, "heap", None) or "fixed")

    def replace(self, **changes) -> MeasureSettings:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    def stamp(self, row: dict, device: str) -> dict:
        """Write the settings a row was measured under on it (every row, failed ones too): the
        budget, the threads, the precision target where one applies (the CPU timer; the
        GPU timers take a fixed number of samples, so a CUDA row's precision is None) and the
        worker's C heap (--heap)."""
        row.update(budget_ms=self.budget_ms, threads=self.threads,
                   precision=self.precision if device == "cpu" else None, heap=self.heap)
        return row
