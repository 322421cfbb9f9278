"""The database's schema (om_core.store.db): migration 008 keeps om's tables in om_internal, the default
schema main holds only the documented views and macros, and a database written before 008 keeps every
row, constraint and answer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from fake_openai import text, tool_call
from legacy_db import RENAMED_BY_008, legacy_copy
from pi_migrate import migrate_file
from conftest import workspace
from typer.testing import CliRunner

from flows.cli.main import app

from om_core.store import db as dbmod
from om_core.store.catalog import run_sql
from om_core.errors import InvalidArgument
from om_core.ingest import ingest
from om_core.replay.engine import replay_session
from om_core.replay.plan import record_replay
from om_core.settings import Settings
from om_core.store.sqlfiles import migrations, schema_snapshot, view_scripts
from om_core.workers.run_config import ModelConfig, make_brain
from om_core.store.workspace import MemoryDatabase, Workspace

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


# Tables later migrations add (010: Pi's migration followed; 011: projects, the project ledger, the search
# index): a database at 007 or 008 has no rows for them, nor the views over them.
TABLES_ADDED_AFTER_009 = ("entry_id_map", "replaced_entries", "project_sessions", "project_ledger",
                          "project_reflections", "project_retirements", "project_stages", "search_documents",
                          "search_terms", "search_vectors", "reflection_drops")
VIEWS_ADDED_AFTER_009 = ("projects", "project_growth")


def populated(tmp_path: Path, server) -> Path:
    """A database with rows in every table, from real ingests, an offline replay and model calls."""
    sb = SessionBuilder(SID)
    first = sb.user("I prefer tabs over spaces.")  # 00000001
    sb.assistant("Noted.")
    sb.custom("om.observations.recorded", {"observations": [OBS], "coversUpToId": first})  # imported records
    sb.custom("om.reflections.recorded", {"reflections": [REFL], "coversUpToId": first})
    sb.custom("om.observations.recorded", {"observations": "not a list", "coversUpToId": first})  # a reject
    sb.custom("om.reflections.dropped", {"reflectionIds": ["0123456789ab"], "coversUpToId": first})  # an unseen id
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
    fourth = SessionBuilder("0d8a0008-0000-4000-8000-000000000004", version=None)  # a v1 file Pi then migrated
    fourth.user("An old session.")
    fourth.assistant("From before ids.")
    fourth.entries = [{k: v for k, v in e.items() if k not in ("id", "parentId")} for e in fourth.entries]
    old = fourth.write(tmp_path / "d.jsonl")
    ingest(workspace(db), [old])
    migrate_file(old)
    ingest(workspace(db), [old])  # entry_id_map: the minted ids and Pi's

    con = dbmod.connect(db)
    try:
        ws = Workspace.on_connection(con, SETTINGS)
        replay_session(ws, SID, make_brain(ModelConfig(model="offline"), SETTINGS), run_id="run-offline")
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
    # project memory: the offline project stage, and a user's forget of what it recorded
    from om_core.usecases.forget import forget
    from om_core.project.stage import run_due_projects

    projects_ws = workspace(db, SETTINGS.model_copy(update={"projectReflectAfterTokens": 1}))
    (outcome, *_) = run_due_projects(projects_ws, make_brain(ModelConfig(model="offline"), SETTINGS))
    forget(projects_ws, outcome.reflections[0].id, "no longer true", project=True)
    # the embeddings of recall by meaning, through the writers' path, with a stand-in model (the
    # embeddings extra is optional)
    from om_core.recall.vectors import refresh_vectors

    class Lengths:
        name = "test/lengths/2"

        def embed(self, texts):
            return [[1.0, float(len(t) % 7)] for t in texts]

    with dbmod.writing(db) as con, dbmod.transaction(con):
        assert refresh_vectors(con, Lengths()) > 0
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
    assert internal - public == {"session_files", "stage_results", "replaced_entries", *BOOKKEEPING}
    assert rows(db, "SELECT schema_name FROM duckdb_sequences()") == [("om_internal",)]


# Columns migrations after 008 added (a database at 007 cannot hold them: they migrate as NULL).
ADDED_AFTER_008 = {"observations": ["ts_repaired_from"], "drops": ["reason"]}
# columns a later migration adds with a default: a file at 008 had none of them
DEFAULTED_AFTER_013 = {"llm_calls": ["fallback"]}


def forget_added_columns(db: Path) -> None:
    with dbmod.writing(db) as con:
        for table, columns in ADDED_AFTER_008.items():
            for column in columns:
                con.execute(f"UPDATE om_internal.{table} SET {column} = NULL")


def test_migration_008_keeps_every_row_constraint_and_answer_of_a_database_at_007(tmp_path, server):
    current = populated(tmp_path, server)
    forget_added_columns(current)
    before = schema(current)
    # (replaced_entries is a work table: empty between ingests)
    empty = [t for t, r in before.items() if not t.endswith(("columns", "constraints")) and not r
             and t != "replaced_entries"]
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
    assert rows(legacy, "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main'")[0][0] == (
        len(before) // 3 - len(TABLES_ADDED_AFTER_009))

    dbmod.connect(legacy, read_only=True).close()  # a reader upgrades an outdated file first
    after = schema(legacy)
    for bookkeeping in BOOKKEEPING:  # when each migration ran differs; that they ran does not
        before.pop(bookkeeping)
        after.pop(bookkeeping)
    for table in TABLES_ADDED_AFTER_009:  # a database at 007 had none of their rows
        assert after.pop(table) == []
        before.pop(table)
        answers.pop(table, None)
    for view in VIEWS_ADDED_AFTER_009:
        answers.pop(view)
    assert after == before
    assert rows(legacy, "SELECT version FROM om_internal.schema_migrations ORDER BY 1") == [
        (v,) for v, _, _ in migrations()]
    assert schema(legacy, internal_tables=False) == {}  # main: views and macros only
    assert {k: v for k, v in public_answers(legacy).items()
            if k not in TABLES_ADDED_AFTER_009 + VIEWS_ADDED_AFTER_009} == answers

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


def test_migration_009_adds_the_checks_columns_to_a_database_at_008(tmp_path, server):
    """The columns observations.ts_repaired_from and drops.reason; a database without them gets them
    empty, and every other row and answer stays."""
    current = populated(tmp_path, server)
    forget_added_columns(current)
    answers = public_answers(current)
    before = schema(current)
    with dbmod.writing(current) as con:  # the file as om left it at 008
        for table, columns in {**ADDED_AFTER_008, **DEFAULTED_AFTER_013}.items():
            for column in columns:
                con.execute(f"ALTER TABLE om_internal.{table} DROP COLUMN {column}")
        for table in TABLES_ADDED_AFTER_009:  # nor had it the tables of later migrations
            con.execute(f"DROP TABLE om_internal.{table}")
        con.execute("DELETE FROM om_internal.schema_migrations WHERE version >= 9")
        con.execute("UPDATE om_internal.om_meta SET value = 'from-008' WHERE key = 'views_fingerprint'")
    assert "reason" not in [r[0] for r in rows(current, "DESCRIBE om_internal.drops")]
    dbmod.connect(current, read_only=True).close()  # a reader upgrades an outdated file first
    after = schema(current)
    for bookkeeping in BOOKKEEPING:
        before.pop(bookkeeping)
        after.pop(bookkeeping)
    for table in TABLES_ADDED_AFTER_009:  # created empty by their migration
        assert after.pop(table) == []
        before.pop(table)
        answers.pop(table, None)
    for view in VIEWS_ADDED_AFTER_009:
        answers.pop(view)
    assert after == before
    assert {k: v for k, v in public_answers(current).items()
            if k not in TABLES_ADDED_AFTER_009 + VIEWS_ADDED_AFTER_009} == answers
    assert [r[0] for r in rows(current, "DESCRIBE drops")][-1] == "reason"
    assert "ts_repaired_from" in [r[0] for r in rows(current, "DESCRIBE observations")]


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


# ---------------------------------------------------------------- the schema snapshot (sql/schema/current.sql)

# What DuckDB's catalog says about a database's own objects, every column but the ids and the
# database's name (which differ between any two databases with the same schema).
CATALOG_FUNCTIONS = ("duckdb_schemas", "duckdb_tables", "duckdb_columns", "duckdb_constraints", "duckdb_sequences",
                     "duckdb_indexes", "duckdb_views", "duckdb_functions", "duckdb_types")


# DuckDB holds a star's EXCLUDE list as a set: a macro read back from storage (the template, any file)
# prints it in another order than the one parsed from sql/views. The list is sorted before comparing;
# the columns a star gives keep their table's order whatever the list's.
_EXCLUDE = re.compile(r"EXCLUDE \(([^()]*)\)")


def _sorted_excludes(text: str | None) -> str | None:
    return text and _EXCLUDE.sub(lambda m: f"EXCLUDE ({', '.join(sorted(m.group(1).split(', ')))})", text)


def catalog(con: duckdb.DuckDBPyConnection) -> dict[str, set[tuple]]:
    """Every schema, table, column (type, default, nullability), constraint (keys, not-null, checks),
    sequence, index, view and macro of the connection's database, and the bookkeeping's rows."""
    out = {}
    for function in CATALOG_FUNCTIONS:
        found = con.execute(f"SELECT COLUMNS(lambda c: c NOT LIKE '%oid' AND c <> 'database_name')::VARCHAR "
                            f"FROM {function}() WHERE database_name = current_database()")
        names = [d[0] for d in found.description]
        out[function] = {tuple((n, _sorted_excludes(v) if n in ("macro_definition", "sql") else v)
                               for n, v in zip(names, row)) for row in found.fetchall()}
    out["schema_migrations"] = set(con.execute("SELECT version, name FROM om_internal.schema_migrations").fetchall())
    out["om_meta"] = set(con.execute("SELECT key, value FROM om_internal.om_meta").fetchall())
    return out


def catalog_difference(got: dict[str, set[tuple]], want: dict[str, set[tuple]]) -> dict[str, dict[str, list]]:
    """Per catalog function, the rows only one side has (empty when the two schemas are equal)."""
    return {f: {"only in got": sorted(got[f] - want[f], key=repr), "only in want": sorted(want[f] - got[f], key=repr)}
            for f in want if got[f] != want[f]}


def by_migrations() -> duckdb.DuckDBPyConnection:
    """A new database built the old way: every migration from 001, then the views and macros."""
    con = duckdb.connect(":memory:")
    dbmod.apply_migrations(con)
    dbmod.ensure_views(con)
    return con


def test_the_snapshot_equals_every_migration_applied(tmp_path):
    history = by_migrations()
    want = catalog(history)
    history.close()
    # the comparison sees every table of the snapshot (and the bookkeeping's two), view and macro
    views = "\n".join(script for _, script in view_scripts())
    assert len(want["duckdb_tables"]) == schema_snapshot().count("CREATE TABLE ") + len(BOOKKEEPING)
    assert len(want["duckdb_views"]) == views.count("CREATE OR REPLACE VIEW ") > 20
    assert len(want["duckdb_functions"]) == views.count("CREATE OR REPLACE MACRO ") > 20
    assert want["duckdb_constraints"] and want["duckdb_sequences"]
    assert want["schema_migrations"] == {(v, name) for v, name, _ in migrations()}

    in_place = duckdb.connect(":memory:")  # the snapshot itself (what the template is made of)
    dbmod.build_schema(in_place)
    memory = MemoryDatabase()  # a replay's database: the template copied into memory
    dbmod.connect(tmp_path / "om.duckdb").close()  # a new file: a copy of the template file
    new_file = duckdb.connect(str(tmp_path / "om.duckdb"), read_only=True)
    try:
        for built in (in_place, memory.con, new_file):
            assert catalog_difference(catalog(built), want) == {}
    finally:
        in_place.close()
        memory.close()
        new_file.close()


# Changes made in the snapshot only, and the catalog function that must then tell the two apart.
SNAPSHOT_ONLY_CHANGES = {
    "a default": ("status       VARCHAR NOT NULL DEFAULT 'running'", "status       VARCHAR NOT NULL DEFAULT 'queued'",
                  "duckdb_columns"),
    "a not-null": ("command      VARCHAR NOT NULL,", "command      VARCHAR,", "duckdb_constraints"),
    "a primary key": ("run_id       VARCHAR PRIMARY KEY,", "run_id       VARCHAR,", "duckdb_constraints"),
    "a type": ("pid          INTEGER,", "pid          BIGINT,", "duckdb_columns"),
    "a check": ("pid          INTEGER,", "pid          INTEGER CHECK (pid > 0),", "duckdb_constraints"),
    "a sequence": ("ledger_append_seq START 1;", "ledger_append_seq START 2;", "duckdb_sequences"),
    "an index": ("CREATE TABLE om_internal.session_files", "CREATE INDEX runs_by_host ON om_internal.runs (host);\n"
                 "CREATE TABLE om_internal.session_files", "duckdb_indexes"),
}


@pytest.mark.parametrize("change", sorted(SNAPSHOT_ONLY_CHANGES))
def test_a_change_made_in_the_snapshot_only_is_a_difference(monkeypatch, change):
    old, new, function = SNAPSHOT_ONLY_CHANGES[change]
    text = schema_snapshot()
    assert text.count(old) == 1
    monkeypatch.setattr(dbmod, "schema_snapshot", lambda: text.replace(old, new))
    history = by_migrations()
    changed = duckdb.connect(":memory:")
    dbmod.build_schema(changed)
    try:
        assert function in catalog_difference(catalog(changed), catalog(history))
    finally:
        history.close()
        changed.close()


@pytest.mark.parametrize("version", range(1, 8))
def test_a_file_at_version_n_runs_the_migrations_after_n_and_ends_at_the_snapshot(tmp_path, monkeypatch, version):
    dbmod.connect(tmp_path / "current.duckdb").close()
    old = legacy_copy(tmp_path / "current.duckdb", tmp_path / f"at_{version}.duckdb", through=version)
    ran = []
    apply = dbmod.apply_migrations
    monkeypatch.setattr(dbmod, "apply_migrations", lambda con: ran.extend(apply(con)) or ran)
    dbmod.connect(old).close()
    assert ran == [v for v, _, _ in migrations() if v > version]
    upgraded = duckdb.connect(str(old), read_only=True)
    new = MemoryDatabase()
    try:
        assert catalog_difference(catalog(upgraded), catalog(new.con)) == {}
    finally:
        upgraded.close()
        new.close()


def test_a_new_database_runs_no_migration(tmp_path, monkeypatch):
    def no_migration(con):
        raise AssertionError("a new database is built from the snapshot, not by the migrations")

    dbmod.template_path()  # this process's template is built already (by the snapshot: see above)
    monkeypatch.setattr(dbmod, "apply_migrations", no_migration)
    dbmod.connect(tmp_path / "om.duckdb").close()
    MemoryDatabase().close()
    assert rows(tmp_path / "om.duckdb", "SELECT version FROM om_internal.schema_migrations ORDER BY 1") == [
        (v,) for v, _, _ in migrations()]


def test_memory_databases_are_copies_of_one_template_and_independent():
    first, second = MemoryDatabase(), MemoryDatabase()
    try:
        template = dbmod.template_path()
        first.con.execute("INSERT INTO om_internal.runs (run_id, command) VALUES ('r1', 'test')")
        assert second.con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
        assert rows(template, "SELECT count(*) FROM om_internal.runs") == [(0,)]  # the template stays empty
        assert dbmod.template_path() == template  # built once per process
        assert not template.with_name(template.name + ".wal").exists()
    finally:
        first.close()
        second.close()


def test_a_deleted_template_is_built_again(tmp_path):
    template = dbmod.template_path()
    template.unlink()
    dbmod.connect(tmp_path / "om.duckdb").close()
    assert dbmod.template_path().exists()
    assert rows(tmp_path / "om.duckdb", "SELECT count(*) FROM om_internal.schema_migrations") == [(len(migrations()),)]


def test_without_hard_links_a_new_file_is_built_in_place(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(dbmod.os, "link", no_links)
    folder = tmp_path / "db"
    dbmod.connect(folder / "om.duckdb").close()
    con = duckdb.connect(str(folder / "om.duckdb"), read_only=True)
    history = by_migrations()
    try:
        assert catalog_difference(catalog(con), catalog(history)) == {}
    finally:
        con.close()
        history.close()
    assert sorted(p.name for p in folder.iterdir()) == ["om.duckdb"]  # no copy left beside it


def test_a_file_another_process_created_meanwhile_is_kept(tmp_path, monkeypatch):
    db = tmp_path / "om.duckdb"
    theirs = tmp_path / "other.duckdb"
    with dbmod.writing(theirs) as con:
        con.execute("INSERT INTO om_internal.runs (run_id, command) VALUES ('theirs', 'ingest')")
    link = dbmod.os.link

    def the_other_process_first(src, dst):  # between our copy and our link, theirs appears at the path
        link(theirs, dst)
        raise FileExistsError(17, "File exists", str(dst))

    monkeypatch.setattr(dbmod.os, "link", the_other_process_first)
    with dbmod.writing(db) as con:
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("theirs",)]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".new")]


def test_a_forked_process_builds_its_own_template_and_leaves_its_parents(tmp_path):
    script = tmp_path / "fork.py"
    script.write_text(
        "import os, sys\n"
        "from om_core.store import db\n"
        "parent = db.template_path()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    db.memory_database().close()\n"
        "    print(db.template_path() != parent and db.template_path().exists(), flush=True)\n"
        "    sys.exit(0)  # runs the exit handlers it inherited: the parent's template must survive them\n"
        "os.waitpid(pid, 0)\n"
        "print(parent.exists(), flush=True)\n"
        "db.memory_database().close()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
