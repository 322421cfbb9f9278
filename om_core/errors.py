"""Errors the library raises on purpose. The CLI prints their message; it never shows a traceback."""

from __future__ import annotations


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


class EntryNotFound(OmError):
    pass


class InvalidArgument(OmError):
    exit_code = 2
