"""A session's replay as a unit of work that needs no database file (one writer, many workers).

* ``read_session_payload``: the flow reads a session's rows (session, entries and tree, ledger
  records, compactions, the observer's empty results) from the user's database;
* ``payload_workspace``: a replay task loads them into an in-memory DuckDB with the same ``sql/``
  schema, views and macros, so fold and projection are still carried out in SQL;
* ``replayed_rows``: after the replay, the rows it appended (records, compactions, stage runs, model
  calls: every one carries the run id);
* ``commit_replayed_rows``: the flow writes them to the user's database in one short transaction.

Payloads and results are Arrow IPC bytes per table: plain, compact and serialisable by any task
runner (Prefect's threads, a Dask cluster).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import duckdb
import pyarrow as pa

from om_core.store import db as dbmod
from om_core.settings import Settings
from om_core.store.sqlfiles import query, table_query
from om_core.store.workspace import Workspace

class ReplayTable(StrEnum):
    """A table of ``om_internal`` that a replay reads or appends to."""

    SESSIONS = "sessions"
    ENTRIES = "entries"
    ENTRY_TREE = "entry_tree"
    LEDGER = "ledger"
    OBSERVATIONS = "observations"
    REFLECTIONS = "reflections"
    DROPS = "drops"
    REFLECTION_DROPS = "reflection_drops"
    COMPACTIONS = "compactions"
    COMPACTION_ITEMS = "compaction_items"
    STAGES = "stages"
    LLM_CALLS = "llm_calls"
    LLM_CALL_TEXTS = "llm_call_texts"

    @property
    def qualified(self) -> str:
        return f"om_internal.{self.value}"


T = ReplayTable
# The tables a replay reads, in load order, and those it appends to, in commit order.
PAYLOAD_TABLES = (T.SESSIONS, T.ENTRIES, T.ENTRY_TREE, T.LEDGER, T.OBSERVATIONS, T.REFLECTIONS, T.DROPS,
                  T.REFLECTION_DROPS, T.COMPACTIONS, T.COMPACTION_ITEMS, T.STAGES)
REPLAYED_TABLES = (T.LEDGER, T.OBSERVATIONS, T.REFLECTIONS, T.DROPS, T.REFLECTION_DROPS, T.COMPACTIONS,
                   T.COMPACTION_ITEMS, T.STAGES, T.LLM_CALLS, T.LLM_CALL_TEXTS)
# Reads of their own shape, named queries in replay_payload.sql; every other table's read is a template
# of sql/queries/tables.
_OWN_PAYLOAD_READS = {T.STAGES: "payload_stages"}
_RENUMBERED = {T.LEDGER, T.COMPACTIONS}  # their record order is renumbered for the payload
_OWN_REPLAYED_READS = {T.LEDGER: "replayed_ledger", T.COMPACTIONS: "replayed_compactions",
                       T.COMPACTION_ITEMS: "replayed_compaction_items", T.STAGES: "replayed_stages",
                       T.LLM_CALLS: "replayed_llm_calls", T.LLM_CALL_TEXTS: "replayed_llm_call_texts"}
_COMMITTED_ONCE = {T.STAGES, T.LLM_CALLS, T.LLM_CALL_TEXTS}  # an earlier commit may hold them already


def payload_read(table: ReplayTable) -> str:
    """The statement reading a session's rows of ``table`` for its payload (``$session_id``)."""
    if table in _OWN_PAYLOAD_READS:
        return query(_OWN_PAYLOAD_READS[table])
    return table_query("renumbered_of_session" if table in _RENUMBERED else "rows_of_session", table)


def payload_load(table: ReplayTable) -> str:
    """The statement loading a payload's rows of ``table`` (registered as ``payload_batch``)."""
    return table_query("load_payload", table)


def replayed_read(table: ReplayTable) -> str:
    """The statement reading the rows of ``table`` a run's replay appended (``$run_id``)."""
    if table in _OWN_REPLAYED_READS:
        return query(_OWN_REPLAYED_READS[table])
    return table_query("of_replayed_records", table)


def commit_statement(table: ReplayTable) -> str:
    """The statement committing a replay's rows of ``table`` (registered as ``replay_batch``)."""
    return table_query("commit_replayed_once" if table in _COMMITTED_ONCE else "commit_replayed", table)


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _arrow(con: duckdb.DuckDBPyConnection, statement: str, params: dict) -> pa.Table:
    return con.sql(statement, params=params).to_arrow_table()


@dataclass
class SessionPayload:
    """Everything a replay of one session reads, as Arrow IPC bytes per table."""

    session_id: str
    tables: dict[str, bytes] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(len(b) for b in self.tables.values())

    @property
    def file_path(self) -> str | None:
        """The session's file (what a run shows beside its id), from the payload's sessions row."""
        data = self.tables.get("om_internal.sessions")
        if data is None:
            return None
        table = _from_ipc(data)
        if table.num_rows == 0 or "file_path" not in table.column_names:
            return None
        return table.column("file_path")[0].as_py()


@dataclass
class ReplayedRows:
    """The rows one replay appended, to be committed by the flow."""

    session_id: str
    run_id: str
    tables: dict[str, bytes] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not any(self.rows.values())

    @property
    def cost(self) -> float:
        """What its model calls cost, as priced (USD; unpriced calls count nothing)."""
        data = self.tables.get("om_internal.llm_calls")
        if data is None:
            return 0.0
        return float(sum(c for c in _from_ipc(data).column("cost").to_pylist() if c is not None))


def read_session_payload(con: duckdb.DuckDBPyConnection, session_id: str) -> SessionPayload:
    payload = SessionPayload(session_id)
    params = {"session_id": session_id}
    for table in PAYLOAD_TABLES:
        data = _arrow(con, payload_read(table), params)
        payload.tables[table.qualified] = _to_ipc(data)
        payload.rows[table.qualified] = data.num_rows
    return payload


def payload_workspace(payload: SessionPayload, settings: Settings) -> Workspace:
    """An in-memory workspace holding the payload's rows (the caller closes it)."""
    ws = Workspace.in_memory(settings)
    with ws.write() as con, dbmod.transaction(con):
        for table in PAYLOAD_TABLES:
            if payload.rows.get(table.qualified):
                dbmod.insert_arrow_with(con, "payload_batch", _from_ipc(payload.tables[table.qualified]),
                                        payload_load(table))
        ordered = payload.rows.get("om_internal.ledger", 0) + payload.rows.get("om_internal.compactions", 0)
        if ordered:
            con.execute(query("advance_append_seq"), {"n": ordered}).fetchall()
    return ws


def replayed_rows(con: duckdb.DuckDBPyConnection, session_id: str, run_id: str) -> ReplayedRows:
    result = ReplayedRows(session_id, run_id)
    for table in REPLAYED_TABLES:
        data = _arrow(con, replayed_read(table), {"run_id": run_id})
        result.rows[table.qualified] = data.num_rows
        if data.num_rows:
            result.tables[table.qualified] = _to_ipc(data)
    return result


def _renumber(tables: dict[str, pa.Table], seqs: list[int]) -> dict[str, pa.Table]:
    """New records and compactions take fresh database positions, in the replay's own order."""
    local = []
    for name in ("om_internal.ledger", "om_internal.compactions"):
        if name in tables:
            local += tables[name].column("append_seq").to_pylist()
    fresh = dict(zip(sorted(local), sorted(seqs)))
    out = dict(tables)
    for name in ("om_internal.ledger", "om_internal.compactions"):
        if name in tables:
            column = pa.array([fresh[s] for s in tables[name].column("append_seq").to_pylist()], pa.int64())
            index = tables[name].schema.get_field_index("append_seq")
            out[name] = tables[name].set_column(index, "append_seq", column)
    return out


def _without_committed(tables: dict[str, pa.Table], committed: set[str]) -> dict[str, pa.Table]:
    """Leave out records and compactions (with their items) that are already in the database."""
    if not committed:
        return tables
    out = dict(tables)
    for name, key in (("om_internal.ledger", "ledger_id"), ("om_internal.observations", "ledger_id"),
                      ("om_internal.reflections", "ledger_id"), ("om_internal.drops", "ledger_id"),
                      ("om_internal.reflection_drops", "ledger_id"),
                      ("om_internal.compactions", "compaction_id"), ("om_internal.compaction_items", "compaction_id")):
        if name in tables:
            keep = [value not in committed for value in tables[name].column(key).to_pylist()]
            out[name] = tables[name].filter(pa.array(keep, pa.bool_()))
    return out


def commit_replayed_rows(con: duckdb.DuckDBPyConnection, result: ReplayedRows) -> dict[str, int]:
    """Write a replay's rows (inside the caller's transaction); a result committed twice changes nothing."""
    tables = {name: _from_ipc(data) for name, data in result.tables.items()}
    written: dict[str, int] = {}
    committed = set(dbmod.named_column(con, "committed_ledger_ids", {"session_id": result.session_id}))
    tables = _without_committed(tables, committed)
    ordered = sum(tables[n].num_rows for n in ("om_internal.ledger", "om_internal.compactions") if n in tables)
    if ordered:
        seqs = dbmod.named_column(con, "take_append_seqs", {"n": ordered})
        tables = _renumber(tables, seqs)
    for table in REPLAYED_TABLES:
        name = table.qualified
        if name in tables and tables[name].num_rows:
            dbmod.insert_arrow_with(con, "replay_batch", tables[name], commit_statement(table))
            written[name] = tables[name].num_rows
    return written
