"""FlexAttention never falls back to unfused code: fullgraph compiles, an error at a recompile
limit, and a reset before a worker's compiles reach dynamo's limit."""

import pytest

from bench.case import Case
from bench.measure.correctness import run_and_check
from bench.measure.inputs import make_inputs


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


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_compiled_backward_primed_once_is_timed_through_the_retained_graph_under_flexs_scope(dynamic):
    """torch 2.6+ donates a compiled backward's saved buffers: primed with a plain .backward() (as flex's
    setup compiles it), the timed backward through the retained graph (timing.timed_call's bwd) then raises.
    Under flex's scope the compile keeps them, so every repetition runs; with --dynamic too."""
    import torch

    from bench.measure.timing import timed_call
    from variants.flex import flex_scope

    def f(q, k, v):  # saves an intermediate for its backward: a donated buffer by default
        return ((q @ k.transpose(-1, -2)).sin() * 2) @ v

    case = Case("cpu", "float32", 1, 1, 1, 8, 8, 8, "none", None, "bwd")

    def run(scope):
        torch._dynamo.reset()
        g = torch.compile(f, backend="aot_eager", dynamic=dynamic)
        q, k, v = (torch.randn(1, 1, 8, 8, requires_grad=True) for _ in range(3))
        with scope():
            out = g(q, k, v)
            out.backward(torch.ones_like(out))  # the setup's priming call
            call = timed_call(case, g, q, k, v, torch.ones_like(out))
            return [call() for _ in range(3)]

    import contextlib

    with pytest.raises(RuntimeError, match="donated buffers"):
        run(contextlib.nullcontext)  # the default: the defect, as torch 2.11 shows it on the GPU
    grads = run(flex_scope)
    assert len(grads) == 3 and all(torch.equal(a, b) for a, b in zip(grads[0], grads[2]))
    torch._dynamo.reset()


def test_flex_kernel_options_on_cuda_follow_torch_2_11s_decode_and_paged_configs():
    """Recorded heuristics of torch 2.11 (the device machine's release): flex_decoding has no valid
    config when q_len < 128 and q_len x the GQA group > 128 (README's draft tree: q 64, 32/8 heads;
    gpt-oss at q >= 32), and a paged cache's KV tile must divide its page (bf16 d=64 defaults to
    BLOCK_N = 128 on H100/H200)."""
    from variants.flex import kernel_options

    def case(q, heads=32, kv_heads=8, **kw):
        return Case(device="cuda", dtype="bfloat16", batch=1, heads=heads, kv_heads=kv_heads, q_len=q,
                    kv_len=4096, head_dim=64, mask="causal", window=None, direction="fwd", align="br", **kw)

    assert kernel_options(case(64)) == {"FORCE_USE_FLEX_ATTENTION": True}  # 64 x 4 = 256 rows
    assert kernel_options(case(32, heads=64, kv_heads=8)) == {"FORCE_USE_FLEX_ATTENTION": True}  # gpt-oss
    assert kernel_options(case(16)) is None  # 64 rows: decode's configs hold
    assert kernel_options(case(128)) is None  # not the decode kernel
    assert kernel_options(case(64, heads=8, kv_heads=8)) is None  # no group
    assert kernel_options(case(1, kv_layout="paged:64"), kv_block=64) == {"BLOCK_N": 64}
    assert kernel_options(case(1, kv_layout="paged:32"), kv_block=32) == {"BLOCK_N": 32}
    assert kernel_options(case(1, kv_layout="paged:256"), kv_block=128) is None
    assert kernel_options(case(64).replace(device="cpu")) is None


def test_flex_declares_head_dims_past_256_unsupported_on_cuda_with_the_reason():
    from variants.flex import _check, rounded_dim

    assert [rounded_dim(d) for d in (64, 128, 192, 256, 512, 576)] == [64, 128, 256, 256, 512, 1024]
    big = Case(device="cuda", dtype="bfloat16", batch=1, heads=16, kv_heads=1, q_len=1, kv_len=4096, head_dim=576,
               mask="causal", window=None, direction="fwd", align="br", head_dim_v=512)
    why = _check(big)
    assert why and "1024" in why and "shared memory" in why
    assert _check(big.replace(head_dim=192, head_dim_v=128)) is None
    assert _check(big.replace(device="cpu", dtype="float32")) is None  # the CPU's C++ template takes it


def test_a_layer_setup_counts_the_two_dynamo_cache_entries_it_stores(monkeypatch):
    """A layer's recording and its checked call run under different grad modes: two cache entries per
    setup, so the reset comes before a worker's layer cases reach the limit (scaled down to 8 here)."""
    import variants.flex as flex
    from bench.registry import Prepared

    monkeypatch.setattr(flex, "CACHE_SIZE_LIMIT", 8)
    monkeypatch.setattr(flex, "_prepare", lambda case, compiled: Prepared(lambda q, k, v: q, {}))
    factory = flex.FlexFactory()
    stored = []
    for scope in ("core", "block", "decoder", "encoder", "block"):
        ffn = "none" if scope in ("core", "block") else "mlp:64"
        factory(Case(q_len=32, kv_len=32, heads=2, kv_heads=2, head_dim=16, scope=scope, ffn=ffn))
        stored.append((factory.compiles, factory.resets))
    assert stored == [(1, 0), (3, 0), (5, 0), (7, 0), (2, 1)]  # 7 + 2 would reach 8: reset first
