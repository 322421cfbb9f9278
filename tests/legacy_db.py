"""Databases as earlier versions of om wrote them, for migration tests.

``legacy_copy`` writes a database at an earlier migration (before 008: every table in ``main``
under its name of the time, the bookkeeping in ``main`` too) holding the rows of a database built by
today's code, so a test can open it with today's code and watch the migrations bring it back.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from om_core.store.sqlfiles import migrations

# Migration 008's renames: the name a table had before it -> its name in om_internal.
RENAMED_BY_008 = {
    "ledger_records": "ledger", "ledger_observations": "observations", "ledger_reflections": "reflections",
    "ledger_drops": "drops", "compaction_folds": "compactions", "compaction_fold_items": "compaction_items",
    "stage_runs": "stages", "model_calls": "llm_calls", "model_call_texts": "llm_call_texts",
}

# The bookkeeping as om created it in main before migration 008.
_BOOKKEEPING_BEFORE_008 = """
CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL,
                                applied_at TIMESTAMPTZ NOT NULL DEFAULT current_timestamp);
CREATE TABLE om_meta (key VARCHAR PRIMARY KEY, value VARCHAR NOT NULL);
"""


def _columns(con: duckdb.DuckDBPyConnection, database: str, schema: str, table: str) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = ? AND schema_name = ? AND table_name = ? "
        "ORDER BY column_index", [database, schema, table]).fetchall()]


def legacy_copy(current: Path, out: Path, through: int) -> Path:
    """``current``'s rows in a new database at migration ``through`` (1-7), as om then stored them.

    The tables are created by the migrations 001-``through`` themselves; each gets the rows of its
    table in ``current`` (the columns it had then), and the record-order sequence continues where
    ``current``'s stood. Data-deriving steps do not run: the rows come derived already."""
    assert through < 8
    con = duckdb.connect(str(out))
    try:
        con.execute(_BOOKKEEPING_BEFORE_008)
        for version, name, script in migrations():
            if version <= through:
                con.execute(script)
                con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, name])
        con.execute("ATTACH ? AS cur (READ_ONLY)", [str(current)])
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
            "AND table_name NOT IN ('schema_migrations', 'om_meta')").fetchall()]
        for table in tables:
            source = RENAMED_BY_008.get(table, table)
            if not _columns(con, "cur", "om_internal", source):
                continue  # a table a later migration dropped (branch_entries)
            columns = ", ".join(f'"{c}"' for c in _columns(con, current_database(con), "main", table))
            con.execute(f"INSERT INTO main.{table} ({columns}) SELECT {columns} FROM cur.om_internal.{source}")
        taken = con.execute(
            "SELECT greatest((SELECT coalesce(max(last_value), 0) FROM duckdb_sequences() WHERE database_name = 'cur' "
            "AND sequence_name = 'ledger_append_seq'), (SELECT coalesce(max(append_seq), 0) FROM cur.om_internal.ledger), "
            "(SELECT coalesce(max(append_seq), 0) FROM cur.om_internal.compactions))").fetchone()[0]
        if taken and through >= 2:
            con.execute("SELECT max(nextval('ledger_append_seq')) FROM range(?)", [taken]).fetchall()
        con.execute("DETACH cur")
    finally:
        con.close()
    return out


def current_database(con: duckdb.DuckDBPyConnection) -> str:
    return con.execute("SELECT current_database()").fetchone()[0]
