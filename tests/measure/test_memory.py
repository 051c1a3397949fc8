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
