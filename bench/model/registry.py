"""The variant registry: the ``variant`` decorator that records a variant's capabilities, the
Registry of one run's variants, and availability (discovery is ``bench.engine.discovery``).

A variant is a *factory*: ``factory(case)`` does every piece of setup that is not
attention (building a mask or bias, compiling) and returns the callable that will be
timed, ``fn(q, k, v) -> out``.  A factory may return ``Prepared(fn, info, scope)`` to report
figures about its setup (``info={"compile_ms": ...}``) or to hold state open around
the timed calls.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench.errors import RegistryError, first_line
from bench.model.case import CASE_DTYPES, CASE_FIELDS, DEVICES, DTYPES, MASKS, Case
from bench.model.shards import SHARDS, shard_reason

ENTRY_POINT_GROUP = "attnbench.variants"


class DuplicateVariantError(RegistryError):
    pass


@dataclass
class Prepared:
    """What a factory built: the callable to time, figures about its setup, and a scope
    (a context manager factory) that the harness holds open around every call, so that
    state such as a pinned SDPA backend is set once, not inside the timed call."""
    fn: Callable
    info: dict = field(default_factory=dict)
    scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


@contextlib.contextmanager
def prep(info: dict, device: str = "cpu"):
    """Time what a factory must redo whenever the inputs' structure changes (a block mask, a bias
    or a bool mask, a page table, nested-tensor offsets), apart from a compile: the time inside
    the ``with`` adds to ``info["prep_ms"]``, the row's prep_ms (on a GPU, synchronized)::

        info = {}
        with prep(info, case.device):
            keep = masks.bind(case).keep(case.device)
        return Prepared(attention, info)
    """
    import time

    t0 = time.perf_counter()
    try:
        yield info
    finally:
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        info["prep_ms"] = info.get("prep_ms", 0.0) + (time.perf_counter() - t0) * 1e3


_COMPILE = {"dynamic": False}


def compile_dynamic(value: bool | None = None) -> bool:
    """Whether a variant that compiles should compile with dynamic shapes (``--dynamic``: one
    graph for every length, instead of one per shape); the worker sets it from the sweep."""
    if value is not None:
        _COMPILE["dynamic"] = bool(value)
    return _COMPILE["dynamic"]


@dataclass(frozen=True)
class Capability:
    """One thing a case may ask that a variant declares it can do (``variant(..., NAME=True)``):
    whether the case asks it, and the reason a variant that does not declare it is
    unsupported.  A new capability is one more entry in CAPABILITIES: the decorator's keyword,
    the Variant's attribute, the availability check and ``list``'s table follow from it."""
    name: str
    default: bool
    asks: Callable[[Case], bool]
    refusal: Callable[[Variant, Case], str]
    doc: str = ""


CAPABILITIES: tuple[Capability, ...] = (
    Capability("cross", True, lambda c: c.is_cross, lambda v, c: "cross-attention (q_len != kv_len) not supported",
               "takes q_len != kv_len"),
    Capability("gqa", True, lambda c: c.is_gqa, lambda v, c: "GQA (kv_heads != heads) not supported",
               "takes fewer key/value heads than query heads"),
    Capability("backward", True, lambda c: c.needs_grad, lambda v, c: "backward not supported",
               "has a backward (bwd, fwd+bwd)"),
    Capability("paged", False, lambda c: c.paged,
               lambda v, c: f"a paged KV cache (--kv-layout {c.kv_layout}) not supported: {v.name} reads a "
                            f"contiguous cache (the variants that declare paged=True read one)",
               "reads a paged KV cache: k, v a page pool (kv_heads, batch x pages, PAGE, D), case.page_table()"),
    Capability("bottom_right", False, lambda c: c.offset != 0 and c.mask not in ("none", "padding") and not c.mixed,
               lambda v, c: f"bottom-right alignment (--align bottom-right, q_len {c.q_len} < kv_len {c.kv_len}) "
                            f"not supported: {v.name} places query i at key i (the variants that declare "
                            f"bottom_right=True place it at kv_len - q_len + i)",
               "places the queries at the end of the keys (--align bottom-right) for its masks and score mods"),
    Capability("value_dim", False, lambda c: c.head_dim_v is not None,
               lambda v, c: f"a value head dim apart from the query/key one (--head-dims {c.dims}, as multi-head "
                            f"latent attention) not supported: {v.name} takes one head dim (the variants that "
                            f"declare value_dim=True take v's apart)",
               "takes v (and returns the output) with its own head dim, case.dv (--head-dims 192/128)"),
    Capability("sinks", False, lambda c: _has_sinks(c.mask),
               lambda v, c: f"learned sinks ({', '.join(_sink_names(c.mask))}) not supported: {v.name} has no "
                            f"term in the softmax denominator (the variants that declare sinks=True add one)",
               "adds a learned sink's logit per head to each row's softmax denominator (masks.bind(case)"
               ".sink_logits)"),
    Capability("ragged", False, lambda c: c.ragged,
               lambda v, c: f"ragged batches (--lengths {c.lengths}) not supported: {v.name} takes sequences of one "
                            f"length (the variants that declare ragged=True take them packed)",
               "takes a ragged batch packed: q, k, v (1, H, total tokens, D), case.seq_lengths()"),
    Capability("mix", False, lambda c: c.mixed,
               lambda v, c: f"mixed batches (--batch-mix {c.mix}) not supported: {v.name} takes one query length "
                            f"and one key length per call (the variants that declare mix=True take them packed)",
               "takes a mixed serving batch packed, q and k apart: q (1, H, total queries, D), k and v (1, KvH, "
               "total keys, D), case.segments() the (q_len, kv_len) of each sequence, bottom-right within each"),
)


def _sink_names(spelling: str) -> list[str]:
    from bench.model import masks

    try:
        return [t.d.name for t in masks.parse(spelling, window=1)[1] if t.d.sink]
    except masks.MaskError:
        return []


def _has_sinks(spelling: str) -> bool:
    return "sink" in spelling and bool(_sink_names(spelling))


def capability_names() -> tuple[str, ...]:
    return tuple(c.name for c in CAPABILITIES)


WORK = ("all", "kept", "causal")  # the pairs a variant's work follows under a mask (Traits.work)
# the gpu-check steps a variant may take part in (Traits.checks; bench/cli/gpu_check.py runs them): the quick
# check's profile, timer agreement, trace, tiny (sub-0.1 ms, CUDA graphs) and paged steps, the full check's
# scaling sweeps, and the --extra paths (the layer scopes, a layer under the graph timer, an anchor, ab of the tree
# against a copy of it, a context-parallel cell on its process group)
CHECKS = ("profile", "timer", "trace", "tiny", "paged", "scaling-causal", "scaling-window", "sinks", "mla", "mix",
          "cross-gqa", "ragged", "decode-gqa", "paged-64", "layers", "layer-graph", "anchor", "ab", "ranks")


@dataclass(frozen=True)
class Traits:
    """What the harness knows of a variant beyond what it can run, declared on the variant so that
    no part of the harness names one:

    - ``work``: the (query, key) pairs its work follows under a mask: ``all`` (every pair, whatever
      the mask drops: a dense kernel), ``kept`` (only the pairs the mask keeps: it skips the rest),
      or ``causal`` (a causal mask's, every pair under any other mask). The plan prices it by them.
    - ``rates``: (device, rate) pairs, its achieved FLOP/s against the plan's default for the device
      when no earlier run here says better.
    - ``colour``: its slot of the report's palette (``reports.charts.PALETTE``), the same in every
      chart of every run; without one, a slot from its name.
    - ``peak_share``: the share of the measured matmul peak gpu-check's peak step expects of it at
      its large size (taking part in that step).
    - ``memory_exponents``: (device, (low, high)) pairs, the exponent of its peak memory against n
      that gpu-check's scaling step expects under a causal mask (taking part in that step).
    - ``selfcheck``: (device, case fields) pairs: the case ``python -m bench selfcheck`` times it on.
    - ``checks``: the other gpu-check steps it takes part in (``bench.cli.gpu_check.STEPS``)."""
    work: str = "all"
    rates: tuple = ()
    colour: int | None = None
    peak_share: float | None = None
    memory_exponents: tuple = ()
    selfcheck: tuple = ()
    checks: tuple[str, ...] = ()

    def rate(self, device: str) -> float | None:
        return dict(self.rates).get(device)

    def memory_exponent(self, device: str) -> tuple | None:
        return dict(self.memory_exponents).get(device)

    def selfcheck_case(self, device: str) -> dict | None:
        fields = dict(self.selfcheck).get(device)
        return dict(fields) if fields is not None else None


def _traits(name: str, work: str, rates, colour, peak_share, memory_exponents, selfcheck, checks) -> Traits:
    """``variant(...)``'s trait keywords, checked and made hashable."""
    if work not in WORK:
        raise RegistryError(f"variant {name!r}: work is one of {', '.join(WORK)}, got {work!r}")
    for label, given in (("rates", rates), ("memory_exponents", memory_exponents), ("selfcheck", selfcheck)):
        if not isinstance(given, dict) or set(given) - set(DEVICES):
            raise RegistryError(f"variant {name!r}: {label} takes a dict by device ({', '.join(DEVICES)}), "
                                f"got {given!r}")
    if any(not (isinstance(r, (int, float)) and r > 0) for r in rates.values()):
        raise RegistryError(f"variant {name!r}: a rate is a positive number, got {rates!r}")
    if any(not (isinstance(e, tuple) and len(e) == 2 and e[0] <= e[1]) for e in memory_exponents.values()):
        raise RegistryError(f"variant {name!r}: a memory exponent is a (low, high) pair, got {memory_exponents!r}")
    if colour is not None and not (isinstance(colour, int) and colour >= 0):
        raise RegistryError(f"variant {name!r}: colour is a palette slot, a whole number from 0, got {colour!r}")
    if peak_share is not None and not 0 < peak_share <= 1:
        raise RegistryError(f"variant {name!r}: peak_share is a share of the peak, in (0, 1], got {peak_share!r}")
    if isinstance(checks, str):
        raise RegistryError(f"variant {name!r}: checks takes a tuple of step names, got the string {checks!r}")
    unknown = sorted(set(checks) - set(CHECKS))
    if unknown:
        raise RegistryError(f"variant {name!r}: unknown gpu-check step(s) {unknown}; valid: {', '.join(CHECKS)}")
    for device, fields in selfcheck.items():
        if not isinstance(fields, dict) or set(fields) - set(CASE_FIELDS):
            raise RegistryError(f"variant {name!r}: selfcheck's {device} case takes case fields "
                                f"({', '.join(CASE_FIELDS)}), got {fields!r}")
    return Traits(work=work, rates=tuple(sorted(rates.items())), colour=colour, peak_share=peak_share,
                  memory_exponents=tuple(sorted(memory_exponents.items())),
                  selfcheck=tuple(sorted((d, tuple(sorted(f.items()))) for d, f in selfcheck.items())),
                  checks=tuple(checks))


@dataclass(frozen=True)
class Variant:
    name: str
    factory: Callable[[Case], Callable | Prepared]
    description: str
    devices: tuple[str, ...] = DEVICES
    dtypes: tuple[str, ...] = DTYPES
    masks: tuple[str, ...] = MASKS
    score_mods: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()
    baseline: bool = False
    check: Callable[[Case], str | None] | None = None
    approximate: bool = False
    error_budget: float | None = None
    compiles: bool = False  # its setup compiles per case (seconds, not milliseconds: a sweep's plan counts it)
    module: str = ""
    source: str = ""
    # the CAPABILITIES it declares other than their defaults, by name (read as attributes: v.ragged)
    declared: tuple[tuple[str, bool], ...] = ()
    # the answers of ``check`` per case, kept with the variant (a probe runs library code once)
    probes: dict = field(default_factory=dict, compare=False, repr=False)
    # what the harness's plan, judge, charts and checks know of it (``variant(...)``'s keywords: Traits)
    traits: Traits = field(default_factory=lambda: Traits())
    # a context-parallel variant: how its sequence is split over a cell's ranks (SHARDS), its factory
    # ``factory(case, ctx)`` given the rank's place in the group (bench.scopes.context.RankContext)
    shard: str | None = None

    def __getattr__(self, name: str):
        for cap in CAPABILITIES:
            if cap.name == name:
                return dict(self.declared).get(name, cap.default)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def prepare(self, case: Case, ctx=None) -> Prepared:
        """The factory's call for ``case`` (a context-parallel variant's for its rank too: ``ctx``)."""
        out = self.factory(case, ctx) if self.shard else self.factory(case)
        return out if isinstance(out, Prepared) else Prepared(out)

    def static_reason(self, case: Case) -> str | None:
        """Why the declared capabilities exclude ``case`` (None when they admit it)."""
        if case.unsupported_reason:
            return case.unsupported_reason
        if self.shard and not _ranked(case):
            return (f"a context-parallel variant splits the attention call itself over ranks: scope {case.scope} "
                    f"is not timed over ranks")
        if case.ranks > 1 and not self.shard:
            return (f"ranks {case.ranks}: {self.name} runs in one process; a context-parallel variant (declared "
                    f"with shard=, such as cp.ring) splits the sequence over ranks")
        if self.shard and shard_reason(case, self.shard):
            return shard_reason(case, self.shard)
        cores = _scope_cores(case)
        if cores is not None:  # a layer, say: what its attention calls ask of the variant
            return _in_scope(case, cores, self.static_reason)
        if case.device not in self.devices:
            return f"device {case.device} not supported (supports {', '.join(self.devices)})"
        if case.dtype not in self.dtypes:
            return f"dtype {case.dtype} not supported (supports {', '.join(self.dtypes)})"
        why = self.mask_reason(case.mask)
        if why:
            return why
        for cap in CAPABILITIES:
            if cap.asks(case) and not getattr(self, cap.name):
                return cap.refusal(self, case)
        return None

    @property
    def default_mask(self) -> str:
        """The mask a command that names none uses for this variant: none when it takes it."""
        return "none" if "none" in self.masks or "any" in self.masks else self.masks[0]

    def mask_reason(self, spelling: str) -> str | None:
        """Why the declared masks and score mods exclude a mask spelling (None when they admit it)."""
        from bench.model import masks

        try:
            ms, mods = masks.parse(spelling, window=1)
        except masks.MaskError as exc:
            return str(exc)
        for t in ms:
            if masks.ANY not in self.masks and t.d.name not in self.masks:
                what = t.text() + " (an intersection)" if t.d.name == "intersection" else t.d.name
                return f"mask {what} not supported (supports {', '.join(self.masks)})"
        for t in mods:
            if masks.ANY in self.score_mods or t.d.name in self.score_mods:
                continue
            if masks.ADDITIVE in self.score_mods and t.d.additive:
                continue
            if masks.ADDITIVE in self.score_mods:
                return (f"score mod {t.d.name} not supported: {self.name} takes only score mods that add a bias "
                        f"to the scores ({', '.join(n for n, d in masks.catalogue().items() if d.additive)}); "
                        f"{t.d.name} is not one")
            takes = ", ".join(self.score_mods) if self.score_mods else "none"
            return f"score mod {t.d.name} not supported (takes score mods: {takes})"
        return None

    def capabilities(self) -> dict:
        return {"name": self.name, "description": self.description, "devices": list(self.devices),
                "dtypes": list(self.dtypes), "masks": list(self.masks), "score_mods": list(self.score_mods),
                **{cap.name: getattr(self, cap.name) for cap in CAPABILITIES}, "requires": list(self.requires),
                "baseline": self.baseline, "approximate": self.approximate, "error_budget": self.error_budget,
                "compiles": self.compiles, "shard": self.shard, "source": self.source}


# Every decorated factory is kept by the module that defines it, under this attribute;
# discover() reads the modules it was asked for, so that there is no process-wide
# catalogue and tests and plugins never leak into each other.
MODULE_ATTR = "__attnbench_variants__"


def _declared(name, devices, dtypes, masks, score_mods, capabilities: dict, approximate: bool,
              error_budget) -> tuple:
    """What ``@variant`` was given, checked: every name a known one, each capability a bool, an
    error budget only for an approximation.  Returns the capabilities it declares away from
    their defaults, as sorted (name, value) pairs."""
    from bench.model import masks as mask_defs

    for label, given, valid in (("devices", devices, DEVICES), ("dtypes", dtypes, CASE_DTYPES),
                                ("masks", masks, [mask_defs.ANY, *mask_defs.names("mask")]),
                                ("score_mods", score_mods,
                                 [mask_defs.ANY, mask_defs.ADDITIVE, *mask_defs.names("score_mod")])):
        if isinstance(given, str):
            raise RegistryError(f"variant {name!r}: {label} takes a tuple of names, got the string {given!r}")
        bad = set(given) - set(valid)
        if bad:
            raise RegistryError(f"variant {name!r}: unknown {label} {sorted(bad)}; valid: {', '.join(valid)} "
                                f"(define a mask before the variants that use it)")

    unknown = sorted(set(capabilities) - set(capability_names()))
    if unknown:
        raise RegistryError(f"variant {name!r}: unknown keyword(s) {unknown}; the capabilities it may declare: "
                            f"{', '.join(capability_names())}")
    if any(not isinstance(v, bool) for v in capabilities.values()):
        raise RegistryError(f"variant {name!r}: a capability is True or False, got {capabilities}")
    defaults = {cap.name: cap.default for cap in CAPABILITIES}
    declared = tuple(sorted((k, v) for k, v in capabilities.items() if v != defaults[k]))
    if error_budget is not None and (not approximate or not error_budget > 0):
        raise RegistryError(f"variant {name!r}: error_budget is a positive relative error, for approximate=True "
                            f"variants only (an exact variant is held to the dtype's tolerance)")
    return declared


def variant(name: str, *, description: str, devices: Iterable[str] = DEVICES,
            dtypes: Iterable[str] = DTYPES, masks: Iterable[str] = MASKS, score_mods: Iterable[str] = (),
            requires: Iterable[str] = (), baseline: bool = False, check: Callable[[Case], str | None] | None = None,
            approximate: bool = False, error_budget: float | None = None, compiles: bool = False,
            work: str = "all", rates: dict | None = None, colour: int | None = None, peak_share: float | None = None,
            memory_exponents: dict | None = None, selfcheck: dict | None = None, checks: Iterable[str] = (),
            shard: str | None = None, **capabilities):
    """Register ``factory(case) -> fn(q, k, v)`` as a variant called ``name``.

    ``work``, ``rates``, ``colour``, ``peak_share``, ``memory_exponents``, ``selfcheck`` and
    ``checks``: what the plan, the charts and the checks know of it (``Traits``); all optional.

    ``capabilities``: the CAPABILITIES it declares, by keyword: ``cross``, ``gqa`` and
    ``backward`` (default True), ``paged``, ``bottom_right`` and ``ragged`` (default False).

    ``approximate=True`` declares a variant that does not compute attention exactly: it is
    timed like any other, its rows carry its errors against the float64 reference (output and
    gradients), and it is ``ok`` when the relative Frobenius error of its output is within
    ``error_budget`` (always, without one), ``mismatch`` beyond it.

    ``compiles=True`` declares a setup that compiles per case (seconds of it): a sweep's cost
    model counts it when it balances shards and workers.

    ``ragged=True`` declares a variant that takes a ragged batch (``--lengths``): its q, k, v
    are packed, (1, heads, total tokens, head_dim), ``case.seq_lengths()`` gives the length of
    each sequence, and the mask applies within each one.  It may say how it held them in
    ``Prepared.info["layout"]`` (packed, nested or padded): the row records it.

    ``mix=True`` declares a variant that takes a mixed serving batch (``--batch-mix``): q is
    (1, heads, total query tokens, head_dim), k and v (1, kv_heads, total key tokens, head_dim),
    packed apart; ``case.segments()`` gives each sequence's (q_len, kv_len), and within each
    sequence its queries are its last q_len tokens (bottom-right).

    ``paged=True`` declares a variant that reads a paged KV cache (``--kv-layout paged:PAGE``):
    its k and v are a page pool (kv_heads, batch x pages, PAGE, head_dim) and
    ``case.page_table()`` the pool page of each sequence's pages.

    ``shard="zigzag"`` or ``"contiguous"`` declares a context-parallel variant (``--ranks``): a cell of
    P ranks runs it in P processes of one torch.distributed group, and its factory is
    ``factory(case, ctx)``, ``ctx`` the rank's place (bench.scopes.context.RankContext: its group,
    rank, positions and timed collectives); its call takes the rank's shard of q, k and v, split as
    it declares (zigzag: chunks r and 2P-1-r of 2P, which balances a causal mask; contiguous: chunk
    r of P), and returns the shard of the output.

    ``masks`` names the masks the variant computes (``bench.model.masks.ANY``: every registered one,
    through ``bench.model.masks``); ``score_mods`` the score mods it applies (``ANY``, or
    ``bench.model.masks.ADDITIVE`` for every mod that is a bias added to the scores)."""
    if shard is not None and shard not in SHARDS:
        raise RegistryError(f"variant {name!r}: shard={shard!r}; valid: {', '.join(SHARDS)} (or None: one process)")
    declared = _declared(name, devices, dtypes, masks, score_mods, capabilities, approximate, error_budget)
    traits = _traits(name, work, rates or {}, colour, peak_share, memory_exponents or {}, selfcheck or {}, checks)

    def deco(factory):
        mod = sys.modules.get(factory.__module__)
        entry = Variant(name=name, factory=factory, description=description, devices=tuple(devices),
                        dtypes=tuple(dtypes), masks=tuple(masks), score_mods=tuple(score_mods),
                        requires=tuple(requires), baseline=baseline, check=check, approximate=approximate,
                        error_budget=error_budget, compiles=compiles, module=factory.__module__,
                        source=_source_of(mod, factory.__module__), declared=declared, traits=traits, shard=shard)
        entries = module_variants(mod, create=True)
        if any(v.name == name for v in entries):
            raise DuplicateVariantError(f"variant {name!r} is registered twice in {entry.source}")
        entries.append(entry)
        return factory

    return deco


def module_variants(mod, create: bool = False) -> list[Variant]:
    """The variants ``mod`` registered (an empty list for none)."""
    if mod is None:
        if create:
            raise RegistryError("@variant is used at the top level of a module (a file), not in exec'd code")
        return []
    if create and MODULE_ATTR not in vars(mod):
        setattr(mod, MODULE_ATTR, [])
    return vars(mod).get(MODULE_ATTR, [])


def _source_of(mod, modname: str) -> str:
    path = getattr(mod, "__file__", None)
    if not path:
        return modname
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path(__file__).resolve().parents[2]))
    except ValueError:
        return str(p)


def plugin_module(path: str) -> str:
    """The module name a ``--plugin`` file is loaded under."""
    p = Path(path).expanduser().resolve()
    return "attnbench_plugin_" + "".join(c if c.isalnum() else "_" for c in str(p))


class Registry:
    """The variants one run can use, by name, in discovery order."""

    def __init__(self, variants: Iterable[Variant] = ()):
        self._by_name: dict[str, Variant] = {}
        for v in variants:
            self.add(v)

    def add(self, v: Variant) -> None:
        old = self._by_name.get(v.name)
        if old is not None and old is not v:
            raise DuplicateVariantError(
                f"variant {v.name!r} is defined twice: in {old.source} and in {v.source}")
        self._by_name[v.name] = v

    def __getitem__(self, name: str) -> Variant:
        try:
            return self._by_name[name]
        except KeyError:
            raise RegistryError(f"unknown variant {name!r}; valid: {', '.join(self.names())}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __iter__(self):
        return iter(self._by_name.values())

    def __len__(self):
        return len(self._by_name)

    def names(self) -> list[str]:
        return list(self._by_name)

    def baseline(self) -> Variant | None:
        return next((v for v in self if v.baseline), None)


@functools.cache
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


ONE_PROCESS = ("{name} is context-parallel: it runs on the ranks of a process group, which a sweep starts "
               "(python -m bench sweep --variants {name} --ranks 1,2), not in this command's one process")


def available(v: Variant, case: Case, probe: bool = True, one_process: bool = False) -> tuple[bool, str]:
    """(True, "") when this machine can run ``v`` on ``case``, else (False, why not).
    ``probe=False`` leaves out the variant's own check (which runs library code: the sweep
    runs it in the worker, isolated, see ``probe_reason``); ``one_process``: for a command that
    calls the variant in its own process (profile, selfcheck), which a context-parallel one is not."""
    if one_process and v.shard:
        return False, ONE_PROCESS.format(name=v.name)
    reason = v.static_reason(case)
    if reason:
        return False, reason
    for mod in v.requires:
        if importlib.util.find_spec(mod) is None:
            return False, f"module {mod!r} is not installed"
    if case.device == "cuda" and not _cuda_available():
        return False, "CUDA is not available on this machine"
    if probe:
        try:
            reason = probe_reason(v, case)
        except Exception as exc:  # a bug in the variant's check, not the library's refusal
            return False, f"its availability check failed: {type(exc).__name__}: {first_line(exc)}"
        if reason:
            return False, reason
    return True, ""


def probe_reason(v: Variant, case: Case) -> str | None:
    """The variant's own availability check (a library probe) for ``case``, or None.  A check
    that raises is not a refusal: the exception goes on up (in a sweep's worker it becomes
    the cell's ``error``, with where it was raised)."""
    if v.check is None:
        return None
    cores = _scope_cores(case)
    if cores is not None:
        return _in_scope(case, cores, lambda core: probe_reason(v, core))
    if case not in v.probes:
        v.probes[case] = v.check(case)
    return v.probes[case]


def _ranked(case: Case) -> bool:
    """Whether the case's scope times a call over ranks (bench.model.scope.Scope.ranked)."""
    from bench.model import scope

    return scope.of(case).ranked


def _scope_cores(case: Case) -> dict | None:
    """The variant's attention calls in a cell of ``case`` as its scope makes them (bench.model.scope),
    or None where the one call is the case itself."""
    from bench.model import scope

    cores = scope.of(case).cores(case)
    return None if list(cores.values()) == [case] else cores


def _in_scope(case: Case, cores: dict, reason) -> str | None:
    """Why a case's attention calls (its scope's ``cores``) cannot run, by ``reason`` of each core case;
    None when every one can."""
    from bench.model import scope

    for name, core in cores.items():
        why = reason(core)
        if why:
            return f"{scope.of(case).core_label(case, name)}: {why}"
    return None


def __getattr__(name: str):
    if name == "discover":  # its home until the layers were made to point one way
        raise AttributeError("discover() loads the built-in variants package, so it lives above the "
                             "variants now: use `from bench.api import discover`")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
