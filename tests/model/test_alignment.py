"""Where the queries sit among the keys (--align): top-left (query i is key i) or bottom-right
(the queries are the last q_len tokens, as decode, chunked prefill and draft verification run).
The masks, the score mods, the reference and the pair counts follow it; every variant that
declares bottom_right computes it, the others say they do not; a kernel aligned the other way fails."""

from __future__ import annotations

import pytest
import torch

from bench.cli import main
from bench.measure.bound import bind_variant
from bench.measure.correctness import reference, run_and_check
from bench.model import masks
from bench.model.case import Case, CaseError

SPELLINGS = ["causal", "window:8", "sink:2+window:4", "prefix_lm:3", "chunked_causal:4", "causal+alibi",
             "document:2:causal=1"]


def _case(spelling, q, kv, align, **kw):
    mask, window = masks.canonical(spelling, 8)
    return Case(batch=2, heads=4, kv_heads=2, q_len=q, kv_len=kv, head_dim=16, mask=mask, window=window,
                align=align, **kw)


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_top_left_and_bottom_right_differ_across_lengths_and_agree_when_equal(spelling):
    same = [masks.bind(_case(spelling, 24, 24, a)) for a in ("top-left", "bottom-right")]
    assert same[0].counts == same[1].counts
    assert torch.equal(same[0].keep() if same[0].keep() is not None else torch.ones(1),
                       same[1].keep() if same[1].keep() is not None else torch.ones(1))
    tl, br = (_case(spelling, 4, 40, a) for a in ("top-left", "bottom-right"))
    keep_tl, keep_br = masks.bind(tl).keep(), masks.bind(br).keep()
    assert not torch.equal(keep_tl.expand(2, 4, 4, 40), keep_br.expand(2, 4, 4, 40))
    if spelling.startswith("causal"):  # the last query sees every key, the first all but the three after it
        assert keep_br[0, 0, -1].all() and int(keep_br[0, 0, 0].sum()) == 37
        assert int(keep_tl[0, 0, 0].sum()) == 1  # top-left: query 0 sees key 0 alone
    # the exact count (closed form per row) agrees with the dense mask, both ways
    for case in (tl, br):
        kept = int(masks.bind(case).keep().expand(2, 4, 4, 40).sum())
        assert masks.bind(case).counts[0] == kept


def test_decode_verification_with_bottom_right_causal():
    """Four draft tokens against a cache of 28: each sees the cache and the drafts before it, itself
    included (not the drafts after it, as mask none would let it)."""
    case = Case(batch=1, heads=1, kv_heads=1, q_len=4, kv_len=32, head_dim=8, mask="causal", align="br")
    keep = masks.bind(case).keep()[0, 0]
    assert [int(row.sum()) for row in keep] == [29, 30, 31, 32]
    assert masks.kept_pairs(case) == 29 + 30 + 31 + 32


def test_a_kernel_aligned_top_left_fails_where_bottom_right_is_asked(registry):
    case = _case("causal", 4, 40, "bottom-right")
    q, k, v = bind_variant(registry["naive"], case).inputs
    ref = reference(case, q, k, v)

    def top_left(q, k, v):  # SDPA's is_causal is top-left
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    result = run_and_check(case, top_left, q, k, v, ref=ref)
    assert not result.ok and result.kind == "mismatch-values"
    assert run_and_check(case.replace(align="top-left"), top_left, q, k, v).ok  # right where it is asked


def _bottom_right_variants(registry):
    return [v.name for v in registry if v.bottom_right and v.name != "flex" and not v.approximate]


def _check_bottom_right(registry, case) -> int:
    """Every exact variant that declares bottom-right (flex aside: it compiles) against the float64
    reference on ``case``; one that does not take it says why.  Returns how many ran."""
    from bench.model.registry import available

    ran = 0
    for name in _bottom_right_variants(registry):
        ok, why = available(registry[name], case)
        if not ok:
            assert why
            continue
        bound = bind_variant(registry[name], case)
        with bound.scope():
            result = run_and_check(case, bound.fn, *bound.inputs, bound.grad_out)
        assert result.ok, (name, result.reason)
        ran += 1
    return ran


@pytest.mark.parametrize("spelling", ["causal", "window:8", "causal+alibi", "document:2:causal=1"])
@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_every_variant_that_declares_bottom_right_computes_it(registry, spelling, direction):
    case = _case(spelling, 5, 40, "bottom-right", direction=direction)
    assert _check_bottom_right(registry, case) >= 3  # naive, chunked.online and the SDPA family at least


@pytest.mark.slow
def test_compiled_flex_takes_the_mask_algebra_aligned_bottom_right(registry):
    """The compiled variant itself, as a sweep runs it, on one case (one compile) that holds an '&', a
    document(...) wrapper and bottom-right alignment: the queries are the last 5 of 256 positions,
    in the second document.  Eager flex cannot vouch for the compiled path alone (issue 33: the
    algebra once reached it as a partial it refused)."""
    mask, _ = masks.canonical("document:lengths=64/192(chunked_causal:16&window:8)")
    case = Case(batch=2, heads=4, kv_heads=2, q_len=5, kv_len=256, head_dim=16, mask=mask, align="bottom-right")
    bound = bind_variant(registry["flex"], case)
    with bound.scope():
        result = run_and_check(case, bound.fn, *bound.inputs)
    assert result.ok, result.reason
    # positions 251..255, 187..191 within their document: the chunk 176..191 meets the last 8 keys
    keep = masks.bind(case).keep()[0, 0]
    assert [int(r.sum()) for r in keep] == [8, 8, 8, 8, 8] and masks.bind(case).counts[0] == 2 * 4 * 5 * 8


def test_a_variant_that_does_not_declare_it_is_unsupported_with_the_reason(registry):
    case = _case("window:8", 5, 40, "bottom-right")
    why = registry["window.chunked"].static_reason(case)
    assert why.startswith("bottom-right alignment (--align bottom-right, q_len 5 < kv_len 40) not supported")
    assert registry["window.chunked"].static_reason(_case("window:8", 40, 40, "bottom-right")) is None  # same thing
    assert registry["naive"].static_reason(_case("none", 5, 40, "bottom-right")) is None


def test_bottom_right_needs_the_queries_within_the_keys():
    with pytest.raises(CaseError, match="q_len <= kv_len"):
        Case(q_len=64, kv_len=32, align="bottom-right")
    assert Case(q_len=4, kv_len=32, align="br").align == "bottom-right"


def test_the_align_flag_and_the_decode_preset(capsys):
    from bench.api import discover
    from bench.model.specbuild import build_spec, parse_values

    spec = build_spec(parse_values({"preset": "decode", "device": "cpu"}), discover())
    assert spec.masks == ["causal"] and spec.align == ["bottom-right"]
    assert all(c.offset == c.kv_len - c.q_len for c in spec.cases())
    assert main(["sweep", "--variants", "naive", "--align", "sideways", "--device", "cpu", "--dry-run"]) == 2
    assert "unknown alignment 'sideways'; valid: top-left, bottom-right" in capsys.readouterr().err
    counts = []
    for align in ("tl", "tl,br"):
        assert main(["sweep", "--variants", "naive", "--align", align, "--seq-lens", "8", "--kv-lens", "32",
                     "--device", "cpu", "--dry-run"]) == 0
        counts.append(int(capsys.readouterr().out.split(" cells")[0].split()[-1]))
    assert counts[1] == 2 * counts[0] > 0  # each alignment its own cells


# every catalogue mask at parameters that bite at these lengths; a mask added to the catalogue and not
# here fails the first test below (None: varlen is what --batch-mix builds, tests/model/test_mix.py; tree takes
# one parent per query, tests/model/test_trees.py)
BOTTOM_RIGHT_FORMS = {"none": "none", "causal": "causal", "window": "window:8", "padding": "padding",
                      "document": "document:2:causal=1", "varlen": None,
                      "prefix_lm": "prefix_lm:8", "chunked_causal": "chunked_causal:8",
                      "dilated": "dilated:2:window=8", "sink": "sink:2+window:8", "gym_window": "gym_window:8",
                      "gym_dilated": "gym_dilated:2:window=8", "tree": None, "tree_chain": "tree_chain",
                      "tree_binary": "tree_binary", "tree_topk": "tree_topk:2", "bigbird": "bigbird:8"}


def test_every_catalogue_mask_is_covered_under_bottom_right():
    from bench.model import maskdefs

    builtin = [n for n, d in maskdefs.catalogue().items()
               if d.kind == "mask" and d.module == "bench.model.mask_catalog"]
    assert sorted(builtin) == sorted(BOTTOM_RIGHT_FORMS)


@pytest.mark.parametrize("name", sorted(n for n, s in BOTTOM_RIGHT_FORMS.items() if s))
@pytest.mark.parametrize("q, kv", [(5, 40), (40, 136)])
def test_every_catalogue_mask_bottom_right_with_fewer_queries_than_keys(registry, name, q, kv):
    """The pair counts agree with the dense mask, and every exact variant that declares bottom-right
    computes the mask against the float64 reference (bigbird once indexed its block table by the
    query's row, not its position, and crashed here)."""
    case = _case(BOTTOM_RIGHT_FORMS[name], q, kv, "bottom-right")
    bound_mask = masks.bind(case)
    keep = bound_mask.keep()
    dense = keep.expand(2, 4, q, kv) if keep is not None else torch.ones(2, 4, q, kv, dtype=torch.bool)
    assert bound_mask.counts[0] == int(dense.sum())
    assert _check_bottom_right(registry, case) >= 2, name  # naive and chunked.online take every catalogue mask


def test_padded_decode_aligns_each_sequences_queries_to_its_own_real_length(registry):
    """padding&causal bottom-right: query i of a sequence of real length L sits at L - q_len + i
    (FlashAttention's seqlens_k), not at the padded end; checked against each sequence computed
    alone in float64, and the kept keys per row against FlashAttention's [L-3, L-2, L-1, L]."""
    from bench.measure.inputs import make_inputs

    case = Case(batch=3, heads=2, kv_heads=2, q_len=4, kv_len=54, head_dim=8, mask="padding&causal",
                align="bottom-right", dtype="float32")
    lens = masks.kv_lengths_of_padding(case)
    assert len(set(lens)) == 3 and max(lens) <= 54  # three real lengths, none the padded one for all
    keep = masks.bind(case).keep().expand(3, 2, 4, 54)
    for b, length in enumerate(lens):
        assert keep[b, 0].sum(-1).tolist() == [length - 3, length - 2, length - 1, length]
    q, k, v = make_inputs(case)
    want = []
    for b, length in enumerate(lens):  # each sequence alone: its queries are its last q_len tokens
        qb, kb, vb = q[b].double(), k[b, :, :length].double(), v[b, :, :length].double()
        scores = qb @ kb.transpose(-1, -2) * case.scale
        pos = torch.arange(4).view(-1, 1) + length - 4
        scores = scores.masked_fill(torch.arange(length).view(1, -1) > pos, float("-inf"))
        want.append(torch.softmax(scores, -1) @ vb)
    want = torch.stack(want)
    for name in ("naive", "chunked.online", "sdpa"):
        bound = bind_variant(registry[name], case)
        with bound.scope():
            out = bound.fn(*bound.inputs)
        assert torch.allclose(out.double(), want, atol=1e-5), name
    assert masks.bind(case).counts[0] == int(keep.sum())
