"""Where an exception came from, and so what kind of failure it is.

A status is a verdict on the cell, so it must not depend on the words of a message: a
plugin whose own code raises ``ValueError("mode not supported")`` has a bug, not a library
that refuses the case.  ``origin(exc)`` reads the traceback instead:

- ``library``: the innermost frame is in an installed library (torch, xformers, triton,
  the standard library, generated code: Inductor's cache included; ``pip --user`` or any other
  install root of an imported library), or the innermost frame of our code or the
  variant's was calling into compiled code (a C function such as
  ``torch.nn.functional.scaled_dot_product_attention`` has no Python frame of its own);
- ``harness``: the innermost frame is in ``bench/`` and was not such a call;
- ``variant``: the innermost frame is in a variant's file (``variants/`` or a plugin).

``classify(exc)`` turns that into a status: an out-of-memory error is ``oom``; a library's
``NotImplementedError``, or a library error whose text reads as a refusal (matched without
regard to case: ``CUDNN_STATUS_NOT_SUPPORTED`` is one), is ``unsupported``; a variant's own
``raise NotImplementedError(...)`` is its deliberate refusal, ``unsupported`` too; anything
else is ``error``, with where it was raised.
"""

from __future__ import annotations

import dis
import functools
import sysconfig
from dataclasses import dataclass
from pathlib import Path

REFUSALS = ("no available kernel", "no viable backend", "no operator found", "not supported",
            "does not support", "not_supported", "no execution plans", "cudnn frontend error",
            "not implemented for", "does not have a deterministic implementation")
OOM_TEXTS = ("out of memory", "can't allocate memory")
_CALLS = ("CALL", "PRECALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX", "CALL_KW")


LIBRARIES = ("torch", "triton", "xformers", "numpy")  # where one is imported, its install root is a library's


def inductor_cache_dir(environ=None, user: str | None = None, tmp: str | None = None) -> Path:
    """The folder Inductor writes the code it generates to: TORCHINDUCTOR_CACHE_DIR, or
    torchinductor_<user> in the temporary folder (torch._inductor's own default), computed
    without importing Inductor."""
    import getpass
    import os
    import tempfile

    environ = os.environ if environ is None else environ
    if environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return Path(environ["TORCHINDUCTOR_CACHE_DIR"])
    try:
        user = user or getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Path(tmp or tempfile.gettempdir()) / f"torchinductor_{user.replace(os.sep, '_')}"


def library_roots(modules=None) -> tuple[Path, ...]:
    """Every folder whose code counts as a library's: the interpreter's library paths, the user
    site (``pip --user``), each imported library's own install root wherever it lies, and the
    Inductor cache that holds the code torch.compile generates."""
    import site
    import sys

    modules = sys.modules if modules is None else modules
    roots = {Path(p) for key in ("stdlib", "platstdlib", "purelib", "platlib")
             if (p := sysconfig.get_paths().get(key))}
    try:
        roots.add(Path(site.getusersitepackages()))
    except (AttributeError, TypeError):  # a site module without a user site (some virtual environments)
        pass
    for name in LIBRARIES:
        mod = modules.get(name)
        if getattr(mod, "__file__", None):
            roots.add(Path(mod.__file__).parent)
    roots.add(inductor_cache_dir())
    return tuple(sorted({r.resolve() for r in roots}))


@functools.cache
def _roots() -> tuple[Path, Path]:
    """(the harness's folder, the built-in variants' folder)."""
    harness = Path(__file__).resolve().parents[1]  # bench/
    return harness, harness.parent / "variants"  # the built-in variants lie beside bench/


def _where(filename: str) -> str:
    if filename.startswith("<"):  # generated code: dynamo's, exec'd strings, frozen modules
        return "library"
    path = Path(filename).resolve()
    harness, builtin_variants = _roots()
    if path.is_relative_to(harness):
        return "harness"
    if path.is_relative_to(builtin_variants):
        return "variant"
    if any(path.is_relative_to(root) for root in library_roots()):
        return "library"
    return "variant"  # a plugin file, wherever it lies


def _calling(tb) -> bool:
    """True when the frame's current instruction is a call (the exception came from the callee)."""
    for ins in dis.get_instructions(tb.tb_frame.f_code):
        if ins.offset == tb.tb_lasti:
            return ins.opname in _CALLS
    return False


@dataclass(frozen=True)
class Origin:
    who: str  # library | harness | variant
    where: str  # file:line of the innermost frame ("" when the exception has no traceback)


def origin(exc: BaseException) -> Origin:
    tb = exc.__traceback__
    if tb is None:
        return Origin("library", "")
    while tb.tb_next is not None:
        tb = tb.tb_next
    filename = tb.tb_frame.f_code.co_filename
    who = _where(filename)
    if who != "library" and _calling(tb):
        who = "library"
    short = filename if filename.startswith("<") else "/".join(Path(filename).parts[-2:])
    return Origin(who, f"{short}:{tb.tb_lineno}")


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    return origin(exc).who == "library" and any(t in str(exc).lower() for t in OOM_TEXTS)


def is_refusal(exc: BaseException) -> bool:
    """The library refused the case (or the variant declined it with NotImplementedError)."""
    who = origin(exc).who
    if isinstance(exc, NotImplementedError):
        return who in ("library", "variant")
    return who == "library" and any(t in str(exc).lower() for t in REFUSALS)


def classify(exc: BaseException) -> tuple[str, str, str]:
    """(status, reason kind, where): oom, unsupported (library) or error (see the module doc)."""
    o = origin(exc)
    if is_oom(exc):
        return "oom", "oom", o.where
    if is_refusal(exc):
        return "unsupported", ("library" if o.who == "library" else "capability"), o.where
    return "error", "error", f"{o.who} code, {o.where}" if o.where else o.who
