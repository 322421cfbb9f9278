"""What a search hit is: its own module, so the command line can offer the choice without loading the
search (pyarrow, duckdb)."""

from __future__ import annotations

from enum import Enum


class SearchKind(str, Enum):
    """What a hit is (``om search --kind``)."""

    observation = "observation"
    reflection = "reflection"
    entry = "entry"
    project_reflection = "project_reflection"
