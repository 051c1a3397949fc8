import pytest

from bench.case import Case
from bench.measure.inputs import make_inputs
from bench.measure.memory import peak_bytes
from bench.measure.timing import timed_call


def _peak(registry, name, n, mask="none", window=None, direction="fwd"):
    case = Case("cpu", "float32", 1, 4, 4, n, n, 64, mask, window, direction)
    q, k, v = make_inputs(case)
    fn = registry[name].prepare(case).fn
    return peak_bytes("cpu", timed_call(case, fn, q, k, v))


def test_naive_memory_grows_quadratically(registry):
    small, large = _peak(registry, "naive", 512), _peak(registry, "naive", 1024)
    # the (4, 512, 512) float32 scores alone are 4 MiB
    assert small >= 4 * 512 * 512 * 4
    assert 3.0 <= large / small <= 5.0


@pytest.mark.parametrize("name, mask, window", [("sdpa.flash", "none", None),
                                                ("window.chunked", "window", 64)])
def test_fused_and_windowed_memory_grows_at_most_linearly(registry, name, mask, window):
    small = _peak(registry, name, 1024, mask, window)
    large = _peak(registry, name, 2048, mask, window)
    assert 0 < small and large / small <= 2.5
    assert large < _peak(registry, "naive", 2048, mask, window) / 4


def test_the_memory_pass_frees_what_every_timer_of_the_cell_holds():
    """A timed call holds its inputs (a backward's: its retained graph); the memory pass drops the
    cell's and its parts' before it measures, though the cell still keeps the timers themselves."""
    import gc
    import types
    import weakref

    import torch

    from bench.measure import memory
    from bench.measure.timing import CpuTimer

    held = torch.ones(1 << 16)
    gone = weakref.ref(held)
    whole, part = CpuTimer(lambda t=held: t.sum()), CpuTimer(lambda t=held: t.mean())
    del held

    class Record:  # the machine's record of this cell's peak: no profiled pass here
        def key(self, *a):
            return "k"

        def get(self, key, age):
            return 123

    item = types.SimpleNamespace(call=None, timer=whole, parts={"ffn": part}, variant="v", bound=None)
    result = types.SimpleNamespace()
    t = types.SimpleNamespace(item=item, case=Case(), result=result, kept={"memory": Record()},
                              settings=types.SimpleNamespace(threads=1, peak_age_h=24.0))
    timers = [whole, part]  # the cell's rounds keep them, as its interleave did
    memory._memory(t)
    gc.collect()
    assert gone() is None and result.peak_mem_bytes == 123 and len(timers) == 2
