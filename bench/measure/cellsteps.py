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

A feature may also keep something in a worker across its cells: a ``Keep``, declared as
``"module:NAME"`` among its ``kept``.  ``make(device_name)`` builds it once, at the worker's
start, before the worker reports ready; the cell hands every kept object to the steps as
``t.kept[name]`` and calls the hooks each one has, all optional:

- ``on_setup() -> str``: after each variant's setup and check; a non-empty answer says what the
  variant left behind in the worker, which is then tainted (the variant's row is an error with
  it, and a fresh worker takes the rest of the case);
- ``on_case(case, settings, live, quiet, emit, at)``: after a case's rounds and rows (``live``: its
  timed items; ``quiet``: none of them was contended);
- ``on_flush(emit, at)``: when the sweep asks the worker to finish what it holds (a job with no case);
- ``on_job_end()`` after each job and ``on_exit()`` when the sweep lets the worker go.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Timed:
    """A timed cell as the steps after its timing see it: its live item (``variant``, ``bound``,
    ``timer``, ``parts``, ``checked``, ``call``), its case and settings, its timing, what each
    step watched around the rounds (by the step's name), and what the worker's features keep (by
    the ``Keep``'s name)."""
    item: object
    case: object
    settings: object
    timing: object  # TimingSummary
    watched: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)

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


@dataclass(frozen=True)
class Keep:
    """What a feature keeps in a worker across its cells (the module's docstring has the protocol)."""
    name: str
    make: Callable[[str], object]  # the worker's device name -> the kept object


def kept_calls(kept: dict, hook: str) -> list[Callable]:
    """The kept objects' ``hook`` methods, for those that have one, in the declarations' order."""
    return [m for obj in kept.values() if (m := getattr(obj, hook, None)) is not None]


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
