"""The context-parallel variants swept over real ranks (torch.distributed's gloo, P rank processes
per cell): every rank's output shard and gradients, gathered, against the float64 reference of the
whole sequence, causal and not, forward and backward, at P = 1, 2 and 4 (torch's context_parallel
included: on the CPU its ring templates over the CPU's fused kernel); a ring that merges its
blocks without rescaling them by the new maximum is caught as a mismatch."""

import pytest

from tests.conftest import made_once, read_jsonl, run_cli

WRONG_MERGE = '''
from bench.registry import variant
from variants.cp import ring_attention


@variant("cp.ring.unscaled", description="ring attention whose merge skips the rescale by the running maximum",
         masks=("none", "causal"), cross=False, shard="zigzag")
def unscaled(case, ctx):
    return ring_attention(case, ctx, rescale=False)
'''


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    def make(folder):
        plugin = folder / "wrong_merge.py"
        plugin.write_text(WRONG_MERGE)
        variants = "cp.ring,cp.alltoall,cp.torch,cp.ring.unscaled,sdpa"
        return run_cli("sweep", "--plugin", plugin, "--variants", variants, "--ranks", "1,2,4", "--seq-lens", "64",
                       "--heads", "4", "--head-dims", "16", "--masks", "none,causal", "--directions", "fwd,fwd+bwd",
                       "--budget-ms", "20", "--device", "cpu", "--out", folder / "run", "--quiet")

    folder, proc = made_once(tmp_path_factory, "cp", make)
    out = folder / "run"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {(r["variant"], r["ranks"], r["mask"], r["direction"]): r for r in read_jsonl(out / "results.jsonl")}, out


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["cp.ring", "cp.alltoall", "cp.torch"])
def test_each_variant_matches_the_float64_reference_of_the_whole_sequence_at_every_world_size(swept, variant):
    rows, _ = swept
    for ranks in (1, 2, 4):
        for mask in ("none", "causal"):
            for direction in ("fwd", "fwd+bwd"):
                r = rows[(variant, ranks, mask, direction)]
                assert r["status"] == "ok", (ranks, mask, direction, r["reason"])
                assert r["rel_err"] < 1e-5, r
                if direction == "fwd+bwd":
                    assert r["grad_rel_err"] < 1e-4, r
                assert len(r["rank_samples_ms"]) == ranks and len(r["rank_median_ms"]) == ranks
                assert r["median_ms"] >= max(r["rank_median_ms"]) * 0.999  # the step waits for the slowest rank
                sent = r["rank_bytes_sent"]
                assert (sum(sent) == 0) == (ranks == 1)  # one rank sends nothing; more exchange their shards
                if direction == "fwd":  # the profiled step: time inside the collectives, on every rank of several
                    inside = r["rank_collective_ms"]
                    assert len(inside) == ranks and all((c > 0) == (ranks > 1) for c in inside), inside


@pytest.mark.slow
def test_each_variant_sends_what_its_scheme_exchanges(swept):
    rows, _ = swept
    shard = 4 * (64 // 2) * 16 * 4  # one rank's K (or V) at P = 2: heads x n / P x head dim x 4 bytes
    ring = rows[("cp.ring", 2, "none", "fwd")]["rank_bytes_sent"]
    assert ring == [2 * shard, 2 * shard]  # K and V to the next rank, once (P - 1 passes)
    ulysses = rows[("cp.alltoall", 2, "none", "fwd")]["rank_bytes_sent"]
    assert ulysses == [4 * shard // 2] * 2  # q, k, v and the output, half of each to the other rank
    gathered = rows[("cp.torch", 4, "none", "fwd")]["rank_bytes_sent"]
    assert gathered == [3 * 2 * (shard // 2)] * 4  # torch all-gathers K and V once: its shard to the 3 others


@pytest.mark.slow
def test_a_merge_without_the_rescale_is_a_mismatch_once_there_are_blocks_to_merge(swept):
    rows, _ = swept
    for mask in ("none", "causal"):
        assert rows[("cp.ring.unscaled", 1, mask, "fwd")]["status"] == "ok"  # one block: nothing to merge
        for ranks in (2, 4):
            r = rows[("cp.ring.unscaled", ranks, mask, "fwd")]
            assert r["status"] == "mismatch", (ranks, mask, r["reason"])


@pytest.mark.slow
def test_what_cannot_split_the_sequence_says_why(swept):
    rows, _ = swept
    assert rows[("sdpa", 1, "none", "fwd")]["status"] == "ok"
    refused = rows[("sdpa", 2, "none", "fwd")]
    assert refused["status"] == "unsupported" and "runs in one process" in refused["reason"]


@pytest.mark.slow
def test_the_report_draws_the_world_sizes(swept):
    _, out = swept
    page = (out / "report" / "index.html").read_text()
    assert "Context parallelism" in page
    assert list((out / "report" / "charts").glob("ranks_*.png"))
    table = (out / "report" / "ranks.csv").read_text().splitlines()
    assert table[0].startswith("variant,mask,direction,n,ranks,step ms") and len(table) > 1
