"""The write connection of an ingest, and the memory DuckDB may use on it."""

from __future__ import annotations

import os
import threading
import time

import duckdb

from om_core.store import db as dbmod
from om_core.store.sqlfiles import query

# DuckDB's memory limit on connections the ingest opens itself (DuckDB's default is 80% of RAM and
# its cache grows towards it). Raised for a file with very long lines: a row must fit with room.
MEMORY_LIMIT = 256 << 20
LINE_ROOM = 3  # memory limit >= LINE_ROOM x the longest line in flight + MEMORY_LIMIT
HOLD_SECONDS = 5.0  # give readers a chance at the file between files of a long ingest


class WriteConnection:
    """The write connection of an ingest: a given one, or one opened from a path and released
    between files every few seconds so a waiting reader can take the file. Its ``cursor`` reads
    committed rows beside it (the read-ahead thread plans the next files with it)."""

    def __init__(self, db: str | os.PathLike | duckdb.DuckDBPyConnection) -> None:
        self.path = None if isinstance(db, duckdb.DuckDBPyConnection) else db
        self.memory_limit: int | None = None  # bytes, when this ingest set it (its own connection)
        self.con = db if self.path is None else self._open()
        self.cursor = self.con.cursor()  # for the read-ahead thread, which holds ``lock`` to use it
        self.lock = threading.Lock()
        self.since = time.monotonic()

    def _open(self) -> duckdb.DuckDBPyConnection:
        con = dbmod.connect(self.path)
        self.memory_limit = None
        if MEMORY_LIMIT:
            self._set_memory_limit(con, MEMORY_LIMIT)
        return con

    def _set_memory_limit(self, con: duckdb.DuckDBPyConnection, limit: int) -> None:
        con.execute(query("set_memory_limit"), {"limit": f"{int(limit)}B"})
        self.memory_limit = int(limit)

    def make_room(self, line_bytes: int) -> None:
        """Raise the memory limit this ingest set if a line needs it (called by whoever holds the connection)."""
        if self.memory_limit is not None and LINE_ROOM * line_bytes + MEMORY_LIMIT > self.memory_limit:
            self._set_memory_limit(self.con, LINE_ROOM * line_bytes + MEMORY_LIMIT)

    def after_out_of_memory(self) -> bool:
        """Raise the limit this ingest set after DuckDB ran out of memory; False if there is none to raise."""
        if self.memory_limit is None:
            return False
        self._set_memory_limit(self.con, self.memory_limit * 4)
        return True

    def breathe(self) -> duckdb.DuckDBPyConnection:
        if self.path is not None and time.monotonic() - self.since > HOLD_SECONDS:
            with self.lock:
                self.cursor.close()
                self.con.close()
                time.sleep(0.2)
                self.con = self._open()
                self.cursor = self.con.cursor()
            self.since = time.monotonic()
        return self.con

    def close(self) -> None:
        with self.lock:
            self.cursor.close()
            if self.path is not None:
                self.con.close()
