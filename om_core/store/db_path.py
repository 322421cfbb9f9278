"""Where the user's database is: ``--db``, else ``OM_DB``, else om's folder in the user's data
directory. Apart from ``om_core.store.db`` so that finding the path loads no DuckDB (a command that
only asks a running endpoint never opens the file)."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DB = "om.duckdb"


def data_dir() -> Path:
    """om's folder in the user's data directory: ``$XDG_DATA_HOME/om``, else ``~/.local/share/om``."""
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "share") / "om"


def default_db_path() -> Path:
    """The database when none is named: in the user's data directory, never in a project folder."""
    return data_dir() / DEFAULT_DB


def resolve_db_path(explicit: str | os.PathLike | None = None) -> Path:
    """``--db`` wins, then ``OM_DB``, then the user's data directory (``default_db_path``)."""
    return Path(explicit or os.environ.get("OM_DB") or default_db_path())
