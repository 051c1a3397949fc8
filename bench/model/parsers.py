"""The value parsers of the settings: raw value (a flag's text, a TOML value, a preset's) ->
typed value, or a UsageError that says what is valid.  ``bench.model.spec`` declares which
setting takes which."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from bench.errors import UsageError
from bench.model import digits
from bench.model.case import MASK_FORM, MASK_SPELLING


def _items(raw, name: str) -> list:
    if isinstance(raw, (list, tuple)):
        items = list(raw)
    elif isinstance(raw, str):
        items = [x.strip() for x in raw.split(",")]
        if len(items) > 1 and not all(items):
            raise UsageError(f"{name} {raw}: an empty value between commas; give values joined by single commas, "
                             f"e.g. {name} {','.join(x for x in items if x) or '...'}")
        items = [x for x in items if x]
    else:
        items = [raw]
    if not items:
        raise UsageError(f"{name} is empty; give at least one value")
    return items


def _ascii_note(raw) -> str:
    """What a refusal adds when the value holds digits of another script (², ６): only ASCII's are taken."""
    return f" ({digits.ASCII} only)" if isinstance(raw, str) and not raw.isascii() else ""


def ints(limit: int, lo: int = 1):
    what = "positive integers" if lo == 1 else f"integers from {lo}"

    def parse(raw, name: str) -> list[int]:
        out = []
        for x in _items(raw, name):  # 64.5 and true are not lengths: no silent conversion
            if isinstance(x, bool) or not (isinstance(x, int) or digits.is_int(x)):
                raise UsageError(f"{name} takes {what} up to {limit:,}, got {x!r}{_ascii_note(x)}")
            if not lo <= int(x) <= limit:
                raise UsageError(f"{name} takes {what} up to {limit:,}, got {int(x)}")
            out.append(int(x))
        return list(dict.fromkeys(out))  # a value given twice is one cell, not two
    return parse


def ranks(limit: int):
    """World sizes: positive integers, or ``all`` (every GPU of the node on CUDA, every core on the
    CPU; bench.model.spec resolves it for the sweep's device)."""
    counts = ints(limit)

    def parse(raw, name: str) -> list:
        items = [str(x).strip().lower() if isinstance(x, str) else x for x in _items(raw, name)]
        if "all" in items:
            if len(items) > 1:
                raise UsageError(f"{name} all is every device (or core) alone: give all, or world sizes such as 1,2,4")
            return ["all"]
        return counts(items, name)
    return parse


def head_dims(limit: int):
    """Head dims: 64, or 192/128 for a query/key head dim of 192 and a value head dim of 128
    (multi-head latent attention); a pair of equal dims is the one dim."""
    valid = f"positive integers up to {limit:,}, or QK/V such as 192/128 (the value head dim apart)"

    def one(x, name):
        if isinstance(x, bool) or not (isinstance(x, int) or digits.is_int(x)):
            raise UsageError(f"{name} takes {valid}, got {x!r}{_ascii_note(x)}")
        if not 1 <= int(x) <= limit:
            raise UsageError(f"{name} takes {valid}, got {int(x)}")
        return int(x)

    def parse(raw, name: str) -> list:
        out = []
        for x in _items(raw, name):
            parts = str(x).split("/") if isinstance(x, str) else [x]
            if len(parts) > 2:
                raise UsageError(f"{name} takes {valid}, got {x!r}")
            d = [one(p, name) for p in parts]
            out.append(d[0] if len(d) == 1 or d[0] == d[1] else f"{d[0]}/{d[1]}")
        return list(dict.fromkeys(out))
    return parse


def split_dims(value) -> tuple[int, int | None]:
    """(head_dim, head_dim_v or None) of one --head-dims value (64 or '192/128')."""
    if isinstance(value, str) and "/" in value:
        d, dv = value.split("/")
        return int(d), int(dv)
    return int(value), None


def text(raw, name: str) -> str:
    return str(raw)


def texts(raw, name: str) -> list[str]:
    return list(dict.fromkeys(str(x) for x in _items(raw, name)))


def choices(what: str, valid, normalize: Callable[[str], str] = str):
    def parse(raw, name: str) -> list[str]:
        values = list(dict.fromkeys(normalize(str(x)) for x in _items(raw, name)))
        for v in values:
            if v not in valid:
                raise UsageError(f"unknown {what} {v!r}; valid: {', '.join(valid)}")
        return values
    return parse


SCOPE_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,39}$")


def scope_names(raw, name: str) -> list[str]:
    """--scope values, checked for their form here; their names are checked when the cases are
    built, once the plugins (which may add a scope: bench.model.scope) are loaded."""
    from bench.model import scope

    values = list(dict.fromkeys(str(x).strip().lower() for x in _items(raw, name)))
    for v in values:
        if not SCOPE_NAME.match(v):
            raise UsageError(f"{name} {v!r}: a scope is named in lower-case letters, digits, '_', '.' or '-', "
                             f"starting with a letter (built in: {', '.join(scope.names())})")
    return values


def mask_spellings(raw, name: str) -> list[str]:
    """Mask spellings, checked for their form here; their names are checked by ``build_spec``,
    once the plugins (which may define masks) are loaded. A well-formed spelling is read without
    torch (``bench.model.mask_spelling``), so that the workers can start importing it before this
    process does; a malformed one is parsed by the catalogue for its own words."""
    from bench.model import mask_spelling

    values = texts(raw, name)
    for text in values:
        try:
            mask_spelling.check_size(text)
        except mask_spelling.MaskError as exc:
            raise UsageError(f"--masks: {exc}") from None
        if any(not term.strip() for term in text.split("+")):
            raise UsageError(f"--masks {text}: an empty term between '+' signs; join terms such as "
                             f"causal+softcap:50")
        if not MASK_SPELLING.match(text):
            from bench.model import masks

            try:  # the parser's own words where it has some (an empty term beside '&', a wrapper's form)
                masks.parse(text, window=1)
                specific = ""
            except masks.MaskError as exc:
                specific = "" if str(exc).startswith("unknown mask") else f"{exc}; "
            raise UsageError(f"--masks {text}: {specific}{MASK_FORM} (python -m bench list --masks)")
    return values


def workload_spellings(kind: str):
    """--lengths, --inputs, --kv-layout or --batch-mix values, each checked and written in its one
    canonical form."""
    def parse(raw, name: str) -> list[str]:
        from bench.model import workload

        canonical = {"lengths": workload.canonical_lengths, "inputs": workload.canonical_inputs,
                     "kv_layout": workload.canonical_kv_layout, "mix": workload.canonical_mix}[kind]
        try:
            if kind == "mix":  # a trace (@FILE) is read here and sampled when the spec is built (--trace-mixes)
                return list(dict.fromkeys(_trace_checked(x) if x.startswith("@") else canonical(x)
                                          for x in texts(raw, name)))
            return list(dict.fromkeys(canonical(x) for x in texts(raw, name)))
        except workload.WorkloadError as exc:
            raise UsageError(str(exc)) from None
    return parse


def _trace_checked(text: str) -> str:
    from bench.model.trace import read_trace

    read_trace(text[1:])
    return text


def check_masks(spellings) -> None:
    """Every term of every spelling names a registered mask or score mod, with valid parameters."""
    from bench.model import masks

    for text in spellings:
        try:
            masks.parse(text, window=1)
        except masks.MaskError as exc:
            raise UsageError(f"--masks {text}: {exc}") from None


def choice(what: str, valid):
    def parse(raw, name: str) -> str:
        if str(raw) not in valid:
            raise UsageError(f"unknown {what} {raw!r}; valid: {', '.join(valid)}")
        return str(raw)
    return parse


def number(lo: float, hi: float, whole: bool):
    """A number in [lo, hi] (nan, inf and booleans refused; a whole number when ``whole``)."""
    def parse(raw, name: str):
        span = f"{int(lo)} to {int(hi)}" if whole else f"{lo:g} to {hi:g}"
        what = f"{name} takes {'a whole number' if whole else 'a number'} from {span}"
        try:
            if isinstance(raw, bool) or (whole and isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            if isinstance(raw, str) and not (digits.is_int(raw) if whole else digits.is_number(raw)):
                raise ValueError  # ASCII digits only: int() and float() take other scripts' digits too
            value = int(raw) if whole else float(raw)
        except (TypeError, ValueError):
            raise UsageError(f"{what}, got {raw!r}{_ascii_note(raw)}") from None
        if not lo <= value <= hi:  # also refuses nan
            raise UsageError(f"{what}, got {value if whole else repr(raw)}")
        return value
    return parse


def threads_or_auto(raw, name: str):
    """``auto`` (None: chosen at the start of each sweep) or a whole number from 1 to 4096."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return None
    cores = usable_cores()
    limit = min(4096, THREADS_PER_CORE * cores)
    try:
        return number(1, limit, True)(raw, name)
    except UsageError as exc:
        raise UsageError(str(exc).replace(" takes ", " takes auto or ", 1)
                         + f" (this machine gives {cores} core(s) to this process: more than {THREADS_PER_CORE} "
                           f"threads a core are still spinning after one cell when the next starts)") from None


THREADS_PER_CORE = 32  # --threads beyond this many a core is refused: 64 on 2 cores is timed (contended), 999 is not


def usable_cores() -> int:
    """The cores this process may run on."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def positive(unit: str):
    def parse(raw, name: str) -> float:
        try:
            value = float(raw) if not isinstance(raw, bool) and not (isinstance(raw, str)
                                                                      and not digits.is_number(raw)) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not 0 < value < math.inf:
            raise UsageError(f"{name} takes a positive, finite number of {unit}, got {raw!r}{_ascii_note(raw)}")
        return value
    return parse


def shard_pair(text: str) -> tuple[int, int]:
    """``i/N`` as (i, N); (0, 0) when it is not two whole numbers."""
    i, _, n = str(text).partition("/")
    if not (digits.is_int(i) and digits.is_int(n)):
        return 0, 0
    return int(i), int(n)


def shard_text(raw, name: str) -> str:
    """``i/N`` with 1 <= i <= N."""
    i, n = shard_pair(raw)
    if not 1 <= i <= n:
        raise UsageError(f"{name} takes i/N with 1 <= i <= N, e.g. 2/4, got {raw!r}")
    return f"{i}/{n}"


def gpu_list(raw, name: str) -> str:
    text = str(raw).replace(" ", "")
    if text != "all" and not all(digits.is_digits(x) for x in text.split(",")):
        raise UsageError(f"{name} takes all or GPU indices such as 0,1,3, got {raw!r}")
    return text


def sweep_name(raw, name: str) -> str:
    text = str(raw)
    if not text or not all(c.isalnum() or c in "-_." for c in text) or text.startswith("."):
        raise UsageError(f"{name} takes letters, digits, '-', '_' and '.', got {raw!r}")
    return text


def paths(raw, name: str) -> list[str]:
    if isinstance(raw, str):
        raw = [raw]  # plugins = "x.py" is one file, not four characters
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise UsageError(f"{name} takes a list of paths, got {raw!r}")
    return list(dict.fromkeys(str(Path(p).expanduser().resolve()) for p in raw))


def yes_no(raw, name: str) -> bool:
    """A yes/no setting: true or false in TOML; the flag alone on the command line."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise UsageError(f"{name} takes true or false, got {raw!r}")


def ffn_spelling(raw, name: str) -> str:
    """A layer's FFN: mlp:D_FF or swiglu:D_FF (bench.model.ffn)."""
    from bench.model import ffn

    try:
        return ffn.ffn_text(str(raw))
    except ffn.LayerError as exc:
        raise UsageError(str(exc).replace("--ffn", name, 1)) from None
