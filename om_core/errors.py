"""Errors the library raises on purpose. The CLI prints their message; it never shows a traceback."""

from __future__ import annotations

from enum import StrEnum


class StopReason(StrEnum):
    """Every way a run stops before its work is done, one value wherever it is carried (a replay's
    result, the flow's result, the command's exit)."""

    BUDGET = "budget"  # --max-cost: the next model call could pass it; nothing half-done kept, a rerun resumes
    CIRCUIT = "circuit"  # the run's circuit breaker tripped: model calls failing (om_core.model.circuit)
    STORAGE = "storage"  # the database could not be written (a full disk)
    INTERRUPT = "interrupt"  # Ctrl-C or SIGTERM
    BUSY = "busy"  # another process holds the database's writer lock


class OmError(Exception):
    """An expected failure with a message meant for the user."""

    exit_code = 1


class DatabaseBusy(OmError):
    """Another process holds the database file for writing."""

    exit_code = 3


class DatabaseMissing(OmError):
    """No database at the given path (nothing has been ingested yet)."""


class NotADatabase(OmError):
    """The path is not an om DuckDB database (another file, a directory, someone else's database)."""


class SessionNotFound(OmError):
    pass


class AmbiguousSession(OmError):
    pass


class AmbiguousMemoryId(OmError):
    """A prefix that starts several observation or reflection ids."""


class EntryNotFound(OmError):
    pass


class InvalidArgument(OmError):
    exit_code = 2


class StorageError(OmError):
    """The database could not be written: no space left, a read-only filesystem, no permission.
    What was committed before stays; the command stops instead of trying file after file."""


_STORAGE_CAUSES = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded",
                   "File too large")
_STORAGE_ERRNOS = {28: "No space left on device", 30: "Read-only file system", 13: "Permission denied",
                   1: "Operation not permitted", 122: "Disk quota exceeded", 27: "File too large"}


def storage_error(exc: BaseException, path: object = None) -> StorageError | None:
    """A ``StorageError`` naming the path and the cause when ``exc`` is a write failure of the
    storage (DuckDB reports them as text: 'Could not write file "X": No space left on device')."""
    if isinstance(exc, StorageError):
        return exc
    import re

    text = str(exc)
    cause = next((c for c in _STORAGE_CAUSES if c.lower() in text.lower()), None)
    if cause is None and isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        cause = _STORAGE_ERRNOS[exc.errno]
    if cause is None:
        return None
    named = re.search(r'(?:file|directory|open|create|write)\s+"([^"]+)"', text, re.IGNORECASE)
    where = named.group(1) if named else (getattr(exc, "filename", None) or path)
    return StorageError(f"cannot write {where}: {cause}" if where else f"cannot write the database: {cause}")
