"""The steps of a timed cell's life: the protocol through which a feature adds to a cell.

The core's part of a cell is fixed (bench.engine.cell): its variants set up and checked against
float64, timed together in interleaved rounds, and decided.  A feature adds a ``Step``, declared
in bench/model/features.py as ``"module:NAME"`` among its ``steps``; the cell runs every declared
step, in ``order``, and knows none by name.  A step may have two parts:

- ``watch(case, settings)``: what it watches around the rounds, or None where it has nothing
  to watch for this case.  A watch has ``start()`` before the rounds and ``stop()`` after them, and may have
  ``turn(name, timer)``: a context around each turn of a variant's whole call (a layer's parts'
  turns are not watched).  A turn's watch runs outside the timed samples but inside the
  variant's turn: it must stay cheap, and it must not allocate on the device.
- ``run(t)``, where ``applies(t)``: what it adds to the cell's result after the timing, from the
  ``Timed`` cell (``t.watched[name]`` is its watch).  A step that raises ends its cell with what
  the result held before (``during`` names the step in the row's reason; without it, the
  reason names the step before); a step that must not fail its cell catches its own errors.

``order`` places a step among the others (lower first): a check on the timer's outputs (10),
figures of the timing (20-40), the memory pass (50), which frees the timed call and its graph,
then what runs its own calls (60 and beyond).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Timed:
    """A timed cell as the steps after its timing see it: its live item (``variant``, ``bound``,
    ``timer``, ``parts``, ``checked``, ``call``), its case and settings, its timing, what each
    step watched around the rounds (by the step's name), and the machine's memory record."""
    item: object
    case: object
    settings: object
    timing: object  # TimingSummary
    watched: dict = field(default_factory=dict)
    memory: object = None  # bench.engine.memcache.MemoryCache, in a sweep's worker

    @property
    def result(self):
        return self.item.result


@dataclass(frozen=True)
class Step:
    """One step of a timed cell's life (the module's docstring has the protocol)."""
    name: str
    order: int
    applies: Callable[[Timed], bool]
    run: Callable[[Timed], None]
    during: Callable[[Timed], str] | None = None  # None: a failure names the step before
    watch: Callable[[object, object], object] | None = None


def free_device_memory(device: str) -> None:
    """Return memory between cases.  Only CUDA needs a collection (cached blocks go back to
    the driver); on the CPU reference counting frees tensors, and a full collection over
    torch's heap costs ~100 ms a time."""
    if device == "cuda":
        import torch

        gc.collect()
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:  # a sticky CUDA error: the row already has it; the worker restarts
            pass
