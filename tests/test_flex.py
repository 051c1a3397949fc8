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


def test_block_sparsity_is_counted_in_blocks_at_a_decode_shape():
    """16 queries against 4096 keys, bottom-right, a window of 256: each query block (one, of 16
    rows) visits the last 3 of 32 key blocks (the window's 256 keys straddle three).  PyTorch's
    BlockMask.sparsity() counts those blocks against the shape's elements (it said -700 % for causal)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from bench.model import masks
    from bench.model.case import Case
    from variants.flex import block_sparsity

    case = Case(q_len=16, kv_len=4096, heads=2, kv_heads=2, mask="window", window=256, align="br")
    bm = create_block_mask(masks.bind(case).mask_mod(), None, None, 16, 4096, device="cpu")
    assert block_sparsity(bm) == round(100 * (1 - 3 / 32), 2)  # BlockMask.sparsity() says 25 % here
