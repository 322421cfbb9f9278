"""Finding sessions and branches in the database, and the read-only analyst query."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
from pydantic import BaseModel

from om_core.pi.branch_entry import BranchEntry, branch_entries_from_rows
from om_core.pi.cutpoint import (
    CutPoint,
    CutPointRules,
    NothingToCompact,
    compaction_cut_point,
)
from om_core.store.db import named_column, named_row, named_rows, rows_as, scalar
from om_core.errors import AmbiguousSession, EntryNotFound, InvalidArgument, OmError, SessionNotFound
from om_core.pi.session import file_header
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


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
    row = named_row(con, "session_by_id", {"ref": ref})
    if row:
        return row["session_id"]
    candidate = Path(ref)
    if candidate.exists():
        row = named_row(con, "session_by_path", {"path": str(candidate.resolve())})
        if row:
            return row["session_id"]
        if candidate.is_dir():
            raise SessionNotFound(f"{ref} is a directory, not a session file (a directory's sessions: "
                                  f"`om ingest {ref}`, then `om sessions`)")
        if file_header(candidate) is None:
            raise SessionNotFound(f"{ref} is not a Pi session file (no session header in its first lines)")
        raise SessionNotFound(f"{ref} has not been ingested; run `om ingest {ref}`")
    matches = named_column(con, "sessions_by_prefix", {"ref": ref})
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise AmbiguousSession(f"{ref!r} matches several sessions: {', '.join(matches)}; give more characters")
    raise SessionNotFound(f"no ingested session matches {ref!r} (try `om sessions`)")


def resolve_tip(con: duckdb.DuckDBPyConnection, session_id: str, leaf: str | None) -> str:
    """``--leaf`` (any entry id) or the session's current leaf."""
    if leaf is None:
        row = named_row(con, "session_leaf", {"session_id": session_id})
        if not row or row["leaf_id"] is None:
            raise EntryNotFound(f"session {session_id} has no entries")
        return row["leaf_id"]
    if not scalar(con, "entry_exists", {"session_id": session_id, "entry_id": leaf}):
        raise EntryNotFound(f"entry {leaf!r} is not in session {session_id}")
    return leaf


def list_sessions(con: duckdb.DuckDBPyConnection) -> list[SessionInfo]:
    return rows_as(SessionInfo, con.execute(query("list_sessions")))


def branch_for_cut_point(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> list[BranchEntry]:
    return branch_entries_from_rows(named_rows(con, "branch_for_cut_point", {"session_id": session_id, "tip": tip}))


def file_branch(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> list[BranchEntry]:
    """The branch as the file om export writes holds it (om's records as entries after their anchors):
    what Pi's cut point sees in the session file's world."""
    return branch_entries_from_rows(named_rows(con, "file_branch_for_cut_point", {"session_id": session_id, "tip": tip}))


class PiDeclines(OmError):
    """Pi would not compact this branch (pi-sessions.md §7.4): ``reason`` says why."""

    def __init__(self, session_id: str, tip: str, reason: str, rules: str) -> None:
        super().__init__(f"Pi would not compact at {tip}: {reason}")
        self.session_id, self.tip, self.reason, self.rules = session_id, tip, reason, rules


def cut_point(ws: Workspace, session: str, leaf: str | None = None, keep_recent_tokens: int | None = None,
              rules: CutPointRules | None = None) -> CutPoint:
    """Pi's cut point if it compacted at ``leaf`` (default: the current leaf), by the workspace's
    keepRecentTokens and cutPointRules unless given; ``PiDeclines`` where Pi would not compact.

    In the session file's world: on the branch as the file om export writes holds it, so F can be one
    of om's records (positions count them as entries) and equals Pi's cut on the exported file."""
    if keep_recent_tokens is None:
        keep_recent_tokens = ws.settings.keepRecentTokens
    if rules is None:
        rules = ws.settings.cutPointRules
    if keep_recent_tokens < 0:
        raise InvalidArgument("--keep-recent must be zero or more")
    with ws.read() as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        branch = file_branch(con, sid, tip)
    try:
        return compaction_cut_point(branch, keep_recent_tokens, rules=rules)
    except NothingToCompact as exc:
        raise PiDeclines(sid, tip, str(exc), rules) from None


def sessions(ws: Workspace) -> list[SessionInfo]:
    with ws.read() as con:
        return list_sessions(con)


class QueryResult(BaseModel):
    statement: str = ""
    columns: list[str]
    rows: list[list[Any]]

    def text_rows(self) -> list[list[str]]:
        """Every value as text for a table or CSV: NULL empty, BLOBs as hex, nested values as JSON."""
        return [[display_value(v) for v in row] for row in self.rows]

    def json_rows(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, (json_value(v) for v in row))) for row in self.rows]


def json_value(value: Any) -> Any:
    """A JSON-ready value: BLOBs as hex strings, nested lists and structs converted throughout."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # dates, times, decimals, UUIDs, intervals: their text form


def display_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    converted = json_value(value)
    if isinstance(converted, (dict, list)):
        return json.dumps(converted, ensure_ascii=False)
    return str(converted)


# Statements `om sql` runs: queries only. DuckDB's own parser says what each statement is; DuckDB's
# settings (sql/queries/catalog.sql: sql_sandbox) refuse file, network and extension access and lock
# the configuration, so a statement that slips past this list still cannot write or reconfigure.
_QUERY_TYPES = {"SELECT", "CALL", "MULTI"}  # MULTI: a PIVOT (DuckDB adds its temporary enum type)
_REFUSAL_REASONS = {
    "COPY": "COPY writes and reads files (print with --csv or --json instead)",
    "EXPORT": "EXPORT DATABASE writes files",
    "ATTACH": "ATTACH opens another database",
    "DETACH": "DETACH changes the attached databases",
    "LOAD": "INSTALL and LOAD add extensions",
    "SET": "SET, RESET and USE change the configuration",
    "PRAGMA": "PRAGMA statements change settings or import data (read with SHOW, DESCRIBE or pragma_* "
              "table functions)",
    "TRANSACTION": "transactions are for writes",
}


def _refusal(con: duckdb.DuckDBPyConnection, statement: Any, number: int) -> str | None:
    kind = statement.type.name
    if kind == "EXPLAIN":  # EXPLAIN ANALYZE runs its statement: allowed when that statement is
        inner = _explained_statement(con, statement.query)
        return None if inner is None else _refusal(con, inner, number)
    if kind in _QUERY_TYPES:
        return None
    reason = _REFUSAL_REASONS.get(kind, f"{kind} statements change the database")
    return f"om sql is read-only: statement {number} refused: {reason}"


def _explained_statement(con: duckdb.DuckDBPyConnection, text: str) -> Any:
    """The statement an EXPLAIN explains (found with DuckDB's tokenizer), or None for none."""
    tokens = [(offset, kind) for offset, kind in duckdb.tokenize(text) if kind != duckdb.token_type.comment]
    i = 1  # tokens[0] is EXPLAIN
    if i < len(tokens) and text[tokens[i][0]:].lower().startswith(("analyze", "analyse")):
        i += 1
    elif i < len(tokens) and text[tokens[i][0]] == "(":  # EXPLAIN (ANALYZE, FORMAT json) ...
        while i < len(tokens) and text[tokens[i][0]] != ")":
            i += 1
        i += 1
    if i >= len(tokens):
        return None
    inner = con.extract_statements(text[tokens[i][0]:])
    return inner[0] if inner else None


def _one_line(exc: duckdb.Error) -> str:
    """DuckDB's message without its caret diagram, on one line."""
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not line.startswith("LINE ") and set(line) != {"^"}]
    return "; ".join(kept) or type(exc).__name__


def run_sql(ws: Workspace, sql: str, *, allow_files: bool = False) -> list[QueryResult]:
    """Run analyst queries on a read-only, locked-down connection: one result per statement.

    Every statement is checked before any runs, so several statements either all run or none does.
    Files on disk are readable only with ``allow_files`` (``om sql --allow-files``).
    """
    if not sql.strip().strip(";").strip():
        raise InvalidArgument("the query is empty")
    if sql.strip().startswith("."):
        return [_dot_command(ws, sql.strip().rstrip(";").split())]
    # a read-only connection of its own, opened for this use (waiting out a writer's short hold on the
    # file): `om sql` reads between the uses of a running flow
    with ws.read() as con:
        if allow_files:
            con.execute(query("sql_sandbox_local_files"))
        con.execute(query("sql_sandbox"))
        try:
            statements = con.extract_statements(sql)
        except duckdb.Error as exc:
            raise OmError(f"query failed: {_one_line(exc)}") from None
        if not statements:
            raise InvalidArgument("the query is empty")
        for number, statement in enumerate(statements, 1):
            reason = _refusal(con, statement, number)
            if reason:
                raise InvalidArgument(reason)
        results = []
        for statement in statements:
            try:
                cursor = con.execute(statement)
                columns = [d[0] for d in cursor.description] if cursor.description else []
                rows = [list(r) for r in cursor.fetchall()] if columns else []
            except duckdb.PermissionException as exc:
                if allow_files:
                    raise OmError(f"query failed: {_one_line(exc)}") from None
                raise OmError(f"om sql reads no files unless --allow-files is given ({_one_line(exc)})") from None
            except duckdb.Error as exc:
                raise OmError(f"query failed: {_one_line(exc)}") from None
            results.append(QueryResult(statement=statement.query.strip(), columns=columns, rows=rows))
        return results


def _dot_command(ws: Workspace, words: list[str]) -> QueryResult:
    """The shell's questions about the schema, as the DuckDB and SQLite shells spell them: ``.tables``
    (every view and macro of the analyst schema) and ``.schema [NAME]`` (their columns and types, a
    macro's parameters)."""
    command, args = words[0], words[1:]
    if command == ".tables" and not args:
        name, params = "catalog_objects", {}
    elif command == ".schema" and len(args) <= 1:
        name, params = "catalog_schema", {"name": args[0] if args else None}
    else:
        raise InvalidArgument(f"unknown command {' '.join(words)!r}: om sql takes SQL, .tables or .schema [NAME]")
    with ws.read() as con:
        cursor = con.execute(query(name), params)
        columns = [d[0] for d in cursor.description]
        rows = [list(r) for r in cursor.fetchall()]
    if args and not rows:
        raise OmError(f"no view or macro named {args[0]!r} in the analyst schema (om sql .tables lists them)")
    return QueryResult(statement=" ".join(words), columns=columns, rows=rows)


# ---------------------------------------------------------------- the analyst schema, documented


class AnalystObject(BaseModel):
    """A view or macro of the analyst schema as the documentation lists it: its columns in the
    catalog's order (a scalar macro has none), a macro's parameters, and what it holds."""

    name: str
    kind: str  # view, macro or table macro
    parameters: list[str]
    columns: list[str]
    what: str
    column_notes: dict[str, str]


def analyst_schema(con: duckdb.DuckDBPyConnection) -> list[AnalystObject]:
    """Every view and macro of ``main`` with its columns and its text from catalog_docs; an object
    without a text, or a text for no object, is an error naming them."""
    from om_core.store.catalog_docs import SCHEMA_DOCS

    objects: dict[str, AnalystObject] = {}
    for row in named_rows(con, "catalog_schema", {"name": None}):
        name, kind = row["name"], row["kind"]
        doc = SCHEMA_DOCS.get(name)
        item = objects.setdefault(name, AnalystObject(
            name=name, kind=kind, parameters=[], columns=[], what=doc.what if doc else "",
            column_notes=doc.columns if doc else {}))
        if kind == "view":
            item.columns.append(row["column"])
        else:
            item.parameters.append(row["column"])
    for item in objects.values():
        if item.kind == "table macro":
            item.columns = list(con.table_function(item.name, [None] * len(item.parameters)).columns)
    undocumented = sorted(set(objects) - set(SCHEMA_DOCS))
    unknown = sorted(set(SCHEMA_DOCS) - set(objects))
    if undocumented or unknown:
        raise OmError("om_core/store/catalog_docs.py is out of step with the analyst schema: "
                      + "; ".join(part for part in (
                          undocumented and f"no text for {', '.join(undocumented)}",
                          unknown and f"a text for no object: {', '.join(unknown)}") if part))
    for item in objects.values():
        stray = set(item.column_notes) - set(item.columns)
        if stray:
            raise OmError(f"catalog_docs.py notes columns {sorted(stray)} that {item.name} does not have")
    order = list(SCHEMA_DOCS)
    return sorted(objects.values(), key=lambda item: (item.kind != "view", order.index(item.name)))
