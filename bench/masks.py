"""The one definition of every mask kind.  All variants follow it or declare the
combination unsupported; the float64 reference and the FLOP count are built from it.

Every mask keeps, for query ``i`` of batch element ``b``, one contiguous range of keys
``lo <= j < hi``:

* ``none``:    all keys, ``0 <= j < kv_len``.
* ``causal``:  ``j <= i``.  Aligned top-left (query 0 sees key 0), as PyTorch SDPA's
  ``is_causal`` and xformers' ``LowerTriangularMask``: with ``q_len > kv_len`` the
  queries past the last key see every key; with ``q_len < kv_len`` the keys past
  ``q_len`` are seen by nobody.
* ``window``:  causal sliding window of ``window`` keys including the query's own
  position: ``i - window < j <= i`` (top-left aligned, like causal).
* ``padding``: batch element ``b`` has ``kv_lengths(case)[b]`` valid keys, ``j < len_b``;
  all queries are valid.  The lengths are deterministic:
  ``len_b = kv_len - ((b + 1) * kv_len) // (2 * batch)``, spread evenly from nearly
  ``kv_len`` (b = 0) down to about ``kv_len / 2`` (last b); never below 1.

A query that sees no key (possible with ``window`` when ``q_len >= kv_len + window``)
returns zeros, as PyTorch SDPA does, and passes no gradient.
"""

from __future__ import annotations

import torch

from bench.case import Case


def kv_lengths(case: Case) -> list[int]:
    """Valid key count per batch element (padding mask); kv_len for other masks."""
    if case.mask != "padding":
        return [case.kv_len] * case.batch
    b2 = 2 * case.batch
    return [case.kv_len - ((b + 1) * case.kv_len) // b2 for b in range(case.batch)]


def _ramp(n: int, cap: int) -> int:
    """sum of min(m, cap) for m = 1..n (0 when n <= 0), in closed form."""
    if n <= 0:
        return 0
    if n <= cap:
        return n * (n + 1) // 2
    return cap * (cap + 1) // 2 + (n - cap) * cap


def kept_pairs(case: Case) -> int:
    """(query, key) pairs the mask keeps, summed over the batch, for one head: exact, in
    closed form (no per-token memory, whatever the lengths).  Query i keeps
    clamp(hi_i, 0, kv_len) - clamp(lo_i, 0, kv_len) keys with the ranges of key_range."""
    lq, lk = case.q_len, case.kv_len
    if case.mask == "none":
        per_batch = lq * lk
    elif case.mask == "causal":
        per_batch = _ramp(lq, lk)  # query i keeps min(i + 1, kv_len)
    elif case.mask == "window":
        per_batch = _ramp(lq, lk) - _ramp(lq - case.window, lk)  # less the keys before i - window + 1
    elif case.mask == "padding":
        return lq * sum(kv_lengths(case))
    else:
        raise ValueError(f"unknown mask {case.mask!r}")
    return per_batch * case.batch


def key_range(case: Case, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) int64 tensors of shape (B or 1, q_len): query i keeps keys lo <= j < hi."""
    i = torch.arange(case.q_len, device=device).unsqueeze(0)  # (1, Lq)
    hi = torch.full_like(i, case.kv_len)
    lo = torch.zeros_like(i)
    if case.mask in ("causal", "window"):
        hi = torch.clamp(i + 1, max=case.kv_len)
    if case.mask == "window":
        lo = torch.clamp(i - case.window + 1, min=0)
    if case.mask == "padding":
        lens = torch.tensor(kv_lengths(case), device=device).unsqueeze(1)  # (B, 1)
        hi = lens.expand(case.batch, case.q_len)
        lo = torch.zeros_like(hi)
    return lo, hi


def dense_keep(case: Case, device="cpu") -> torch.Tensor | None:
    """Boolean keep-mask of shape (B or 1, 1, q_len, kv_len); None for mask 'none'."""
    if case.mask == "none":
        return None
    lo, hi = key_range(case, device)
    j = torch.arange(case.kv_len, device=device)
    keep = (j >= lo.unsqueeze(-1)) & (j < hi.unsqueeze(-1))  # (B|1, Lq, Lk)
    return keep.unsqueeze(1)


def has_empty_rows(case: Case) -> bool:
    """True when some query sees no key (its output is defined as zero)."""
    return case.mask == "window" and case.q_len >= case.kv_len + case.window


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None, empty_rows: bool) -> torch.Tensor:
    """softmax(scores) over keys with masked positions at -inf; empty rows give zeros.

    The empty-row handling keeps both the forward and its gradient finite.
    """
    if keep is None:
        return scores.softmax(-1)
    scores = scores.masked_fill(~keep, float("-inf"))
    if not empty_rows:
        return scores.softmax(-1)
    empty = ~keep.any(-1, keepdim=True)
    return scores.masked_fill(empty, 0.0).softmax(-1).masked_fill(empty, 0.0)
