"""``python -m bench sweep``: settings from the preset, ``--config`` and flags into a Spec;
the engine runs it into a run folder; then the summary, the warnings and the report."""

from __future__ import annotations

import math
import shlex
import sys
import time
from pathlib import Path

from bench.cli.common import Parser, add_setting_flags, bars, given_settings, process_started
from bench.engine import spans
from bench.engine.runner import prestart, release_prestarted
from bench.errors import UsageError
from bench.model.digits import is_digits
from bench.model.row import STATUSES, current_rows
from bench.runs import store

# torch and the engine are imported once the workers are started (prestart): they import
# theirs meanwhile


def add_parser(sub) -> None:
    sp = sub.add_parser("sweep", help="run a sweep and write a run folder and its report")
    add_arguments(sp)
    sp.set_defaults(func=command)


def add_arguments(sp) -> None:
    add_setting_flags(sp)
    sp.add_argument("--config", metavar="FILE.toml", help="axis values and settings; flags override it")
    sp.add_argument("--out", metavar="DIR", help="run folder (default: runs/<timestamp>-<device>)")
    sp.add_argument("--resume", metavar="DIR", help="run only the cells DIR lacks, appending to it")
    sp.add_argument("--retry", metavar="STATUSES",
                    help="with --resume: measure again the cells whose row has one of these statuses, e.g. "
                         "crash,timeout,oom (the old rows stay in the file; reports use the newest)")
    sp.add_argument("--allow-env-change", dest="allow_env_change", action="store_true",
                    help="with --resume: go on although this machine's fingerprint differs from the run's "
                         "(the report marks the run mixed)")
    sp.add_argument("--profile", action="store_true",
                    help="profile every ok cell once the timing is done (category shares in "
                         "profile.jsonl, a breakdown chart in the report)")
    sp.add_argument("--no-report", dest="no_report", action="store_true", help="skip the report")
    sp.add_argument("--strict", action="store_true",
                    help="exit 1 when any cell is error, crash, timeout, mismatch or oom, or unsupported "
                         "without a reason")
    sp.add_argument("--quiet", action="store_true", help="no progress bar")
    sp.add_argument("--trace-spans", dest="trace_spans", action="store_true",
                    help="print where the command's wall time went, span by span, and write it to the run "
                         "folder's spans.json")
    sp.add_argument("--dry-run", dest="dry_run", action="store_true",
                    help="print the cell count and the projected wall time (per shard and per worker), then exit")


def run(argv: list[str]) -> int:
    """``sweep`` with these arguments, as from the command line (for scripts such as gpu-check)."""
    p = Parser(prog="python -m bench sweep")
    add_arguments(p)
    args = p.parse_args(argv)
    args.started = time.perf_counter()  # not the process's start: the caller did other work before
    return command(args)


def command(args) -> int:
    if getattr(args, "started", None) is None:
        args.started = process_started()  # the command's wall time counts the interpreter's start-up
    if getattr(args, "trace_spans", False):
        spans.enable()
        spans.absorb({"start-up: the interpreter and its imports": (time.perf_counter() - args.started, 1)})
    with spans.span("start-up: flags"):
        flags = given_settings(args)  # a value no setting takes is refused before any worker starts
    prestart(_workers_hint(args))  # the workers import torch while this process does the same
    try:
        return _command(args, flags)
    finally:
        release_prestarted()  # any that no worker took (a dry run, a refusal)
        spans.enable(False)  # a traced command's totals are its own (a script may call sweeps in turn)


def _command(args, flags: dict) -> int:
    from bench.engine.prepare import prepare
    from bench.engine.request import sweep_spec
    from bench.engine.sweep import SweepOptions, run_sweep
    from bench.measure import cpuload
    from bench.model import masks

    resume = Path(args.resume) if args.resume else None
    with spans.span("start-up: the spec and its variants"):
        spec, registry, given = sweep_spec(flags, resume, args.config,  # the one path bench.api takes too
                                           here=not args.dry_run)  # a dry run plans a GPU sweep on any machine
    if flags.get("window") is not None and not any(masks.uses_window_flag(m) for m in spec.masks):
        print(f"warning: --window {','.join(map(str, flags['window']))} has no effect: no window mask in --masks "
              f"({','.join(spec.masks)}); add window to --masks to use it", file=sys.stderr)
    if resume is not None and args.out and Path(args.out).resolve() != resume.resolve():
        raise UsageError(f"--resume {resume} writes into that run folder; --out {args.out} names another: give one "
                         f"of them")
    _tree_alignment_warning(spec)
    from bench.cli import subcommands

    for module in subcommands():  # a feature's command may run this sweep its own way (the jobs: --executor)
        instead = getattr(module, "sweep_instead", None)
        if instead is not None and (code := instead(spec, registry, args, resume)) is not None:
            return code
    target = _run_folder(resume, args.out, spec, create=False)
    resumed = resume is not None or (spec.shard is not None and (target / store.ENV).exists())
    retry = frozenset(_retry_statuses(args.retry, resume))
    with spans.span("start-up: the load probe"):
        others = cpuload.others_busy(tree=True) if spec.device == "cpu" else None  # its own workers: not others
    # prepared once (bench.engine.prepare): the plan prices what is left, the sweep runs it
    prepared = prepare(spec, registry, target if resumed else None, retry, report=not args.no_report, others=others)
    projection = prepared.projection
    if retry and not prepared.todo:
        print(f"--retry {args.retry}: no cell of {resume} is {' or '.join(sorted(retry))} (by its newest row), and "
              f"none is missing: nothing to measure")
        return 0
    covers = _covers(spec, given)
    lines = [covers] if covers else []
    lines += projection.lines() if projection is not None else [f"{len(prepared.todo)} cells"]
    if args.dry_run:
        print("\n".join(lines + _elsewhere(spec)))
        return 0
    run_dir = _run_folder(resume, args.out, spec)  # a folder that cannot be written is refused before the plan
    print("plan: " + "; ".join(lines), file=sys.stderr)
    options = SweepOptions(resume=resumed, retry=retry, allow_env_change=args.allow_env_change, profile=args.profile,
                           progress=not args.quiet, bars=bars, given=given,
                           command=shlex.join(["python", "-m", "bench", *sys.argv[1:]]),
                           projected_s=getattr(projection, "wall_s", None),
                           model_rest_s=getattr(projection, "model_rest_s", None),
                           model=getattr(projection, "model", None), others_cores_start=others)
    summary = run_sweep(spec, run_dir, options, registry, prepared)
    return _finish(summary, spec, args, options.projected_s)


def _elsewhere(spec) -> list[str]:
    """A dry run of a device this machine lacks (a GPU sweep planned on a laptop): where its rates come
    from, the GPUs earlier runs here measured on, or the cost model's defaults."""
    from bench.model.specbuild import default_device
    from bench.runs import store

    if spec.device == default_device():
        return []
    gpus = set()
    for path in sorted(Path(store.DEFAULT_ROOT).glob(f"*/{store.ENV}"), key=lambda p: p.stat().st_mtime)[-100:]:
        try:
            env = store.read_env(path.parent)
        except Exception:  # an unreadable env.json says nothing of where rates come from
            continue
        if env.get("device") == spec.device and env.get("device_name"):
            gpus.add(str(env["device_name"]))
    gpus = sorted(gpus)
    return [f"planned for {spec.device}, which this machine lacks: "
            + (f"rates from earlier runs here on {', '.join(gpus)}" if gpus else
               f"no {spec.device} run is recorded here, so the rates are the cost model's defaults for {spec.device} "
               f"(bench.features.cost_model.plan), not a measured GPU's; a dry run on the GPU itself prices with "
               f"what its earlier runs measured")]


def _tree_alignment_warning(spec) -> None:
    """A draft tree under top-left alignment with more keys than queries: the cache's keys sit after
    the tree's positions and are never seen; verification runs bottom-right."""
    trees = [m for m in spec.masks if "tree" in m]
    longer = [kv for kv in (spec.kv_lens or []) if any(kv > q for q in spec.seq_lens)]
    if trees and longer and "top-left" in spec.align:
        print(f"warning: --masks {','.join(trees)} under --align top-left with --kv-lens {longer[0]} above the query "
              f"length: the tree's queries sit at the first positions and never see the cache's keys; draft "
              f"verification runs --align bottom-right", file=sys.stderr)


def _workers_hint(args) -> int:
    """How many CPU workers to start ahead: --workers when it is plain (a GPU worker sets its
    device before it imports torch, so it is never started ahead), and none when it asks for
    more workers than this process has cores (the placement refuses it in a moment, and
    nothing is started for it meanwhile), or for a dry run, which measures nothing."""
    from bench.measure.cpuload import usable_cpus

    if getattr(args, "dry_run", False):
        return 0
    text = str(args.workers or "1")
    if args.gpus or args.device == "cuda" or not is_digits(text):
        return 1
    if int(text) > len(usable_cpus()):
        return 0
    return max(1, int(text))


def _finish(summary, spec, args, projected_s: float | None = None) -> int:
    from bench.engine.sweep import contention_warning
    from bench.runs.judge import failures
    from reports.tables import summary_table

    rows, run_dir = summary.rows, summary.run_dir
    with spans.span("summary"):
        print(summary_table(rows))
        for note in summary.remeasured:
            print(note)
        print("statuses: " + ", ".join(f"{k} {v}" for k, v in summary.counts.items() if v)
              + f"  ({summary.cells - summary.idle} cells swept in {summary.elapsed_s:.0f} s"
              + (f"; {summary.idle} that cannot run here, not swept" if summary.idle else "") + ")")
        print(shaky_count(rows, summary.settled, run_dir))
        warning = contention_warning(rows, spec)
    if warning:
        print(warning, file=sys.stderr)
    report_s, report, report_failed = 0.0, None, False
    if not args.no_report:
        from reports.build import build_report

        t0 = time.perf_counter()
        try:
            with spans.span("report"):
                report = build_report([run_dir])
        except Exception as exc:  # the rows are measured and kept: a report is rebuilt from them
            report_failed = True
            print(f"error: the report could not be built ({type(exc).__name__}: {exc}); the rows are kept in "
                  f"{run_dir / store.RESULTS}, and `python -m bench report {run_dir}` builds it again",
                  file=sys.stderr)
        report_s = time.perf_counter() - t0
    print(f"results: {run_dir / store.RESULTS}")
    command_s = time.perf_counter() - args.started
    print(timed_share(summary.timed_s, summary.elapsed_s, command_s, report_s)
          + (f"; projected {projected_s:.3g} s, {command_s / projected_s:.2f}x of it measured" if projected_s else ""))
    if spans.enabled():
        totals = spans.take()
        print("\n".join(spans.lines(totals, command_s)))
        print(f"spans: {spans.write(run_dir, totals, command_s, summary.timed_s)}")
    if report is not None:
        print(f"report: {report}")  # the last line: what to open
    bad = failures(rows)
    if args.strict and bad:
        print(f"strict: {len(bad)} failed cell(s), e.g. {bad[0]}", file=sys.stderr)
        return 1
    return 1 if report_failed else 0  # a report that was asked for and not built is a failed command


def shaky_count(rows, remeasured: frozenset = frozenset(), run_dir=None) -> str:
    """How many of the ok cells (their current rows) are shaky, by reason, and what would help."""
    from bench.runs import judge

    current = current_rows(rows)
    t = judge.trust(current)
    text = f"shaky: {t.shaky} of {t.ok} ok cells ({judge.reasons_text(t.counts)})"
    wide = (f"; {t.noisy} with an interval beyond +-5% (noisy: shown with the cell, not shaky, since what the "
            f"report concludes from a cell takes its interval into account)") if t.noisy else ""
    if not t.shaky:
        return text + wide
    return text + "; " + "; ".join(remedies(current, t, remeasured, run_dir)) + wide


def remedies(rows, t, remeasured: frozenset = frozenset(), run_dir=None) -> list[str]:
    """What would help each reason the cells are shaky for, with its cost where it can be told;
    never a remedy the sweep has just applied (``remeasured``: the flags its end-of-sweep pass
    measured again); ``run_dir``: the run folder its commands name (RUN where none is given)."""
    from bench.runs import judge

    run = shlex.quote(str(run_dir)) if run_dir else "RUN"
    out = []
    for flag, n in t.counts.items():
        if not n:
            continue
        if flag == "few_samples":
            need, more = judge.interval_cost(rows)
            out.append(f"{n} with too few samples: --ceiling-s {max(1, math.ceil(need))} would give them an interval "
                       f"(about {more / 60:.1f} more minutes of timing: --resume {run} --retry few_samples)")
        elif flag == "contended" and "contended" in remeasured:
            out.append(f"{n} contended after the end-of-sweep re-measurement: a quieter machine, or fewer --threads "
                       f"than cores")
        else:
            out.append(f"{n} {judge.WHY[flag]}: {judge.remedy(flag, run_dir)}")
    return out


def timed_share(timed_s: float, cells_s: float, command_s: float, report_s: float) -> str:
    """The sweep's last line: how much of the wall time was timed samples, of the cells' and
    of the whole command's (the rest: start-up, peaks, summary, report)."""
    def pct(part, whole):
        return f"{100 * part / max(whole, 1e-9):.0f}%"

    command_s = max(command_s, cells_s + report_s)
    rest = command_s - cells_s - report_s
    return (f"timed samples: {timed_s:.3g} s, {pct(timed_s, cells_s)} of the cells' {cells_s:.3g} s wall and "
            f"{pct(timed_s, command_s)} of the command's {command_s:.3g} s (start-up, peaks and summary {rest:.3g} s"
            + (f", report {report_s:.3g} s)" if report_s else ")"))


def _retry_statuses(raw: str | None, resume) -> set:
    if raw is None:
        return set()
    if resume is None:
        raise UsageError("--retry re-measures cells of an earlier run: give it with --resume RUN")
    from bench.runs.judge import RETRY_FLAGS

    valid = [s for s in STATUSES if s not in ("ok", "unsupported")] + list(RETRY_FLAGS)
    wanted = [s.strip() for s in str(raw).split(",") if s.strip()]
    bad = [s for s in wanted if s not in valid]
    if bad or not wanted:
        raise UsageError(f"--retry takes statuses from {', '.join(v for v in valid if v not in RETRY_FLAGS)} "
                         f"and the flags {', '.join(RETRY_FLAGS)} (ok cells with too few samples for an interval, "
                         f"noisy, contended, throttled, or shaky: any of them), got {raw!r}")
    return set(wanted)


def _run_folder(resume: Path | None, out: str | None, spec, create: bool = True) -> Path:
    """The folder to write: the resumed one, a new --out, a shard's own folder in its sweep's
    (runs/<sweep id>/shard-i-of-N, resumed when it exists), or a new timestamped one.  An
    existing run is never written to without --resume (its env.json holds its history)."""
    if resume is not None:
        return resume
    if not out and spec.shard:
        from bench.model.spec import shard_pair, sweep_id

        i, n = shard_pair(spec.shard)
        folder = store.shard_folder(store.DEFAULT_ROOT / sweep_id(spec), i, n)
        return store.writable_dir(folder) if create else folder
    if not out:
        return store.new_run_dir(spec.device) if create else store.DEFAULT_ROOT / "(new)"
    path = Path(out)
    if path.is_dir() and ((path / store.RESULTS).exists() or (path / store.ENV).exists()):
        raise UsageError(f"--out {out}: already a run folder; --resume {out} measures only the cells it lacks "
                         f"(or choose a new --out)")
    return store.writable_dir(path) if create else path


def _covers(spec, given: dict) -> str:
    """What the preset covers, as its TOML says (``about``), when no flag changed what it sweeps."""
    from bench.model.spec import AXES
    from bench.model.specbuild import preset_about

    about = preset_about(spec.device, spec.preset)
    changed = [k for k in given if k in AXES and given[k] is not None]
    return f"preset {spec.preset}: {about}" if about and not changed and not spec.model else ""
