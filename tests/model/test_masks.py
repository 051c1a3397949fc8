"""Masks and score mods: one predicate each, and everything derived from it agrees with it."""

import itertools
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from bench.case import Case
from bench.cli import main
from bench.measure.flops import flops
from bench.model import masks
from bench.runs import maskfile
from tests.conftest import ROOT, eager_flex, read_jsonl, run_cli, write_plugin

# every built-in mask, at parameters that make each of its parts bite at these lengths
BUILTIN_SPELLINGS = ["none", "causal", "window:5", "padding", "document:3", "document:4:causal=1",
                     "document:lengths=7/1/REST", "prefix_lm:9", "chunked_causal:6", "dilated:3:window=4",
                     "sink:2", "sink:3+window:5", "bigbird:4", "bigbird:3:window=0:globals=2:random=3:seed=7",
                     "causal+chunked_causal:4", "tree_chain", "tree_binary", "tree_topk:3", "gym_dilated:3:window=7"]
SHAPES = [(37, 37), (19, 44), (50, 13), (1, 9)]  # self, more keys, more queries, one query


def fit(spelling, q_len, kv_len):
    """Explicit document lengths sum to exactly the case's positions: REST is what is left."""
    return spelling.replace("REST", str(max(q_len, kv_len) - 8))


def _case(spelling, q_len, kv_len, batch=3, heads=2):
    mask, window = masks.canonical(fit(spelling, q_len, kv_len))
    return Case(batch=batch, heads=heads, kv_heads=heads, q_len=q_len, kv_len=kv_len, head_dim=8,
                mask=mask, window=window)


def _brute_force(case):
    """Every (b, h, i, j) pair asked of the predicate one at a time, with Python ints in tensors."""
    fn = masks.bind(case).mask_mod()
    kept, rows = 0, []
    for b, h, i in itertools.product(range(case.batch), range(case.heads), range(case.q_len)):
        row = sum(bool(fn(torch.tensor(b), torch.tensor(h), torch.tensor(i), torch.tensor(j)))
                  for j in range(case.kv_len)) if fn is not None else case.kv_len
        kept += row
        rows.append(row)
    return kept, min(rows)


@pytest.mark.parametrize("spelling", BUILTIN_SPELLINGS)
def test_exact_pair_counts_match_brute_force(spelling):
    for q_len, kv_len in SHAPES:
        if spelling.startswith("tree_topk:") and q_len < int(spelling.split(":")[1]):
            with pytest.raises(masks.MaskError, match="a width of at most q_len"):  # a level wider than the tree
                _ = masks.bind(_case(spelling, q_len, kv_len, batch=2, heads=1)).counts
            continue
        case = _case(spelling, q_len, kv_len, batch=2, heads=1)
        assert masks.bind(case).counts == _brute_force(case), (spelling, q_len, kv_len)


@pytest.mark.parametrize("spelling", BUILTIN_SPELLINGS)
def test_flops_and_density_come_from_the_kept_pairs(spelling):
    case = _case(spelling, 37, 37, batch=2, heads=4)
    keep = masks.bind(case).keep()  # the predicate on the whole (b, h, i, j) grid
    kept = 2 * 4 * 37 * 37 if keep is None else int(keep.expand(2, 4, 37, 37).sum())
    assert flops(case) == 4 * kept * case.head_dim
    assert masks.density(case) == pytest.approx(kept / (2 * 4 * 37 * 37))
    assert flops(case.replace(direction="fwd+bwd")) == 3.5 * flops(case)


def test_the_dense_mask_is_the_predicate_in_every_block():
    case = _case("sink:3+window:5", 50, 13)
    whole = masks.bind(case).keep()
    parts = torch.cat([masks.bind(case).keep(rows=(s, min(50, s + 7))) for s in range(0, 50, 7)], dim=2)
    assert torch.equal(whole, parts)
    assert whole.shape == (1, 1, 50, 13)  # the mask does not depend on b or h: it broadcasts
    assert masks.dense_keep(_case("padding", 5, 8)).shape == (3, 1, 5, 8)


@pytest.mark.slow
def test_counts_at_128k_are_exact_and_in_bounded_memory():
    """The dense mask at 128k x 128k is 16 GiB; the counts take a few MiB, and agree with the
    closed forms."""
    code = textwrap.dedent("""
        import json, resource, torch
        from bench.model import masks
        from bench.case import Case
        n = 131072
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = {}
        for s in ["causal", "window:4096", "chunked_causal:8192", "document:lengths=1000/30000/100072",
                  "prefix_lm:777", "sink:4+window:256", "dilated:2:window=64", "bigbird", "document:16:causal=1"]:
            mask, window = masks.canonical(s)
            out[s] = masks.kept_pairs(Case(batch=1, heads=1, kv_heads=1, q_len=n, kv_len=n, mask=mask, window=window))
        out["grew_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    n = 131072
    tri = lambda m: m * (m + 1) // 2  # noqa: E731
    assert got["causal"] == tri(n)
    assert got["window:4096"] == tri(4096) + (n - 4096) * 4096
    assert got["chunked_causal:8192"] == (n // 8192) * tri(8192)
    assert got["document:lengths=1000/30000/100072"] == 1000 ** 2 + 30000 ** 2 + (n - 31000) ** 2
    assert got["prefix_lm:777"] == 777 * 777 + (tri(n) - tri(777))
    # rows past the window see its 256 keys and the sinks left of it (1, 2, 3, then all 4)
    assert got["sink:4+window:256"] == tri(256) + (n - 256) * (256 + 4) - (3 + 2 + 1)
    assert got["dilated:2:window=64"] == sum(min(64, i // 2 + 1) for i in range(n))
    assert 0 < got["bigbird"] < n * n and 0 < got["document:16:causal=1"] < tri(n)
    assert got["grew_mib"] < 512, got  # a dense mask would be 16384 MiB


@pytest.mark.parametrize("text, want", [
    ("window:64", ("window", 64)), ("window", ("window", 32)), ("document:4", ("document:4", None)),
    ("softcap:30+causal", ("causal+softcap:30", None)), ("sink:4:window=256", ("sink:window=256", None)),
    ("none+softcap:50", ("softcap:50", None)), ("causal+none", ("none", None)),
    ("bigbird:block=32:seed=3", ("bigbird:32:seed=3", None)),
    ("document:lengths=64/192", ("document:lengths=64/192", None)),
])
def test_spellings_have_one_canonical_form(text, want):
    assert masks.canonical(text, window=32) == want
    assert masks.canonical(want[0], window=want[1]) == want  # and it is a fixed point


@pytest.mark.parametrize("text, says", [
    ("triangle", "unknown mask or score mod 'triangle'; masks: none, causal"),
    ("document:x", "docs takes int"), ("document:docs=4:docs=5", "given twice"),
    ("prefix_lm:1:2", "too many positional values"), ("chunked_causal:size=3", "has no parameter 'size'"),
    ("softcap:inf", "cap takes float"),
])
def test_bad_spellings_say_what_is_valid(text, says):
    with pytest.raises(masks.MaskError, match=None) as exc:
        masks.canonical(text)
    assert says in str(exc.value)


@pytest.mark.slow  # a few seconds: the quick loop leaves it to the whole suite
def test_bad_masks_on_the_command_line_exit_2_with_the_valid_ones(tmp_path, capsys):
    assert main(["sweep", "--masks", "causal,triangle", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--masks triangle" in err and "prefix_lm" in err and "softcap" in err and "Traceback" not in err
    assert main(["sweep", "--masks", "document:100", "--seq-lens", "64", "--out", str(tmp_path / "r")]) == 2
    assert "document:docs=100 needs 1 <= docs <= 64" in capsys.readouterr().err


def test_score_mods_follow_their_definitions():
    case = _case("causal+alibi+softcap:2", 6, 6, batch=1, heads=4)
    scores = torch.randn(1, 4, 6, 6, dtype=torch.float64) * 5
    got = masks.bind(case).apply_mods(scores)
    slopes = torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8], dtype=torch.float64)  # 2^(-8(h+1)/4)
    i, j = torch.arange(6).view(6, 1), torch.arange(6).view(1, 6)
    want = 2 * torch.tanh((scores + slopes.view(1, 4, 1, 1) * (j - i)) / 2)
    assert torch.allclose(got, want.to(got.dtype), atol=1e-6)
    from bench.model.mask_catalog import alibi_slopes

    assert alibi_slopes(6) == pytest.approx([2 ** (-8 * (k + 1) / 4) for k in range(4)] + [2 ** -1, 2 ** -3])


def test_each_variant_takes_what_it_declares(registry):
    causal_softcap = _case("causal+softcap:50", 16, 16)
    why = registry["sdpa"].static_reason(causal_softcap)
    assert "softcap" in why and "alibi" in why  # what it does take
    assert registry["sdpa"].static_reason(_case("document:2+alibi", 16, 16)) is None
    assert registry["naive"].static_reason(causal_softcap) is None
    assert "mask document not supported (supports window)" in registry["window.chunked"].static_reason(
        _case("document:2", 16, 16))
    assert registry["xformers"].static_reason(_case("prefix_lm:4", 16, 16)).startswith("device cpu")


CHECKER = """\
    import torch
    from bench.masks import mask

    @mask("checker", params={"cell": 8}, description="query and key cells of the same colour")
    def checker(b, h, q_idx, kv_idx, cell):
        return (q_idx // cell + kv_idx // cell) % 2 == 0
"""


@pytest.mark.slow
def test_a_plugin_mask_is_swept_checked_and_counted(tmp_path):
    assert len(textwrap.dedent(CHECKER).strip().splitlines()) <= 10
    plugin = write_plugin(tmp_path, "checker", CHECKER)
    listed = run_cli("list", "--masks", "--plugin", plugin, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    entry = {r["name"]: r for r in json.loads(listed.stdout)}["checker"]
    assert entry["params"] == {"cell": 8} and {"naive", "sdpa.math", "flex"} <= set(entry["variants"])
    out = tmp_path / "run"
    proc = run_cli("sweep", "--plugin", plugin, "--variants", "naive,sdpa.math", "--masks", "checker:4,checker",
                   "--seq-lens", "24,40", "--heads", "2", "--head-dims", "16", "--budget-ms", "5", "--out", out,
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = read_jsonl(out / "results.jsonl")
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}  # every one passed the reference check
    for r in rows:
        cell = r["mask_params"]["checker"]["cell"]
        i, j = torch.arange(r["q_len"]).view(-1, 1), torch.arange(r["kv_len"]).view(1, -1)
        kept = int(((i // cell + j // cell) % 2 == 0).sum())
        assert r["density"] == pytest.approx(kept / (r["q_len"] * r["kv_len"]), abs=1e-6)
        assert r["flops"] == 4 * 2 * kept * 16
    pictures = json.loads((out / "masks.json").read_text())
    assert set(pictures) == {"checker:4", "checker:8"}
    assert maskfile.unpack(pictures["checker:4"]["rows"])[:8, :8].tolist() == \
        [[(i // 4 + j // 4) % 2 == 0 for j in range(8)] for i in range(8)]
    assert (out / "report" / "charts" / "masks.png").exists()


EAGER_SHAPES = [(40, 136, 4, 2), (150, 45, 4, 1)]  # cross both ways: the alignment matters


WITH_MODS = ["causal+softcap:1", "causal+alibi", "alibi_symmetric", "bigbird:8+alibi+softcap:2",
             "document:3:causal=1+rel_bias:16", "padding+rel_bias:8"]


def _flex_against_the_reference(spelling, shapes, traced):
    from bench.measure.correctness import check, reference

    for q_len, kv_len, heads, kv_heads in shapes:
        mask, window = masks.canonical(fit(spelling, q_len, kv_len), window=24)
        case = Case("cpu", "float32", 2, heads, kv_heads, q_len, kv_len, 32, mask, window, "fwd")
        out, (q, k, v) = eager_flex(case, traced=traced)
        result = check(case, out, reference(case, q, k, v).out)
        assert result.ok, (spelling, q_len, kv_len, result.reason)


@pytest.mark.parametrize("spelling", BUILTIN_SPELLINGS + WITH_MODS)
def test_flex_reads_every_mask_and_score_mod_as_defined(spelling):
    """The mask_mod and score_mod FlexAttention is given, run by eager flex_attention (its
    reference implementation, no compile), against the float64 reference: self, cross both
    ways, GQA and MQA."""
    _flex_against_the_reference(spelling, EAGER_SHAPES, traced=False)


@pytest.mark.slow
@pytest.mark.parametrize("spelling", BUILTIN_SPELLINGS + WITH_MODS)
def test_dynamo_traces_every_mask_and_score_mod_whole(spelling):
    """The same definitions as torch.compile first sees them: traced whole by dynamo (fullgraph,
    flex_attention's own uncompiled default), at the cross shape with GQA."""
    _flex_against_the_reference(spelling, EAGER_SHAPES[:1], traced=True)


ALGEBRA = ["document:4&causal", "causal&window:8+sink:2", "document:lengths=20/28&window:5",
           "dilated:2:8&document:3", "document:lengths=20/28(prefix_lm:8)", "document:3(chunked_causal:4)+sink:1",
           "document:5(sink:2&window:6)"]


def _loop_keep(spelling: str, n: int) -> torch.Tensor:
    """The algebra written out as loops over (i, j) from the built-ins' own definitions."""
    def doc_of(lengths):
        return [d for d, size in enumerate(lengths) for _ in range(size)]

    def seeded_docs(docs):
        sizes = masks.bind(Case(batch=1, heads=1, kv_heads=1, q_len=n, kv_len=n, mask=f"document:{docs}"))
        kw = sizes.masks[0][1]
        return [int(x) for x in kw["doc"]]

    def base(term, i, j):
        name, *args = term.split(":")
        if name == "causal":
            return j <= i
        if name == "window":
            return j <= i and i - j < int(args[0])
        if name == "sink":
            return j <= i and j < int(args[0])  # causal sinks
        if name == "prefix_lm":
            return j < int(args[0]) or j <= i
        if name == "chunked_causal":
            return j <= i and i // int(args[0]) == j // int(args[0])
        if name == "dilated":
            return j <= i and (i - j) % int(args[0]) == 0 and (i - j) // int(args[0]) < int(args[1])
        raise AssertionError(term)

    def docs_of(term):
        args = term.split(":", 1)[1]
        return doc_of([int(x) for x in args.split("=")[1].split("/")]) if "lengths" in args else seeded_docs(args)

    def keeps(group, i, j):
        ok = True
        for term in group.split("&") if "(" not in group else [group]:
            if "(" in term:
                doc_term, inner = term[:-1].split("(")
                d = docs_of(doc_term)
                start = {x: d.index(x) for x in set(d)}
                ok &= d[i] == d[j] and all(base(t, i - start[d[i]], j - start[d[j]]) for t in inner.split("&"))
            elif term.startswith("document"):
                d = docs_of(term)
                ok &= d[i] == d[j]
            else:
                ok &= base(term, i, j)
        return ok

    return torch.tensor([[any(keeps(g, i, j) for g in spelling.split("+")) for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("spelling", ALGEBRA)
def test_intersections_and_per_document_masks_keep_what_their_loops_keep(spelling):
    n = 48
    case = Case(batch=1, heads=1, kv_heads=1, q_len=n, kv_len=n, mask=masks.canonical(spelling)[0])
    keep = masks.bind(case).keep()[0, 0]
    assert torch.equal(keep, _loop_keep(spelling, n))
    assert masks.bind(case).counts[0] == int(keep.sum())  # counted by the ranges where each part has one


def test_gym_window_is_attention_gym_s_convention():
    """attention-gym keeps q - kv <= w; attnbench's window keeps q - kv < w: gym_window:W = window:W+1."""
    a = Case(batch=1, heads=1, kv_heads=1, q_len=100, kv_len=100, mask="gym_window:7")
    b = Case(batch=1, heads=1, kv_heads=1, q_len=100, kv_len=100, mask="window", window=8)
    assert torch.equal(masks.bind(a).keep(), masks.bind(b).keep())


@pytest.mark.parametrize("bad,why", [("window:4(causal)", "only document wraps a mask"),
                                     ("document:4(causal", "unbalanced parentheses"),
                                     ("causal&softcap:5", "'&' joins masks"), ("causal&", "empty term beside '&'")])
def test_bad_algebra_says_what_is_valid(bad, why):
    with pytest.raises(masks.MaskError, match=why):
        masks.parse(bad, window=1)


@pytest.mark.parametrize("spelling", ["document:4&causal", "document:lengths=20/44(prefix_lm:8)"])
def test_the_algebra_runs_in_naive_and_chunked_online_against_the_reference(registry, spelling):
    from bench.measure.bound import bind_variant
    from bench.measure.correctness import run_and_check

    case = Case(batch=2, heads=2, kv_heads=2, q_len=64, kv_len=64, head_dim=16, mask=spelling, direction="fwd+bwd")
    for name in ("naive", "chunked.online"):
        bound = bind_variant(registry[name], case)
        result = run_and_check(case, bound.fn, *bound.inputs, bound.grad_out)
        assert result.ok, (name, result.reason)


def _bias(spelling, q_len=7, kv_len=11, heads=3, align="top-left"):
    mask, window = masks.canonical(spelling)
    case = Case(batch=1, heads=heads, kv_heads=heads, q_len=q_len, kv_len=kv_len, head_dim=8, mask=mask,
                window=window, align=align)
    bound = masks.bind(case)
    return bound.apply_mods(torch.zeros(1, heads, q_len, kv_len)), bound


@pytest.mark.parametrize("align", ["top-left", "bottom-right"])
def test_symmetric_alibi_is_flash_attentions_non_causal_alibi(align):
    """FlashAttention's attention_ref: bias = -slope * |i + kv_len - q_len - j| (bottom-right) without a
    causal mask; the one-sided alibi (attention-gym's) differs from it after the query, and agrees with it
    on every pair a causal mask keeps."""
    from bench.model.mask_catalog import alibi_slopes

    q_len, kv_len, heads = 7, 11, 3
    sym, _ = _bias("alibi_symmetric", q_len, kv_len, heads, align)
    one, _ = _bias("alibi", q_len, kv_len, heads, align)
    slopes = torch.tensor(alibi_slopes(heads)).view(1, -1, 1, 1)
    shift = kv_len - q_len if align == "bottom-right" else 0
    i, j = torch.arange(q_len).view(1, 1, -1, 1), torch.arange(kv_len).view(1, 1, 1, -1)
    assert torch.allclose(sym, -slopes * (i + shift - j).abs())
    assert torch.allclose(one, slopes * (j - i - shift))  # attention-gym's score + slope * (kv - q)
    kept = j <= i + shift
    assert torch.equal(sym.expand_as(one)[kept.expand_as(one)], one[kept.expand_as(one)])
    assert not torch.allclose(sym, one)


def test_alibi_slopes_follow_the_paper_for_any_head_count_and_gyms_differ_off_powers_of_two():
    from bench.model.mask_catalog import alibi_slopes

    def gym(heads):  # attention-gym's generate_alibi_bias: 2^(-8(h+1)/H) for every H
        return [2 ** (-8 * (h + 1) / heads) for h in range(heads)]
    assert alibi_slopes(8) == pytest.approx(gym(8))
    assert alibi_slopes(12) != pytest.approx(gym(12))
    assert alibi_slopes(12)[:8] == pytest.approx(gym(8))  # the paper: the closest power of two's first
    listing = subprocess.run([sys.executable, "-m", "bench", "list", "--masks"], capture_output=True, text=True,
                             cwd=ROOT).stdout
    assert "alibi_symmetric" in listing and "FlashAttention" in listing and "attention-gym" in listing


def test_gym_dilated_is_attention_gyms_two_sided_dilated_window_and_its_causal_half_is_dilated():
    d, w, n = 3, 7, 40
    mask, _ = masks.canonical(f"gym_dilated:{d}:window={w}")
    case = Case(batch=1, heads=1, kv_heads=1, q_len=n, kv_len=n, head_dim=8, mask=mask)
    keep = masks.bind(case).keep()[0, 0]
    i, j = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
    diff = (i - j).abs()
    assert torch.equal(keep, (diff <= w) & (diff % d == 0))  # attention-gym's dilated_sliding_window
    causal_half, _ = masks.canonical(f"dilated:{d}:window={w // d + 1}")
    ours = masks.bind(Case(batch=1, heads=1, kv_heads=1, q_len=n, kv_len=n, head_dim=8, mask=causal_half)).keep()
    assert torch.equal(keep & (j <= i), ours[0, 0])
    assert masks.bind(case).counts[0] == int(keep.sum())


def test_a_union_inside_a_document_is_refused_with_the_form_that_works(capsys):
    assert main(["sweep", "--masks", "document:4(prefix_lm:8+gym_window:16)", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "not supported" in err and "document:4(prefix_lm:8)+document:4(gym_window:16)" in err
    assert "prefix takes int" not in err
    masks.canonical("document:4(prefix_lm:8)+document:4(gym_window:16)")  # the form it names is taken


def test_a_masks_picture_is_drawn_at_a_length_where_it_shows():
    """window:256 at n = 256 is causal to the eye: its picture is at n = 1024, pooled to 256 pixels, and
    differs from causal's there; a mask of no size keeps n = 256."""
    from bench.runs import maskfile

    win, causal = maskfile.picture(Case(mask="window", window=256)), maskfile.picture(Case(mask="causal"))
    assert (win["size"], causal["size"]) == (1024, 256)
    a, b = maskfile.unpack(win["rows"]), maskfile.unpack(causal["rows"])
    assert a.shape == b.shape == (256, 256)
    assert not (a == b).all() and not a[-1, 0] and b[-1, 0]  # the last row sees no early key under the window
    assert win["density"] == pytest.approx(sum(min(i + 1, 256) for i in range(1024)) / 1024**2)
