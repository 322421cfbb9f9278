"""Finding sessions and branches in the database, and the read-only analyst query."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb
from pydantic import BaseModel

from om_core.cutpoint import DEFAULT_KEEP_RECENT_TOKENS, BranchEntry, CutPoint, NothingToCompact, compaction_cut_point
from om_core.db import one, reading, rows_as_dicts, scalar
from om_core.errors import AmbiguousSession, EntryNotFound, InvalidArgument, OmError, SessionNotFound
from om_core.sqlfiles import query


class SessionInfo(BaseModel):
    session_id: str
    file_path: str
    version: int
    cwd: str | None
    started_at: Any = None
    leaf_id: str | None
    entry_count: int
    source_count: int
    leaf_count: int
    tokens_pi: int | None
    tokens: int | None
    ingested_at: Any = None


def resolve_session(con: duckdb.DuckDBPyConnection, ref: str) -> str:
    """A session id, a unique prefix of one, or the path of an ingested file."""
    if not ref:
        raise InvalidArgument("empty session reference")
    row = one(con, "session_by_id", {"ref": ref})
    if row:
        return row[0]
    candidate = Path(ref)
    if candidate.exists():
        row = one(con, "session_by_path", {"path": str(candidate.resolve())})
        if row:
            return row[0]
        raise SessionNotFound(f"{ref} has not been ingested; run `om ingest {ref}`")
    matches = [r[0] for r in con.execute(query("sessions_by_prefix"), {"ref": ref}).fetchall()]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise AmbiguousSession(f"{ref!r} matches several sessions: {', '.join(matches)}; give more characters")
    raise SessionNotFound(f"no ingested session matches {ref!r} (try `om sessions`)")


def resolve_tip(con: duckdb.DuckDBPyConnection, session_id: str, leaf: str | None) -> str:
    """``--leaf`` (any entry id) or the session's current leaf."""
    if leaf is None:
        row = one(con, "session_leaf", {"session_id": session_id})
        if not row or row[0] is None:
            raise EntryNotFound(f"session {session_id} has no entries")
        return row[0]
    if not scalar(con, "entry_exists", {"session_id": session_id, "entry_id": leaf}):
        raise EntryNotFound(f"entry {leaf!r} is not in session {session_id}")
    return leaf


def list_sessions(con: duckdb.DuckDBPyConnection) -> list[SessionInfo]:
    return [SessionInfo(**row) for row in rows_as_dicts(con.execute(query("list_sessions")))]


def branch_for_cut_point(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> list[BranchEntry]:
    rows = con.execute(query("branch_for_cut_point"), {"session_id": session_id, "tip": tip}).fetchall()
    return [BranchEntry(*row) for row in rows]


def cut_point(db_path: str | os.PathLike, session: str, leaf: str | None = None,
              keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS) -> CutPoint:
    """Pi's cut point if it compacted at ``leaf`` (default: the current leaf)."""
    if keep_recent_tokens < 0:
        raise InvalidArgument("--keep-recent must be zero or more")
    with reading(db_path) as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        branch = branch_for_cut_point(con, sid, tip)
    try:
        return compaction_cut_point(branch, keep_recent_tokens)
    except NothingToCompact as exc:
        raise OmError(f"Pi would not compact at {tip}: {exc}") from None


def sessions(db_path: str | os.PathLike) -> list[SessionInfo]:
    with reading(db_path) as con:
        return list_sessions(con)


class QueryResult(BaseModel):
    columns: list[str]
    rows: list[list[Any]]


def run_sql(db_path: str | os.PathLike, sql: str) -> QueryResult:
    """Run one analyst query on a read-only connection."""
    if not sql.strip().strip(";").strip():
        raise InvalidArgument("the query is empty")
    with reading(db_path) as con:
        try:
            cursor = con.execute(sql)
        except duckdb.Error as exc:
            raise OmError(f"query failed: {exc}") from None
        if cursor is None or cursor.description is None:
            return QueryResult(columns=[], rows=[])
        return QueryResult(columns=[d[0] for d in cursor.description], rows=[list(r) for r in cursor.fetchall()])
