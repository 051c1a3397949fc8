"""Availability probes: run a factory on a tiny copy of the case and keep the library's reason."""

from __future__ import annotations

import re
import warnings

from bench.measure.inputs import make_grad_out, make_inputs, probe_case
from bench.measure.origin import origin
from bench.model.case import Case


def library_reason(exc: BaseException, limit: int = 300) -> str:
    """The informative part of a library's refusal, on one line.

    PyTorch puts its reasons in warnings and a generic error; xformers lists, per
    operator, the lines after '... is not supported because:'.
    """
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    reasons, collecting = [], False
    for ln in lines[1:]:
        if ln.endswith("is not supported because:"):
            collecting = True
            continue
        if collecting and not re.match(r"^(query|key|value|attn_bias|p)\s*:", ln):
            if ln not in reasons:
                reasons.append(ln)
    text = lines[0] + (" (" + "; ".join(reasons) + ")" if reasons else "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def run_probe(factory, case: Case) -> str | None:
    """None when ``factory`` runs a small copy of ``case`` (with backward when the case has
    one), else the library's reason.  Only the library's refusal is a reason: an exception
    raised by the variant's own code (its factory, its call) or by the harness is a bug, and
    goes on up to become the cell's ``error`` (``bench.measure.origin``); a variant's own
    ``NotImplementedError`` is its deliberate refusal, a reason too."""
    small = probe_case(case)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = factory(small)
            fn = getattr(out, "fn", out)
            q, k, v = make_inputs(small)
            o = fn(q, k, v)
            if small.needs_grad:
                o.backward(make_grad_out(small))
        except (RuntimeError, NotImplementedError, ValueError, TypeError, AssertionError) as exc:
            who = origin(exc).who
            if not (who == "library" or (who == "variant" and isinstance(exc, NotImplementedError))):
                raise
            why = library_reason(exc)
            extra = [str(w.message).strip().splitlines()[0] for w in caught
                     if issubclass(w.category, UserWarning) and str(w.message).strip()]
            if extra:
                why += " [" + "; ".join(dict.fromkeys(extra)) + "]"
            return why
    return None
