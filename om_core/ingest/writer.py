"""The DuckDB writes of an ingest's bulk rows: batches of entries and quarantined lines (through
Arrow tables, one INSERT for consecutive batches, a COMMIT every ``COMMIT_BYTES``), and a session's
``entry_tree`` rows: derived whole, or extended by the entries of lines appended to the file."""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import pyarrow as pa

from om_core.store import db as dbmod
from om_core.store.sqlfiles import query
from om_core.ingest.reader import Batch
from om_core.pi.session import ParsedEntry, RejectedLine
from om_core.pi.tokens import TokenCounts
from om_core.pi.tree import AppendedTree, Forest, TreeIntervals, appended_intervals

INSERT_BYTES = 4 << 20  # consecutive batches go into one INSERT
COMMIT_BYTES = 16 << 20  # commit a long file in chunks: DuckDB keeps uncommitted rows in memory


class BatchWriter:
    """Inserts batches, waiting for their token counts: consecutive batches go into one INSERT of
    up to ``INSERT_BYTES``; a COMMIT follows every ``COMMIT_BYTES``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, run_id: str, file_path: str,
                 make_room: Callable[[int], None] | None = None) -> None:
        self.con = con
        self.run_id = run_id
        self.file_path = file_path
        self.make_room = make_room  # called with the longest line (bytes) before an INSERT
        self.pending: list[Batch] = []
        self.pending_size = 0
        self.entries_written = 0
        self.rejected_written = 0
        self.uncommitted = 0
        self.commits = 0  # commits made in the middle of the file

    def add(self, batch: Batch) -> None:
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
            dbmod.insert_arrow(self.con, "entry_batch", _entry_table(entries, tokens), "insert_entries",
                               {"session_id": session_id, "run_id": self.run_id})
            self.entries_written += len(entries)
        if rejected:
            dbmod.insert_arrow(self.con, "quarantine_batch", _quarantine_table(rejected), "insert_quarantine",
                               {"file_path": self.file_path, "session_id": session_id, "run_id": self.run_id})
            self.rejected_written += len(rejected)
        if self.uncommitted >= COMMIT_BYTES:
            # Rows beyond the offset recorded in session_files: if this ingest never finishes the
            # file, the next one removes them before reading it again.
            self.con.execute("COMMIT")
            self.con.execute("BEGIN TRANSACTION")
            self.uncommitted = 0
            self.commits += 1


def _entry_table(entries: list[ParsedEntry], tokens: list[int | None]) -> pa.Table:
    """The columns of query insert_entries' ``entry_batch``."""
    return pa.table({
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
    })


def _quarantine_table(rejected: list[RejectedLine]) -> pa.Table:
    """The columns of query insert_quarantine's ``quarantine_batch``."""
    return pa.table({
        "line_no": pa.array([r.line_no for r in rejected], pa.int32()),
        "reason": pa.array([r.reason for r in rejected], pa.string()),
        "detail": pa.array([r.detail for r in rejected], pa.string()),
        "raw": pa.array([r.raw for r in rejected], pa.binary()),
    })


def store_tree(con: duckdb.DuckDBPyConnection, session_id: str, forest: Forest) -> TreeIntervals:
    """Write a session's ``entry_tree`` rows (one per entry; its old rows are already gone)."""
    tree = forest.intervals()
    _insert_tree(con, session_id, tree)
    return tree


def _insert_tree(con: duckdb.DuckDBPyConnection, session_id: str, tree: TreeIntervals) -> None:
    if not tree.entry_id:
        return
    table = pa.table({"entry_id": pa.array(tree.entry_id, pa.string()), "depth": pa.array(tree.depth, pa.int32()),
                      "pre": pa.array(tree.pre, pa.int32()), "last": pa.array(tree.last, pa.int32()),
                      "is_leaf": pa.array(tree.is_leaf, pa.bool_())})
    dbmod.insert_arrow(con, "tree_batch", table, "insert_entry_tree", {"session_id": session_id})


def appended_tree(con: duckdb.DuckDBPyConnection, session_id: str, line_no: int) -> AppendedTree | None:
    """What the entries after ``line_no`` (lines appended to the file) add to the session's stored tree,
    the rows ``store_tree`` would give the whole session; None when the tree must be derived whole: an
    appended entry shares an id with another, resolves an old entry's dangling parent or names a later
    entry as its parent, the tree was repaired before (its notes), or the stored tree is not the old
    entries'."""
    check = dbmod.named_row(con, "tree_append_check", {"session_id": session_id, "line_no": line_no})
    if check is None or check["conflicts"] or check["tree_notes"] or check["size"] != check["old_entries"]:
        return None
    new = [(r[0], r[1], r[2]) for r in con.execute(query("tree_rows_after"),
                                                    {"session_id": session_id, "line_no": line_no}).fetchall()]
    if len({entry_id for entry_id, _, _ in new}) != len(new):
        return None
    parents = sorted({p for _, p, _ in new if p is not None})
    known = {r[0]: (r[1], r[2], r[3]) for r in con.execute(query("tree_nodes"), {
        "session_id": session_id, "entry_ids": parents}).fetchall()} if parents else {}
    return appended_intervals(new, known, check["size"])


def store_appended_tree(con: duckdb.DuckDBPyConnection, session_id: str, grown: AppendedTree) -> None:
    """Extend the session's ``entry_tree`` rows by ``grown`` (``appended_tree``): the old entries'
    intervals shifted, the new entries' rows inserted."""
    if not grown.blocks:
        return
    blocks = pa.table({"entry_id": pa.array([b.entry_id for b in grown.blocks], pa.string()),
                       "at_pre": pa.array([b.at_pre for b in grown.blocks], pa.int32()),
                       "at_last": pa.array([b.at_last for b in grown.blocks], pa.int32()),
                       "size": pa.array([len(b.rows.entry_id) for b in grown.blocks], pa.int32())})
    dbmod.insert_arrow(con, "tree_blocks", blocks, "shift_entry_tree", {"session_id": session_id})
    _insert_tree(con, session_id, grown.rows)
