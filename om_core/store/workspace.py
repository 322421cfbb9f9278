"""One way into the library: a workspace is the database, the resolved settings, and a runner of the
named ``sql/`` queries that returns named rows.

A command builds one workspace (``Workspace.open``), a flow run builds one from its serialisable form
(``WorkspaceSpec``, once per flow run), and a session's replay builds one around an in-memory copy of
the session's rows (``om_core.replay.payload``). Every library entry point takes a workspace, so
nothing below it resolves settings or opens files on its own (no ``Settings()`` default anywhere).

Two kinds of database:
* ``FileDatabase``: the user's file, opened for each use and closed right after (read-only to read),
  so another process (an analyst's ``om sql``) can open it between uses. Only the process that owns
  the run (the flow, or a command) ever writes to it.
* ``MemoryDatabase``: a task-local in-memory DuckDB with the same schema, views and macros.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

import duckdb
from pydantic import BaseModel, ConfigDict

from om_core.store import db as dbmod
from om_core.store import writer_lock
from om_core.settings import ResolvedSettings, Settings, load_settings


class Database(Protocol):
    def read(self) -> Any: ...

    def write(self) -> Any: ...


class FileDatabase:
    """The user's DuckDB file: each use opens it and closes it again."""

    def __init__(self, path: str | os.PathLike, busy_seconds: float = dbmod.DEFAULT_BUSY_SECONDS) -> None:
        self.path = Path(path)
        self.busy_seconds = busy_seconds

    def read(self):
        return dbmod.reading(self.path, self.busy_seconds)

    def write(self):
        return dbmod.writing(self.path, self.busy_seconds)

    def __repr__(self) -> str:
        return f"FileDatabase({str(self.path)!r})"


class SharedFileDatabase:
    """The user's file, opened once for the uses in progress at the same time and closed when the last
    of them ends: each use gets a cursor of its own (DuckDB runs them side by side), so concurrent
    requests (the live endpoint's sessions) share one open instead of queueing for the file, and
    between bursts the file is free for other processes, as with ``FileDatabase``.

    ``holding()`` keeps the file open across several uses (a request and its reply: the close, which
    checkpoints, comes after the answer is sent). ``hold_seconds``: the file stays open that long after
    the last use, so the next use of a burst finds it open; ``close()`` lets it go at once."""

    def __init__(self, path: str | os.PathLike, busy_seconds: float = dbmod.DEFAULT_BUSY_SECONDS,
                 hold_seconds: float = 0.0) -> None:
        self.path = Path(path)
        self.busy_seconds = busy_seconds
        self.hold_seconds = hold_seconds
        self._lock = threading.Lock()  # the open happens under it: the others wait for that one open
        self._con: duckdb.DuckDBPyConnection | None = None
        self._users = 0
        self._idle_timer: threading.Timer | None = None
        self.opens = 0  # how many times the file was opened (the tests and the bench read it)
        # How many times the file was found changed when it was opened again: another process wrote it
        # while this one had let it go (what a holder of state read from it must drop then).
        self.changed_by_others = 0
        self._closed_mark: tuple[tuple[int, int] | None, ...] | None = None

    def _acquire(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            if self._con is None:
                if self._closed_mark is None or self._mark() != self._closed_mark:
                    self.changed_by_others += 1
                self._con = dbmod.connect(self.path, busy_seconds=self.busy_seconds)
                self.opens += 1
            self._users += 1
            return self._con

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users or self._con is None:
                return
            if self.hold_seconds <= 0:
                con, self._con = self._con, None
            else:
                self._idle_timer = threading.Timer(self.hold_seconds, self._close_if_idle)
                self._idle_timer.daemon = True
                self._idle_timer.start()
                return
        self._let_go(con)

    def _mark(self) -> tuple[tuple[int, int] | None, ...]:
        """The file and its write-ahead log as they stand (size, modification time)."""
        marks = []
        for path in (self.path, Path(f"{self.path}.wal")):
            try:
                info = path.stat()
                marks.append((info.st_size, info.st_mtime_ns))
            except OSError:
                marks.append(None)
        return tuple(marks)

    def _let_go(self, con: duckdb.DuckDBPyConnection) -> None:
        """Close (DuckDB checkpoints), then note how the file stands: a change found at the next open is
        another process's."""
        con.close()
        self._closed_mark = self._mark()

    def _close_if_idle(self) -> None:
        with self._lock:
            if self._users or self._con is None or self._idle_timer is not threading.current_thread():
                return  # a use came in meanwhile (and maybe a later timer): the file stays
            con, self._con, self._idle_timer = self._con, None, None
        self._let_go(con)

    @property
    def is_open(self) -> bool:
        return self._con is not None

    def close(self) -> None:
        """Let the file go now (when no use is in progress), not after ``hold_seconds``."""
        with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
                self._idle_timer = None
            if self._users or self._con is None:
                return
            con, self._con = self._con, None
        self._let_go(con)

    @contextmanager
    def holding(self) -> Iterator[None]:
        self._acquire()
        try:
            yield
        finally:
            self._release()

    @contextmanager
    def _use(self) -> Iterator[duckdb.DuckDBPyConnection]:
        cursor = self._acquire().cursor()
        try:
            yield cursor
        finally:
            try:
                cursor.close()
            finally:
                self._release()

    def read(self):
        return self._use()

    def write(self):
        return self._use()

    def __repr__(self) -> str:
        return f"SharedFileDatabase({str(self.path)!r})"


class ConnectionDatabase:
    """One open connection, used for every read and write (a command's many steps, a test, a task).

    Uses are serialised: DuckDB connections are not meant to be shared by threads without cursors."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self._lock = threading.RLock()

    @contextmanager
    def _use(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._lock:
            yield self.con

    def read(self):
        return self._use()

    def write(self):
        return self._use()

    def close(self) -> None:
        self.con.close()


class MemoryDatabase(ConnectionDatabase):
    """An in-memory DuckDB holding om's schema, views and macros (one per replay task)."""

    def __init__(self) -> None:
        # One DuckDB thread: these databases are small and many run side by side.
        super().__init__(dbmod.memory_database({"threads": 1}))


class WorkspaceSpec(BaseModel):
    """What flows, tasks and deployments carry: where the database is, and the typed settings."""

    model_config = ConfigDict(extra="forbid")

    db_path: str
    settings: Settings
    busy_seconds: float = dbmod.DEFAULT_BUSY_SECONDS


class Workspace:
    def __init__(self, db: Database, settings: Settings | None = None, *, sources: ResolvedSettings | None = None,
                 resolve: Callable[[], ResolvedSettings] | None = None) -> None:
        if settings is None and sources is None and resolve is None:
            raise TypeError("a workspace needs settings, resolved settings, or a way to resolve them")
        self.db = db
        self._settings = settings if settings is not None else (sources.settings if sources else None)
        self._sources = sources  # where each setting came from, when the workspace resolved them
        self._resolve = resolve

    @property
    def settings(self) -> Settings:
        """The typed settings, resolved on first use: a command that reads no setting (``om view``,
        ``om sql``) works, as it always did, even where a settings source is invalid."""
        if self._settings is None:
            self._sources = self._resolve()
            self._settings = self._sources.settings
        return self._settings

    @property
    def resolved(self) -> ResolvedSettings | None:
        """The settings with their sources (``om config``), when this workspace resolves them itself."""
        if self._resolve is not None and self._sources is None:
            self.settings  # noqa: B018  (resolves them)
        return self._sources

    # ------------------------------------------------------------------ building one

    @classmethod
    def open(cls, db_path: str | os.PathLike, *, config: str | os.PathLike | None = None,
             flags: Mapping[str, Any] | None = None, settings: Settings | None = None,
             busy_seconds: float = dbmod.DEFAULT_BUSY_SECONDS, project: bool = True) -> Workspace:
        """A command's workspace: the user's file and, unless given, the settings resolved from every
        source (defaults, Pi's settings files, om.toml or ``config``, OM_* variables, then the command's
        ``flags``) when first used; ``project=False`` leaves out the working folder's own files. Nothing
        is opened here: each use opens the file."""
        db = FileDatabase(db_path, busy_seconds)
        if settings is not None:
            return cls(db, settings)
        return cls(db, resolve=lambda: load_settings(config, flags, project=project))

    @classmethod
    def from_spec(cls, spec: WorkspaceSpec | dict[str, Any]) -> Workspace:
        spec = spec if isinstance(spec, WorkspaceSpec) else WorkspaceSpec.model_validate(spec)
        return cls(FileDatabase(spec.db_path, spec.busy_seconds), spec.settings)

    @classmethod
    def in_memory(cls, settings: Settings) -> Workspace:
        return cls(MemoryDatabase(), settings)

    @classmethod
    def on_connection(cls, con: duckdb.DuckDBPyConnection, settings: Settings) -> Workspace:
        """A workspace around an open connection (``close()`` closes it)."""
        return cls(ConnectionDatabase(con), settings)

    def waiting(self, busy_seconds: float) -> Workspace:
        """This workspace (its file and its settings, resolved or not) with another wait for a busy file."""
        if not isinstance(self.db, FileDatabase):
            raise TypeError("only a workspace on a database file waits for it")
        if self._settings is not None and self._resolve is None:
            return Workspace(FileDatabase(self.db.path.resolve(), busy_seconds), self._settings)
        return Workspace(FileDatabase(self.db.path.resolve(), busy_seconds), resolve=lambda: self.resolved)

    def spec(self) -> WorkspaceSpec:
        if not isinstance(self.db, FileDatabase):
            raise TypeError("only a workspace on a database file has a serialisable form")
        return WorkspaceSpec(db_path=str(self.db.path.resolve()), settings=self.settings,
                             busy_seconds=self.db.busy_seconds)

    @property
    def path(self) -> Path | None:
        return self.db.path if isinstance(self.db, FileDatabase) else None

    @property
    def has_file(self) -> bool:
        """Whether the database is a file of its own (then ``path`` names it), not one in memory or a
        caller's open connection: only a file has a writer lock, helpers and a disk that fills."""
        return isinstance(self.db, FileDatabase)

    # ------------------------------------------------------------------ using it

    def read(self):
        return self.db.read()

    def write(self):
        return self.db.write()

    @contextmanager
    def held(self) -> Iterator[Workspace]:
        """This workspace on one write connection for the block: several steps (an ingest, then the
        reads that follow it) without letting the file go in between, and without opening it twice."""
        with self.write() as con:
            yield Workspace(ConnectionDatabase(con), self.settings)

    def one_writer(self, command: str, busy_seconds: float | None = None):
        """The database's writer lock around a writing command or flow run (``om_core.store.writer_lock``):
        ``DatabaseBusy`` (exit 3) when another process holds it after ``busy_seconds`` (the database's
        own wait by default). A workspace around an open connection or in memory has no file another
        process could write."""
        if not isinstance(self.db, FileDatabase):
            return nullcontext()
        wait = self.db.busy_seconds if busy_seconds is None else busy_seconds
        return writer_lock.one_writer(self.db.path, command, wait)

    def rows(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The named query's rows as dicts (column name -> value)."""
        with self.read() as con:
            return dbmod.named_rows(con, name, params)

    def close(self) -> None:
        """Close what the database holds open (a file database holds nothing between uses)."""
        if isinstance(self.db, ConnectionDatabase):
            self.db.close()
