"""FlexAttention never falls back to unfused code: fullgraph compiles, an error at a recompile
limit, and a reset before a worker's compiles reach dynamo's limit."""

import pytest

from bench.case import Case
from bench.measure.inputs import make_inputs
from bench.measure.reference import run_and_check


@pytest.mark.slow
def test_flex_resets_dynamo_before_its_recompile_limit_and_stays_correct(monkeypatch):
    import variants.flex as flex

    monkeypatch.setattr(flex, "CACHE_SIZE_LIMIT", 2)  # a worker's 256th case, brought forward
    factory = flex.FlexFactory()
    infos = []
    for n in (32, 48):  # two shapes: two compiles, the second after a reset
        case = Case("cpu", "float32", 1, 2, 2, n, n, 16, "causal", None, "fwd")
        prepared = factory(case)
        q, k, v = make_inputs(case)
        with prepared.scope():  # fail_on_recompile_limit_hit: a fall-back would raise here
            assert run_and_check(case, prepared.fn, q, k, v).ok
        infos.append(prepared.info["compiled"])
    assert factory.resets == 1
    assert infos[0].startswith("torch.compile fullgraph") and infos[-1].endswith("reset 1")
    with flex._dynamo_limits():
        import torch

        assert torch._dynamo.config.fail_on_recompile_limit_hit
