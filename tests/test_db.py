"""The database's schema (om_core.db): migration 008 keeps om's tables in om_internal, the default
schema main holds only the documented views and macros, and a database written before 008 keeps every
row, constraint and answer."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from fake_openai import text, tool_call
from legacy_db import RENAMED_BY_008, legacy_copy
from conftest import workspace
from typer.testing import CliRunner

from flows.cli.main import app

from om_core import db as dbmod
from om_core.catalog import run_sql
from om_core.errors import InvalidArgument
from om_core.ingest import ingest
from om_core.replay import replay_in_process
from om_core.run_plan import record_replay
from om_core.settings import Settings
from om_core.workers.stages import ModelConfig, make_brain
from om_core.workspace import Workspace

pytestmark = pytest.mark.usefixtures("isolated_home")

SID = "0d8a0008-0000-4000-8000-000000000001"
OTHER = "0d8a0008-0000-4000-8000-000000000002"
SETTINGS = Settings(observeAfterTokens=120, reflectAfterTokens=250, compactAfterTokens=600, keepRecentTokens=150,
                    observationsPoolMaxTokens=400, observationsPoolTargetTokens=200)
TABS_ID = "098e1f1f2928"
OBS = {"id": TABS_ID, "content": "User prefers tabs over spaces.", "timestamp": "2026-01-15 14:01",
       "relevance": "high", "sourceEntryIds": ["00000001"], "tokenCount": 12}
REFL = {"id": "2ce2fee9bc8d", "content": "User decided to switch from REST to GraphQL for the public API; motivation "
        "was reducing over-fetching on mobile clients.", "supportingObservationIds": [TABS_ID], "tokenCount": 25}
BOOKKEEPING = ("schema_migrations", "om_meta")


def rows(db: Path, sql: str) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def populated(tmp_path: Path, server) -> Path:
    """A database with rows in every table, from real ingests, an offline replay and model calls."""
    sb = SessionBuilder(SID)
    first = sb.user("I prefer tabs over spaces.")  # 00000001
    sb.assistant("Noted.")
    sb.custom("om.observations.recorded", {"observations": [OBS], "coversUpToId": first})  # imported records
    sb.custom("om.reflections.recorded", {"reflections": [REFL], "coversUpToId": first})
    sb.custom("om.observations.recorded", {"observations": "not a list", "coversUpToId": first})  # a reject
    kept = sb.user("Keep going.")
    sb.compaction("memory", kept, details={"type": "om.folded", "version": 1, "fullFold": False,
                                           "observations": [OBS], "reflections": [REFL]}, from_hook=True)
    for i in range(6):
        sb.user(f"Please build part {i}; it must stay offline and use DuckDB. " * 4)
        sb.assistant(f"Built part {i} and the tests pass. " * 4, tool_calls=[(f"c{i}", "edit", {"path": f"p{i}.py"})])
        sb.tool_result(f"c{i}", "edit", "ok " * 30)
    sb.compaction("Pi's own summary", None)
    path = sb.write(tmp_path / "a.jsonl")
    with path.open("a") as f:
        f.write("{not json\n")  # quarantined
    other = SessionBuilder(OTHER)
    other_first = other.user("Please use PostgreSQL 16 for the orders service.")
    other.assistant("Using PostgreSQL 16.")
    third = SessionBuilder("0d8a0008-0000-4000-8000-000000000003")
    third.go("deadbeef")  # a dangling parent: kept, with an ingest note
    third.user("And after that?")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [path, other.write(tmp_path / "b.jsonl"), third.write(tmp_path / "c.jsonl")])

    con = dbmod.connect(db)
    try:
        ws = Workspace.on_connection(con, SETTINGS)
        replay_in_process(ws, SID, make_brain(ModelConfig(model="offline"), SETTINGS), run_id="run-offline")
        record_replay(con, SID, "fingerprint-1", "run-offline")
    finally:
        con.close()
    server.add(tool_call("record_observations", {"observations": [{
        "timestamp": "2026-01-15 14:02", "content": "User wants the orders service on PostgreSQL 16.",
        "relevance": "high", "sourceEntryIds": [other_first]}]}), text("All recorded."))
    result = CliRunner().invoke(app, ["--db", str(db), "observe", OTHER, "--model", "openai/fake-model",
                                      "--api-base", server.base_url])
    assert result.exit_code == 0, result.output
    with dbmod.writing(db) as con:  # a computed result not yet appended (what a crash leaves)
        con.execute("INSERT INTO om_internal.stage_results (session_id, stage_key, stage, result) "
                    "VALUES (?, 'key-1', 'observer', '[]')", [OTHER])
    return db


def schema(db: Path, *, internal_tables: bool = True) -> dict[str, list[tuple]]:
    """Every table of a schema with its rows, columns (types, defaults) and constraints."""
    where = "schema_name = 'om_internal'" if internal_tables else "schema_name = 'main'"
    tables = [r[0] for r in rows(db, f"SELECT table_name FROM duckdb_tables() WHERE {where} ORDER BY 1")]
    out = {}
    for t in tables:
        out[t] = rows(db, f"SELECT * FROM om_internal.{t} ORDER BY ALL") if internal_tables else []
        out[t + " columns"] = rows(db, "SELECT column_name, data_type, column_default, is_nullable FROM duckdb_columns() "
                                       f"WHERE {where} AND table_name = '{t}' ORDER BY column_index")
        out[t + " constraints"] = rows(db, "SELECT constraint_type, constraint_text FROM duckdb_constraints() "
                                           f"WHERE {where} AND table_name = '{t}' ORDER BY ALL")
    return out


def public_answers(db: Path) -> dict[str, list[tuple]]:
    """What every view in main and the main table macros answer."""
    views = [r[0] for r in rows(db, "SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal "
                                    "ORDER BY 1")]
    out = {v: rows(db, f"SELECT * FROM {v} ORDER BY ALL") for v in views}
    tip = rows(db, f"SELECT leaf_id FROM sessions WHERE session_id = '{SID}'")[0][0]
    for macro in ("ledger_at", "visible_projection", "replayed_projection", "progress_clocks", "coverage_tiers",
                  "memory_drift", "branch_records", "branch_compactions"):
        out[macro] = rows(db, f"SELECT * FROM {macro}('{SID}', '{tip}') ORDER BY ALL")
    out["full_projection"] = rows(db, f"SELECT * FROM full_projection('{SID}', '{tip}', '{tip}') ORDER BY ALL")
    return out


def test_a_new_database_keeps_its_tables_in_om_internal_and_only_views_in_main(tmp_path):
    db = tmp_path / "om.duckdb"
    dbmod.connect(db).close()
    assert rows(db, "SELECT table_name FROM duckdb_tables() WHERE schema_name <> 'om_internal'") == []
    internal = {r[0] for r in rows(db, "SELECT table_name FROM duckdb_tables()")}
    public = {r[0] for r in rows(db, "SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' AND NOT internal")}
    assert set(RENAMED_BY_008.values()) <= internal and not internal & set(RENAMED_BY_008)
    # one name per concept: a public view over a table has the table's name
    assert internal - public == {"session_files", "stage_results", *BOOKKEEPING}
    assert rows(db, "SELECT schema_name FROM duckdb_sequences()") == [("om_internal",)]


def test_migration_008_keeps_every_row_constraint_and_answer_of_a_database_at_007(tmp_path, server):
    current = populated(tmp_path, server)
    before = schema(current)
    empty = [t for t, r in before.items() if not t.endswith(("columns", "constraints")) and not r]
    assert empty == [], f"the test database should have rows in every table: {empty}"
    answers = public_answers(current)
    assert answers["ledger_at"] and answers["visible_projection"] and answers["compaction_gaps"]

    legacy = legacy_copy(current, tmp_path / "at_007.duckdb", through=7)
    con = duckdb.connect(str(legacy))  # views and a macro over the old tables, as an earlier om left them
    con.execute("CREATE VIEW ledger AS SELECT * FROM ledger_records")
    con.execute("CREATE VIEW llm_calls AS SELECT * FROM model_calls")
    con.execute("CREATE MACRO branch_records(p_session, p_tip) AS TABLE SELECT * FROM ledger_records")
    con.execute("INSERT INTO om_meta VALUES ('views_fingerprint', 'from-007')")
    con.close()
    assert rows(legacy, "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main'")[0][0] == len(before) // 3

    dbmod.connect(legacy, read_only=True).close()  # a reader upgrades an outdated file first
    after = schema(legacy)
    for bookkeeping in BOOKKEEPING:  # when each migration ran differs; that they ran does not
        before.pop(bookkeeping)
        after.pop(bookkeeping)
    assert after == before
    assert rows(legacy, "SELECT version FROM om_internal.schema_migrations ORDER BY 1") == [(v,) for v in range(1, 9)]
    assert schema(legacy, internal_tables=False) == {}  # main: views and macros only
    assert public_answers(legacy) == answers

    # the record order continues after every position taken; keys and defaults hold
    taken = rows(legacy, "SELECT max(append_seq) FROM om_internal.ledger")[0][0]
    taken = max(taken, rows(legacy, "SELECT max(append_seq) FROM om_internal.compactions")[0][0])
    with dbmod.writing(legacy) as con:
        con.execute("INSERT INTO om_internal.ledger (session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, "
                    "origin) VALUES (?, 'new-record', 'om.observations.dropped', 'x', 'x', 'pipeline')", [SID])
        assert con.execute("SELECT append_seq FROM om_internal.ledger WHERE ledger_id = 'new-record'").fetchone()[0] > taken
        with pytest.raises(duckdb.ConstraintException):
            con.execute("INSERT INTO om_internal.ledger (session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, "
                        "origin) VALUES (?, 'new-record', 'om.observations.dropped', 'x', 'x', 'pipeline')", [SID])


def test_om_sql_reads_views_and_internal_tables_by_their_qualified_name(tmp_path):
    db = tmp_path / "om.duckdb"
    sb = SessionBuilder(SID)
    sb.user("hello")
    ingest(workspace(db), [sb.write(tmp_path / "a.jsonl")])
    for sql in ("SELECT count(*) FROM entries", "SELECT count(*) FROM om_internal.entries"):
        (result,) = run_sql(workspace(db), sql)
        assert result.rows == [[1]]
    with pytest.raises(InvalidArgument, match="read-only"):
        run_sql(workspace(db), "DELETE FROM om_internal.entries")
