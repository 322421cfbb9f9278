"""Lossless, idempotent, incremental ingest of Pi session files into DuckDB.

Per file, in one transaction:
* new file: read it all;
* grown file (Pi appends): the stored hash of the ingested prefix still matches, so only the new
  lines are read;
* rewritten file (Pi rewrites whole files when it migrates them): the prefix hash differs, so the
  session's rows are replaced;
* unchanged file: nothing happens.

Lines stream through in batches (memory does not grow with file size). Real-tokenizer counts run
on a worker thread (tiktoken releases the GIL) while the next batch is parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from pydantic import BaseModel, Field

from om_core import db as dbmod
from om_core.errors import OmError
from om_core.ledger import ImportCounts, forget_imported, import_entries, ledger_candidates
from om_core.session import ParsedEntry, ParserState, RejectedLine, SessionHeader, SessionParser
from om_core.sqlfiles import query
from om_core.tokens import DEFAULT_ENCODING, count_tokens
from om_core.tree import build_forest

BATCH_ENTRIES = 2000
BATCH_BYTES = 4 << 20
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


# ------------------------------------------------------------------ batch writer


class _BatchWriter:
    """Collects parsed rows and writes them on a worker thread, one batch in flight at a time."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, file_path: str, encoding: str,
                 threads: int) -> None:
        self.con = con
        self.run_id = run_id
        self.file_path = file_path
        self.encoding = encoding
        self.threads = threads
        self.session_id: str | None = None
        self.entries: list[ParsedEntry] = []
        self.rejected: list[RejectedLine] = []
        self.size = 0
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="om-ingest")
        self.pending: Future | None = None
        self.entries_written = 0
        self.rejected_written = 0

    def add(self, item: ParsedEntry | RejectedLine) -> None:
        if isinstance(item, ParsedEntry):
            self.entries.append(item)
            self.size += len(item.raw)
        else:
            self.rejected.append(item)
            self.size += len(item.raw)
        if len(self.entries) >= BATCH_ENTRIES or self.size >= BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.entries and not self.rejected:
            return
        entries, rejected = self.entries, self.rejected
        self.entries, self.rejected, self.size = [], [], 0
        self.wait()
        self.pending = self.pool.submit(self._write, self.session_id, entries, rejected)

    def wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self) -> None:
        try:
            self.flush()
            self.wait()
        finally:
            self.pool.shutdown(wait=True)

    def _write(self, session_id: str | None, entries: list[ParsedEntry], rejected: list[RejectedLine]) -> None:
        if entries:
            pieces: list[str] = []
            spans: list[tuple[int, int]] = []
            for e in entries:
                start = len(pieces)
                pieces.extend(e.text_pieces or ())
                spans.append((start, len(pieces)))
            counts = count_tokens(pieces, self.encoding, self.threads)
            tokens = [sum(counts[a:b]) if e.is_source else None for e, (a, b) in zip(entries, spans)]
            table = pa.table(
                {
                    "session_id": pa.array([session_id] * len(entries), pa.string()),
                    "entry_id": [e.entry_id for e in entries],
                    "parent_id": pa.array([e.parent_id for e in entries], pa.string()),
                    "line_no": pa.array([e.line_no for e in entries], pa.int32()),
                    "entry_index": pa.array([e.entry_index for e in entries], pa.int32()),
                    "entry_type": [e.entry_type for e in entries],
                    "role": pa.array([e.role for e in entries], pa.string()),
                    "ts": pa.array([e.timestamp for e in entries], pa.string()),
                    "is_source": pa.array([e.is_source for e in entries], pa.bool_()),
                    "tokens_pi": pa.array([e.tokens_pi for e in entries], pa.int32()),
                    "tokens": pa.array(tokens, pa.int32()),
                    "first_kept_entry_id": pa.array([e.first_kept_entry_id for e in entries], pa.string()),
                    "custom_type": pa.array([e.custom_type for e in entries], pa.string()),
                    "raw": [e.raw for e in entries],
                    "run_id": pa.array([self.run_id] * len(entries), pa.string()),
                }
            )
            self.con.register("entry_batch", table)
            try:
                self.con.execute(query("insert_entries"))
            finally:
                self.con.unregister("entry_batch")
            self.entries_written += len(entries)
        if rejected:
            table = pa.table(
                {
                    "file_path": pa.array([self.file_path] * len(rejected), pa.string()),
                    "session_id": pa.array([session_id] * len(rejected), pa.string()),
                    "line_no": pa.array([r.line_no for r in rejected], pa.int32()),
                    "reason": [r.reason for r in rejected],
                    "detail": [r.detail for r in rejected],
                    "raw": pa.array([r.raw for r in rejected], pa.binary()),
                    "run_id": pa.array([self.run_id] * len(rejected), pa.string()),
                }
            )
            self.con.register("quarantine_batch", table)
            try:
                self.con.execute(query("insert_quarantine"))
            finally:
                self.con.unregister("quarantine_batch")
            self.rejected_written += len(rejected)


# ------------------------------------------------------------------ reading lines


def _lines(path: Path, offset: int) -> Iterator[tuple[bytes, bool]]:
    """(line without newline, had newline) from byte ``offset`` on."""
    with open(path, "rb") as f:
        f.seek(offset)
        for data in f:
            if data.endswith(b"\n"):
                yield data[:-1], True
            else:
                yield data, False


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
                 encoding: str, threads: int) -> None:
        self.con = con
        self.path = path
        self.key = str(path)
        self.run_id = run_id
        self.progress = progress
        self.encoding = encoding
        self.threads = threads

    def run(self) -> FileReport:
        stat = self.path.stat()
        row = dbmod.one(self.con, "get_session_file", {"file_path": self.key})
        if row is None:
            return self._read(stat, mode="new")
        _, session_id, status, size, mtime_ns, done_bytes, done_lines, prefix, state_json = row
        unchanged = stat.st_size == size and stat.st_mtime_ns == mtime_ns
        if unchanged and status != "duplicate_session":
            return FileReport(path=self.key, session_id=session_id, status="unchanged")
        if status != "ingested":
            # Never became a session (no header, or a copy of another file): read it afresh. A copy
            # is looked at every time, since the file it copies may have gone (cheap: one line).
            self.con.execute(query("delete_file_quarantine"), {"file_path": self.key})
            self.con.execute(query("delete_session_file"), {"file_path": self.key})
            return self._read(stat, mode="new")
        same_prefix = stat.st_size >= done_bytes and _hash_prefix(self.path, done_bytes).hexdigest() == prefix
        if same_prefix and stat.st_size == done_bytes:
            self.con.execute(query("touch_session_file"),
                             {"file_path": self.key, "size_bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
            return FileReport(path=self.key, session_id=session_id, status="unchanged")
        if same_prefix:
            return self._read(stat, mode="appended", resume=(session_id, done_bytes, done_lines, state_json))
        self._forget(session_id)
        return self._read(stat, mode="rewritten")

    def _forget(self, session_id: str | None) -> None:
        """Remove what an earlier ingest of this file stored (the file was rewritten)."""
        self.con.execute(query("delete_file_quarantine"), {"file_path": self.key})
        self.con.execute(query("delete_session_file"), {"file_path": self.key})
        if session_id:
            self._drop_session_rows(session_id)

    def _drop_session_rows(self, session_id: str) -> None:
        for name in ("delete_session_entries", "delete_session_branches", "delete_session_row"):
            self.con.execute(query(name), {"session_id": session_id})
        self.con.execute(query("delete_session_notes"), {"session_id": session_id, "file_path": self.key})
        forget_imported(self.con, session_id)

    def _read(self, stat: os.stat_result, mode: str, resume: tuple | None = None) -> FileReport:
        report = FileReport(path=self.key, status=mode)
        offset = 0
        line_no = 0
        if resume is not None:
            session_id, offset, line_no, state_json = resume
            state = _state_from_json(state_json)
            if state.version < 2 and state.session_id:
                for index, entry_id in self.con.execute(query("v1_ids_by_index"), {"session_id": state.session_id}).fetchall():
                    state.ids_by_index[index] = entry_id
                    state.minted_ids.add(entry_id)
            parser = SessionParser(state)
            hasher = _hash_prefix(self.path, offset)
            self.con.execute(query("delete_pending_tail"), {"file_path": self.key})
        else:
            parser = SessionParser()
            hasher = hashlib.sha256()
        writer = _BatchWriter(self.con, self.run_id, self.key, self.encoding, self.threads)
        writer.session_id = parser.state.session_id
        duplicate_of: str | None = None
        try:
            for data, had_newline in _lines(self.path, offset):
                line_no += 1
                if self.progress:
                    self.progress(len(data) + had_newline)
                result = parser.feed(line_no, data)
                if not had_newline and isinstance(result, RejectedLine) and result.reason == "invalid_json":
                    # Pi may still be writing this line: keep it aside and re-read it next time.
                    result.reason = "truncated_last_line"
                    writer.add(result)
                    line_no -= 1
                    break
                hasher.update(data + (b"\n" if had_newline else b""))
                offset += len(data) + had_newline
                if isinstance(result, SessionHeader):
                    writer.session_id = result.id
                    duplicate_of = self._claim_session(result.id)
                    if duplicate_of:
                        writer.add(RejectedLine(line_no, "duplicate_session",
                                                f"session {result.id} is already ingested from {duplicate_of}", data))
                        break
                    continue
                if result is not None:
                    writer.add(result)
        finally:
            writer.close()
        report.entries_added = writer.entries_written
        report.lines_quarantined = writer.rejected_written
        report.bytes_read = offset - (resume[1] if resume else 0)
        state = parser.state
        report.session_id = state.session_id
        if duplicate_of:
            report.status = "duplicate_session"
            report.notes.append(f"same session id as {duplicate_of}; file skipped")
        elif state.header is None:
            report.status = "no_header"
            report.notes.append("no valid session header: Pi would read this file as empty")
        else:
            self._finish_session(state, report)
        self.con.execute(query("upsert_session_file"), {
            "file_path": self.key,
            "session_id": state.session_id,
            "status": "ingested" if report.status in ("new", "appended", "rewritten") else report.status,
            "size_bytes": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
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
        dup = dbmod.one(self.con, "quarantine_duplicate_ids", params)
        if dup and dup[0]:
            self.con.execute(query("delete_duplicate_ids"), {"session_id": sid})
            report.lines_quarantined += dup[0]
            report.entries_added -= dup[0]
            report.notes.append(f"{dup[0]} entries share an id with a later entry (Pi keeps the later)")
        # Ledger entries are imported from the stored entries once duplicates are settled; after a
        # plain append only the new ones are read.
        only_run = self.run_id if report.status == "appended" and not (dup and dup[0]) else None
        if only_run is None:
            forget_imported(self.con, sid)
        counts = ImportCounts()
        import_entries(self.con, sid, ledger_candidates(self.con, sid, only_run), self.run_id, counts)
        report.ledger = counts.as_dict()
        forest = build_forest(self.con.execute(query("tree_rows"), {"session_id": sid}).fetchall())
        self.con.execute(query("delete_session_branches"), {"session_id": sid})
        self.con.execute(query("delete_session_notes"), {"session_id": sid, "file_path": self.key})
        lines = forest.order
        for note in forest.notes:
            self.con.execute(query("insert_note"), {**params, "line_no": lines.get(note.entry_id),
                                                    "entry_id": note.entry_id, "kind": note.kind,
                                                    "detail": note.detail})
            report.notes.append(f"{note.kind}: {note.entry_id} ({note.detail})")
        leaves, positions, ids = [], [], []
        for leaf, position, entry_id in forest.branch_rows():
            leaves.append(leaf)
            positions.append(position)
            ids.append(entry_id)
        table = pa.table({
            "session_id": pa.array([sid] * len(ids), pa.string()),
            "leaf_id": pa.array(leaves, pa.string()),
            "position": pa.array(positions, pa.int32()),
            "entry_id": pa.array(ids, pa.string()),
        })
        self.con.register("branch_batch", table)
        try:
            self.con.execute(query("insert_branch_entries"))
        finally:
            self.con.unregister("branch_batch")
        header = state.header
        self.con.execute(query("upsert_session"), {
            **params,
            "version": header.file_version,
            "cwd": header.cwd,
            "started_at": header.timestamp,
            "parent_session": header.parentSession,
            "leaf_count": len(forest.leaves()),
            "header": state.header_raw or header.model_dump_json(exclude_none=True),
        })


# ------------------------------------------------------------------ many files


class _Connection:
    """The write connection of an ingest: a given one, or one opened from a path and released
    between files every few seconds so a waiting reader can take the file."""

    def __init__(self, db: str | os.PathLike | duckdb.DuckDBPyConnection) -> None:
        self.path = None if isinstance(db, duckdb.DuckDBPyConnection) else db
        self.con = db if self.path is None else dbmod.connect(self.path)
        self.since = time.monotonic()

    def breathe(self) -> duckdb.DuckDBPyConnection:
        if self.path is not None and time.monotonic() - self.since > HOLD_SECONDS:
            self.con.close()
            time.sleep(0.2)
            self.con = dbmod.connect(self.path)
            self.since = time.monotonic()
        return self.con

    def close(self) -> None:
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
    holder = _Connection(db)
    try:
        holder.con.execute(query("start_run"), {"run_id": run_id, "command": command,
                                                "detail": json.dumps({"paths": [str(p) for p in files]})})
        for path in files:
            con = holder.breathe()
            try:
                with dbmod.transaction(con):
                    report.files.append(_FileIngest(con, path, run_id, progress, encoding, threads).run())
            except OmError:
                raise
            except Exception as exc:  # a bad file is reported, never fatal to the rest
                report.files.append(FileReport(path=str(path), status="error", error=f"{type(exc).__name__}: {exc}"))
        report.seconds = time.monotonic() - started
        status = "failed" if any(f.error for f in report.files) else "ok"
        holder.con.execute(query("finish_run"), {"run_id": run_id, "status": status,
                                                 "detail": json.dumps(report.summary())})
    finally:
        holder.close()
    return report
