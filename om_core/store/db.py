"""Opening the DuckDB ledger: a new database from the schema snapshot, an existing one upgraded by the
migrations it lacks, views and macros, and a polite wait when it is busy.

A new database (a file, or a replay's in-memory one) is a copy of a template that this process builds
once from ``sql/schema/current.sql`` (``build_schema``); the numbered migrations only upgrade files
that already exist. DuckDB admits one writing process. Long runs therefore open the database only to
write, and every opener retries briefly on a lock before giving a clear ``DatabaseBusy`` error.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from om_core.errors import DatabaseBusy, DatabaseMissing, NotADatabase, storage_error
from om_core.store.migrations import DATA_STEPS
from om_core.store.sqlfiles import migrations, query, schema_snapshot, view_scripts, views_fingerprint

DEFAULT_BUSY_SECONDS = 5.0


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc)
    return "Could not set lock" in text or "Conflicting lock" in text


def _open(path: Path, read_only: bool, busy_seconds: float) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + busy_seconds
    delay = 0.05
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.ConnectionException as exc:
            # another thread of this process holds the file open the other way (a read beside a write,
            # e.g. an interrupted run's row written while the flow reads): it lets go within moments
            if "different configuration" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(delay)
        except duckdb.IOException as exc:
            if not _is_lock_error(exc):
                stored = storage_error(exc, path)
                if stored is not None:  # a read-only filesystem, no permission, no space: not a bad file
                    raise stored from None
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise NotADatabase(f"cannot open {path} as a DuckDB database: {reason}") from None
            if time.monotonic() >= deadline:
                holder = str(exc).split("Conflicting lock is held in", 1)[-1].split(". See", 1)[0].strip()
                raise DatabaseBusy(
                    f"the database {path} is being written by another process ({holder}); "
                    "try again when it finishes"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)  # poll often: a long run releases the file only briefly


def _applied_migrations(con: duckdb.DuckDBPyConnection) -> set[int]:
    return {row["version"] for row in rows_as_dicts(con.execute(query("applied_migrations")))}


def _bookkeeping(con: duckdb.DuckDBPyConnection) -> None:
    """om_internal.schema_migrations and om_meta, adopted from main for a database before 008."""
    with transaction(con):
        con.execute(query("create_internal_schema"))
        con.execute(query("create_schema_migrations"))
        con.execute(query("create_om_meta"))
        if scalar(con, "bookkeeping_in_main"):
            con.execute(query("adopt_bookkeeping_in_main"))


def apply_migrations(con: duckdb.DuckDBPyConnection) -> list[int]:
    """Apply every pending migration, each in its own transaction with its record."""
    _bookkeeping(con)
    done = _applied_migrations(con)
    applied = []
    for version, name, script in migrations():
        if version in done:
            continue
        with transaction(con):
            con.execute(script)
            if version in DATA_STEPS:
                # rows derived from stored data, in the migration's transaction: the migration is
                # recorded only together with them
                DATA_STEPS[version](con)
            con.execute(query("record_migration"), {"version": version, "name": name})
        applied.append(version)
    return applied


def build_schema(con: duckdb.DuckDBPyConnection) -> None:
    """A new database's tables from the schema snapshot, recorded as at the latest migration (every
    migration listed as applied: none of them has anything to do), then its views and macros."""
    _bookkeeping(con)
    with transaction(con):
        con.execute(schema_snapshot())
        for version, name, _ in migrations():
            con.execute(query("record_migration"), {"version": version, "name": name})
    ensure_views(con)


def bring_up_to_date(con: duckdb.DuckDBPyConnection) -> None:
    """The schema of any database opened for writing: a new one (no migration recorded) is built from
    the snapshot, an existing one gets the migrations it lacks; then the views and macros."""
    _bookkeeping(con)
    if _applied_migrations(con):
        apply_migrations(con)
        ensure_views(con)
    else:
        build_schema(con)


# The template: one database per process built by build_schema, which every new database copies.
# A process forked from this one builds its own (the parent removes its template when it exits).
_template_lock = threading.Lock()
_template: Path | None = None


def _forget_template() -> None:
    global _template, _template_lock
    _template, _template_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_template)


def _remove_template(owner: int, folder: Path) -> None:
    if os.getpid() == owner:
        shutil.rmtree(folder, ignore_errors=True)


def template_path() -> Path:
    """This process's template database, built on first use (and again if it was deleted)."""
    global _template
    with _template_lock:
        if _template is None or not _template.exists():
            folder = Path(tempfile.mkdtemp(prefix="om-schema-"))
            atexit.register(_remove_template, os.getpid(), folder)
            path = folder / "template.duckdb"
            con = duckdb.connect(str(path))
            try:
                build_schema(con)
            finally:
                con.close()  # checkpointed: the file alone holds it, no WAL beside it
            _template = path
        return _template


def memory_database(config: dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory database with om's schema, views and macros: the template's catalog copied in
    as it is (a few ms), where parsing and binding the snapshot, views and macros again would cost
    some 100 ms more (bench/perf/fresh_db.py --parts)."""
    con = duckdb.connect(":memory:", config=config or {})
    try:
        con.execute(query("attach_template"), {"path": str(template_path())})
        con.execute(query("copy_template_to_memory"))
        con.execute(query("detach_template"))
    except Exception:
        con.close()
        raise
    return con


def _create_from_template(path: Path) -> None:
    """A new database file at ``path``, as a copy of the template. It appears whole (copied beside it,
    then linked into place), and a file another process created meanwhile is kept. Where the
    filesystem has no hard links, nothing is created: the opener then builds the schema in the new
    file itself (build_schema, the fallback)."""
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.new")
    try:
        shutil.copyfile(template_path(), part)
        os.chmod(part, 0o600)  # the user's sessions: this user's only, whatever the umask
        try:
            os.link(part, path)
        except FileExistsError:
            pass  # another process created it first: that one is the database
        except OSError:
            pass  # no hard links here: the fallback above
    except OSError as exc:
        stored = storage_error(exc, path)
        if stored is not None:
            raise stored from None
        raise
    finally:
        part.unlink(missing_ok=True)


def ensure_views(con: duckdb.DuckDBPyConnection) -> bool:
    """(Re)create views and macros when their SQL text changed. Returns True if it did."""
    fingerprint = views_fingerprint()
    if scalar(con, "get_meta", {"key": "views_fingerprint"}) == fingerprint:
        return False
    with transaction(con):
        for _, script in view_scripts():
            con.execute(script)
        con.execute(query("set_meta"), {"key": "views_fingerprint", "value": fingerprint})
    return True


def _schema_current(con: duckdb.DuckDBPyConnection) -> bool:
    if not scalar(con, "internal_table_exists", {"name": "schema_migrations"}):
        return False  # new, or written before migration 008 (bookkeeping in main)
    done = _applied_migrations(con)
    if not {v for v, _, _ in migrations()} <= done:
        return False
    return scalar(con, "get_meta", {"key": "views_fingerprint"}) == views_fingerprint()


def connect(
    path: str | os.PathLike,
    *,
    read_only: bool = False,
    busy_seconds: float = DEFAULT_BUSY_SECONDS,
) -> duckdb.DuckDBPyConnection:
    """Open the database; a writer brings schema, views and macros up to date first.

    A reader of an outdated file briefly opens it for writing to upgrade it, then reopens it
    read-only, so analysts never see a half-built schema.
    """
    path = Path(path)
    if read_only:
        if not path.exists():
            raise DatabaseMissing(f"no database at {path}; run `om ingest PATH` first (or pass --db)")
        con = _open(path, True, busy_seconds)
        if _schema_current(con):
            return con
        foreign = not scalar(con, "table_exists", {"name": "schema_migrations"}) and scalar(con, "user_table_count", {})
        con.close()
        if foreign:  # a reader never adds om's schema to somebody else's database
            raise NotADatabase(f"{path} is a DuckDB database but not an om one (no schema_migrations table)")
        _open_for_write(path, busy_seconds).close()
        return _open(path, True, busy_seconds)
    return _open_for_write(path, busy_seconds)


def _open_for_write(path: Path, busy_seconds: float) -> duckdb.DuckDBPyConnection:
    if path.parent and not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        _create_from_template(path)
    con = _open(path, False, busy_seconds)
    try:
        if not _schema_current(con):
            bring_up_to_date(con)
    except Exception:
        con.close()
        raise
    return con


@contextmanager
def writing(path: str | os.PathLike, busy_seconds: float = DEFAULT_BUSY_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    """A write connection that is closed (and the file released) as soon as the block ends."""
    con = connect(path, busy_seconds=busy_seconds)
    try:
        yield con
    finally:
        con.close()


@contextmanager
def reading(path: str | os.PathLike, busy_seconds: float = DEFAULT_BUSY_SECONDS) -> Iterator[duckdb.DuckDBPyConnection]:
    con = connect(path, read_only=True, busy_seconds=busy_seconds)
    try:
        yield con
    finally:
        con.close()


@contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


def scalar(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any] | None = None) -> Any:
    """The one value of a one-row, one-column query (None when it returns no row). Reads the whole
    result: DuckDB refuses some calls (``register``) while a result is still open."""
    rows = con.execute(query(name), params or {}).fetchall()
    return rows[0][0] if rows else None


def insert_arrow(con: duckdb.DuckDBPyConnection, view_name: str, table: Any, query_name: str,
                 params: dict[str, Any] | None = None) -> None:
    """Run the named INSERT … SELECT over an Arrow table registered as ``view_name``."""
    insert_arrow_with(con, view_name, table, query(query_name), params)


def insert_arrow_with(con: duckdb.DuckDBPyConnection, view_name: str, table: Any, statement: str,
                      params: dict[str, Any] | None = None) -> None:
    """``insert_arrow`` for a statement of ``sql/`` already in hand (a table template's, ``table_query``)."""
    con.register(view_name, table)
    try:
        con.execute(statement, params or {})
    finally:
        try:
            con.unregister(view_name)
        except duckdb.Error:  # an aborted transaction refuses even this; the insert's error matters
            pass


# Python reads query results by column name, never by position: the helpers below give rows as dicts
# (or models) keyed by the names the SQL gives its columns.


def rows_as_dicts(cursor: Any) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


Row = TypeVar("Row")


def rows_as(model: Callable[..., Row], cursor: Any) -> list[Row]:
    """The cursor's rows as ``model(**row)`` (a pydantic model, dataclass or NamedTuple whose fields
    are the query's column names)."""
    return [model(**row) for row in rows_as_dicts(cursor)]


def named_rows(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows of the named query as dicts (column name -> value)."""
    return rows_as_dicts(con.execute(query(name), params or {}))


def named_row(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The first row of the named query as a dict, or None."""
    found = named_rows(con, name, params)
    return found[0] if found else None


def named_column(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any] | None = None) -> list[Any]:
    """The values of a one-column named query, in row order."""
    cursor = con.execute(query(name), params or {})
    if len(cursor.description) != 1:
        raise ValueError(f"query {name!r} returns {len(cursor.description)} columns, not one")
    return [value for (value,) in cursor.fetchall()]
