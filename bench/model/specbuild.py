"""How a ``Spec`` is built from what is given: settings by name (flags, ``bench.api``), a TOML
file (``--config``), the device's presets (``bench/model/presets/<device>.toml``), a model's
shapes (``--model``) and, for a resume, the frozen spec of a run folder, then the checks that
involve several settings or the registry.  The CLI and ``bench.api.run_sweep`` both come through
here (``bench.engine.request``)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from functools import cache
from importlib import resources
from pathlib import Path

from bench.errors import UsageError
from bench.model.parsers import check_masks, choices
from bench.model.spec import AXES, SETTINGS, Spec, flag

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

DEFAULT_TIMEOUT_S = {"cpu": 300.0, "cuda": 120.0}
log = logging.getLogger(__name__)


def parse_values(raw: dict, source: str | None = None) -> dict:
    """Settings given by name (None: not given) parsed into Spec values, once. ``source``
    names a file the values came from (its messages then name the key, not a flag)."""
    out = {}
    for key, value in raw.items():
        if value is None:
            continue
        if key not in SETTINGS:
            raise UsageError(f"unknown setting {key!r}; valid: {', '.join(SETTINGS)}")
        try:
            out[key] = SETTINGS[key].parse(value, key if source else flag(key))
        except UsageError as exc:
            raise UsageError(f"{source}: {exc}" if source else str(exc)) from None
    return out


def load_config(path: str) -> dict:
    """The settings of a TOML file (keys at the top level or under ``[sweep]``), parsed."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"--config {path}: no such file")
    try:
        data = tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: malformed TOML: {exc}") from None
    section = data.pop("sweep", {})
    if not isinstance(section, dict):
        raise UsageError(f"--config {path}: 'sweep' must be a table ([sweep] with keys under it), "
                         f"got {type(section).__name__}")
    norm: dict = {}
    for where, table in (("the top level", data), ("[sweep]", section)):  # both places read; never one silently
        for k, v in table.items():
            key = k.replace("-", "_")
            if key in norm:
                raise UsageError(f"--config {path}: {key!r} is set twice ({norm[key][0]} and {where}); "
                                 f"keep one of them")
            norm[key] = (where, v)
    norm = {k: v for k, (_, v) in norm.items()}
    unknown = sorted(set(norm) - set(SETTINGS))
    if unknown:
        raise UsageError(f"--config {path}: unknown key {unknown[0]!r}; valid: {', '.join(SETTINGS)}")
    return parse_values(norm, source=f"--config {path}")


@cache
def _preset_tables(device: str) -> dict[str, dict]:
    text = resources.files("bench.model").joinpath("presets", f"{device}.toml").read_text()
    return tomllib.loads(text)


@cache
def presets(device: str) -> dict[str, dict]:
    """The presets of a device, from the packaged ``presets/<device>.toml``, parsed (a preset's
    ``about``, what it covers, is ``preset_about``'s)."""
    return {name: parse_values({k: v for k, v in values.items() if k != "about"}, source=f"preset {name} ({device})")
            for name, values in _preset_tables(device).items()}


def preset_about(device: str, name: str) -> str:
    """What a preset covers, as its TOML table says (``about``), or ''."""
    return str(_preset_tables(device).get(name, {}).get("about", ""))


def _unknown_preset(preset: str, device: str) -> UsageError:
    """An unknown preset; one another device has is refused with what it is for."""
    for other in (d for d in ("cpu", "cuda") if d != device):
        if preset in presets(other):
            about = preset_about(other, preset)
            return UsageError(f"--preset {preset} is a {other} preset{f' ({about})' if about else ''}: it needs "
                              f"--device {other}, and this sweep runs on {device}; valid here: "
                              f"{', '.join(presets(device))}")
    return UsageError(f"unknown preset {preset!r}; valid: {', '.join(presets(device))}")


ANCHOR_AXES = (*(a for a in AXES if a != "variants"), "total_tokens")  # what an anchor's own case replaces


def _anchored(merged: dict, values: dict, here: bool) -> dict:
    """A spec of published anchors (--anchors): refused off the GPU and beside the flags whose
    axes the anchors replace; its shape axes say what the anchors cover."""
    from bench.model.anchors import select

    if merged["device"] != "cuda":
        raise UsageError(f"--anchors times the shapes of published GPU figures against them: it needs --device cuda"
                         f"{' (this machine has no CUDA device)' if here else ''}; this sweep runs on "
                         f"{merged['device']}")
    clash = [flag(k) for k in (*ANCHOR_AXES, "model") if k in values]
    if clash:
        raise UsageError(f"--anchors gives each anchor its own shape, mask, dtype and direction; give it or "
                         f"{', '.join(clash)}, not both")
    chosen = select(merged["anchors"])

    def union(key):
        return sorted({key(a) for a in chosen}, key=lambda v: (isinstance(v, str), v))

    return merged | {"seq_lens": union(lambda a: a.q_len), "kv_lens": union(lambda a: a.kv),
                     "heads": union(lambda a: a.heads), "kv_heads": union(lambda a: a.kvh),
                     "head_dims": union(lambda a: f"{a.head_dim}/{a.head_dim_v}" if a.head_dim_v else a.head_dim),
                     "batch": union(lambda a: a.batch), "dtypes": union(lambda a: a.dtype),
                     "masks": union(lambda a: a.mask), "directions": union(lambda a: a.direction),
                     "align": union(lambda a: a.align), "kv_layout": union(lambda a: a.kv_layout),
                     "lengths": ["fixed"], "inputs": ["normal"], "batch_mix": None, "total_tokens": None,
                     "scope": ["core"]}


def _traced(mixes: list[str], n: int) -> list[str]:
    """--batch-mix with its traces (@FILE) replaced by their ``n`` representative batches, each named
    in the log by its place in the trace."""
    from bench.model.trace import trace_mixes
    from bench.model.workload import WorkloadError

    out = []
    for mix in mixes:
        if not str(mix).startswith("@"):
            out.append(mix)
            continue
        try:
            chosen = trace_mixes(mix[1:], n)
        except WorkloadError as exc:
            raise UsageError(str(exc)) from None
        for name, spelling in chosen:
            log.info("trace batch %s: %s", name, spelling)
        out += [s for _, s in chosen]
    return list(dict.fromkeys(out))


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_spec(given: dict, registry, base: Spec | None = None, here: bool = True) -> Spec:
    """The Spec from settings given by name, already parsed (``parse_values``, ``load_config``;
    None = unset), over ``base`` (a frozen spec, for a resume) or else the preset.  The checks
    that involve several settings or the registry are made here.  ``here=False``: a spec to
    price for another machine (a projection), whose device this one need not have."""
    values = {k: v for k, v in given.items() if v is not None}
    device = values.get("device") or (base.device if base else default_device())
    if here and device == "cuda" and default_device() != "cuda":
        raise UsageError("device cuda: CUDA is not available on this machine; valid here: cpu")
    preset = values.get("preset") or (base.preset if base else "default")
    if preset not in presets(device):
        raise _unknown_preset(preset, device)
    if base is not None and preset == base.preset and device == base.device:
        merged = base.to_dict()
    else:
        merged = {f.name: f.default for f in dataclasses.fields(Spec)} | dict(presets(device)[preset])
        if base is not None:  # a resume that names another preset keeps the run's other settings
            merged |= {k: v for k, v in base.to_dict().items() if not SETTINGS[k].axis and k != "budget_ms"}
    if "model" in values and not str(values["model"] or "").strip():
        from bench.model.models import MODELS

        raise UsageError(f"--model is empty; valid: {', '.join(MODELS)} (python -m bench list --models)")
    name = values.get("model") or (base.model if base else None)
    if name and not (base is not None and name == base.model):  # the model's settings, under the flags'
        from bench.model.models import model

        given_by_user = {k for k in values if k not in ("device", "preset")}
        merged |= {k: v for k, v in model(name).settings(preset).items() if k not in given_by_user}
    merged |= values | {"device": device, "preset": preset}
    if merged.get("anchors"):
        merged = _anchored(merged, values, here)
    if any(str(m).startswith("@") for m in merged.get("batch_mix") or []):
        merged["batch_mix"] = _traced(merged["batch_mix"], merged.get("trace_mixes") or 4)
    _check_batches(merged, values)
    if merged["variants"] is None:  # every variant; the context-parallel ones where the sweep splits a sequence
        split = any(r == "all" or r > 1 for r in merged.get("ranks") or [1])
        merged["variants"] = [v.name for v in registry if split or not v.shard]
    choices("variant", registry.names())(merged["variants"], "--variants")
    check_masks(merged["masks"])
    for h, kvh in itertools.product(merged["heads"], merged["kv_heads"] or []) if not merged.get("anchors") else ():
        if h % kvh:
            raise UsageError(f"heads {h} is not divisible by kv_heads {kvh}; kv_heads must divide heads "
                             f"(GQA groups of equal size)")
    if merged.get("timer") == "graph" and device != "cuda":
        raise UsageError("--timer graph captures CUDA graphs: it needs --device cuda (the CPU timer is perf_counter)")
    merged["timeout"] = merged["timeout"] or DEFAULT_TIMEOUT_S[device]
    timeout, budget = merged["timeout"], merged["budget_ms"]
    if timeout * 1e3 < budget:
        raise UsageError(f"--timeout {timeout:g} s is shorter than the timing budget (--budget-ms {budget:g}): no cell "
                         f"could finish; give a timeout of at least {math.ceil(budget / 1e3)} s")
    merged["plugins"] = list(merged["plugins"] or [])
    return Spec(**merged)


def _check_batches(merged: dict, values: dict) -> None:
    """The settings that shape a batch, held against each other: a mix gives its own sequences,
    lengths and alignment; a token budget sets the batch and needs a sequence at every length."""
    if merged.get("batch_mix"):  # first: a mix replaces the lengths the other checks would speak of
        clash = [flag(k) for k in ("batch", "seq_lens", "kv_lens", "lengths", "align", "total_tokens") if k in values]
        if clash:
            raise UsageError(f"--batch-mix gives each mix its own sequences, lengths and alignment (bottom-right "
                             f"within each sequence); give it or {', '.join(clash)}, not both")
    elif merged.get("total_tokens"):
        if "batch" in values:
            raise UsageError("--total-tokens sets the batch at each length (T // n); give it or --batch, not both")
        total, longest = merged["total_tokens"], max(merged["seq_lens"])
        if total < longest:
            raise UsageError(f"--total-tokens {total} is below the longest length {longest}: "
                             f"every length needs at least one sequence (T >= {longest})")
        ragged = [x for x in merged.get("lengths") or [] if str(x).split(":")[0] not in ("fixed",)]
        if ragged and total < 2 * longest:
            raise UsageError(f"--total-tokens {total} gives one sequence at n={longest} (T // n), and --lengths "
                             f"{ragged[0]} needs a batch of 2 or more: give --total-tokens {2 * longest} or more, or "
                             f"shorter --seq-lens")
