"""Built-in attention variants: one module per family, each registered with
``bench.registry.variant``.  See variants/README.md for how to add one."""
