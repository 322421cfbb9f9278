"""Lossless, idempotent, incremental ingest of Pi session files into DuckDB.

Per file:
* new file: read it all;
* grown file (Pi appends): the stored hash of the ingested prefix still matches, so only the new
  lines are read;
* rewritten file (Pi rewrites whole files when it migrates them): the prefix hash differs, so the
  session's rows are replaced;
* unchanged file: nothing happens.

Lines stream through in batches of about 1 MB, so memory does not grow with file size. A reader
thread plans the files and parses them into batches, up to ``READ_AHEAD_BYTES`` ahead; each batch's
real-tokenizer counts start at once on the tokenizer threads (``count_tokens(wait=False)``, the GIL
released). The calling thread does all the database work: it inserts batches as their counts come
in, commits every ``COMMIT_BYTES`` (DuckDB holds uncommitted rows in memory) and finishes each
session, while the reader and the tokenizer threads are already on the next files.

Crash safety: a file's ``session_files`` row (offset, prefix hash, parser state) is written only in
the file's last transaction, together with everything derived from the whole session (branches,
notes, ledger imports, the session row). Rows that an interrupted ingest committed beyond the
recorded offset are deleted before the file is read again, so nothing is ever duplicated; a failed
ingest removes them at once where it can.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from pydantic import BaseModel, Field

from om_core import db as dbmod
from om_core.errors import OmError, StorageError, storage_error
from om_core.ledger import ImportCounts, forget_imported, import_entries, ledger_candidates
from om_core.session import ParsedEntry, ParserState, RejectedLine, SessionHeader, SessionParser
from om_core.runs import finish_run, start_run
from om_core.sqlfiles import query
from om_core.tokens import DEFAULT_ENCODING, TokenCounts, count_tokens
from om_core.tree import Forest, TreeIntervals, build_forest

BATCH_ENTRIES = 2000
BATCH_BYTES = 1 << 20  # small batches: parsing and tokenizing overlap even in small files
INSERT_BYTES = 4 << 20  # consecutive batches go into one INSERT
COMMIT_BYTES = 16 << 20  # commit a long file in chunks: DuckDB keeps uncommitted rows in memory
READ_BUFFER = 1 << 20  # file reads (each lets go of the GIL)
READ_AHEAD_BYTES = 8 << 20  # parsed (and being counted) in the next files while one is finished
# DuckDB's memory limit on connections the ingest opens itself (DuckDB's default is 80% of RAM and
# its cache grows towards it). Raised for a file with very long lines: a row must fit with room.
MEMORY_LIMIT = 256 << 20
LINE_ROOM = 3  # memory limit >= LINE_ROOM x the longest line in flight + MEMORY_LIMIT
HOLD_SECONDS = 5.0  # give readers a chance at the file between files of a long ingest
TREE_NOTE_KINDS = ("dangling_parent", "parent_cycle")

ProgressFn = Callable[[int], None]


class FileReport(BaseModel):
    path: str
    session_id: str | None = None
    status: str  # new | appended | rewritten | unchanged | no_header | duplicate_session | error
    entries_added: int = 0
    lines_quarantined: int = 0
    bytes_read: int = 0
    ledger: dict[str, int] = Field(default_factory=dict)  # imported records, folded compactions, ignored
    notes: list[str] = Field(default_factory=list)
    error: str | None = None


class IngestReport(BaseModel):
    run_id: str
    files: list[FileReport] = Field(default_factory=list)
    missing_paths: list[str] = Field(default_factory=list)
    seconds: float = 0.0

    @property
    def entries_added(self) -> int:
        return sum(f.entries_added for f in self.files)

    @property
    def lines_quarantined(self) -> int:
        return sum(f.lines_quarantined for f in self.files)

    def ledger_counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for f in self.files:
            for key, value in f.ledger.items():
                total[key] = total.get(key, 0) + value
        return total

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.files:
            out[f.status] = out.get(f.status, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "files": len(self.files),
            "by_status": self.counts(),
            "entries_added": self.entries_added,
            "lines_quarantined": self.lines_quarantined,
            "ledger": self.ledger_counts(),
            "bytes_read": sum(f.bytes_read for f in self.files),
            "missing_paths": self.missing_paths,
            "errors": [{"path": f.path, "error": f.error} for f in self.files if f.error],
            "seconds": round(self.seconds, 3),
        }


def discover(paths: Iterable[str | os.PathLike]) -> tuple[list[Path], list[str]]:
    """Files to ingest (directories searched recursively for *.jsonl) and paths that do not exist."""
    files: list[Path] = []
    missing: list[str] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
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


def total_bytes(files: Iterable[Path]) -> int:
    return sum(f.stat().st_size for f in files)


# ------------------------------------------------------------------ reading a file


@dataclass(slots=True)
class _Batch:
    """Parsed rows of consecutive lines, their token counts on the way (``count_tokens(wait=False)``)."""

    session_id: str | None
    entries: list[ParsedEntry]
    rejected: list[RejectedLine]
    ends: list[int]  # per entry: end of its text pieces in the counted list
    counts: TokenCounts | None  # None: no text to count
    longest: int  # longest line, in bytes
    size: int  # characters of raw text


@dataclass(slots=True)
class _Header:
    """The session header, with what the file's row must record if the file turns out to be a copy."""

    header: SessionHeader
    line_no: int
    data: bytes
    offset: int  # just after the header line
    hasher: Any  # prefix hash up to there
    state: ParserState  # parser state just after the header


@dataclass(slots=True)
class _Plan:
    """What to do with a file, decided from its ``session_files`` row and the file on disk."""

    path: Path
    stat: os.stat_result
    row: tuple | None
    action: str  # new | afresh | unchanged | touch | appended | rewritten
    offset: int = 0  # appended: where the new lines start
    line_no: int = 0
    state: ParserState | None = None
    hasher: Any = None

    @property
    def key(self) -> str:
        return str(self.path)

    @property
    def reads(self) -> bool:
        return self.action not in ("unchanged", "touch")


def _no_header_error(lines: int) -> str:
    return f"not a Pi session file: no valid session header in {lines} line(s) (all kept in quarantine)"


def _plan(con: duckdb.DuckDBPyConnection, path: Path) -> _Plan:
    """Decide what to do with ``path``. Only reads: ``con`` may be a cursor beside the writing connection
    (a file's row is changed by nothing but the ingest of that file)."""
    stat = path.stat()
    row = dbmod.one(con, "get_session_file", {"file_path": str(path)})
    if row is None:
        return _Plan(path, stat, row, "new")
    _, session_id, status, size, mtime_ns, done_bytes, done_lines, prefix, state_json = row
    if stat.st_size == size and stat.st_mtime_ns == mtime_ns and status != "duplicate_session":
        return _Plan(path, stat, row, "unchanged")
    if status != "ingested":
        # Never became a session (no header, or a copy of another file): read it afresh. A copy
        # is looked at every time, since the file it copies may have gone (cheap: one line).
        return _Plan(path, stat, row, "afresh")
    hasher = _hash_prefix(path, done_bytes) if stat.st_size >= done_bytes else None
    if hasher is None or hasher.hexdigest() != prefix:
        return _Plan(path, stat, row, "rewritten")
    if stat.st_size == done_bytes:
        return _Plan(path, stat, row, "touch")
    state = _state_from_json(state_json)
    if state.version < 2 and state.session_id:
        ids = con.execute(query("v1_ids_by_index_upto"),
                          {"session_id": state.session_id, "line_no": done_lines}).fetchall()
        for index, entry_id in ids:
            state.ids_by_index[index] = entry_id
            state.minted_ids.add(entry_id)
    return _Plan(path, stat, row, "appended", done_bytes, done_lines, state, hasher)


class _Reader:
    """Parses one file into ``_Batch`` and ``_Header`` events. It touches no database, so the
    read-ahead thread runs it ahead of the ingest (``feeder`` set); a reader without a feeder is
    driven by whoever asks for its events."""

    def __init__(self, plan: _Plan, progress: ProgressFn | None, encoding: str, threads: int,
                 feeder: _ReadAhead | None = None) -> None:
        appended = plan.action == "appended"
        self.plan = plan
        self.progress = progress
        self.encoding = encoding
        self.threads = threads
        self.feeder = feeder
        self.offset = self.start_offset = plan.offset if appended else 0
        self.line_no = plan.line_no if appended else 0
        self.parser = SessionParser(plan.state if appended else None)
        self.hasher = plan.hasher if appended else hashlib.sha256()
        self.session_id = self.parser.state.session_id
        self.file = open(plan.path, "rb", buffering=READ_BUFFER)
        self.unhashed: list[bytes] = []  # lines read but not yet hashed (hashed a batch at a time)
        self.file.seek(self.offset)
        self.lines = iter(self.file)
        self.entries: list[ParsedEntry] = []
        self.rejected: list[RejectedLine] = []
        self.size = 0
        self.longest = 0
        # Shared with the consumer (under the feeder's lock when there is a feeder):
        self.events: deque[_Batch | _Header] = deque()
        self.done = False  # no more events will come
        self.stopped = False  # the consumer wants no more events
        self.error: BaseException | None = None
        self.final: tuple[int, int, Any, ParserState] | None = None  # offset, lines, hash, parser state
        self.finished: tuple[int, int, Any, ParserState] | None = None  # the producer's, at the end

    # ---- consumer side

    def next_event(self) -> _Batch | _Header | None:
        if self.feeder is not None:
            return self.feeder.next_event(self)
        while not self.events and not self.done:
            self.events.extend(self.parse_some())
        return self.events.popleft() if self.events else None

    def stop_at(self, header: _Header) -> None:
        """The file is a copy of another session: as far as the ingest goes, it ends at its header."""
        self.abandon((header.offset, header.line_no, header.hasher, header.state))

    def abandon(self, final: tuple | None = None) -> None:
        """No more events are wanted; ``final`` is where the ingest of the file ends (None: nowhere)."""
        if self.feeder is not None:
            self.feeder.stop(self, final)
        else:
            self.stopped = self.done = True
            self.events.clear()
            self.final = final
            self.close()

    def close(self) -> None:
        self.file.close()

    # ---- producer side (the read-ahead thread, or the consumer itself)

    def parse_some(self) -> list[_Batch | _Header]:
        """Parse lines until a batch or the header is ready, or the file ends (``finished``)."""
        events: list[_Batch | _Header] = []
        feed, add, update, progress = self.parser.feed, self._add, self.unhashed.append, self.progress
        line_no, offset = self.line_no, self.offset
        try:
            for raw in self.lines:
                line_no += 1
                size = len(raw)
                if size > self.longest:
                    self.longest = size
                had_newline = raw.endswith(b"\n")
                data = raw[:-1] if had_newline else raw
                if progress:
                    progress(size)
                result = feed(line_no, data)
                if not had_newline and isinstance(result, RejectedLine) and result.reason == "invalid_json":
                    # Pi may still be writing this line: keep it aside and re-read it next time.
                    result.reason = "truncated_last_line"
                    add(result, events)
                    line_no -= 1
                    break
                update(raw)
                offset += size
                if isinstance(result, SessionHeader):
                    self.session_id = result.id
                    self._flush(events)  # batches never straddle the header
                    self._hash()
                    events.append(_Header(result, line_no, data, offset, self.hasher.copy(),
                                          copy.copy(self.parser.state)))
                    return events
                if result is not None:
                    add(result, events)
                    if events:
                        return events
            self._flush(events)
            self._hash()
            self.finished = (offset, line_no, self.hasher, self.parser.state)
            if self.feeder is None:
                self.done = True
                self.final = self.finished
                self.close()
            return events
        finally:
            self.line_no, self.offset = line_no, offset

    def _hash(self) -> None:
        """Hash the lines read since the last time: one update per batch, not one per line (each
        update of a long line lets go of the GIL and must win it back)."""
        if self.unhashed:
            self.hasher.update(b"".join(self.unhashed))
            self.unhashed.clear()

    def _flush(self, events: list) -> None:
        self._hash()
        entries, rejected = self.entries, self.rejected
        if not entries and not rejected:
            return
        pieces: list[str] = []
        ends: list[int] = []
        for e in entries:
            if e.text_pieces:
                pieces.extend(e.text_pieces)
            ends.append(len(pieces))
        counts = count_tokens(pieces, self.encoding, self.threads, wait=False) if pieces else None
        events.append(_Batch(self.session_id, entries, rejected, ends, counts, self.longest, self.size))
        self.entries, self.rejected, self.size, self.longest = [], [], 0, 0

    def _add(self, item: ParsedEntry | RejectedLine, events: list) -> None:
        if isinstance(item, ParsedEntry):
            item.obj = None  # the parsed JSON is not needed any more; keep queued batches small
            self.entries.append(item)
        else:
            self.rejected.append(item)
        self.size += len(item.raw)
        if len(self.entries) >= BATCH_ENTRIES or self.size >= BATCH_BYTES:
            self._flush(events)


class _ReadAhead:
    """A thread that plans the files of an ingest in order and parses them into batches (their token
    counts started at once), up to ``READ_AHEAD_BYTES`` ahead of the ingest. The tokenizer threads so
    always have work, also while the ingest inserts, commits and finishes a file.

    Plans are made from committed rows through a cursor; a file's row is changed by nothing but the
    ingest of that file, and the ingest checks the row again before it uses a plan."""

    PLAN_FILES_AHEAD = 64

    def __init__(self, holder: _Connection, files: list[Path], progress: ProgressFn | None, encoding: str,
                 threads: int) -> None:
        self.holder = holder
        self.files = files
        self.progress = progress
        self.encoding = encoding
        self.threads = threads
        self.cond = threading.Condition()
        self.prepared: dict[int, tuple[_Plan, _Reader | None] | None] = {}  # None: plan it yourself
        self.taken = 0  # files handed to the ingest
        self.buffered = 0  # characters in batches not yet taken
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="om-ingest-reader", daemon=True)
        self.thread.start()

    # ---- the ingest's side

    def take(self, index: int) -> tuple[_Plan, _Reader | None] | None:
        with self.cond:
            while index not in self.prepared and self.thread.is_alive() and not self.closed:
                self.cond.wait()
            prepared = self.prepared.pop(index, None)
            self.taken = index + 1
            self.cond.notify_all()
        return prepared

    def next_event(self, reader: _Reader) -> _Batch | _Header | None:
        with self.cond:
            while not reader.events and not reader.done:
                self.cond.wait()
            if reader.error is not None:
                raise reader.error
            if not reader.events:
                return None
            event = reader.events.popleft()
            if isinstance(event, _Batch):
                self.buffered -= event.size
                self.cond.notify_all()
            return event

    def stop(self, reader: _Reader, final: tuple | None) -> None:
        with self.cond:
            reader.stopped = reader.done = True
            reader.final = final
            for event in reader.events:
                if isinstance(event, _Batch):
                    self.buffered -= event.size
            reader.events.clear()
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.thread.join()
        for prepared in self.prepared.values():
            if prepared is not None and prepared[1] is not None:
                prepared[1].close()
        self.prepared.clear()

    # ---- the thread

    def _run(self) -> None:
        for index, path in enumerate(self.files):
            with self.cond:
                while not self.closed and index >= self.taken + self.PLAN_FILES_AHEAD:
                    self.cond.wait()
                if self.closed:
                    return
            try:
                with self.holder.lock:
                    plan = _plan(self.holder.cursor, path)
                reader = _Reader(plan, self.progress, self.encoding, self.threads, self) if plan.reads else None
            except Exception:
                prepared = None  # the ingest plans the file itself, and reports what goes wrong
            else:
                prepared = (plan, reader)
            with self.cond:
                if self.closed:
                    if prepared is not None and prepared[1] is not None:
                        prepared[1].close()
                    return
                self.prepared[index] = prepared
                self.cond.notify_all()
            if prepared is not None and prepared[1] is not None:
                if not self._read(prepared[1]):
                    return

    def _read(self, reader: _Reader) -> bool:
        """Parse the whole file into events; False if the read-ahead is closing."""
        try:
            while True:
                with self.cond:
                    while not self.closed and not reader.stopped and self.buffered >= READ_AHEAD_BYTES:
                        self.cond.wait()
                    if self.closed:
                        return False
                    if reader.stopped:
                        return True
                try:
                    events = reader.parse_some()
                except Exception as exc:
                    with self.cond:
                        reader.error = exc
                        reader.done = True
                        self.cond.notify_all()
                    return True
                with self.cond:
                    if reader.stopped:
                        return True
                    reader.events.extend(events)
                    self.buffered += sum(e.size for e in events if isinstance(e, _Batch))
                    if reader.finished is not None:
                        reader.final = reader.finished
                        reader.done = True
                    self.cond.notify_all()
                    if reader.done:
                        return True
        finally:
            reader.close()


# ------------------------------------------------------------------ writing batches


class _BatchWriter:
    """Inserts batches, waiting for their token counts: consecutive batches go into one INSERT of
    up to ``INSERT_BYTES``; a COMMIT follows every ``COMMIT_BYTES``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, file_path: str,
                 make_room: Callable[[int], None] | None = None) -> None:
        self.con = con
        self.run_id = run_id
        self.file_path = file_path
        self.make_room = make_room  # called with the longest line (bytes) before an INSERT
        self.pending: list[_Batch] = []
        self.pending_size = 0
        self.entries_written = 0
        self.rejected_written = 0
        self.uncommitted = 0
        self.commits = 0  # commits made in the middle of the file

    def add(self, batch: _Batch) -> None:
        if self.pending and batch.session_id != self.pending[0].session_id:
            self.flush()
        self.pending.append(batch)
        self.pending_size += batch.size
        if self.pending_size >= INSERT_BYTES:
            self.flush()

    def flush(self) -> None:
        """Insert the pending batches (the caller is about to use the connection, or the file ends)."""
        batches, self.pending, self.pending_size = self.pending, [], 0
        if not batches:
            return
        session_id = batches[0].session_id
        if self.make_room is not None:
            self.make_room(max(b.longest for b in batches))
        entries: list[ParsedEntry] = []
        tokens: list[int | None] = []
        rejected: list[RejectedLine] = []
        for batch in batches:
            counts = batch.counts
            if isinstance(counts, TokenCounts):
                counts = counts.result()
            elif counts is None:  # no text to count in this batch
                counts = []
            start = 0
            for e, end in zip(batch.entries, batch.ends):
                tokens.append(sum(counts[start:end]) if e.is_source else None)  # type: ignore[index]
                start = end
            entries.extend(batch.entries)
            rejected.extend(batch.rejected)
            self.uncommitted += batch.size
        if entries:
            table = pa.table(
                {
                    "entry_id": pa.array([e.entry_id for e in entries], pa.string()),
                    "parent_id": pa.array([e.parent_id for e in entries], pa.string()),
                    "line_no": pa.array([e.line_no for e in entries], pa.int32()),
                    "entry_index": pa.array([e.entry_index for e in entries], pa.int32()),
                    "entry_type": pa.array([e.entry_type for e in entries], pa.string()),
                    "role": pa.array([e.role for e in entries], pa.string()),
                    "ts": pa.array([e.timestamp for e in entries], pa.string()),
                    "is_source": pa.array([e.is_source for e in entries], pa.bool_()),
                    "tokens_pi": pa.array([e.tokens_pi for e in entries], pa.int32()),
                    "tokens": pa.array(tokens, pa.int32()),
                    "first_kept_entry_id": pa.array([e.first_kept_entry_id for e in entries], pa.string()),
                    "custom_type": pa.array([e.custom_type for e in entries], pa.string()),
                    "raw": pa.array([e.raw for e in entries], pa.string()),
                }
            )
            dbmod.insert_arrow(self.con, "entry_batch", table, "insert_entries",
                          {"session_id": session_id, "run_id": self.run_id})
            self.entries_written += len(entries)
        if rejected:
            table = pa.table(
                {
                    "line_no": pa.array([r.line_no for r in rejected], pa.int32()),
                    "reason": pa.array([r.reason for r in rejected], pa.string()),
                    "detail": pa.array([r.detail for r in rejected], pa.string()),
                    "raw": pa.array([r.raw for r in rejected], pa.binary()),
                }
            )
            dbmod.insert_arrow(self.con, "quarantine_batch", table, "insert_quarantine",
                          {"file_path": self.file_path, "session_id": session_id, "run_id": self.run_id})
            self.rejected_written += len(rejected)
        if self.uncommitted >= COMMIT_BYTES:
            # Rows beyond the offset recorded in session_files: if this ingest never finishes the
            # file, the next one removes them before reading it again.
            self.con.execute("COMMIT")
            self.con.execute("BEGIN TRANSACTION")
            self.uncommitted = 0
            self.commits += 1


def _hash_prefix(path: Path, length: int) -> Any:
    hasher = hashlib.sha256()
    remaining = length
    with open(path, "rb") as f:
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            hasher.update(chunk)
            remaining -= len(chunk)
    return hasher


def _state_to_json(state: ParserState) -> str:
    data = {k: v for k, v in asdict(state).items() if k not in ("minted_ids", "ids_by_index", "header")}
    data["header"] = state.header.model_dump(mode="json") if state.header else None
    return json.dumps(data)


def _state_from_json(text: str | None) -> ParserState:
    data = json.loads(text) if text else {}
    header = data.pop("header", None)
    state = ParserState(**{k: v for k, v in data.items() if k in ParserState.__dataclass_fields__})
    state.header = SessionHeader(**header) if header else None
    return state


# ------------------------------------------------------------------ one file


class _FileIngest:
    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, run_id: str, progress: ProgressFn | None,
                 encoding: str, threads: int, make_room: Callable[[int], None] | None = None,
                 prepared: tuple[_Plan, _Reader | None] | None = None) -> None:
        self.con = con
        self.path = path
        self.key = str(path)
        self.run_id = run_id
        self.progress = progress
        self.encoding = encoding
        self.threads = threads
        self.make_room = make_room
        self.prepared = prepared  # the plan (and reader) of the read-ahead thread
        self.reader: _Reader | None = None
        self.writer: _BatchWriter | None = None
        self.read_session: str | None = None  # the session whose entries this read writes

    def run(self) -> FileReport:
        """The whole file, in one transaction (several for a long file: see ``COMMIT_BYTES``)."""
        self.con.execute("BEGIN TRANSACTION")
        try:
            report = self._run()
        except BaseException:
            _rollback(self.con)
            if self.writer is not None and self.writer.commits:
                self._drop_unrecorded_rows()
            raise
        finally:
            for reader in (self.reader, self.prepared[1] if self.prepared else None):
                if reader is not None and (not reader.done or reader.events):
                    # the read-ahead thread stops reading it, and its queued batches no longer
                    # count against the read-ahead budget (else the thread waits for ever)
                    reader.abandon()
        self.con.execute("COMMIT")
        return report

    def _run(self) -> FileReport:
        plan, reader = self.prepared or (None, None)
        if plan is not None:
            # Made from what was committed before earlier files: still right unless the row moved.
            row = dbmod.one(self.con, "get_session_file", {"file_path": self.key})
            if row != plan.row:
                if reader is not None:
                    reader.abandon()
                plan = reader = None
        if plan is None:
            plan = _plan(self.con, self.path)
        session_id = plan.row[1] if plan.row else None
        if plan.action == "unchanged":
            report = FileReport(path=self.key, session_id=session_id, status="unchanged")
            if plan.row[2] == "no_header" and plan.row[6]:  # still not a session: still an error
                report.error = _no_header_error(plan.row[6])
            return report
        if plan.action == "touch":
            self.con.execute(query("touch_session_file"), {"file_path": self.key, "size_bytes": plan.stat.st_size,
                                                           "mtime_ns": plan.stat.st_mtime_ns})
            return FileReport(path=self.key, session_id=session_id, status="unchanged")
        if plan.action == "afresh":
            self.con.execute(query("delete_file_quarantine"), {"file_path": self.key})
            self.con.execute(query("delete_session_file"), {"file_path": self.key})
        elif plan.action == "rewritten":
            self._forget(session_id)
        elif plan.action == "appended":
            self.read_session = session_id
            self._drop_rows_after(session_id, plan.line_no)
            self.con.execute(query("delete_pending_tail"), {"file_path": self.key})
        else:
            self._drop_rows_after(None, 0)  # quarantine rows an interrupted read of this file left
        if reader is None:
            reader = _Reader(plan, self.progress, self.encoding, self.threads)
        self.reader = reader
        mode = {"afresh": "new"}.get(plan.action, plan.action)
        return self._read(plan, reader, mode)

    def _forget(self, session_id: str | None) -> None:
        """Remove what an earlier ingest of this file stored (the file was rewritten)."""
        self.con.execute(query("delete_file_quarantine"), {"file_path": self.key})
        self.con.execute(query("delete_session_file"), {"file_path": self.key})
        if session_id:
            self._drop_session_rows(session_id)

    def _drop_session_rows(self, session_id: str) -> None:
        for name in ("delete_session_entries", "delete_session_tree", "delete_session_row"):
            self.con.execute(query(name), {"session_id": session_id})
        self.con.execute(query("delete_session_notes"), {"session_id": session_id, "file_path": self.key})
        forget_imported(self.con, session_id)

    def _drop_rows_after(self, session_id: str | None, line_no: int) -> None:
        """Entries of the session and quarantine rows of this file after ``line_no``: what an ingest
        that was interrupted after committing part of the file left (its offset was never recorded)."""
        if session_id:
            self.con.execute(query("delete_entries_after"), {"session_id": session_id, "line_no": line_no})
        self.con.execute(query("delete_quarantine_after"), {"file_path": self.key, "line_no": line_no})

    def _drop_unrecorded_rows(self) -> None:
        """After a failed read that had committed part of the file: remove what the file's recorded
        state does not cover, so the database reads as if this ingest had not started."""
        try:
            with dbmod.transaction(self.con):
                row = dbmod.one(self.con, "get_session_file", {"file_path": self.key})
                if row is not None and row[2] == "ingested":
                    self._drop_rows_after(row[1], row[6])
                else:
                    owner = dbmod.one(self.con, "session_file_of_session", {"session_id": self.read_session})
                    self._drop_rows_after(self.read_session if owner is None else None, 0)
        except Exception:
            pass  # the next ingest of the file removes them

    def _read(self, plan: _Plan, reader: _Reader, mode: str) -> FileReport:
        report = FileReport(path=self.key, status=mode)
        writer = self.writer = _BatchWriter(self.con, self.run_id, self.key, self.make_room)
        duplicate_of: str | None = None
        while (event := reader.next_event()) is not None:
            if isinstance(event, _Batch):
                writer.add(event)
                continue
            writer.flush()  # the lines before the header
            session_id = event.header.id
            duplicate_of = self._claim_session(session_id)
            if duplicate_of:
                reader.stop_at(event)
                writer.add(_Batch(session_id, [], [RejectedLine(
                    event.line_no, "duplicate_session",
                    f"session {session_id} is already ingested from {duplicate_of}", event.data)],
                    [], None, 0, len(event.data)))
                break
            # No other file owns this session: entries it has were left by an interrupted read (the
            # file's own quarantine rows went before reading; the lines before the header are new).
            self.read_session = session_id
            self.con.execute(query("delete_entries_after"), {"session_id": session_id, "line_no": 0})
        writer.flush()
        offset, line_no, hasher, state = reader.final
        report.entries_added = writer.entries_written
        report.lines_quarantined = writer.rejected_written
        report.bytes_read = offset - reader.start_offset
        report.session_id = state.session_id
        if duplicate_of:
            report.status = "duplicate_session"
            report.notes.append(f"same session id as {duplicate_of}; file skipped")
        elif state.header is None:
            report.status = "no_header"
            if line_no:  # lines, none of them a session header: not a Pi session (an empty file may become one)
                report.error = _no_header_error(line_no)
            else:
                report.notes.append("empty file: no session header yet")
        else:
            self._finish_session(state, report)
        self.con.execute(query("upsert_session_file"), {
            "file_path": self.key,
            "session_id": state.session_id,
            "status": "ingested" if report.status in ("new", "appended", "rewritten") else report.status,
            "size_bytes": plan.stat.st_size,
            "mtime_ns": plan.stat.st_mtime_ns,
            "ingested_bytes": offset,
            "ingested_lines": line_no,
            "prefix_sha256": hasher.hexdigest(),
            "parser_state": _state_to_json(state),
            "run_id": self.run_id,
        })
        return report

    def _claim_session(self, session_id: str) -> str | None:
        """Another ingested file with the same session id: a copy (skip this one) or a move (take over)."""
        row = dbmod.one(self.con, "session_file_of_session", {"session_id": session_id})
        if row is None or row[0] == self.key:
            return None
        if Path(row[0]).exists():
            return row[0]
        # The old file is gone: this one replaces it.
        self.con.execute(query("delete_file_quarantine"), {"file_path": row[0]})
        self.con.execute(query("delete_session_file"), {"file_path": row[0]})
        self._drop_session_rows(session_id)
        return None

    def _finish_session(self, state: ParserState, report: FileReport) -> None:
        sid = state.session_id
        params = {"session_id": sid, "file_path": self.key, "run_id": self.run_id}
        # Unless lines were appended, nothing derived from this session is stored any more: it was
        # removed when reading began (a rewrite, or a moved file taking over), or never stored (it is
        # only ever written in a file's last transaction, with the file's row).
        fresh = report.status != "appended"
        rows = self.con.execute(query("tree_rows"), {"session_id": sid}).fetchall()
        duplicates = 0
        if len({row[0] for row in rows}) != len(rows):
            duplicates = dbmod.one(self.con, "quarantine_duplicate_ids", params)[0]
            self.con.execute(query("delete_duplicate_ids"), {"session_id": sid})
            report.lines_quarantined += duplicates
            report.entries_added -= duplicates
            report.notes.append(f"{duplicates} entries share an id with a later entry (Pi keeps the later)")
            rows = self.con.execute(query("tree_rows"), {"session_id": sid}).fetchall()
        # Ledger entries are imported from the stored entries once duplicates are settled; after a
        # plain append only the new ones are read.
        only_run = self.run_id if report.status == "appended" and not duplicates else None
        if only_run is None and not fresh:
            forget_imported(self.con, sid)
        counts = ImportCounts()
        import_entries(self.con, sid, ledger_candidates(self.con, sid, only_run), self.run_id, counts)
        report.ledger = counts.as_dict()
        forest = build_forest(rows)
        if not fresh:
            self.con.execute(query("delete_session_tree"), {"session_id": sid})
            self.con.execute(query("delete_session_notes"), {"session_id": sid, "file_path": self.key})
        lines = forest.order
        for note in forest.notes:
            self.con.execute(query("insert_note"), {**params, "line_no": lines.get(note.entry_id),
                                                    "entry_id": note.entry_id, "kind": note.kind,
                                                    "detail": note.detail})
            report.notes.append(f"{note.kind}: {note.entry_id} ({note.detail})")
        tree = store_tree(self.con, sid, forest)
        header = state.header
        self.con.execute(query("upsert_session"), {
            **params,
            "version": header.file_version,
            "cwd": header.cwd,
            "started_at": header.timestamp,
            "parent_session": header.parentSession,
            "leaf_count": sum(tree.is_leaf),
            "header": state.header_raw or header.model_dump_json(exclude_none=True),
        })


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass  # no transaction was open (it failed between a chunk's COMMIT and the next BEGIN)


def store_tree(con: duckdb.DuckDBPyConnection, session_id: str, forest: Forest) -> TreeIntervals:
    """Write a session's ``entry_tree`` rows (one per entry; its old rows are already gone)."""
    tree = forest.intervals()
    if not tree.entry_id:
        return tree
    table = pa.table({"entry_id": pa.array(tree.entry_id, pa.string()), "depth": pa.array(tree.depth, pa.int32()),
                      "pre": pa.array(tree.pre, pa.int32()), "last": pa.array(tree.last, pa.int32()),
                      "is_leaf": pa.array(tree.is_leaf, pa.bool_())})
    dbmod.insert_arrow(con, "tree_batch", table, "insert_entry_tree", {"session_id": session_id})
    return tree


def rebuild_trees(con: duckdb.DuckDBPyConnection) -> int:
    """Derive ``entry_tree`` rows from the stored entries for every session that has none (sessions
    stored before migration 004). Runs inside the caller's transaction."""
    sessions = [row[0] for row in con.execute(query("sessions_without_tree")).fetchall()]
    for session_id in sessions:
        rows = con.execute(query("tree_rows"), {"session_id": session_id}).fetchall()
        store_tree(con, session_id, build_forest(rows))
    return len(sessions)


# ------------------------------------------------------------------ many files


class _Connection:
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
        con.execute(f"SET memory_limit = '{int(limit)}B'")
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


def ingest(
    db: str | os.PathLike | duckdb.DuckDBPyConnection,
    paths: Iterable[str | os.PathLike],
    *,
    progress: ProgressFn | None = None,
    encoding: str = DEFAULT_ENCODING,
    threads: int = 2,
    command: str = "ingest",
) -> IngestReport:
    """Ingest files and directories into ``db`` (a path, or an open write connection).

    One bad file never stops the others; its error is in the report.
    """
    started = time.monotonic()
    files, missing = discover(paths)
    run_id = dbmod.new_run_id()
    report = IngestReport(run_id=run_id, missing_paths=missing)
    where = None if isinstance(db, duckdb.DuckDBPyConnection) else db
    try:
        return _ingest_files(db, files, report, started, progress, encoding, threads, command)
    except Exception as exc:
        # A write error of the storage ends the ingest: every later file would fail the same way.
        stored = storage_error(exc, where)
        if stored is None:
            raise
        kept = sum(1 for f in report.files if not f.error)
        raise StorageError(f"{stored} (ingest stopped; {kept} file(s) before it are stored and readable)") from None


def _ingest_files(db, files: list[Path], report: IngestReport, started: float, progress: ProgressFn | None,
                  encoding: str, threads: int, command: str) -> IngestReport:
    run_id = report.run_id
    holder = _Connection(db)
    ahead: _ReadAhead | None = None
    failed = False
    try:
        start_run(holder.con, run_id, command, {"paths": [str(p) for p in files]})
        ahead = _ReadAhead(holder, files, progress, encoding, threads)
        for index, path in enumerate(files):
            con = holder.breathe()
            make_room = holder.make_room if holder.memory_limit is not None else None
            prepared = ahead.take(index)
            try:
                try:
                    result = _FileIngest(con, path, run_id, progress, encoding, threads, make_room,
                                         prepared).run()
                except duckdb.OutOfMemoryException:
                    if not holder.after_out_of_memory():
                        raise
                    result = _FileIngest(con, path, run_id, progress, encoding, threads, make_room).run()
                report.files.append(result)
            except OmError:
                raise
            except Exception as exc:  # a bad file is reported, never fatal to the rest
                if storage_error(exc) is not None:
                    raise  # but a full disk is fatal to all
                report.files.append(FileReport(path=str(path), status="error",
                                               error=f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
        report.seconds = time.monotonic() - started
        status = "failed" if any(f.error for f in report.files) else "ok"
        finish_run(holder.con, run_id, status, report.summary())
    except BaseException:
        failed = True
        raise
    finally:
        if ahead is not None:
            ahead.close()
        try:
            holder.close()  # may checkpoint: a full disk can fail here too
        except Exception:
            if not failed:
                raise
    return report
