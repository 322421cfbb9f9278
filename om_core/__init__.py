"""om_core: the observational-memory library (pure functions and small classes, no Prefect)."""

__version__ = "0.1.0"
