"""Sweep specification: presets, axis values from flags or a TOML file, and expansion
into cells (variant x case).  All user errors raise UsageError with what is valid."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

from bench.case import DIRECTIONS, DTYPES, MASKS, MAX_DIM, MAX_LEN, Case, CaseError, normalize_dtype
from bench.errors import UsageError

AXES = ("variants", "seq_lens", "kv_lens", "heads", "kv_heads", "head_dims", "batch", "dtypes",
        "masks", "window", "directions")
INT_AXES = ("seq_lens", "kv_lens", "heads", "kv_heads", "head_dims", "batch", "window")
AXIS_LIMITS = {"seq_lens": MAX_LEN, "kv_lens": MAX_LEN, "window": MAX_LEN, "heads": MAX_DIM, "kv_heads": MAX_DIM,
               "head_dims": MAX_DIM, "batch": MAX_DIM}
SETTINGS = ("device", "timeout", "budget_ms", "preset", "threads", "precision", "rounds")

PRESETS = {
    "cpu": {
        "quick": dict(seq_lens=[128, 256], heads=[4], head_dims=[64], batch=[1], dtypes=["float32"],
                      masks=list(MASKS), window=[64], directions=["fwd", "fwd+bwd"], budget_ms=150),
        "default": dict(seq_lens=[256, 512, 1024, 2048, 4096], heads=[8], head_dims=[64], batch=[1],
                        dtypes=["float32"], masks=list(MASKS), window=[256],
                        directions=["fwd"], budget_ms=300),
        "full": dict(seq_lens=[256, 512, 1024, 2048, 4096, 8192], heads=[8], head_dims=[64, 128],
                     batch=[1], dtypes=["float32", "bfloat16"], masks=list(MASKS), window=[256],
                     directions=["fwd", "bwd"], budget_ms=1000),
        # decode: the next token (and 4, as speculative decoding verifies) against a KV cache;
        # mask none is causal for the newest tokens (they see the whole cache)
        "decode": dict(variants=["naive", "sdpa", "sdpa.math", "sdpa.flash", "flex"], seq_lens=[1, 4],
                       kv_lens=[1024, 4096, 16384, 32768], heads=[32], kv_heads=[8], head_dims=[128], batch=[1],
                       dtypes=["float32"], masks=["none"], window=[256], directions=["fwd"], budget_ms=200),
    },
    "cuda": {
        "quick": dict(seq_lens=[512, 1024], heads=[8], head_dims=[64], batch=[2],
                      dtypes=["bfloat16"], masks=list(MASKS), window=[128],
                      directions=["fwd", "bwd"], budget_ms=50),
        "default": dict(seq_lens=[512, 1024, 2048, 4096, 8192, 16384], heads=[16], head_dims=[64, 128],
                        batch=[4], dtypes=["bfloat16", "float16"], masks=list(MASKS), window=[256],
                        directions=["fwd", "bwd"], budget_ms=100),
        "full": dict(seq_lens=[256, 512, 1024, 2048, 4096, 8192, 16384, 32768], heads=[16],
                     kv_heads=[16, 4], head_dims=[64, 128], batch=[4], dtypes=["bfloat16", "float16"],
                     masks=list(MASKS), window=[256, 1024], directions=["fwd", "bwd", "fwd+bwd"],
                     budget_ms=200),
        "decode": dict(variants=["naive", "sdpa", "sdpa.flash", "sdpa.efficient", "sdpa.cudnn", "flex", "xformers"],
                       seq_lens=[1, 4], kv_lens=[4096, 16384, 65536, 131072], heads=[32], kv_heads=[8],
                       head_dims=[128], batch=[8], dtypes=["bfloat16"], masks=["none"], window=[256],
                       directions=["fwd"], budget_ms=100),
    },
}
DEFAULT_TIMEOUT_S = {"cpu": 300.0, "cuda": 120.0}


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class Spec:
    device: str
    preset: str
    variants: list[str]
    seq_lens: list[int]
    kv_lens: list[int] | None
    heads: list[int]
    kv_heads: list[int] | None
    head_dims: list[int]
    batch: list[int]
    dtypes: list[str]
    masks: list[str]
    window: list[int]
    directions: list[str]
    timeout: float
    budget_ms: float
    plugins: list[str] = field(default_factory=list)
    threads: int | None = None  # the worker's torch threads (None: torch's default)
    precision: float = 2.0  # percent: the CPU timer stops when the median's 95% CI is within +-this
    rounds: int = 3  # interleaved rounds per case

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def cases(self) -> list[Case]:
        """Every case, grouped so that cells sharing inputs run back to back, and ordered
        from small to large n within a group."""
        from bench import masks

        out, seen = [], set()
        for dtype, direction, spelling, batch, heads, head_dim in itertools.product(
                self.dtypes, self.directions, self.masks, self.batch, self.heads, self.head_dims):
            for kv_heads in self.kv_heads or [heads]:
                for size in (self.window if masks.uses_window_flag(spelling) else [None]):
                    try:
                        mask, window = masks.canonical(spelling, size)
                    except masks.MaskError as exc:
                        raise UsageError(f"--masks {spelling}: {exc}") from None
                    for q_len in sorted(self.seq_lens):
                        for kv_len in self.kv_lens or [q_len]:
                            try:
                                case = Case(self.device, dtype, batch, heads, kv_heads, q_len, kv_len,
                                            head_dim, mask, window, direction)
                                masks.bind(case)  # parameters that do not fit the lengths are refused here
                            except (CaseError, masks.MaskError) as exc:
                                raise UsageError(str(exc)) from None
                            if case not in seen:
                                seen.add(case)
                                out.append(case)
        return out


def as_list(key, value):
    if isinstance(value, (list, tuple)):
        items = list(value)
    elif isinstance(value, str):
        items = [x.strip() for x in value.split(",") if x.strip()]
    else:
        items = [value]
    if not items:
        raise UsageError(f"--{key.replace('_', '-')} is empty; give at least one value")
    if key in INT_AXES:
        flag, limit = f"--{key.replace('_', '-')}", AXIS_LIMITS[key]
        ints = []
        for x in items:  # 64.5 and true are not lengths: no silent conversion
            if isinstance(x, bool) or not (isinstance(x, int) or (isinstance(x, str) and x.lstrip("+-").isdigit())):
                raise UsageError(f"{flag} takes positive integers up to {limit:,}, got {x!r}")
            ints.append(int(x))
        bad = [x for x in ints if not 1 <= x <= limit]
        if bad:
            raise UsageError(f"{flag} takes positive integers up to {limit:,}, got {bad[0]}")
        return list(dict.fromkeys(ints))
    return list(dict.fromkeys(str(x) for x in items))  # a value given twice is one cell, not two


def _check_masks(spellings) -> None:
    from bench import masks

    for text in spellings:
        try:
            masks.parse(str(text), window=1)
        except masks.MaskError as exc:
            raise UsageError(f"--masks {text}: {exc}") from None


def _check_choice(key, values, valid):
    for v in values:
        if v not in valid:
            raise UsageError(f"unknown {key} {v!r}; valid: {', '.join(valid)}")


def load_config(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--config {path}: no such file")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: malformed TOML: {exc}") from None
    data = data.get("sweep", data)  # keys at top level or under [sweep]
    if not isinstance(data, dict):
        raise UsageError(f"--config {path}: 'sweep' must be a table ([sweep] with keys under it), "
                         f"got {type(data).__name__}")
    norm = {k.replace("-", "_"): v for k, v in data.items()}
    valid = AXES + SETTINGS + ("plugins",)
    unknown = sorted(set(norm) - set(valid))
    if unknown:
        raise UsageError(f"--config {path}: unknown key {unknown[0]!r}; valid: {', '.join(valid)}")
    return norm


def build_spec(given: dict, registry) -> Spec:
    """``given``: axis and setting values from the config file overlaid with flags (None = unset)."""
    device = given.get("device") or default_device()
    if device not in ("cpu", "cuda"):
        raise UsageError(f"unknown device {device!r}; valid: cpu, cuda")
    if device == "cuda" and default_device() != "cuda":
        raise UsageError("device cuda: CUDA is not available on this machine; valid here: cpu")
    preset = given.get("preset") or "default"
    if preset not in PRESETS[device]:
        raise UsageError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS[device])}")
    values = dict(PRESETS[device][preset])
    values.update({k: v for k, v in given.items() if v is not None and k in AXES + ("budget_ms",)})
    axes = {}
    for key in AXES:
        raw = values.get(key)
        axes[key] = None if raw is None else as_list(key, raw)
    axes["dtypes"] = list(dict.fromkeys(normalize_dtype(d) for d in axes["dtypes"]))
    _check_choice("dtype", axes["dtypes"], DTYPES)
    _check_masks(axes["masks"])
    _check_choice("direction", axes["directions"], DIRECTIONS)
    if axes["variants"] is None:
        axes["variants"] = registry.names()
    _check_choice("variant", axes["variants"], registry.names())
    for h, kvh in itertools.product(axes["heads"], axes["kv_heads"] or []):
        if h % kvh:
            raise UsageError(f"heads {h} is not divisible by kv_heads {kvh}; kv_heads must divide heads "
                             f"(GQA groups of equal size)")
    try:
        timeout = float(given.get("timeout") or DEFAULT_TIMEOUT_S[device])
        budget = float(values["budget_ms"])
    except (TypeError, ValueError):
        raise UsageError("--timeout and --budget-ms take numbers") from None
    if not (timeout > 0 and budget > 0) or math.isinf(timeout) or math.isinf(budget):
        raise UsageError("--timeout and --budget-ms must be positive, finite numbers")
    if timeout * 1e3 < budget:
        raise UsageError(f"--timeout {timeout:g} s is shorter than the timing budget (--budget-ms {budget:g}): no cell "
                         f"could finish; give a timeout of at least {math.ceil(budget / 1e3)} s")
    threads = _setting(given, "threads", None, 1, 4096, whole=True)
    rounds = _setting(given, "rounds", 3, 1, 100, whole=True)
    precision = _setting(given, "precision", 2.0, 0.1, 50.0, whole=False)
    return Spec(device=device, preset=preset, timeout=timeout, budget_ms=budget,
                plugins=list(given.get("plugins") or []), threads=threads, precision=precision,
                rounds=rounds, **axes)


def _setting(given: dict, key: str, default, lo, hi, whole: bool):
    """A numeric setting from flags or TOML, checked against [lo, hi] (nan and booleans refused)."""
    raw = given.get(key)
    if raw is None:
        return default
    what = f"--{key.replace('_', '-')} takes {'a whole number' if whole else 'a number'} from {lo:g} to {hi:g}"
    try:
        if isinstance(raw, bool) or (whole and isinstance(raw, float) and not raw.is_integer()):
            raise ValueError
        value = int(raw) if whole else float(raw)
    except (TypeError, ValueError):
        raise UsageError(f"{what}, got {raw!r}") from None
    if not lo <= value <= hi:  # also refuses nan
        raise UsageError(f"{what}, got {value if whole else repr(raw)}")
    return value


def availability_on_this_machine(v, device: str | None = None, direction: str = "fwd") -> tuple[bool, str]:
    """Availability for a representative case of ``v`` on ``device``: the variant's own
    first mask and dtype, ``direction``, at a modest size."""
    from bench.registry import available

    device = device or default_device()
    dtype = "float32" if device == "cpu" else "bfloat16"
    if dtype not in v.dtypes:
        dtype = v.dtypes[0]
    mask = v.default_mask
    case = Case(device=device, dtype=dtype, batch=1, heads=8, kv_heads=8, q_len=256, kv_len=256,
                head_dim=64, mask=mask, window=64 if mask == "window" else None, direction=direction)
    return available(v, case)
