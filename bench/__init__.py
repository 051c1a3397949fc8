"""attnbench: benchmark and profile attention implementations."""

__version__ = "0.1.0"
