"""What a rewrite of a session file takes away (SPEC §2), measured around re-reading it.

Before a session's rows are replaced (the file was rewritten, or a moved file takes the session
over), its entries (id and a hash of the line) and its already orphaned records are noted; once the
file is read again, the report says which entries are gone or changed and which of this project's
records lost their evidence. Those records are never deleted: the ``orphaned_records`` view marks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from om_core.store.db import named_column, named_rows
from om_core.ingest.reports import ReplacedSession


@dataclass(slots=True)
class Before:
    session_id: str
    entries: dict[str, int]  # entry id -> hash of its line
    orphaned: set[str]  # ledger ids orphaned before (an earlier rewrite)


def before_replacing(con: duckdb.DuckDBPyConnection, session_id: str) -> Before:
    rows = named_rows(con, "session_entry_hashes", {"session_id": session_id})
    return Before(session_id, {r["entry_id"]: r["raw_hash"] for r in rows},
                  set(named_column(con, "orphaned_ledger_ids", {"session_id": session_id})))


def what_was_lost(con: duckdb.DuckDBPyConnection, before: Before, now_session_id: str | None) -> ReplacedSession:
    """Compared with what is stored now (in the ingest's transaction, after the file was read)."""
    sid = before.session_id
    now = {r["entry_id"]: r["raw_hash"] for r in named_rows(con, "session_entry_hashes", {"session_id": sid})}
    lost = sum(1 for entry_id in before.entries if entry_id not in now)
    changed = sum(1 for entry_id, h in before.entries.items() if entry_id in now and now[entry_id] != h)
    orphaned = [i for i in named_column(con, "orphaned_ledger_ids", {"session_id": sid}) if i not in before.orphaned]
    return ReplacedSession(session_id=sid, now_session_id=now_session_id, entries_before=len(before.entries),
                           entries_lost=lost, entries_changed=changed, orphaned_ledger_ids=orphaned)
