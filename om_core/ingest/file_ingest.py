"""The ingest of one file, in one transaction (several for a long file: see ``writer.COMMIT_BYTES``).

Crash safety: a file's ``session_files`` row (offset, prefix hash, parser state) is written only in
the file's last transaction, together with everything derived from the whole session (tree, notes,
ledger imports, the session row). Rows that an interrupted ingest committed beyond the recorded
offset are deleted before the file is read again, so nothing is ever duplicated; a failed ingest
removes them at once where it can.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb

from om_core.store import db as dbmod
from om_core.ingest import plan as planning
from om_core.ingest.files import session_file_row
from om_core.ingest.plan import Plan, state_to_json
from om_core.ingest.reader import Batch, FileReader, ProgressFn
from om_core.ingest.migration import (NotFollowed, follow_fork, follow_migration, followed_counts,
                                      keep_replaced_entries)
from om_core.ingest.reports import FileReport, FollowedRewrite, no_header_error
from om_core.ingest.rewrites import Before, before_replacing, what_was_lost
from om_core.ingest.writer import BatchWriter, appended_tree, store_appended_tree, store_tree
from om_core.ledger.records import ImportCounts, forget_imported, import_entries, ledger_candidates
from om_core.pi.session import ParserState, RejectedLine
from om_core.store.sqlfiles import query
from om_core.pi.tree import build_forest


class FileIngest:
    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, run_id: str, progress: ProgressFn | None,
                 encoding: str, threads: int, make_room: Callable[[int], None] | None = None,
                 prepared: tuple[Plan, FileReader | None] | None = None, walked: bool = False) -> None:
        self.con = con
        self.path = path
        self.key = str(path)
        self.run_id = run_id
        self.progress = progress
        self.encoding = encoding
        self.threads = threads
        self.make_room = make_room
        self.prepared = prepared  # the plan (and reader) of the read-ahead thread
        self.walked = walked  # found by walking a directory (not named): a file that is no session is skipped
        self.reader: FileReader | None = None
        self.writer: BatchWriter | None = None
        self.read_session: str | None = None  # the session whose entries this read writes
        self.replacing: list[Before] = []  # sessions whose rows this ingest replaced (see rewrites)
        self.not_followed: dict[str, str] = {}  # session id -> why its rewrite is not Pi's migration
        self.appended_after: int | None = None  # an append: the lines the last ingest had read

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
                if reader is not None and not reader.consumed:
                    # the read-ahead thread stops reading it; its queued batches are dropped
                    reader.abandon()
        self.con.execute("COMMIT")
        return report

    def _run(self) -> FileReport:
        plan, reader = self.prepared or (None, None)
        if plan is not None:
            # Made from what was committed before earlier files: still right unless the row moved.
            if session_file_row(self.con, self.key) != plan.row:
                if reader is not None:
                    reader.abandon()
                plan = reader = None
        if plan is None:
            plan = planning.plan_file(self.con, self.path)
        row = plan.row
        session_id = row.session_id if row else None
        if plan.action == "unchanged":
            report = FileReport(path=self.key, session_id=session_id, status="unchanged")
            if row.status == "no_header" and row.ingested_lines:  # still not a session
                self._not_a_session(report, row.ingested_lines)
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
            self.appended_after = plan.line_no
            self._drop_rows_after(session_id, plan.line_no)
            self.con.execute(query("delete_pending_tail"), {"file_path": self.key})
        else:
            self._drop_rows_after(None, 0)  # quarantine rows an interrupted read of this file left
        if reader is None:
            reader = FileReader(plan, self.progress, self.encoding, self.threads)
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
        self.replacing.append(before_replacing(self.con, session_id))
        keep_replaced_entries(self.con, session_id)  # a v1/v2 file: Pi may have migrated it (migration.py)
        params = {"session_id": session_id}
        self.con.execute(query("delete_session_entries"), params)
        self.con.execute(query("delete_session_tree"), params)
        self.con.execute(query("delete_session_row"), params)
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
                row = session_file_row(self.con, self.key)
                if row is not None and row.status == "ingested":
                    self._drop_rows_after(row.session_id, row.ingested_lines)
                else:
                    owner = dbmod.scalar(self.con, "session_file_of_session", {"session_id": self.read_session})
                    self._drop_rows_after(self.read_session if owner is None else None, 0)
        except Exception:
            pass  # the next ingest of the file removes them

    def _read(self, plan: Plan, reader: FileReader, mode: str) -> FileReport:
        report = FileReport(path=self.key, status=mode)
        writer = self.writer = BatchWriter(self.con, self.run_id, self.key, self.make_room)
        duplicate_of: str | None = None
        while (event := reader.next_event()) is not None:
            if isinstance(event, Batch):
                writer.add(event)
                continue
            writer.flush()  # the lines before the header
            session_id = event.header.id
            duplicate_of = self._claim_session(session_id)
            if duplicate_of:
                reader.stop_at(event)
                writer.add(Batch(session_id, [], [RejectedLine(
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
                self._not_a_session(report, line_no)
            else:
                report.notes.append("empty file: no session header yet")
        else:
            self._finish_session(state, report)
        self._report_losses(state.session_id if state.header is not None else None, report)
        self.con.execute(query("upsert_session_file"), {
            "file_path": self.key,
            "session_id": state.session_id,
            "status": "ingested" if report.status in ("new", "appended", "rewritten") else report.status,
            "size_bytes": plan.stat.st_size,
            "mtime_ns": plan.stat.st_mtime_ns,
            "ingested_bytes": offset,
            "ingested_lines": line_no,
            "prefix_sha256": hasher.hexdigest(),
            "parser_state": state_to_json(state),
            "run_id": self.run_id,
        })
        return report

    def _not_a_session(self, report: FileReport, lines: int) -> None:
        """A file with lines but no session header: skipped with a note when a directory walk found it,
        an error when it was named (its lines then stay in quarantine)."""
        if self.walked:  # another program's file in a sessions folder: none of its lines is kept
            self.con.execute(query("delete_file_quarantine"), {"file_path": self.key})
            report.lines_quarantined = 0
            report.notes.append(f"not a Pi session file (no valid session header in {lines} line(s)): skipped")
        else:
            report.error = no_header_error(lines)

    def _report_losses(self, now_session_id: str | None, report: FileReport) -> None:
        """What replacing the sessions' rows took away; a rewrite that lost something is noted for good
        (its ``ingest_notes`` row stays through later ingests of the file)."""
        followed = {f.session_id for f in report.followed if f.how == "migrated"}
        for before in self.replacing:
            if before.session_id in followed:  # Pi's migration: the same entries, memory re-anchored
                continue
            if before.session_id != now_session_id:  # the file holds another session: nothing to follow
                self.con.execute(query("drop_replaced_entries"), {"session_id": before.session_id})
            loss = what_was_lost(self.con, before, now_session_id)
            loss.not_a_migration = self.not_followed.get(before.session_id)
            if not loss.lost_anything:
                continue
            report.replaced.append(loss)
            self.con.execute(query("insert_note"), {"session_id": loss.session_id, "file_path": self.key,
                                                    "line_no": None, "entry_id": None, "kind": "rewritten",
                                                    "detail": loss.describe(), "run_id": self.run_id})

    def _claim_session(self, session_id: str) -> str | None:
        """Another ingested file with the same session id: a copy (skip this one) or a move (take over)."""
        owner = dbmod.scalar(self.con, "session_file_of_session", {"session_id": session_id})
        if owner is None or owner == self.key:
            return None
        if Path(owner).exists():
            return owner
        # The old file is gone: this one replaces it.
        self.con.execute(query("delete_file_quarantine"), {"file_path": owner})
        self.con.execute(query("delete_session_file"), {"file_path": owner})
        self._drop_session_rows(session_id)
        return None

    def _tree_rows(self, session_id: str) -> list[tuple[str, str | None, int]]:
        rows = dbmod.rows_as_dicts(self.con.execute(query("tree_rows"), {"session_id": session_id}))
        return [(r["entry_id"], r["parent_id"], r["line_no"]) for r in rows]

    def _finish_session(self, state: ParserState, report: FileReport) -> None:
        sid = state.session_id
        params = {"session_id": sid, "file_path": self.key, "run_id": self.run_id}
        # Unless lines were appended, nothing derived from this session is stored any more: it was
        # removed when reading began (a rewrite, or a moved file taking over), or never stored (it is
        # only ever written in a file's last transaction, with the file's row).
        fresh = report.status != "appended"
        # lines appended: the stored tree is extended by their entries (what deriving it whole would
        # give, without reading the whole session again), unless they change what was there
        grown = None if fresh or self.appended_after is None else appended_tree(self.con, sid, self.appended_after)
        duplicates = 0
        rows = self._tree_rows(sid) if grown is None else []
        if grown is None and len({entry_id for entry_id, _, _ in rows}) != len(rows):
            duplicates = dbmod.scalar(self.con, "quarantine_duplicate_ids", params)
            self.con.execute(query("delete_duplicate_ids"), {"session_id": sid})
            report.lines_quarantined += duplicates
            report.entries_added -= duplicates
            report.notes.append(f"{duplicates} entries share an id with a later entry (Pi keeps the later)")
            rows = self._tree_rows(sid)
        # Ledger entries are imported from the stored entries once duplicates are settled; after a
        # plain append only the new ones are read.
        only_run = self.run_id if report.status == "appended" and not duplicates else None
        if only_run is None and not fresh:
            forget_imported(self.con, sid)
        counts = ImportCounts()
        import_entries(self.con, sid, ledger_candidates(self.con, sid, only_run), self.run_id, counts)
        report.ledger = counts.as_dict()
        if grown is not None:
            notes, lines = grown.notes, grown.order
        else:
            forest = build_forest(rows)
            if not fresh:
                self.con.execute(query("delete_session_tree"), {"session_id": sid})
                self.con.execute(query("delete_session_notes"), {"session_id": sid, "file_path": self.key})
            notes, lines = forest.notes, forest.order
        for note in notes:
            self.con.execute(query("insert_note"), {**params, "line_no": lines.get(note.entry_id),
                                                    "entry_id": note.entry_id, "kind": note.kind,
                                                    "detail": note.detail})
            report.notes.append(f"{note.kind}: {note.entry_id} ({note.detail})")
        if grown is not None:
            store_appended_tree(self.con, sid, grown)
            leaf_count = dbmod.scalar(self.con, "session_leaf_count", {"session_id": sid})
        else:
            leaf_count = sum(store_tree(self.con, sid, forest).is_leaf)
        header = state.header
        self.con.execute(query("upsert_session"), {
            **params,
            "version": header.file_version,
            "cwd": header.cwd,
            "started_at": header.timestamp,
            "parent_session": header.parentSession,
            "leaf_count": leaf_count,
            "header": state.header_raw or header.model_dump_json(exclude_none=True),
        })
        self._follow_pi(sid, header.parentSession, report)

    def _follow_pi(self, sid: str, parent_file: str | None, report: FileReport) -> None:
        """Pi's own rewrites, followed (om_core/ingest/migration.py): a v1/v2 file Pi migrated in place
        (its entries were kept before the re-read), a pi --fork copy of another ingested session."""
        params = {"session_id": sid, "file_path": self.key, "line_no": None, "entry_id": None,
                  "run_id": self.run_id}
        for follow in (lambda: follow_migration(self.con, sid, self.run_id),
                       lambda: follow_fork(self.con, sid, parent_file, self.run_id)):
            outcome = follow()
            if outcome is None:
                continue
            if isinstance(outcome, NotFollowed):
                if outcome.how == "forked":
                    self.con.execute(query("insert_note"), {**params, "kind": "not_forked", "detail": outcome.reason})
                    report.notes.append(outcome.reason)
                else:
                    self.not_followed[sid] = outcome.reason
                continue
            counts = followed_counts(self.con, sid, self.run_id)
            done = FollowedRewrite(session_id=sid, how=outcome.how, from_session_id=outcome.from_session_id,
                                   from_version=outcome.from_version, entries=outcome.entries,
                                   appended=outcome.appended, ids_changed=len(outcome.mapping), **counts)
            report.followed.append(done)
            self.con.execute(query("insert_note"), {**params, "kind": outcome.how, "detail": done.describe()})


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass  # no transaction was open (it failed between a chunk's COMMIT and the next BEGIN)
