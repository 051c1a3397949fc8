"""One sweep point: a frozen, hashable, validated description of an attention call.

Shapes follow PyTorch's SDPA layout: q is (batch, heads, q_len, head_dim), k and v
are (batch, kv_heads, kv_len, head_dim).  Mask semantics live in ``bench.model.masks``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from bench.model.axes import PLAIN

DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "float16", "bfloat16")  # a variant's default dtypes=
FP8 = "float8_e4m3fn"  # inference only, and only where a variant declares it (SDPA, flex)
CASE_DTYPES = (*DTYPES, FP8)
DTYPE_ALIASES = {"fp32": "float32", "f32": "float32", "fp16": "float16", "half": "float16",
                 "f16": "float16", "bf16": "bfloat16", "fp8": FP8, "e4m3": FP8, "float8": FP8}
MASKS = ("none", "causal", "window", "padding")  # the four basic masks (a variant's default masks=)
# a mask spelling: terms joined by '+' (union) or '&' (intersection), each a name with ':'-separated
# parameters (bench.model.mask_spelling)
_TERM = r"[a-z_][a-z0-9_.]*(:[a-z0-9_.=/-]+)*"
MASK_SPELLING = re.compile(rf"^[(]*{_TERM}[)]*([+&(][(]*{_TERM}[)]*)*$")  # the parser checks the rest
MASK_FORM = ("a mask is a name with ':'-separated parameters (window:256); masks joined by '+' are unioned and by "
             "'&' intersected, score mods added with '+', and document[:params](INNER) applies a mask within each "
             "document: e.g. causal, causal+softcap:50, document:4&causal, document:4(prefix_lm:16)")
MAX_MASK_TEXT = 500  # characters (bench.model.mask_spelling.MAX_SPELLING says the same to the parser)
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")
# where the queries sit among the keys: top-left (query i is key i: training and prefill, where they
# coincide) or bottom-right (the queries are the last q_len tokens: decode, chunked prefill, draft
# verification; FlashAttention since 2.1, FlashInfer and PyTorch's causal_lower_right)
ALIGNS = ("top-left", "bottom-right")
ALIGN_ALIASES = {"tl": "top-left", "br": "bottom-right", "topleft": "top-left", "bottomright": "bottom-right"}
RAGGED_MASKS = ("none", "causal", "window")  # the masks a ragged batch takes, within each of its sequences


class CaseError(ValueError):
    """An invalid Case field; the message names the field and what is valid."""

    def __init__(self, field: str, value, valid: str, message: str | None = None):
        self.field = field
        super().__init__(message or f"invalid {field}={value!r}: {valid}")


def normalize_align(name: str) -> str:
    name = str(name).strip().lower()
    return ALIGN_ALIASES.get(name, name)


def normalize_dtype(name: str) -> str:
    name = str(name).lower().removeprefix("torch.")
    return DTYPE_ALIASES.get(name, name)


MAX_LEN = 1 << 24  # q_len, kv_len and window: 16,777,216 tokens
MAX_DIM = 1 << 16  # batch, heads, kv_heads and head_dim
MAX_RANKS = 1024  # a cell's world size: the processes its sequence is split over (--ranks)
LIMITS = {"ranks": MAX_RANKS, "q_len": MAX_LEN, "kv_len": MAX_LEN, "window": MAX_LEN, "batch": MAX_DIM,
          "heads": MAX_DIM, "kv_heads": MAX_DIM, "head_dim": MAX_DIM, "head_dim_v": MAX_DIM}


def _positive(field: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CaseError(field, value, "must be a positive integer")
    if value > LIMITS[field]:
        raise CaseError(field, value, f"must be at most {LIMITS[field]:,}")


def later(default, kw_only: bool = False):
    """A case field added after the first run folders: rows written before it lack it and were
    measured with ``default``, which they read as (``CASE_ADDED``); the repro command, the
    memory models and the report's unsaid facets follow from it.  ``kw_only``: given by name
    only (a plain axis's field, which comes after every other)."""
    return dataclasses.field(default=default, metadata={"later": True}, kw_only=kw_only)


@dataclass(frozen=True)
class _Case:
    """What one cell measures besides its variant: the device and dtype, the shape, the mask, the
    direction and the workload.  ``Case`` is this with a field for each plain axis."""
    device: str = "cpu"
    dtype: str = "float32"
    batch: int = 1
    heads: int = 8
    kv_heads: int = 8
    q_len: int = 1024
    kv_len: int = 1024
    head_dim: int = 64
    mask: str = "none"
    window: int | None = None
    direction: str = "fwd"
    lengths: str = later("fixed")  # the sequence lengths of the batch (bench.model.workload): fixed, or a ragged mix
    align: str = later("top-left")  # query i at position i (top-left), or at kv_len - q_len + i (bottom-right): ALIGNS
    head_dim_v: int | None = later(None)  # v's (and the output's) head dim where it is not q's and k's (MLA: 192/128)
    # a mixed serving batch (--batch-mix, bench.model.workload.Mix): sequences of their own query and key
    # lengths packed into one call, q and k apart; it sets batch 1, q_len and kv_len to the packed totals and
    # bottom-right alignment (within each sequence)
    mix: str = later("none")
    # where the core runs (--scope, bench.scopes.layer): alone (core), or inside the seeds' multi-head module
    # (block), encoder or decoder layer; a layer's feed-forward network: mlp:D_FF or swiglu:D_FF (none: no FFN)
    scope: str = later("core")
    ffn: str = later("none")
    # the world size (--ranks, bench.scopes.context): the processes of one cell, each holding a shard of
    # the sequence; a variant that shards it (a context-parallel one, declared with shard=) runs on them
    ranks: int = later(1)

    def __post_init__(self):
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if self.device not in DEVICES:
            raise CaseError("device", self.device, f"valid: {', '.join(DEVICES)}")
        if self.dtype not in CASE_DTYPES:
            raise CaseError("dtype", self.dtype, f"valid: {', '.join(CASE_DTYPES)}")
        for field in ("batch", "heads", "kv_heads", "q_len", "kv_len", "head_dim"):
            _positive(field, getattr(self, field))
        if self.head_dim_v is not None:
            _positive("head_dim_v", self.head_dim_v)
            if self.head_dim_v == self.head_dim:  # 64/64 is 64: one cell, one spelling
                object.__setattr__(self, "head_dim_v", None)
        if self.heads % self.kv_heads:
            raise CaseError("kv_heads", self.kv_heads,
                            f"heads ({self.heads}) must be divisible by kv_heads")
        if not isinstance(self.mask, str) or len(self.mask) > MAX_MASK_TEXT or not MASK_SPELLING.match(self.mask):
            raise CaseError("mask", self.mask if len(str(self.mask)) <= 60 else f"{str(self.mask)[:60]}...",
                            f"{MASK_FORM}; at most {MAX_MASK_TEXT} characters (python -m bench list --masks)")
        if self.mask == "window":
            _positive("window", self.window)
        elif self.window is not None:
            raise CaseError("window", self.window, "only the window mask takes a window size")
        if self.direction not in DIRECTIONS:
            raise CaseError("direction", self.direction, f"valid: {', '.join(DIRECTIONS)}")
        object.__setattr__(self, "align", normalize_align(self.align))
        if self.mix != "none":
            self._derive_mix()
        if self.align not in ALIGNS:
            raise CaseError("align", self.align, f"valid: {', '.join(ALIGNS)} (or tl, br)")
        if self.align == "bottom-right" and self.q_len > self.kv_len:
            raise CaseError("align", self.align, "bottom-right puts the queries at the end of the keys, so q_len <= "
                                                 f"kv_len; got q_len {self.q_len}, kv_len {self.kv_len}")
        _positive("ranks", self.ranks)
        self._check_scope()
        from bench.model import workload

        try:
            object.__setattr__(self, "inputs", workload.canonical_inputs(self.inputs))
            object.__setattr__(self, "kv_layout", workload.canonical_kv_layout(self.kv_layout))
            lengths = workload.parse_lengths(self.lengths)
            object.__setattr__(self, "lengths", lengths.text())
            if lengths.ragged:
                if self.is_cross:
                    raise workload.WorkloadError(f"--lengths {self.lengths}: a ragged batch is self-attention here "
                                                 f"(its keys are its queries); q_len {self.q_len} != kv_len "
                                                 f"{self.kv_len}", "lengths")
                lengths.check(self.batch, self.q_len)
            keys = self.batch * self.kv_len if lengths.ragged else self.kv_len
            workload.check_inputs(self.inputs, self.dtype, keys, self.head_dim)
            workload.check_kv_layout(self.kv_layout, self.kv_len)
        except workload.WorkloadError as exc:
            raise CaseError(exc.field, getattr(self, exc.field), str(exc), message=str(exc)) from None

    def _check_scope(self) -> None:
        """The case's scope (bench.model.scope) and the fields its axes set (a layer's FFN)."""
        from bench.model import scope

        try:
            found = scope.named(self.scope)
        except scope.ScopeError:
            raise CaseError("scope", self.scope, f"valid: {', '.join(scope.names())}") from None
        try:
            found.validate(self)
        except scope.ScopeFieldError as exc:
            raise CaseError(exc.field, exc.value, exc.valid) from None

    def _derive_mix(self) -> None:
        from bench.model import workload

        try:
            mix = workload.parse_mix(self.mix)
        except workload.WorkloadError as exc:
            raise CaseError("mix", self.mix, str(exc), message=str(exc)) from None
        if self.lengths != "fixed":
            raise CaseError("lengths", self.lengths, "a mixed batch (--batch-mix) gives each sequence its own "
                                                     "lengths: --lengths stays fixed")
        for name, value in (("mix", mix.text()), ("batch", 1), ("q_len", mix.q_tokens), ("kv_len", mix.kv_tokens),
                            ("align", "bottom-right")):
            object.__setattr__(self, name, value)

    # -- derived -------------------------------------------------------------
    @property
    def dv(self) -> int:
        """The head dim of v and of the output: head_dim unless the case splits them (MLA)."""
        return self.head_dim_v or self.head_dim

    @property
    def dims(self) -> str:
        """The head dims as --head-dims spells them: 64, or 192/128 when v's differs."""
        return f"{self.head_dim}/{self.head_dim_v}" if self.head_dim_v else str(self.head_dim)

    @property
    def is_cross(self) -> bool:
        return self.q_len != self.kv_len

    @property
    def offset(self) -> int:
        """The position of query 0 among the keys: 0 top-left, kv_len - q_len bottom-right (the
        masks and score mods see query i at position i + offset)."""
        return self.kv_len - self.q_len if self.align == "bottom-right" else 0

    @property
    def is_gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def mixed(self) -> bool:
        """A mixed serving batch (--batch-mix): sequences of their own q and kv lengths, packed."""
        return self.mix != "none"

    def segments(self) -> list[tuple[int, int]]:
        """(q_len, kv_len) of each sequence of the batch, in packing order."""
        if self.mixed:
            from bench.model import workload

            return workload.parse_mix(self.mix).segments()
        if self.ragged:
            return [(n, n) for n in self.seq_lengths()]
        return [(self.q_len, self.kv_len)] * self.batch

    @property
    def ragged(self) -> bool:
        """A batch of sequences of different lengths, held packed (bench.model.workload)."""
        return self.lengths != "fixed"

    def packed(self) -> Case:
        """A ragged batch as the one sequence its tensors hold: batch 1, every token back to back,
        the mask applied within each sequence (a document mask of the lengths; for a mixed batch
        the varlen mask of its runs, q and k packed apart).  The reference, the mask's counts and
        so the FLOPs are those of this case.  A fixed batch: itself."""
        if not (self.ragged or self.mixed):
            return self
        if self.unsupported_reason:
            raise CaseError("mask", self.mask, self.unsupported_reason)
        if self.mixed:
            from bench.model import workload

            runs = "/".join(map(str, workload.parse_mix(self.mix).flat()))
            mask = f"varlen:runs={runs}:causal={int(self.mask == 'causal')}:window={self.window or 0}"
            return dataclasses.replace(self, mask=mask, window=None, mix="none", align="top-left")
        lens = "/".join(map(str, self.seq_lengths()))
        mask = f"document:causal={int(self.mask == 'causal')}:window={self.window or 0}:lengths={lens}"
        total = self.batch * self.q_len
        return self.replace(batch=1, q_len=total, kv_len=total, mask=mask, window=None, lengths="fixed")

    @property
    def unsupported_reason(self) -> str | None:
        """Why no variant can run this case whatever it declares (a ragged batch under a mask that
        has no meaning within each sequence), or None."""
        if self.mixed and self.mask not in RAGGED_MASKS:
            return (f"a mixed batch (--batch-mix {self.mix}) takes the masks {', '.join(RAGGED_MASKS)}, applied "
                    f"within each sequence, bottom-right; not {self.mask}")
        if self.ragged and self.mask not in RAGGED_MASKS:
            return (f"a ragged batch (--lengths {self.lengths}) takes the masks {', '.join(RAGGED_MASKS)}, "
                    f"applied within each sequence; not {self.mask}")
        if self.dtype == FP8 and self.needs_grad:
            return f"{FP8} is an inference dtype here: forward only"
        if self.paged and self.needs_grad:
            return f"a paged KV cache (--kv-layout {self.kv_layout}) is read by inference: forward only"
        if self.paged and self.mixed:
            return "a paged KV cache and a mixed batch together are not modelled: one at a time"
        if self.paged and self.ragged:
            return "a paged KV cache and a ragged batch together are not modelled: one at a time"
        from bench.model import scope

        return scope.of(self).reason(self)

    @property
    def paged(self) -> bool:
        return self.kv_layout != "contiguous"

    @property
    def page_size(self) -> int | None:
        from bench.model import workload

        return workload.parse_kv_layout(self.kv_layout)

    def page_table(self) -> list[list[int]]:
        """The block table of a paged cache (bench.model.workload.page_table)."""
        from bench.model import workload

        return workload.page_table(self.batch, self.kv_len, self.page_size)

    def seq_lengths(self) -> list[int]:
        """The length of each sequence of the batch (all q_len for a fixed batch)."""
        from bench.model import workload

        return list(workload.draw_lengths(self.lengths, self.batch, self.q_len))

    @property
    def needs_grad(self) -> bool:
        return self.direction != "fwd"

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    def replace(self, **changes) -> Case:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def label(self) -> str:
        lens = f"n={self.q_len}" if not self.is_cross else f"q={self.q_len},kv={self.kv_len}"
        heads = f"h={self.heads}" + (f"/{self.kv_heads}" if self.is_gqa else "")
        mask = self.mask + (f"({self.window})" if self.window else "")
        extra = "".join(f" {k}={getattr(self, k)}" for k in CASE_ADDED
                        if k != "head_dim_v" and getattr(self, k) != CASE_DEFAULTS[k])
        return (f"{self.device} {self.dtype} b={self.batch} {heads} {lens} d={self.dims} "
                f"{mask} {self.direction}{extra}")


Case = dataclasses.make_dataclass(  # and a field of each plain axis (bench.model.axes): inputs, kv_layout, ...
    "Case", [(a.name, str, later(a.default, kw_only=True)) for a in PLAIN], bases=(_Case,), frozen=True,
    namespace={"__module__": __name__, "__qualname__": "Case", "__doc__": _Case.__doc__})

CASE_FIELDS = tuple(f.name for f in dataclasses.fields(Case))
CASE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Case)}  # a row written before a field existed
# the fields declared ``later``: a row without them was measured with their default
CASE_ADDED = tuple(f.name for f in dataclasses.fields(Case) if f.metadata.get("later"))
