"""How the report's build time grows with the rows: a real small sweep's rows copied under other
dtypes, head dims, lengths and heads (distinct cells, the same kinds of rows a GPU sweep writes),
then ``python -m bench report`` on each size, timed, with its peak memory.

    python tests/benchmarks/report_scale.py [--rows 208,2000,20000] [--source RUN] [--keep DIR]

``--source``: a run folder to copy (default: a fresh ``sweep --preset quick``).  It prints one
line per size: rows, groups, seconds, peak RSS, the report's size; it asserts nothing.  Run it
alone on the machine (reports/README.md names it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DTYPES = {"float32": 1.0, "bfloat16": 0.55, "float16": 0.5}  # each copy's time against the source's
HEAD_DIMS = (64, 128)
SCALES = (1, 4, 16, 64, 256, 1024)  # lengths x scale: 128 and 256 become 12 lengths, 128 ... 262144
HEADS = (4, 8, 16, 32, 64)  # 20,000 rows: 3 heads, so 4 masks x 3 heads = 12 facets in each of 12 groups


def copies():
    """(dtype, head_dim, scale, heads) in the order sizes take them: dtypes, head dims and lengths
    first (a real sweep's groups), then more heads (more facets per group)."""
    for heads in HEADS:
        yield from ((d, h, s, heads) for d, h, s in itertools.product(DTYPES, HEAD_DIMS, SCALES))


def scaled(row: dict, dtype: str, head_dim: int, scale: int, heads: int) -> dict:
    r = dict(row)
    base_heads, base_dim = row["heads"], row["head_dim"]
    work = DTYPES[dtype] * scale ** 2 * (heads / base_heads) * (head_dim / base_dim)
    r.update(dtype=dtype, head_dim=head_dim, heads=heads, kv_heads=heads, q_len=row["q_len"] * scale,
             kv_len=row["kv_len"] * scale)
    for key in ("median_ms", "iqr_ms", "min_ms", "q1_ms", "q3_ms", "ci_lo_ms", "ci_hi_ms"):
        if r.get(key) is not None:
            r[key] = row[key] * work
    for key in ("samples_ms", "round_medians_ms"):
        if isinstance(r.get(key), list):
            r[key] = [x * work for x in row[key]]
    for key in ("flops", "bytes"):
        if r.get(key) is not None:
            r[key] = row[key] * scale ** 2 * heads / base_heads * head_dim / base_dim
    if r.get("peak_mem_bytes") is not None:
        r["peak_mem_bytes"] = row["peak_mem_bytes"] * scale ** 2 * heads / base_heads
    if isinstance(r.get("interleave_id"), str):
        r["interleave_id"] = f"{row['interleave_id']}-{dtype}-{head_dim}-{scale}-{heads}"
    return r


def make_run(source: Path, rows: int, out: Path) -> int:
    """``out``: a run folder of about ``rows`` rows; returns how many."""
    src = [json.loads(line) for line in (source / "results.jsonl").read_text().splitlines() if line.strip()]
    out.mkdir(parents=True, exist_ok=True)
    env = json.loads((source / "env.json").read_text())
    env["peaks_tflops"] = {d: (env.get("peaks_tflops") or {}).get("float32", 1.0) / f for d, f in DTYPES.items()}
    (out / "env.json").write_text(json.dumps(env))
    if (source / "masks.json").exists():
        (out / "masks.json").write_text((source / "masks.json").read_text())
    written = 0
    with open(out / "results.jsonl", "w") as f:
        for combo in copies():
            if written >= rows:
                break
            for r in src[:rows - written]:
                f.write(json.dumps(scaled(r, *combo)) + "\n")
                written += 1
    return written


def groups_of(report: Path) -> int:
    text = (report / "index.html").read_text(encoding="utf-8")
    return text.count("<option value=") or 1


WRAP = """
import resource, sys
from bench.cli import main
try:
    main(["report", sys.argv[1]])
finally:
    self_, kids = (resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(self_ + kids, file=sys.stderr)
"""


def build(run: Path) -> tuple[float, float]:
    """Seconds and peak RSS (MiB: this process's and its largest drawing process's) of
    ``python -m bench report RUN``, in a process of its own."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WRAP, str(run)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    return seconds, int(done.stderr.strip().splitlines()[-1]) / 1024


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="208,2000,20000", help="sizes, comma-separated")
    p.add_argument("--source", type=Path, help="a run folder to copy (default: a fresh quick sweep)")
    p.add_argument("--keep", type=Path, help="write the run folders here and keep them")
    p.add_argument("--again", action="store_true", help="build each report a second time (the chart cache)")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = a.keep or Path(tmp)
        source = a.source
        if source is None:
            source = where / "source"
            subprocess.run([sys.executable, "-m", "bench", "sweep", "--preset", "quick", "--out", str(source),
                            "--no-report", "--quiet"], check=True, cwd=ROOT)
        print(f"{'rows':>7} {'groups':>6} {'seconds':>8} {'peak MiB':>8} {'report MiB':>10}"
              + (f" {'again s':>8}" if a.again else ""))
        for size in (int(x) for x in a.rows.split(",")):
            run = where / f"rows-{size}"
            n = make_run(source, size, run)
            seconds, peak = build(run)
            line = (f"{n:>7} {groups_of(run / 'report'):>6} {seconds:>8.1f} {peak:>8.0f} "
                    f"{(run / 'report' / 'index.html').stat().st_size / 2**20:>10.1f}")
            if a.again:
                line += f" {build(run)[0]:>8.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
