"""``python -m bench sweep``: settings from the preset, ``--config`` and flags into a Spec;
the engine runs it into a run folder; then the summary, the warnings and the report."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from bench.cli.common import Parser, add_setting_flags, given_settings
from bench.engine import store
from bench.engine.sweep import SweepOptions, contention_warning, failures, run_sweep
from bench.errors import UsageError
from bench.model import masks
from bench.model.row import STATUSES
from bench.model.spec import build_spec, load_config, spec_from_dict


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


def run(argv: list[str]) -> int:
    """``sweep`` with these arguments, as from the command line (for scripts such as gpu-check)."""
    p = Parser(prog="python -m bench sweep")
    add_arguments(p)
    return command(p.parse_args(argv))


def command(args) -> int:
    from bench.engine.runner import prestart
    from bench.model.registry import discover, plugin_module

    prestart(_workers_hint(args))  # the workers import torch while this process does the same
    flags = given_settings(args)
    config = load_config(args.config) if args.config else {}
    plugins = list(dict.fromkeys([*config.get("plugins", []), *flags.get("plugins", [])]))
    given = config | flags | {"plugins": plugins}
    resume = Path(args.resume) if args.resume else None
    base = None
    if resume is not None:
        if not resume.is_dir():
            raise UsageError(f"--resume {args.resume}: no such run folder")
        saved = store.read_env(resume).get("spec")
        if saved is None:
            raise UsageError(f"--resume {args.resume}: not a run folder (no env.json with a spec)")
        base = spec_from_dict(saved)  # the run's own spec: a preset changed since does not change it
        given["plugins"] = list(dict.fromkeys([*base.plugins, *plugins]))
    registry = discover(given["plugins"])
    if base is not None and "variants" not in given:
        new_modules = {plugin_module(p) for p in plugins}  # a resumed run adds new plugins' variants
        added = [v.name for v in registry if v.module in new_modules]
        given["variants"] = list(dict.fromkeys([*base.variants, *added]))
    spec = build_spec(given, registry, base)
    if flags.get("window") is not None and not any(masks.uses_window_flag(m) for m in spec.masks):
        print(f"warning: --window {','.join(map(str, flags['window']))} has no effect: no window mask in --masks "
              f"({','.join(spec.masks)}); add window to --masks to use it", file=sys.stderr)
    options = SweepOptions(resume=resume is not None, retry=frozenset(_retry_statuses(args.retry, resume)),
                           allow_env_change=args.allow_env_change, profile=args.profile, progress=not args.quiet,
                           given=given, command=shlex.join(["python", "-m", "bench", *sys.argv[1:]]))
    summary = run_sweep(spec, _run_folder(resume, args.out, spec.device), options)
    return _finish(summary, spec, args)


def _workers_hint(args) -> int:
    """How many CPU workers to start ahead: --workers when it is plain (a GPU worker sets its
    device before it imports torch, so it is never started ahead)."""
    text = str(args.workers or "1")
    if args.gpus or args.device == "cuda" or not text.isdigit():
        return 1
    return max(1, min(int(text), 64))


def _finish(summary, spec, args) -> int:
    from reports.tables import summary_table

    rows, run_dir = summary.rows, summary.run_dir
    print(summary_table(rows))
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in summary.counts.items() if v)
          + f"  ({summary.cells} cells in {summary.elapsed_s:.0f} s)")
    warning = contention_warning(rows, spec)
    if warning:
        print(warning, file=sys.stderr)
    if not args.no_report:
        from reports.build import build_report

        try:
            print(f"report: {build_report([run_dir])}")
        except Exception as exc:  # the rows are measured and kept: a report is rebuilt from them
            print(f"warning: the report could not be built ({type(exc).__name__}: {exc}); the rows are in "
                  f"{run_dir / store.RESULTS}, and `python -m bench report {run_dir}` builds it again",
                  file=sys.stderr)
    print(f"results: {run_dir / store.RESULTS}")
    print(f"timed samples: {summary.timed_s:.1f} s of {summary.elapsed_s:.1f} s wall "
          f"({100 * summary.timed_s / max(summary.elapsed_s, 1e-9):.0f}%)")
    bad = failures(rows)
    if args.strict and bad:
        print(f"strict: {len(bad)} failed cell(s), e.g. {bad[0]}", file=sys.stderr)
        return 1
    return 0


def _retry_statuses(raw: str | None, resume) -> set:
    if raw is None:
        return set()
    if resume is None:
        raise UsageError("--retry re-measures cells of an earlier run: give it with --resume RUN")
    valid = [s for s in STATUSES if s not in ("ok", "unsupported")]
    wanted = [s.strip() for s in str(raw).split(",") if s.strip()]
    bad = [s for s in wanted if s not in valid]
    if bad or not wanted:
        raise UsageError(f"--retry takes statuses from {', '.join(valid)}, got {raw!r}")
    return set(wanted)


def _run_folder(resume: Path | None, out: str | None, device: str) -> Path:
    """The folder to write: the resumed one, a new --out, or a new timestamped one.  An
    existing run is never written to without --resume (its env.json holds its history)."""
    if resume is not None:
        return resume
    if not out:
        return store.new_run_dir(device)
    path = Path(out)
    if path.is_dir() and ((path / store.RESULTS).exists() or (path / store.ENV).exists()):
        raise UsageError(f"--out {out}: already a run folder; --resume {out} measures only the cells it lacks "
                         f"(or choose a new --out)")
    return store.writable_dir(path)

