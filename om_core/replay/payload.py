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

import duckdb
import pyarrow as pa

from om_core.store import db as dbmod
from om_core.settings import Settings
from om_core.store.sqlfiles import query
from om_core.store.workspace import Workspace

# The tables a replay reads, in load order; each has its payload_/load_ queries in replay_payload.sql.
PAYLOAD_TABLES = (
    ("om_internal.sessions", "payload_sessions", "load_sessions"),
    ("om_internal.entries", "payload_entries", "load_entries"),
    ("om_internal.entry_tree", "payload_entry_tree", "load_entry_tree"),
    ("om_internal.ledger", "payload_ledger", "load_ledger"),
    ("om_internal.observations", "payload_observations", "load_observations"),
    ("om_internal.reflections", "payload_reflections", "load_reflections"),
    ("om_internal.drops", "payload_drops", "load_drops"),
    ("om_internal.reflection_drops", "payload_reflection_drops", "load_reflection_drops"),
    ("om_internal.compactions", "payload_compactions", "load_compactions"),
    ("om_internal.compaction_items", "payload_compaction_items", "load_compaction_items"),
    ("om_internal.stages", "payload_stages", "load_stages"),
)

# The tables a replay appends to, in commit order; each has replayed_/commit_ queries.
REPLAYED_TABLES = (
    ("om_internal.ledger", "replayed_ledger", "commit_ledger"),
    ("om_internal.observations", "replayed_observations", "commit_observations"),
    ("om_internal.reflections", "replayed_reflections", "commit_reflections"),
    ("om_internal.drops", "replayed_drops", "commit_drops"),
    ("om_internal.reflection_drops", "replayed_reflection_drops", "commit_reflection_drops"),
    ("om_internal.compactions", "replayed_compactions", "commit_compactions"),
    ("om_internal.compaction_items", "replayed_compaction_items", "commit_compaction_items"),
    ("om_internal.stages", "replayed_stages", "commit_stages"),
    ("om_internal.llm_calls", "replayed_llm_calls", "commit_llm_calls"),
    ("om_internal.llm_call_texts", "replayed_llm_call_texts", "commit_llm_call_texts"),
)


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _arrow(con: duckdb.DuckDBPyConnection, name: str, params: dict) -> pa.Table:
    return con.sql(query(name), params=params).to_arrow_table()


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
    for table, read_name, _ in PAYLOAD_TABLES:
        data = _arrow(con, read_name, params)
        payload.tables[table] = _to_ipc(data)
        payload.rows[table] = data.num_rows
    return payload


def payload_workspace(payload: SessionPayload, settings: Settings) -> Workspace:
    """An in-memory workspace holding the payload's rows (the caller closes it)."""
    ws = Workspace.in_memory(settings)
    with ws.write() as con, dbmod.transaction(con):
        for table, _, load_name in PAYLOAD_TABLES:
            if payload.rows.get(table):
                dbmod.insert_arrow(con, "payload_batch", _from_ipc(payload.tables[table]), load_name)
        ordered = payload.rows.get("om_internal.ledger", 0) + payload.rows.get("om_internal.compactions", 0)
        if ordered:
            con.execute(query("advance_append_seq"), {"n": ordered}).fetchall()
    return ws


def replayed_rows(con: duckdb.DuckDBPyConnection, session_id: str, run_id: str) -> ReplayedRows:
    result = ReplayedRows(session_id, run_id)
    for table, read_name, _ in REPLAYED_TABLES:
        data = _arrow(con, read_name, {"run_id": run_id})
        result.rows[table] = data.num_rows
        if data.num_rows:
            result.tables[table] = _to_ipc(data)
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
    for table, _, commit_name in REPLAYED_TABLES:
        if table in tables and tables[table].num_rows:
            dbmod.insert_arrow(con, "replay_batch", tables[table], commit_name)
            written[table] = tables[table].num_rows
    return written
