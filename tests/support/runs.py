"""Run folders made from rows, for the report and compare tests."""

from bench.engine.store import ResultWriter, write_env


def run_folder(path, rows, env=None):
    path.mkdir(parents=True)
    w = ResultWriter(path)
    for r in rows:
        w.write(r)
    w.close()
    write_env(path, {"device": "cpu", "torch": "2.13.0", "peaks_tflops": {"float32": 0.2}} | (env or {}))
    return path


def timed_rows(variant, scale, spread, ns=(256, 512, 1024)):
    base = dict(device="cpu", dtype="float32", batch=1, heads=8, kv_heads=8, head_dim=64, mask="none",
                window=None, direction="fwd", reason="", status="ok")
    out = []
    for n in ns:
        med = scale * 1e-5 * n**2
        out.append(base | dict(variant=variant, q_len=n, kv_len=n, median_ms=med, q1_ms=med * (1 - spread),
                               q3_ms=med * (1 + spread), iqr_ms=2 * spread * med))
    return out
