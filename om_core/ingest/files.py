"""Session files on disk and what the database remembers of them: which files an ingest covers,
their sizes, the hash of the part already ingested, and their ``session_files`` rows."""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel

from om_core.store import db as dbmod
from om_core.store.sqlfiles import query

HASH_CHUNK = 1 << 20


class SessionFileRow(BaseModel):
    """A file's ``session_files`` row: how far it was ingested and what the reader needs to go on."""

    file_path: str
    session_id: str | None
    status: str  # ingested | no_header | duplicate_session
    size_bytes: int
    mtime_ns: int
    ingested_bytes: int
    ingested_lines: int
    prefix_sha256: str
    parser_state: str | None


def session_file_row(con: duckdb.DuckDBPyConnection, file_path: str) -> SessionFileRow | None:
    rows = dbmod.rows_as_dicts(con.execute(query("get_session_file"), {"file_path": file_path}))
    return SessionFileRow(**rows[0]) if rows else None


def discover(paths: Iterable[str | os.PathLike], exclude: Iterable[str] = ()) -> tuple[list[Path], list[str]]:
    """Files to ingest (directories searched recursively for *.jsonl) and paths that do not exist.

    ``exclude``: globs (fnmatch: ``*`` also matches ``/``) that leave out a file a directory walk finds,
    matched against its name and its path below that directory; a file named in ``paths`` is kept."""
    patterns = list(exclude)
    files: list[Path] = []
    missing: list[str] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file()
                           and not _excluded(p.name, p.relative_to(path).as_posix(), patterns))
        elif path.is_file():
            found = [path]
        else:
            missing.append(str(raw))
            continue
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                files.append(key)
    return files, missing


def _excluded(name: str, below: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(below, pattern) for pattern in patterns)


def total_bytes(files: Iterable[Path]) -> int:
    return sum(f.stat().st_size for f in files)


def hash_prefix(path: Path, length: int) -> Any:
    """sha256 of the first ``length`` bytes (fewer if the file is shorter), ready to be continued."""
    hasher = hashlib.sha256()
    remaining = length
    with open(path, "rb") as f:
        while remaining > 0:
            chunk = f.read(min(remaining, HASH_CHUNK))
            if not chunk:
                break
            hasher.update(chunk)
            remaining -= len(chunk)
    return hasher
