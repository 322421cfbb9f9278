"""The catalog (session references, listing, read-only SQL, cut point) and the analyst schema."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from builders import SessionBuilder
from conftest import workspace
from legacy_db import legacy_copy
from om_core.store import catalog
from om_core.store import db as dbmod
from om_core.errors import AmbiguousSession, DatabaseMissing, EntryNotFound, InvalidArgument, OmError, SessionNotFound
from om_core.ingest import ingest

SID_A = "abc11111-0000-4000-8000-000000000001"
SID_B = "abc22222-0000-4000-8000-000000000002"
SID_C = "f0f0f0f0-0000-4000-8000-000000000003"
T0 = 1768485600  # 2026-01-15T14:00:00Z, the builder's start


def q(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def two_branches(session_id: str = SID_A) -> tuple[SessionBuilder, dict[str, str]]:
    """u1 a1 u2 a2, then back to a1: u3 a3. Every message is 400 chars, i.e. 100 tokens by Pi's estimate."""
    b = SessionBuilder(session_id)
    ids = {}
    ids["u1"] = b.user("x" * 400)
    ids["a1"] = b.assistant("y" * 400)
    ids["u2"] = b.user("z" * 400)
    ids["a2"] = b.assistant("w" * 400)
    b.go(ids["a1"])
    ids["u3"] = b.user("v" * 400)
    ids["a3"] = b.assistant("t" * 400)
    return b, ids


@pytest.fixture
def catalog_db(tmp_path, db_path):
    """Three sessions: A (two branches), B (same 3-char prefix as A), C (a compaction in the middle)."""
    a, a_ids = two_branches(SID_A)
    path_a = a.write(tmp_path / "sessions" / "a.jsonl")
    b = SessionBuilder(SID_B)
    b._n = 0x1000  # entry ids distinct from A's (the builder numbers them per session)
    b.user("hello")
    b.assistant("hi")
    path_b = b.write(tmp_path / "sessions" / "b.jsonl")
    c = SessionBuilder(SID_C)
    c._n = 0x2000
    c_ids = {}
    c_ids["u1"] = c.user("x" * 400)
    c_ids["a1"] = c.assistant("y" * 400)
    c_ids["u2"] = c.user("z" * 400)
    c_ids["a2"] = c.assistant("w" * 400)
    c_ids["comp"] = c.compaction("so far", first_kept=c_ids["u2"])
    c_ids["think"] = c.thinking_level("high")
    c_ids["u3"] = c.user("v" * 400)
    c_ids["a3"] = c.assistant("t" * 400)
    path_c = c.write(tmp_path / "sessions" / "c.jsonl")
    report = ingest(workspace(db_path), [tmp_path / "sessions"])
    assert [f.status for f in report.files] == ["new", "new", "new"]
    return {"db": db_path, "a": path_a, "b": path_b, "c": path_c, "a_ids": a_ids, "c_ids": c_ids}


# ------------------------------------------------------------------ session references


def test_resolve_session_by_id_prefix_and_path(catalog_db, tmp_path, monkeypatch):
    with dbmod.reading(catalog_db["db"]) as con:
        assert catalog.resolve_session(con, SID_A) == SID_A
        assert catalog.resolve_session(con, SID_B) == SID_B
        assert catalog.resolve_session(con, "abc1") == SID_A
        assert catalog.resolve_session(con, "abc22222-0000") == SID_B
        assert catalog.resolve_session(con, "f") == SID_C
        assert catalog.resolve_session(con, str(catalog_db["b"])) == SID_B
        monkeypatch.chdir(tmp_path / "sessions")
        assert catalog.resolve_session(con, "c.jsonl") == SID_C
        assert catalog.resolve_session(con, "./a.jsonl") == SID_A
        assert catalog.resolve_session(con, "../sessions/b.jsonl") == SID_B


def test_sql_macros_take_the_session_references_the_commands_take(catalog_db):
    """session_id resolves what resolve_session does (an id, a unique prefix, an ingested file's path)
    once, at the analyst's entry point; the macros then take the id; session_leaf gives its leaf."""
    db = catalog_db["db"]
    for ref in (SID_A, "abc1", "abc11111-0000", str(catalog_db["a"].resolve())):
        with dbmod.reading(db) as con:
            assert catalog.resolve_session(con, ref) == SID_A
        assert q(db, "SELECT session_id(?)", [ref]) == [(SID_A,)], ref
    [(leaf,)] = q(db, "SELECT leaf_id FROM sessions WHERE session_id = ?", [SID_C])
    assert q(db, "SELECT session_leaf('f0')") == [(leaf,)]
    by_ref = q(db, "SELECT item_kind, id FROM ledger_at(session_id('f0'), session_leaf('f0')) ORDER BY ALL")
    assert by_ref == q(db, "SELECT item_kind, id FROM ledger_at(?, ?) ORDER BY ALL", [SID_C, leaf])
    branch = q(db, "SELECT position, entry_id FROM branch_detail(session_id('f0f0'), session_leaf('f0f0'))")
    assert branch and branch == q(db, "SELECT position, entry_id FROM branch_detail(?, ?)", [SID_C, leaf])
    for ref, said in (("abc", "abc matches several sessions"), ("0123", "no ingested session matches 0123"),
                      ("", "empty session reference")):
        with pytest.raises(duckdb.Error, match=said):
            q(db, "SELECT session_id(?)", [ref])


def test_resolve_session_errors(catalog_db, tmp_path):
    with dbmod.reading(catalog_db["db"]) as con:
        with pytest.raises(AmbiguousSession) as exc:
            catalog.resolve_session(con, "abc")
        assert SID_A in str(exc.value) and SID_B in str(exc.value)
        with pytest.raises(SessionNotFound) as exc:
            catalog.resolve_session(con, "0123")
        assert "0123" in str(exc.value)
        stray = tmp_path / "stray.jsonl"
        stray.write_text("{}\n")
        with pytest.raises(SessionNotFound) as exc:
            catalog.resolve_session(con, str(stray))
        assert "stray.jsonl" in str(exc.value)
        with pytest.raises(InvalidArgument):
            catalog.resolve_session(con, "")


def test_list_sessions(catalog_db):
    rows = {s.session_id: s for s in catalog.sessions(workspace(catalog_db["db"]))}
    assert set(rows) == {SID_A, SID_B, SID_C}
    a = rows[SID_A]
    assert (a.file_path, a.version, a.cwd, a.leaf_id) == (
        str(catalog_db["a"].resolve()), 3, "/home/dev/project", catalog_db["a_ids"]["a3"])
    assert (a.entry_count, a.source_count, a.leaf_count, a.tokens_pi) == (6, 6, 2, 600)
    c = rows[SID_C]
    assert (c.entry_count, c.source_count, c.leaf_count, c.tokens_pi) == (8, 6, 1, 600)
    assert (rows[SID_B].entry_count, rows[SID_B].leaf_count) == (2, 1)


# ------------------------------------------------------------------ read-only SQL


def test_run_sql_returns_columns_and_rows(catalog_db):
    (result,) = catalog.run_sql(workspace(catalog_db["db"]), "SELECT session_id, entry_count FROM sessions ORDER BY session_id")
    assert result.columns == ["session_id", "entry_count"]
    assert result.rows == [[SID_A, 6], [SID_B, 2], [SID_C, 8]]


@pytest.mark.parametrize("statement", [
    "INSERT INTO sessions (session_id, file_path, version, entry_count, source_count, leaf_count, header) "
    "VALUES ('x', 'y', 3, 0, 0, 0, '{}')",
    "DELETE FROM entries",
    "CREATE TABLE scratch (a INTEGER)",
])
def test_run_sql_is_read_only(catalog_db, statement):
    before = q(catalog_db["db"], "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM entries)")
    with pytest.raises(OmError) as exc:
        catalog.run_sql(workspace(catalog_db["db"]), statement)
    assert "read-only" in str(exc.value).lower() or "read only" in str(exc.value).lower()
    assert q(catalog_db["db"], "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM entries)") == before
    assert q(catalog_db["db"], "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'scratch'") == [(0,)]


def _refused(db: Path, sql: str, **kwargs) -> str:
    with pytest.raises(InvalidArgument) as exc:
        catalog.run_sql(workspace(db), sql, **kwargs)
    message = str(exc.value)
    assert "\n" not in message and "read-only" in message
    return message


@pytest.mark.parametrize("allow_files", [False, True])
def test_run_sql_writes_no_file(catalog_db, tmp_path, allow_files):
    target = tmp_path / "written"
    for sql, reason in (
        (f"COPY (SELECT * FROM sessions) TO '{target}.csv'", "COPY"),
        (f"COPY sessions TO '{target}.parquet' (FORMAT parquet)", "COPY"),
        (f"EXPORT DATABASE '{target}'", "EXPORT DATABASE"),
        (f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}.csv'", "COPY"),  # ANALYZE runs the statement
        (f"EXPLAIN (ANALYZE, FORMAT json) COPY (SELECT 1) TO '{target}.csv'", "COPY"),
    ):
        assert reason in _refused(catalog_db["db"], sql, allow_files=allow_files)
    assert not list(tmp_path.glob("written*"))


@pytest.mark.parametrize("allow_files", [False, True])
def test_run_sql_attaches_nothing_for_writing(catalog_db, tmp_path, allow_files):
    other = tmp_path / "other.duckdb"
    duckdb.connect(str(other)).close()
    fresh = tmp_path / "fresh.duckdb"
    for sql in (f"ATTACH '{other}' AS o (READ_WRITE); CREATE TABLE o.stolen AS SELECT * FROM sessions",
                f"ATTACH '{fresh}' AS f", f"ATTACH '{other}' AS o (READ_ONLY)", "DETACH o"):
        assert "ATTACH" in _refused(catalog_db["db"], sql, allow_files=allow_files) or "DETACH" in sql
    assert q(other, "SELECT count(*) FROM duckdb_tables()") == [(0,)]
    assert not fresh.exists()


@pytest.mark.parametrize("sql", ["INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL json", "LOAD json"])
def test_run_sql_installs_and_loads_no_extension(catalog_db, sql):
    assert "extensions" in _refused(catalog_db["db"], sql, allow_files=True)


@pytest.mark.parametrize("sql", ["SET threads = 1", "RESET threads", "SET enable_external_access = true",
                                 "SET lock_configuration = false", "USE memory", "PRAGMA enable_profiling",
                                 "SET VARIABLE x = 1", "BEGIN TRANSACTION",
                                 "CREATE TEMP TABLE t AS SELECT 1", "CREATE SECRET (TYPE s3, KEY_ID 'a', SECRET 'b')"])
def test_run_sql_changes_no_configuration(catalog_db, sql):
    _refused(catalog_db["db"], sql)


def test_run_sql_settings_that_slip_past_are_locked(catalog_db, tmp_path):
    """What the statement check allows still runs on a locked connection: settings cannot change, even
    through table functions."""
    for sql in ("SELECT * FROM enable_profiling(save_location := '%s')" % (tmp_path / "p.json"),
                "CALL enable_logging(storage := 'file', storage_path := '%s')" % (tmp_path / "logs")):
        with pytest.raises(OmError) as exc:
            catalog.run_sql(workspace(catalog_db["db"]), sql, allow_files=True)
        assert "locked" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "logs").exists()


def test_run_sql_reads_files_only_with_allow_files(catalog_db, tmp_path):
    secret = tmp_path / "secret.csv"
    secret.write_text("hunter2")
    for sql in (f"SELECT content FROM read_text('{secret}')", f"SELECT * FROM read_csv('{secret}')",
                f"SELECT * FROM '{secret}'", f"SELECT * FROM glob('{tmp_path}/*')",
                "SELECT * FROM read_text('/etc/hostname')"):
        with pytest.raises(OmError) as exc:
            catalog.run_sql(workspace(catalog_db["db"]), sql)
        assert "--allow-files" in str(exc.value) and "\n" not in str(exc.value)
        assert "hunter2" not in str(exc.value)
    (result,) = catalog.run_sql(workspace(catalog_db["db"]), f"SELECT content FROM read_text('{secret}')", allow_files=True)
    assert result.rows == [["hunter2"]]
    with pytest.raises(OmError):  # files, not the network
        catalog.run_sql(workspace(catalog_db["db"]), "SELECT * FROM read_text('https://example.com/x')", allow_files=True)


def test_run_sql_queries_that_run(catalog_db):
    results = catalog.run_sql(workspace(catalog_db["db"]), "SELECT count(*) AS n FROM sessions; "
                              "EXPLAIN SELECT 1; PIVOT (SELECT 1 AS a, 2 AS b) ON a; DESCRIBE sessions; "
                              "SHOW TABLES; CALL pragma_version(); SUMMARIZE SELECT 1 AS x")
    assert [r.columns[0] for r in results][:1] == ["n"] and results[0].rows == [[3]]
    assert len(results) == 7 and all(r.rows for r in results)
    assert results[2].rows == [[2, 1]]


def test_run_sql_checks_every_statement_before_running_any(catalog_db):
    message = _refused(catalog_db["db"], "SELECT 1; SELECT 2; COPY sessions TO '/tmp/never.csv'")
    assert "statement 3" in message


def test_run_sql_values_for_printing(catalog_db):
    (result,) = catalog.run_sql(workspace(catalog_db["db"]), "SELECT '\\xAA\\x00'::BLOB AS b, [1, 2] AS l, "
                                "{'k': 'v'} AS s, NULL AS n, true AS t, DATE '2026-01-02' AS d")
    assert result.text_rows() == [["aa00", "[1, 2]", '{"k": "v"}', "", "true", "2026-01-02"]]
    assert result.json_rows() == [{"b": "aa00", "l": [1, 2], "s": {"k": "v"}, "n": None, "t": True,
                                   "d": "2026-01-02"}]


def test_run_sql_bad_query_is_a_clear_error(catalog_db):
    with pytest.raises(OmError) as exc:
        catalog.run_sql(workspace(catalog_db["db"]), "SELECT nope FROM sessions")
    assert "nope" in str(exc.value)


def test_missing_database(tmp_path):
    missing = tmp_path / "none.duckdb"
    with pytest.raises(DatabaseMissing) as exc:
        catalog.run_sql(workspace(missing), "SELECT 1")
    assert str(missing) in str(exc.value)
    with pytest.raises(DatabaseMissing):
        catalog.sessions(workspace(missing))
    with pytest.raises(DatabaseMissing):
        catalog.cut_point(workspace(missing), SID_A)
    assert not missing.exists()


# ------------------------------------------------------------------ cut point


def _cut(cp) -> dict:
    return {k: v for k, v in cp.model_dump().items() if k not in ("tokensBefore", "cutPointRules")}


@pytest.mark.parametrize("rules", ["pi-1.6", "legacy"])
def test_cut_point_at_current_leaf(catalog_db, rules):
    db, ids = catalog_db["db"], catalog_db["a_ids"]
    # branch of a3: u1 a1 u3 a3 (100 tokens each)
    cp = catalog.cut_point(workspace(db), SID_A, keep_recent_tokens=150, rules=rules)
    assert _cut(cp) == {"firstKeptEntryId": ids["u3"], "firstKeptPosition": 2, "turnStartPosition": -1,
                        "isSplitTurn": False}
    assert cp.cutPointRules == rules and cp.tokensBefore == 120  # a3's usage (totalTokens 120), nothing after it
    cp = catalog.cut_point(workspace(db), "abc1", keep_recent_tokens=50, rules=rules)
    assert _cut(cp) == {"firstKeptEntryId": ids["a3"], "firstKeptPosition": 3, "turnStartPosition": 2,
                        "isSplitTurn": True}
    # the budget is never reached: the first cut point; Pi 1.6 then has nothing to summarize
    if rules == "legacy":
        cp = catalog.cut_point(workspace(db), str(catalog_db["a"]), rules=rules)
        assert _cut(cp) == {"firstKeptEntryId": ids["u1"], "firstKeptPosition": 0, "turnStartPosition": -1,
                            "isSplitTurn": False}
    else:
        with pytest.raises(catalog.PiDeclines, match="nothing to summarize") as declined:
            catalog.cut_point(workspace(db), str(catalog_db["a"]), rules=rules)
        assert declined.value.tip == ids["a3"]


def test_cut_point_at_other_leaf_and_interior_entry(catalog_db):
    db, ids = catalog_db["db"], catalog_db["a_ids"]
    cp = catalog.cut_point(workspace(db), SID_A, leaf=ids["a2"], keep_recent_tokens=150)
    assert (cp.firstKeptEntryId, cp.firstKeptPosition, cp.turnStartPosition, cp.isSplitTurn) == (ids["u2"], 2, -1, False)
    cp = catalog.cut_point(workspace(db), SID_A, leaf=ids["a1"], keep_recent_tokens=50)
    assert (cp.firstKeptEntryId, cp.firstKeptPosition, cp.turnStartPosition, cp.isSplitTurn) == (ids["a1"], 1, 0, True)
    with pytest.raises(EntryNotFound):
        catalog.cut_point(workspace(db), SID_A, leaf="not-an-entry")
    with pytest.raises(EntryNotFound):
        catalog.cut_point(workspace(db), SID_A, leaf=catalog_db["c_ids"]["u1"])  # an entry of another session
    with pytest.raises(InvalidArgument):
        catalog.cut_point(workspace(db), SID_A, keep_recent_tokens=-1)


def test_cut_point_after_a_compaction(catalog_db):
    db, ids = catalog_db["db"], catalog_db["c_ids"]
    # branch: u1 a1 u2 a2 comp think u3 a3; the boundary starts after the compaction
    cp = catalog.cut_point(workspace(db), SID_C, keep_recent_tokens=1_000_000, rules="legacy")
    # first cut point after the compaction is u3 (6); backward absorption takes the thinking change (5)
    assert _cut(cp) == {"firstKeptEntryId": ids["think"], "firstKeptPosition": 5, "turnStartPosition": -1,
                        "isSplitTurn": False}
    # Pi 1.6 cuts the projection [comp, u2 a2 (kept), think u3 a3]: 100 tokens each (the thinking change
    # none); a budget of 250 is reached at a2 (3) -> cut a2, a split turn from u2 (2)
    cp = catalog.cut_point(workspace(db), SID_C, keep_recent_tokens=250)
    assert _cut(cp) == {"firstKeptEntryId": ids["a2"], "firstKeptPosition": 3, "turnStartPosition": 2,
                        "isSplitTurn": True}
    # a3's usage 120 comes after the compaction: 120, with nothing after it
    assert cp.tokensBefore == 120
    with pytest.raises(catalog.PiDeclines, match="nothing to summarize"):  # the budget is never reached
        catalog.cut_point(workspace(db), SID_C, keep_recent_tokens=1_000_000)
    with pytest.raises(OmError) as exc:
        catalog.cut_point(workspace(db), SID_C, leaf=ids["comp"])
    assert "compact" in str(exc.value)


# ------------------------------------------------------------------ analyst schema


REQUIRED_COLUMNS = {
    "sessions": {"session_id", "file_path", "version", "cwd", "leaf_id", "entry_count"},
    "entries": {"session_id", "entry_id", "parent_id", "line_no", "entry_type", "role", "ts", "is_source",
                "tokens_pi", "tokens", "first_kept_entry_id", "raw"},
    "branch_entries": {"session_id", "leaf_id", "position", "entry_id"},
    "quarantine": {"file_path", "line_no", "reason", "raw"},
}


def test_analyst_tables_have_the_documented_columns(catalog_db):
    for table, wanted in REQUIRED_COLUMNS.items():
        cols = {r[0] for r in q(catalog_db["db"], "SELECT column_name FROM information_schema.columns "
                                                  "WHERE table_name = ?", [table])}
        assert wanted <= cols, (table, wanted - cols)
    types = dict(q(catalog_db["db"], "SELECT column_name, data_type FROM information_schema.columns "
                                     "WHERE table_name = 'entries'"))
    assert types["line_no"] in ("INTEGER", "BIGINT")
    assert types["is_source"] == "BOOLEAN"
    assert types["ts"].startswith("TIMESTAMP")


def test_branch_entries_one_row_per_entry_per_leaf_path(catalog_db):
    ids = catalog_db["a_ids"]
    got = q(catalog_db["db"], "SELECT leaf_id, position, entry_id FROM branch_entries WHERE session_id = ? "
                              "ORDER BY leaf_id, position", [SID_A])
    expected = [(ids["a2"], p, ids[k]) for p, k in enumerate(["u1", "a1", "u2", "a2"])]
    expected += [(ids["a3"], p, ids[k]) for p, k in enumerate(["u1", "a1", "u3", "a3"])]
    assert got == sorted(expected)


def test_branch_macro_for_interior_entries(catalog_db):
    db, ids = catalog_db["db"], catalog_db["a_ids"]

    def branch(tip):
        return q(db, "SELECT position, entry_id FROM branch(?, ?) ORDER BY position", [SID_A, tip])

    assert branch(ids["a1"]) == [(0, ids["u1"]), (1, ids["a1"])]
    assert branch(ids["u1"]) == [(0, ids["u1"])]
    assert branch(ids["u3"]) == [(0, ids["u1"]), (1, ids["a1"]), (2, ids["u3"])]
    assert branch(ids["a2"]) == [(0, ids["u1"]), (1, ids["a1"]), (2, ids["u2"]), (3, ids["a2"])]
    assert branch("no-such-entry") == []
    # a session's tip does not leak into another session
    assert q(db, "SELECT count(*) FROM branch(?, ?)", [SID_B, ids["a1"]]) == [(0,)]


def test_entry_columns_by_type(tmp_path, db_path):
    b = SessionBuilder(SID_A)
    b.system("You are Pi.")
    b.model_change()
    u1 = b.user("hello world")  # 11 chars -> 3 tokens
    b.assistant("ok", tool_calls=[("c1", "read", {"path": "a.py"})])
    b.tool_result("c1", "read", "print(1)")
    b.bash("ls", "a.py")
    b.custom_message("note", "abcd")
    b.custom("ext.state", {"k": 1})
    b.branch_summary("abandoned path")
    comp = b.compaction("summary", first_kept=u1)
    b.label(u1, "start")
    b.write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [tmp_path / "s.jsonl"])
    got = q(db_path, "SELECT entry_type, role, is_source, tokens_pi, tokens IS NOT NULL, first_kept_entry_id, "
                     "custom_type, CAST(epoch(ts) AS BIGINT) FROM entries ORDER BY line_no")
    assert got == [
        ("message", "system", False, None, False, None, None, T0 + 60),
        ("model_change", None, False, None, False, None, None, T0 + 120),
        ("message", "user", True, 3, True, None, None, T0 + 180),
        ("message", "assistant", True, 6, True, None, None, T0 + 240),  # "ok" + "read" + {"path":"a.py"}: 21 chars
        ("message", "toolResult", True, 2, True, None, None, T0 + 300),
        ("message", "bashExecution", True, 2, True, None, None, T0 + 360),
        ("custom_message", None, True, 1, True, None, "note", T0 + 420),
        ("custom", None, False, None, False, None, "ext.state", T0 + 480),
        ("branch_summary", None, True, 4, True, None, None, T0 + 540),
        ("compaction", None, False, None, False, u1, None, T0 + 600),
        ("label", None, False, None, False, None, None, T0 + 660),
    ]
    assert q(db_path, "SELECT source_count, leaf_id FROM sessions") == [(6, b.leaf)]
    assert q(db_path, "SELECT count(*) FROM entries WHERE entry_id = ? AND entry_type = 'compaction'", [comp]) == [(1,)]


def test_entry_ids_repeat_across_sessions(tmp_path, db_path):
    """Entry ids are unique only within a session: two sessions with the same ids stay apart."""
    first, ids = two_branches(SID_A)
    second = SessionBuilder(SID_B)
    second.user("q" * 40)
    second.assistant("r" * 40)
    assert second.entries[0]["id"] == ids["u1"]
    first.write(tmp_path / "a.jsonl")
    second.write(tmp_path / "b.jsonl")
    ingest(workspace(db_path), [tmp_path])
    assert q(db_path, "SELECT session_id, count(*) FROM entries GROUP BY 1 ORDER BY 1") == [(SID_A, 6), (SID_B, 2)]
    assert q(db_path, "SELECT position, entry_id FROM branch(?, ?) ORDER BY 1", [SID_B, ids["a1"]]) == [
        (0, ids["u1"]), (1, ids["a1"])]
    assert q(db_path, "SELECT count(*) FROM branch_detail(?, ?) WHERE tokens_pi = 10", [SID_B, ids["a1"]]) == [(2,)]
    cp = catalog.cut_point(workspace(db_path), SID_B, keep_recent_tokens=5)
    assert (cp.firstKeptEntryId, cp.firstKeptPosition, cp.turnStartPosition, cp.isSplitTurn) == (ids["a1"], 1, 0, True)


def test_entry_tree_one_row_per_entry(catalog_db):
    assert q(catalog_db["db"], "SELECT count(*) FROM entry_tree") == q(catalog_db["db"], "SELECT count(*) FROM entries")
    leaves = q(catalog_db["db"], "SELECT entry_id FROM entry_tree WHERE session_id = ? AND is_leaf ORDER BY 1", [SID_A])
    assert leaves == sorted([(catalog_db["a_ids"]["a2"],), (catalog_db["a_ids"]["a3"],)])


def test_migration_004_derives_the_tree_of_sessions_stored_before_it(catalog_db, tmp_path):
    """A database from before entry_tree (branch_entries was a table): opening it for writing
    applies migration 004, which derives every stored session's tree in the same transaction."""
    before = q(catalog_db["db"], "SELECT * FROM entry_tree ORDER BY ALL")
    paths = q(catalog_db["db"], "SELECT * FROM branch_entries ORDER BY ALL")
    db = legacy_copy(catalog_db["db"], tmp_path / "at_003.duckdb", through=3)  # empty branch_entries table
    dbmod.connect(db, read_only=True).close()  # a reader upgrades an outdated file first
    assert q(db, "SELECT * FROM entry_tree ORDER BY ALL") == before
    assert q(db, "SELECT * FROM branch_entries ORDER BY ALL") == paths
    assert q(db, "SELECT table_type FROM information_schema.tables WHERE table_name = 'branch_entries'") == [("VIEW",)]


def test_migration_007_counts_user_images_in_stored_estimates(tmp_path):
    """Pi 1.6 counts 1200 tokens per image in user messages: a database ingested before it gets its
    tokens_pi (and the session total) recomputed when migration 007 runs."""
    sb = SessionBuilder("7e57da7a-0000-4000-8000-000000000007")
    image = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
    shot = sb.user([{"type": "text", "text": "what is this? "}, image, image])  # 14 chars + 2 images
    plain = sb.user("no image here")
    sb.assistant("a screenshot")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [sb.write(tmp_path / "s.jsonl")])
    # 14 + 2 * 4800 = 9614 chars -> ceil(9614 / 4) = 2404; 13 chars -> 4; "a screenshot" 12 -> 3
    assert q(db, "SELECT entry_id, tokens_pi FROM entries WHERE role = 'user' ORDER BY 1") == [(shot, 2404), (plain, 4)]
    assert q(db, "SELECT tokens_pi FROM sessions") == [(2404 + 4 + 3,)]
    db = legacy_copy(db, tmp_path / "at_006.duckdb", through=6)
    con = duckdb.connect(str(db))  # as an earlier om stored it: images counted 0 (14 chars -> 4)
    con.execute("UPDATE entries SET tokens_pi = 4 WHERE entry_id = ?", [shot])
    con.execute("UPDATE sessions SET tokens_pi = 11")
    con.close()
    dbmod.connect(db, read_only=True).close()
    assert q(db, "SELECT entry_id, tokens_pi FROM entries WHERE role = 'user' ORDER BY 1") == [(shot, 2404), (plain, 4)]
    assert q(db, "SELECT tokens_pi FROM sessions") == [(2411,)]
    assert q(db, "SELECT count(*) FROM om_internal.schema_migrations WHERE version = 7") == [(1,)]


# ------------------------------------------------------------------ the documented schema and entry texts


SCHEMA_PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "schema.md"


def _readme_rows(header: str) -> list[list[str]]:
    """The cells of the table on the documentation's analyst schema page (generated from the catalog:
    docs_gen) whose header row starts with ``header``."""
    lines = SCHEMA_PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def _listed_columns(cell: str) -> list[str]:
    """The backticked names of a cell before its description (after the first ': ' outside parentheses);
    what a parenthesis says about a column is not a column."""
    import re

    plain = re.sub(r"\([^()]*\)", "", cell)
    return re.findall(r"`(\w+)`", plain.split(": ", 1)[0])


def test_the_readme_lists_every_view_macro_and_column_of_the_schema(tmp_path, db_path):
    import re

    b = SessionBuilder(SID_A)
    b.user("hello")
    ingest(workspace(db_path), [b.write(tmp_path / "s.jsonl")])
    views = {name: _listed_columns(columns) for name, columns in
             ((re.fullmatch(r"`(\w+)`", row[0]).group(1), row[1]) for row in _readme_rows("view"))}
    catalog_views = {}
    for name, column in q(db_path, "SELECT table_name, column_name FROM information_schema.columns "
                                   "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"):
        catalog_views.setdefault(name, []).append(column)
    assert set(views) == set(catalog_views), (set(views) ^ set(catalog_views))
    for name, columns in catalog_views.items():
        assert views[name] == columns, (name, views[name], columns)  # every column, in the catalog's order
    macros = {}
    for row in _readme_rows("macro"):
        name, params = re.fullmatch(r"`(\w+)\(([\w, ]*)\)`", row[0]).groups()
        macros[name] = ([p.strip() for p in params.split(",")], _listed_columns(row[1]))
    catalog_macros = q(db_path, "SELECT function_name, function_type, parameters FROM duckdb_functions() "
                                "WHERE schema_name = 'main' AND NOT internal AND function_type IN ('macro', 'table_macro')")
    assert set(macros) == {name for name, _, _ in catalog_macros}, (set(macros) ^ {n for n, _, _ in catalog_macros})
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        for name, kind, params in catalog_macros:
            listed_params, listed_columns = macros[name]
            assert listed_params == [p.removeprefix("p_") for p in params], name
            columns = [] if kind == "macro" else [r[0] for r in con.execute(
                f"DESCRIBE SELECT * FROM {name}({', '.join('NULL' for _ in params)})").fetchall()]
            assert listed_columns == columns, (name, listed_columns, columns)
    finally:
        con.close()


def _every_kind_of_entry() -> SessionBuilder:
    b = SessionBuilder(SID_A)
    b.user("plain text with a tab\tand ünïcode ✓")
    b.user([{"type": "text", "text": "two"}, {"type": "image", "data": "x", "mimeType": "image/png"},
            {"type": "text", "text": "blocks"}, "not a block", {"type": "image", "data": "y"}])
    b.assistant("the answer", thinking="first I think", tool_calls=[
        ("call_1", "read", {"path": "src/é.py", "limit": 2.50, "flags": [True, None], "nested": {"a": 1e5}})])
    b.assistant(None, thinking="")  # an empty thinking block says nothing
    b.assistant(None, stop_reason="error", error="overloaded")  # no reply at all
    b.tool_result("call_1", "read", "contents\nof the file", images=1)
    b.tool_result("call_2", "bash", "exit 1", is_error=True)
    b.bash("ls -la", "total 0")
    b.bash("false", "", exit_code=1)
    b.message({"role": "bashExecution", "command": "sleep 9", "output": "", "exitCode": None, "cancelled": True})
    b.custom_message("note", "a string note")
    b.custom_message("note", [{"type": "text", "text": "a block note"}])
    b.branch_summary("we tried another way first")
    b.message({"role": "user", "content": "content as a plain string"})
    return b


def test_entry_texts_is_each_entry_as_recall_prints_it(tmp_path, db_path):
    from conftest import EXAMPLES
    from om_core.pi.session import loads_line
    from om_core.pi.source_text import entry_text  # what om recall prints for a source entry

    paths = [_every_kind_of_entry().write(tmp_path / "kinds.jsonl"), *sorted(EXAMPLES.glob("*.jsonl"))]
    ingest(workspace(db_path), paths)
    rows = q(db_path, "SELECT e.entry_id, e.entry_type, e.raw, t.text FROM entries e "
                      "LEFT JOIN entry_texts t USING (session_id, entry_id) WHERE e.is_source")
    assert len(rows) > 600
    for entry_id, entry_type, raw, text in rows:
        assert text == entry_text(entry_type, loads_line(raw)), entry_id
    texts = dict(q(db_path, "SELECT entry_id, text FROM entry_texts WHERE session_id = ?", [SID_A]))
    assert texts["00000003"] == ('(thinking) first I think\nthe answer\n(tool call call_1) read({"path":"src/é.py",'
                                 '"limit":2.5,"flags":[true,null],"nested":{"a":100000.0}})')
    assert texts["00000005"] == "(no reply: error: overloaded)"
    assert texts["00000007"] == "(bash error) exit 1" and texts["0000000a"] == "$ sleep 9\n\n(command cancelled)"
    assert q(db_path, "SELECT count(*) FROM entry_texts WHERE NOT EXISTS (SELECT 1 FROM entries e WHERE e.is_source "
                      "AND e.session_id = entry_texts.session_id AND e.entry_id = entry_texts.entry_id)") == [(0,)]


def test_om_sql_answers_tables_and_schema(tmp_path, db_path):
    b = SessionBuilder(SID_A)
    b.user("hello")
    ingest(workspace(db_path), [b.write(tmp_path / "s.jsonl")])
    [tables] = catalog.run_sql(workspace(db_path), ".tables")
    listed = dict(tables.rows)
    assert listed["entry_texts"] == "view" and listed["fold"] == "table macro" and listed["gap_class"] == "macro"
    [schema] = catalog.run_sql(workspace(db_path), ".schema entry_texts;")
    assert [r[3] for r in schema.rows] == ["session_id", "entry_id", "line_no", "entry_type", "role", "ts", "text"]
    [schema] = catalog.run_sql(workspace(db_path), ".schema fold")
    assert [r[3] for r in schema.rows] == ["p_session", "p_tip", "p_mode", "p_obs_through", "p_refl_through",
                                           "p_drop_through"]
    [everything] = catalog.run_sql(workspace(db_path), ".schema")
    assert {r[0] for r in everything.rows} == set(listed)
    with pytest.raises(OmError, match="no view or macro named 'nope'"):
        catalog.run_sql(workspace(db_path), ".schema nope")
    with pytest.raises(InvalidArgument, match=r"\.tables or \.schema"):
        catalog.run_sql(workspace(db_path), ".dump")
