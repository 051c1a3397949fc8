"""The plugin API's stable import path for variants (``bench.model.registry`` holds them): the
``variant`` decorator, what a factory returns (``Prepared``), timing its structure-dependent
preparation (``prep``), and availability."""

from bench.model.registry import (
    CAPABILITIES,
    DuplicateVariantError,
    Prepared,
    RegistryError,
    Variant,
    available,
    prep,
    variant,
)

__all__ = ["CAPABILITIES", "DuplicateVariantError", "Prepared", "RegistryError", "Variant", "available", "prep",
           "variant"]
