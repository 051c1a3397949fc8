"""The plugin API's stable import path for variants (``bench.model.registry`` holds them): the
``variant`` decorator, what a factory returns (``Prepared``), timing its structure-dependent
preparation (``prep``), whether to compile with dynamic shapes (``compile_dynamic``), the gpu-check steps
a variant may declare (``CHECKS``), and availability."""

from bench.model.registry import (
    CAPABILITIES,
    CHECKS,
    DuplicateVariantError,
    Prepared,
    RegistryError,
    Variant,
    available,
    compile_dynamic,
    prep,
    variant,
)

__all__ = ["CAPABILITIES", "CHECKS", "DuplicateVariantError", "Prepared", "RegistryError", "Variant", "available",
           "compile_dynamic", "prep", "variant"]
