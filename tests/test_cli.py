"""The `om` command line: ingest, sessions, sql, cutpoint; --db / OM_DB; clear errors without tracebacks."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
import om_cli
from conftest import shared_session, workspace
from om_core.store import db as dbmod
from flows.cli.main import app
from flows.run_result import RunReport
from om_core.errors import DatabaseBusy, InvalidArgument
from om_core.ingest import ingest

SID_A = "abc11111-0000-4000-8000-000000000001"
SID_B = "abc22222-0000-4000-8000-000000000002"
LARGE_ID = "d703a1a9-1b7b-4fb1-b512-c9738b1fe617"
BEFORE_ID = "ffae836b-9420-4060-ac13-7745215f90ff"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No OM_DB from the caller's shell, and a cwd where a default ./om.duckdb would be harmless."""
    monkeypatch.delenv("OM_DB", raising=False)
    monkeypatch.chdir(tmp_path)


def invoke(args: list[str], env: dict[str, str] | None = None):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200", **(env or {})})


def om_env(env: dict[str, str] | None = None) -> dict[str, str]:
    full_env = {k: v for k, v in os.environ.items() if k != "OM_DB"}
    full_env.update({"COLUMNS": "200", **(env or {})})
    return full_env


def run_om(args: list[str], cwd: Path, env: dict[str, str] | None = None, stdin: str = ""):
    """`om ...` through the console entry point, so main()'s error handler is what the user sees
    (in this process: tests/om_cli.py)."""
    return om_cli.run_om(args, cwd, om_env(env), stdin=stdin)


def run_om_process(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    """`python -m flows.cli ...` in a fresh process: where the process itself is the point (the
    module's entry point, a terminal's width)."""
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=om_env(env),
                          capture_output=True, text=True, timeout=timeout)


def q(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def cut_session(session_id: str) -> tuple[SessionBuilder, dict[str, str]]:
    """u1 a1 u2 a2, 100 tokens each by Pi's estimate."""
    b = SessionBuilder(session_id)
    ids = {"u1": b.user("x" * 400), "a1": b.assistant("y" * 400), "u2": b.user("z" * 400),
           "a2": b.assistant("w" * 400)}
    return b, ids


@pytest.fixture
def two_sessions(tmp_path, db_path):
    a, ids = cut_session(SID_A)
    path_a = a.write(tmp_path / "in" / "a.jsonl")
    b = SessionBuilder(SID_B)
    b._n = 0x1000
    b.user("hello")
    b.assistant("hi")
    path_b = b.write(tmp_path / "in" / "b.jsonl")
    ingest(workspace(db_path), [path_a, path_b])
    return {"db": db_path, "a": path_a, "b": path_b, "ids": ids}


# ------------------------------------------------------------------ ingest


def test_ingest_reports_entries_and_quarantine(tmp_path, db_path):
    b = SessionBuilder(SID_A)
    b.user("hi")
    b.assistant("hello")
    path = b.write(tmp_path / "s.jsonl")
    with open(path, "ab") as f:
        f.write(b"not json\n{\"type\":\"message\",\"id\":\"zz\"")  # a bad line and a truncated tail
    result = invoke(["--db", str(db_path), "ingest", str(path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["entries_added"] == 2
    assert report["lines_quarantined"] == 2
    assert report["by_status"] == {"new": 1}
    assert report["missing_paths"] == []
    assert [f["status"] for f in report["files"]] == ["new"]
    assert q(db_path, "SELECT line_no, reason FROM quarantine ORDER BY 1") == [(4, "invalid_json"),
                                                                                 (5, "truncated_last_line")]

    path2 = SessionBuilder(SID_B)
    path2.user("x")
    p2 = path2.write(tmp_path / "t.jsonl")
    result = invoke(["--db", str(db_path), "ingest", str(p2), str(path)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "1 entries added" in text
    assert "0 line(s) quarantined" in text
    assert "new: 1" in text and "unchanged: 1" in text


def test_ingest_missing_path_exits_non_zero_but_ingests_the_rest(tmp_path, db_path):
    b = SessionBuilder(SID_A)
    b.user("hi")
    path = b.write(tmp_path / "s.jsonl")
    result = run_om(["--db", str(db_path), "ingest", str(path), str(tmp_path / "missing.jsonl")], cwd=tmp_path)
    assert result.returncode != 0
    assert "missing.jsonl" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert q(db_path, "SELECT session_id, entry_count FROM sessions") == [(SID_A, 1)]


def test_the_default_database_is_in_the_user_s_data_directory_and_this_user_s_only(tmp_path, monkeypatch):
    """No ./om.duckdb in the working folder; the default is
    $XDG_DATA_HOME/om/om.duckdb, else ~/.local/share/om/om.duckdb, created 0700/0600 (om live info says
    where it is)."""
    b = SessionBuilder(SID_A)
    b.user("hi")
    path = b.write(tmp_path / "s.jsonl")
    data = tmp_path / "xdg"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    result = run_om(["ingest", str(path)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl", "xdg"]  # nothing in the working folder
    db = data / "om" / "om.duckdb"
    assert q(db, "SELECT session_id FROM sessions") == [(SID_A,)]
    assert stat.S_IMODE((data / "om").stat().st_mode) == 0o700 and stat.S_IMODE(db.stat().st_mode) == 0o600
    info = json.loads(run_om(["live", "info", "--json"], tmp_path).stdout)
    assert info["db"] == str(db) and info["db_source"] == "om's default, in the user's data directory"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert run_om(["ingest", str(path)], tmp_path).returncode == 0
    assert q(tmp_path / "home" / ".local" / "share" / "om" / "om.duckdb", "SELECT session_id FROM sessions") == [
        (SID_A,)]


def test_a_database_created_in_a_git_work_tree_that_does_not_ignore_it_is_warned_about_once(tmp_path):
    """`git add .` would commit whole sessions: the command that creates the database says so, once;
    an ignored database, or one outside a work tree, is not warned about."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    b = SessionBuilder(SID_A)
    b.user("hi")
    path = b.write(tmp_path / "s.jsonl")
    first = run_om_process(["--db", "om.duckdb", "ingest", str(path)], repo)
    assert first.returncode == 0, first.stderr
    assert first.stderr.count("does not ignore it") == 1 and str(repo) in first.stderr
    again = run_om_process(["--db", "om.duckdb", "ingest", str(path)], repo)
    assert "does not ignore it" not in again.stderr
    (repo / ".gitignore").write_text("*.duckdb\n")
    ignored = run_om_process(["--db", "ignored.duckdb", "ingest", str(path)], repo)
    assert ignored.returncode == 0 and "warning" not in ignored.stderr
    outside = run_om_process(["--db", str(tmp_path / "outside.duckdb"), "ingest", str(path)], repo)
    assert outside.returncode == 0 and "warning" not in outside.stderr


# ------------------------------------------------------------------ --db and OM_DB


def test_db_option_and_env_select_the_database(tmp_path):
    db_a, db_b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    a, _ = cut_session(SID_A)
    b, _ = cut_session(SID_B)
    assert invoke(["--db", str(db_a), "ingest", str(a.write(tmp_path / "a.jsonl"))]).exit_code == 0
    assert invoke(["ingest", str(b.write(tmp_path / "b.jsonl"))], env={"OM_DB": str(db_b)}).exit_code == 0
    assert q(db_a, "SELECT session_id FROM sessions") == [(SID_A,)]
    assert q(db_b, "SELECT session_id FROM sessions") == [(SID_B,)]
    assert not (tmp_path / "om.duckdb").exists()

    def listed(args, env=None):
        result = invoke(args, env)
        assert result.exit_code == 0, result.output
        return [s["session_id"] for s in json.loads(result.stdout)]

    assert listed(["--db", str(db_a), "sessions", "--json"]) == [SID_A]
    assert listed(["sessions", "--json"], env={"OM_DB": str(db_b)}) == [SID_B]
    assert listed(["--db", str(db_a), "sessions", "--json"], env={"OM_DB": str(db_b)}) == [SID_A]  # --db wins

    sql = ["sql", "SELECT session_id FROM sessions", "--json"]
    assert json.loads(invoke(sql, env={"OM_DB": str(db_a)}).stdout) == [{"session_id": SID_A}]
    assert json.loads(invoke(["--db", str(db_b), *sql]).stdout) == [{"session_id": SID_B}]


@pytest.mark.parametrize("args", [["sql", "SELECT 1"], ["sessions"], ["cutpoint", "abc"]])
def test_missing_database_is_a_clear_error(tmp_path, args):
    missing = tmp_path / "nowhere.duckdb"
    result = run_om(["--db", str(missing), *args], cwd=tmp_path)
    assert result.returncode != 0
    assert "no database" in result.stderr
    assert "nowhere.duckdb" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not missing.exists()
    if args[0] == "sql":  # the same through OM_DB
        result = run_om(args, cwd=tmp_path, env={"OM_DB": str(missing)})
        assert result.returncode != 0 and "no database" in result.stderr and "Traceback" not in result.stderr
        assert not missing.exists()


# ------------------------------------------------------------------ sessions and sql


def test_sessions_json(two_sessions):
    result = invoke(["--db", str(two_sessions["db"]), "sessions", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["session_id"]: r for r in json.loads(result.stdout)}
    assert set(rows) == {SID_A, SID_B}
    assert rows[SID_A]["file_path"] == str(two_sessions["a"].resolve())
    assert (rows[SID_A]["entry_count"], rows[SID_A]["source_count"], rows[SID_A]["leaf_count"]) == (4, 4, 1)
    assert rows[SID_A]["leaf_id"] == two_sessions["ids"]["a2"]
    assert rows[SID_A]["version"] == 3
    table = invoke(["--db", str(two_sessions["db"]), "sessions"])
    assert table.exit_code == 0 and SID_A in table.stdout and SID_B in table.stdout


def test_sql_json_prints_an_array_of_row_objects(two_sessions):
    result = invoke(["--db", str(two_sessions["db"]), "sql",
                     "SELECT session_id, entry_count, cwd IS NULL AS no_cwd FROM sessions ORDER BY 1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"session_id": SID_A, "entry_count": 4, "no_cwd": False},
        {"session_id": SID_B, "entry_count": 2, "no_cwd": False},
    ]
    empty = invoke(["--db", str(two_sessions["db"]), "sql", "SELECT * FROM sessions WHERE false", "--json"])
    assert empty.exit_code == 0 and json.loads(empty.stdout) == []


def test_sql_csv(two_sessions):
    result = invoke(["--db", str(two_sessions["db"]), "sql",
                     "SELECT session_id, line_no, entry_type FROM entries WHERE session_id = 'abc22222-0000-4000-8000-000000000002' "
                     "ORDER BY line_no", "--csv"])
    assert result.exit_code == 0, result.output
    assert list(csv.reader(io.StringIO(result.stdout))) == [
        ["session_id", "line_no", "entry_type"],
        [SID_B, "2", "message"],
        [SID_B, "3", "message"],
    ]


def test_sql_table_output(two_sessions):
    result = invoke(["--db", str(two_sessions["db"]), "sql", "SELECT count(*) AS n FROM entries"])
    assert result.exit_code == 0, result.output
    assert "n" in result.stdout and "6" in result.stdout


def test_sql_is_read_only(two_sessions, tmp_path):
    db = two_sessions["db"]
    result = run_om(["--db", str(db), "sql", "INSERT INTO runs (run_id, command) VALUES ('x', 'hack')"], cwd=tmp_path)
    assert result.returncode != 0
    assert "read-only" in result.stderr.lower() or "read only" in result.stderr.lower()
    assert "Traceback" not in result.stderr + result.stdout
    assert q(db, "SELECT count(*) FROM runs WHERE run_id = 'x'") == [(0,)]


@pytest.mark.parametrize("statement", [
    "COPY (SELECT * FROM sessions) TO 'out.csv'",
    "EXPORT DATABASE 'dump'",
    "ATTACH 'other.duckdb' AS o (READ_WRITE)",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET threads = 1",
    "SELECT 1; DROP TABLE sessions",
])
def test_sql_refusals_are_one_line(two_sessions, tmp_path, statement):
    result = run_om(["--db", str(two_sessions["db"]), "sql", statement], cwd=tmp_path)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr.startswith("error: om sql is read-only") and result.stderr.count("\n") == 1, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "om.duckdb"]  # nothing written


def test_sql_reads_files_only_with_allow_files(two_sessions, tmp_path):
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    query = "SELECT * FROM read_csv('notes.csv')"
    result = run_om(["--db", str(two_sessions["db"]), "sql", query], cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("error:") and "--allow-files" in result.stderr and result.stderr.count("\n") == 1
    result = run_om(["--db", str(two_sessions["db"]), "sql", "--allow-files", query, "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"a": 1, "b": 2}]


def test_sql_reads_the_query_from_stdin(two_sessions, tmp_path):
    result = run_om(["--db", str(two_sessions["db"]), "sql", "-", "--json"], cwd=tmp_path,
                    stdin="SELECT count(*) AS n\nFROM sessions;\n")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"n": 2}]


def test_sql_several_statements_all_print_or_are_refused(two_sessions):
    db = str(two_sessions["db"])
    result = invoke(["--db", db, "sql", "SELECT 'first' AS one; SELECT 'second' AS two"])
    assert result.exit_code == 0, result.output
    assert "first" in result.stdout and "second" in result.stdout
    assert result.stdout.index("first") < result.stdout.index("second")
    for fmt in ("--json", "--csv"):
        result = invoke(["--db", db, "sql", "SELECT 1; SELECT 2", fmt])
        assert isinstance(result.exception, InvalidArgument) and result.stdout == ""
        assert "one result" in str(result.exception)


def test_sql_blobs_print_as_hex(two_sessions):
    db = str(two_sessions["db"])
    query = "SELECT '\\xDE\\xAD\\x00'::BLOB AS b"
    assert "dead00" in invoke(["--db", db, "sql", query]).stdout
    assert invoke(["--db", db, "sql", query, "--csv"]).stdout == "b\ndead00\n"
    assert json.loads(invoke(["--db", db, "sql", query, "--json"]).stdout) == [{"b": "dead00"}]
    assert "\\x" not in invoke(["--db", db, "sql", query]).stdout


def test_sql_wide_results_stay_readable_on_a_terminal(two_sessions, monkeypatch):
    from rich.console import Console

    from flows.cli import common as cli  # print_rows writes to common.out

    buffer = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=buffer, force_terminal=True, width=60, color_system=None))
    wide = ", ".join(f"'{c * 30}' AS col_{c}" for c in "abcde")
    result = invoke(["--db", str(two_sessions["db"]), "sql", f"SELECT {wide}"])
    assert result.exit_code == 0, result.output
    text = buffer.getvalue()
    for c in "abcde":  # every value whole, every column named, nothing cut to an ellipsis
        assert c * 30 in text and f"col_{c}" in text
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 60


def test_sql_error_is_clear(two_sessions, tmp_path):
    result = run_om(["--db", str(two_sessions["db"]), "sql", "SELECT no_such_column FROM sessions"], cwd=tmp_path)
    assert result.returncode != 0
    assert "no_such_column" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_what_is_not_an_om_database_is_a_clear_error_and_stays_untouched(tmp_path):
    text = tmp_path / "notes.duckdb"
    text.write_text("just text\n")
    foreign = tmp_path / "theirs.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE mydata (x INTEGER)")
    con.close()
    for db, expected in ((text, "cannot open"), (tmp_path, "cannot open"), (foreign, "not an om one")):
        result = run_om(["--db", str(db), "sql", "SELECT 1"], cwd=tmp_path)
        assert result.returncode == 1, result
        assert expected in result.stderr and "Traceback" not in result.stderr + result.stdout
    assert q(foreign, "SELECT table_name FROM duckdb_tables()") == [("mydata",)]  # a reader added nothing


def test_empty_query_and_markup_in_values_and_arguments(two_sessions, tmp_path):
    db = str(two_sessions["db"])
    for empty in ("", " ; "):
        result = run_om(["--db", db, "sql", empty], cwd=tmp_path)
        assert result.returncode == 2 and "empty" in result.stderr and "Traceback" not in result.stderr
    # square brackets are data, not Rich styles, wherever they come from
    result = run_om(["--db", db, "sql", "SELECT '[red]x[/]' AS a, '[bold]' AS b"], cwd=tmp_path)
    assert result.returncode == 0 and "[red]x[/]" in result.stdout and "[bold]" in result.stdout
    result = run_om(["--db", db, "view", "[/bold]"], cwd=tmp_path)
    assert result.returncode == 1 and "[/bold]" in result.stderr and "Traceback" not in result.stderr


def test_piped_tables_and_messages_are_not_cut_at_80_columns(two_sessions, tmp_path):
    result = run_om_process(["--db", str(two_sessions["db"]), "sessions"], cwd=tmp_path, env={"COLUMNS": ""})
    assert SID_A in result.stdout and str(two_sessions["a"]) in result.stdout


def test_output_paths_and_options_that_cannot_work_are_clear_errors(two_sessions, tmp_path):
    db = str(two_sessions["db"])
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    for args in (["report", "--out", str(a_file)], ["export", SID_A, "--out", str(a_dir), "--force"],
                 ["compact", SID_A, "--first-kept", "nosuch", "--gap-safe"],
                 ["run", SID_A, "--model", "offline", "--task-runner", "bogus"]):
        result = run_om(["--db", db, *args], cwd=tmp_path)
        assert result.returncode in (1, 2), (args, result)
        assert "error:" in result.stderr and "Traceback" not in result.stderr + result.stdout, (args, result)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")) == []


def test_nothing_to_ingest_creates_no_database(tmp_path):
    (tmp_path / "empty").mkdir()
    db = tmp_path / "new.duckdb"
    for target, expected in ((tmp_path / "nope.jsonl", "no such file"), (tmp_path / "empty", "no *.jsonl")):
        result = run_om(["--db", str(db), "ingest", str(target)], cwd=tmp_path)
        assert result.returncode == 1 and expected in result.stderr
    assert not db.exists()


def test_cutpoint_budget_defaults_to_the_keep_recent_tokens_setting(two_sessions):
    db, ids = two_sessions["db"], two_sessions["ids"]
    result = invoke(["--db", str(db), "cutpoint", SID_A, "--json"], env={"OM_KEEP_RECENT_TOKENS": "150"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["first_kept_entry_id"] == ids["u2"]


# ------------------------------------------------------------------ cutpoint and session references


def test_cutpoint_json_shape_and_values(two_sessions):
    db, ids = two_sessions["db"], two_sessions["ids"]
    result = invoke(["--db", str(db), "cutpoint", SID_A, "--keep-recent", "50", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"first_kept_entry_id": ids["a2"], "first_kept_position": 3,
                                         "turn_start_position": 2, "is_split_turn": True, "tokens_before": 120,
                                         "cut_point_rules": "pi-1.6"}
    result = invoke(["--db", str(db), "cutpoint", SID_A, "--keep-recent", "150", "--json"])
    assert json.loads(result.stdout) == {"first_kept_entry_id": ids["u2"], "first_kept_position": 2,
                                         "turn_start_position": -1, "is_split_turn": False, "tokens_before": 120,
                                         "cut_point_rules": "pi-1.6"}
    result = invoke(["--db", str(db), "cutpoint", SID_A, "--leaf", ids["a1"], "--keep-recent", "50", "--json"])
    assert json.loads(result.stdout) == {"first_kept_entry_id": ids["a1"], "first_kept_position": 1,
                                         "turn_start_position": 0, "is_split_turn": True, "tokens_before": 120,
                                         "cut_point_rules": "pi-1.6"}
    text = invoke(["--db", str(db), "cutpoint", SID_A, "--keep-recent", "50"])
    assert text.exit_code == 0 and ids["a2"] in text.stdout and "tokensBefore 120" in text.stdout


def test_cutpoint_where_pi_declines_exits_non_zero_with_the_reason(two_sessions, tmp_path):
    db, ids = two_sessions["db"], two_sessions["ids"]
    # the whole branch fits in 20000 tokens: nothing to summarize, Pi 1.6 does not compact
    result = invoke(["--db", str(db), "cutpoint", SID_A, "--json"])
    assert result.exit_code == 1
    body = json.loads(result.stdout)
    assert body["compacts"] is False and "nothing to summarize" in body["reason"]
    assert body["session_id"] == SID_A and body["cut_point_rules"] == "pi-1.6"
    text = run_om(["--db", str(db), "cutpoint", SID_A], cwd=tmp_path)
    assert text.returncode == 1 and "would not compact" in text.stderr and "Traceback" not in text.stderr
    # the earlier Pi compacts there (cutPoints[0]); --rules or OM_CUT_POINT_RULES pick those rules
    legacy = invoke(["--db", str(db), "cutpoint", SID_A, "--rules", "legacy", "--json"])
    assert legacy.exit_code == 0 and json.loads(legacy.stdout)["first_kept_position"] == 0
    env = invoke(["--db", str(db), "cutpoint", SID_A, "--json"], env={"OM_CUT_POINT_RULES": "legacy"})
    assert env.exit_code == 0 and env.stdout == legacy.stdout
    bad = invoke(["--db", str(db), "cutpoint", SID_A, "--rules", "pi-9"])
    assert bad.exit_code != 0 and "cutPointRules" in str(bad.exception)


def test_session_argument_accepts_id_prefix_and_path(two_sessions, tmp_path, monkeypatch):
    db = two_sessions["db"]
    expected = invoke(["--db", str(db), "cutpoint", SID_A, "--keep-recent", "150", "--json"]).stdout
    assert json.loads(expected)["first_kept_position"] == 2
    for ref in ("abc1", "abc11111-0000", str(two_sessions["a"])):
        result = invoke(["--db", str(db), "cutpoint", ref, "--keep-recent", "150", "--json"])
        assert result.exit_code == 0, (ref, result.output)
        assert result.stdout == expected, ref
    monkeypatch.chdir(tmp_path / "in")
    result = invoke(["--db", str(db), "cutpoint", "a.jsonl", "--keep-recent", "150", "--json"])
    assert result.exit_code == 0 and result.stdout == expected


def test_ambiguous_and_unknown_session_are_clear_errors(two_sessions, tmp_path):
    db = two_sessions["db"]
    result = run_om(["--db", str(db), "cutpoint", "abc", "--json"], cwd=tmp_path)
    assert result.returncode != 0
    assert SID_A in result.stderr and SID_B in result.stderr
    assert "several" in result.stderr or "ambiguous" in result.stderr.lower()
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""

    result = run_om(["--db", str(db), "cutpoint", "999"], cwd=tmp_path)
    assert result.returncode != 0
    assert "999" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout

    result = run_om(["--db", str(db), "cutpoint", SID_A, "--leaf", "nope"], cwd=tmp_path)
    assert result.returncode != 0
    assert "nope" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


# ------------------------------------------------------------------ a busy database


HOLDER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
con.execute("SELECT count(*) FROM sessions").fetchall()
print("ready", flush=True)
time.sleep(120)
"""


def test_busy_database_is_a_clear_error(two_sessions, tmp_path):
    db = two_sessions["db"]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        started = time.monotonic()
        with pytest.raises(DatabaseBusy) as exc:
            dbmod.connect(db, read_only=True, busy_seconds=0.3)
        assert time.monotonic() - started < 5
        assert str(db) in str(exc.value)

        result = run_om(["--db", str(db), "sql", "SELECT 1"], cwd=tmp_path)
        assert result.returncode != 0
        message = result.stderr.lower()
        assert "busy" in message or "being written by another process" in message, result.stderr
        assert "Traceback" not in result.stderr + result.stdout
    finally:
        holder.kill()
        holder.wait()
    # released: it works again
    result = run_om(["--db", str(db), "sql", "SELECT count(*) AS n FROM sessions", "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"n": 2}]


# ------------------------------------------------------------------ the real sample sessions


@pytest.fixture(scope="module")
def real_db(tmp_path_factory):
    large = shared_session("large-session.jsonl")
    before = shared_session("before-compaction.jsonl")
    db = tmp_path_factory.mktemp("real_cli") / "om.duckdb"
    report = ingest(workspace(db), [large, before])
    assert [f.status for f in report.files] == ["new", "new"]
    return db, large, before


@pytest.mark.real_sessions
@pytest.mark.parametrize("ref, session_id, first_kept, turn_start", [
    ("d703a1a9", LARGE_ID, 837, 834),
    ("large-session.jsonl", LARGE_ID, 837, 834),
    (BEFORE_ID, BEFORE_ID, 946, 939),
    ("ffae", BEFORE_ID, 946, 939),
])
def test_real_session_cutpoints(real_db, ref, session_id, first_kept, turn_start):
    db, large, _ = real_db
    if ref.endswith(".jsonl"):
        ref = str(large)
    result = invoke(["--db", str(db), "cutpoint", ref, "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    (leaf,) = q(db, "SELECT leaf_id FROM sessions WHERE session_id = ?", [session_id])[0]
    (kept_id, kept_role, kept_line) = q(
        db, "SELECT b.entry_id, e.role, e.line_no FROM branch(?, ?) b JOIN entries e "
            "ON e.session_id = ? AND e.entry_id = b.entry_id WHERE b.position = ?",
        [session_id, leaf, session_id, first_kept])[0]
    assert got == {"first_kept_entry_id": kept_id, "first_kept_position": first_kept, "turn_start_position": turn_start,
                   "is_split_turn": True, "tokens_before": 177657 if session_id == LARGE_ID else 180820,
                   "cut_point_rules": "pi-1.6"}
    assert kept_role == "assistant"
    assert kept_line == first_kept + 2  # a linear v1 file: position p is line p + 2
    (turn_role,) = q(db, "SELECT e.role FROM branch(?, ?) b JOIN entries e ON e.session_id = ? "
                         "AND e.entry_id = b.entry_id WHERE b.position = ?",
                     [session_id, leaf, session_id, turn_start])[0]
    assert turn_role == "user"


# ------------------------------------------------------------------ conventions


def _commands() -> list[str]:
    """Every command and sub-command (`eval longmemeval`), as typed after `om`."""
    import typer.main

    def walk(group, prefix):
        for name, command in group.commands.items():
            yield f"{prefix}{name}"
            if hasattr(command, "commands"):
                yield from walk(command, f"{prefix}{name} ")

    return sorted(walk(typer.main.get_command(app), ""))


def test_version_and_short_help(tmp_path):
    from om_core import __version__

    result = run_om_process(["--version"], cwd=tmp_path)  # the module entry point itself
    assert (result.returncode, result.stdout) == (0, f"om {__version__}\n")
    result = run_om(["-h"], cwd=tmp_path)
    assert result.returncode == 0 and "Usage: om [OPTIONS] COMMAND" in result.stdout
    result = run_om(["view", "-h"], cwd=tmp_path)
    assert result.returncode == 0 and "Usage: om view [OPTIONS] SESSION" in result.stdout


def test_om_alone_prints_its_help_and_nothing_else(tmp_path):
    for args in ([], ["eval"]):
        result = run_om(args, cwd=tmp_path)
        assert result.returncode == 2 and "Usage: om" in result.stdout and result.stderr == "", result


@pytest.mark.parametrize("args, expected", [
    (["view"], "Missing argument 'SESSION'"),
    (["view", "abc", "--bogus"], "No such option: --bogus"),
    (["cutpoint", "abc", "--keep-recent", "-1"], "--keep-recent"),
    (["nosuchcommand"], "No such command"),
    (["compact", "abc", "--pool-max", "many"], "--pool-max"),
])
def test_usage_errors_are_one_line_when_piped(tmp_path, args, expected):
    result = run_om(args, cwd=tmp_path)
    assert result.returncode == 2, result
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert expected in result.stderr and "╭" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize("command", _commands())
def test_every_help_has_examples_and_real_placeholders(command):
    import re

    result = invoke([*command.split(), "--help"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Examples:" in text and f"om {command}" in text.split("Examples:", 1)[1]
    assert not re.search(r"\{[a-z_]+\}", text), text  # Typer's {session}
    assert not re.search(r"<(str|bool|int|float|path|list\[\w+\]|int range)>", text, re.IGNORECASE), text
    assert "SPEC" not in text and "§" not in text


@pytest.mark.parametrize("command", ["", *_commands()])
def test_every_help_wraps_between_words_at_80_columns(command):
    result = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("Usage:")) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    prose = lines[start:end]
    assert max(len(line.rstrip()) for line in prose) <= 80
    for above, below in zip(prose, prose[1:]):  # within a paragraph, a line ends only where the next word
        if above.strip() and below.strip() and not below.startswith("  "):  # would not fit (78 columns of
            # text): never "(source" alone on a line; an indented line is a table of the help's own
            assert len(above.strip()) + 1 + len(below.split()[0]) > 78, (command, above, below)


def test_the_data_file_is_named_as_the_readme_names_it():
    text = invoke(["eval", "longmemeval", "--help"]).stdout
    readme = (Path(__file__).resolve().parent.parent / "docs" / "longmemeval.md").read_text()
    assert "longmemeval_s_cleaned.json" in text and "longmemeval_s_cleaned.json" in readme
    assert "longmemeval_s.json" not in text and "longmemeval_s.json" not in readme


def terminal(monkeypatch, width: int, *modules) -> io.StringIO:
    """What commands print to stdout, as a terminal of ``width`` columns shows it."""
    from rich.console import Console

    from flows.cli import common

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=width, color_system=None)
    for module in (common, *modules):
        monkeypatch.setattr(module, "out", console)
    return buffer


def assert_fits(text: str, width: int, headers: list[str]) -> None:
    lines = text.splitlines()
    assert "…" not in text and max(len(line) for line in lines) <= width, text
    head = next(line for line in lines if line.startswith("┃"))
    shown = [cell.strip() for cell in head.strip("┃").split("┃")]
    assert shown and all(h in headers for h in shown), (shown, text)  # whole names, never 'sessi…' stumps


def test_the_closing_table_of_om_run_fits_80_columns_with_numbers_right_aligned(monkeypatch):
    from flows.cli import run as run_cli

    buffer = terminal(monkeypatch, 80, run_cli)
    sids = ["5b0e7c1a-3f2d-4e8b-9a61-2c4d7e9f0b13", "8e3f1d26-9c4b-4a7e-b0d5-71a2c6e8f394",
            "8e3f1d2f-9c4b-4a7e-b0d5-71a2c6e8f394"]
    rows = [dict(session_id=sid, observations=125 * n, reflections=8, drops=69, compactions=5, model_calls=40,
                 tokens=123_456, cost=0.0123, errors=0, error=None) for n, sid in enumerate(sids, 1)]
    run_cli._print_run_table(RunReport(run_id="6722ee52b6f04ca2", sessions=rows))
    text = buffer.getvalue()
    headers = ["session", "file", "observations", "reflections", "drops", "compactions", "model calls", "tokens",
               "cost", "errors"]  # the session's file too: a user knows their sessions by file, not by UUID
    assert_fits(text, 80, headers)
    assert "5b0e7c1a " in text and "8e3f1d26 " in text and "8e3f1d2f " in text  # unique prefixes, 8 at least
    assert "not shown at this width" in text and "--json has everything" in text
    body = [line for line in text.splitlines() if line.startswith("│")]
    ends = {line.index(str(125 * n)) + len(str(125 * n)) for n, line in zip((1, 2, 3), body)}
    assert len(ends) == 1  # right-aligned: 125, 250 and 375 end in the same column
    wide = terminal(monkeypatch, 200, run_cli)
    run_cli._print_run_table(RunReport(run_id="6722ee52b6f04ca2", sessions=rows))
    assert all(sid in wide.getvalue() for sid in sids) and "not shown" not in wide.getvalue()


def test_om_logs_fits_80_columns(monkeypatch, tmp_path, db_path):
    from flows.cli import workers as workers_cli

    b = SessionBuilder(SID_A)
    b.user("hello")
    ingest(workspace(db_path), [b.write(tmp_path / "s.jsonl")])
    con = dbmod.connect(db_path)
    con.execute("INSERT INTO om_internal.llm_calls (call_id, run_id, stage_run_id, session_id, stage, model, turn, "
                "attempt, input_tokens, output_tokens, cached_tokens, cost, latency_ms, status, error_kind, error, "
                "started_at) VALUES ('c1', 'r', 's', ?, 'reflector', 'openrouter/anthropic/claude-sonnet-4-5', 1, 1, "
                "123456, 2345, 100000, 0.1234, 12345, 'error', 'transient', 'rate limited', now())", [SID_A])
    con.close()
    buffer = terminal(monkeypatch, 80, workers_cli)
    result = invoke(["--db", str(db_path), "logs"])
    assert result.exit_code == 0, result.output
    text = buffer.getvalue()
    assert_fits(text, 80, ["time", "session", "stage", "model", "status", "in", "out", "cached", "cost", "ms"])
    assert SID_A[:8] in text and "123456" in text and "$0.1234" in text


def test_top_level_help_has_examples_and_no_spec_references():
    text = invoke(["--help"]).stdout
    assert "Examples:" in text and "SPEC" not in text and "<bool>" not in text and "-h" in text


def test_recall_of_an_unknown_id_is_an_error(two_sessions, tmp_path):
    db = str(two_sessions["db"])
    result = run_om(["--db", db, "recall", "0123456789ab"], cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    result = run_om(["--db", db, "recall", "0123456789ab", "--json"], cwd=tmp_path)
    assert result.returncode == 1 and json.loads(result.stdout)["status"] == "not_found"
    # anything but an id or a hex prefix is a query (SPEC §13): one that matches nothing is exit 1
    result = run_om(["--db", db, "recall", "not-an-id"], cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.startswith("error: ")
    result = run_om(["--db", db, "recall", ""], cwd=tmp_path)  # an empty query
    assert result.returncode == 2 and result.stderr.startswith("error: ")


def test_compact_without_first_kept_uses_pis_cut_point_and_says_so(two_sessions, tmp_path):
    db, ids = str(two_sessions["db"]), two_sessions["ids"]
    env = {"OM_KEEP_RECENT_TOKENS": "150"}
    result = run_om(["--db", db, "compact", SID_A], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert f"using Pi's cut point, first kept entry {ids['u2']}" in result.stderr
    derived = run_om(["--db", db, "compact", SID_A, "--json"], cwd=tmp_path, env=env)
    explicit = run_om(["--db", db, "compact", SID_A, "--first-kept", ids["u2"], "--json"], cwd=tmp_path, env=env)
    data = json.loads(derived.stdout)
    assert data.pop("cut_point")["first_kept_entry_id"] == ids["u2"]
    assert data == json.loads(explicit.stdout)
    result = run_om(["--db", db, "compact", SID_A, "--first-kept", ids["u2"]], cwd=tmp_path, env=env)
    assert "cut point" not in result.stderr


def test_ingest_of_a_file_that_is_not_a_session_is_an_error_for_that_file(tmp_path, db_path):
    good = SessionBuilder(SID_A)
    good.user("hi")
    good_path = good.write(tmp_path / "good.jsonl")
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"note": "not a session"}\n{"another": 1}\n')
    (tmp_path / "empty.jsonl").write_text("")
    for _ in range(2):  # and again, unchanged
        result = run_om(["--db", str(db_path), "ingest", str(good_path), str(notes), str(tmp_path / "empty.jsonl")],
                        cwd=tmp_path)
        assert result.returncode == 1, result
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "notes.jsonl" in errors[0] and "not a Pi session" in errors[0]
    assert q(db_path, "SELECT session_id FROM sessions") == [(SID_A,)]
    assert q(db_path, "SELECT count(*) FROM quarantine WHERE file_path LIKE '%notes.jsonl'") == [(2,)]


def test_tables_show_whole_ids_on_a_narrow_terminal(two_sessions, monkeypatch):
    from rich.console import Console

    from flows.cli import common as cli  # print_rows writes to common.out

    for width in (60, 120, 250):
        buffer = io.StringIO()
        monkeypatch.setattr(cli, "out", Console(file=buffer, force_terminal=True, width=width, color_system=None))
        result = invoke(["--db", str(two_sessions["db"]), "sessions"])
        assert result.exit_code == 0, result.output
        text = buffer.getvalue()
        assert SID_A in text and SID_B in text and two_sessions["ids"]["a2"] in text, (width, text)
        assert "…" not in text
        assert max(len(line) for line in text.splitlines()) <= width


def test_gaps_table_shows_whole_session_ids(tmp_path, db_path):
    b = SessionBuilder(SID_A)
    u1 = b.user("x" * 400)
    b.assistant("y" * 400)
    u2 = b.user("z" * 400)
    b.assistant("w" * 400)
    b.compaction("summary", u2)
    b.user("more")
    ingest(workspace(db_path), [b.write(tmp_path / "s.jsonl")])
    result = invoke(["--db", str(db_path), "gaps"])
    assert result.exit_code == 0, result.output
    assert SID_A in result.stdout


def test_cost_cells_and_the_cost_line_say_one_thing(monkeypatch):
    """Priced, unknown, or nothing (no model call); never $0.0000 for a cost nobody
    knows, in the rows, the total row (an unpriced model, the offline baseline) and the closing line."""
    from flows.cli import run as run_cli
    from flows.cli.costs import cost_line

    def table(rows):
        buffer = terminal(monkeypatch, 200, run_cli)
        run_cli._print_run_table(RunReport(run_id="6722ee52b6f04ca2", sessions=rows))
        return [line for line in buffer.getvalue().splitlines() if line.startswith("│")]

    def row(sid, calls, cost, unpriced=0):
        return dict(session_id=sid, observations=3, reflections=0, drops=0, compactions=0, model_calls=calls,
                    tokens=1000 * calls, cost=cost, unpriced_calls=unpriced, errors=0, error=None)

    offline = table([row("5b0e7c1a-3f2d", 0, None), row("8e3f1d26-9c4b", 0, None)])
    assert "$" not in "".join(offline) and "unknown" not in "".join(offline)  # nothing was priced: no figure
    unpriced = table([row("5b0e7c1a-3f2d", 4, None, 4), row("8e3f1d26-9c4b", 2, None, 2)])
    assert "$0.0000" not in "".join(unpriced) and unpriced[-1].count("unknown") == 1 and "total" in unpriced[-1]
    mixed = table([row("5b0e7c1a-3f2d", 4, 0.0123), row("8e3f1d26-9c4b", 2, None, 2)])
    assert "$0.0123" in mixed[0] and "unknown" in mixed[1] and "$0.0123 + unknown" in mixed[-1]
    assert cost_line({"model_calls": 0, "cost_usd": None}) is None  # the offline baseline: no cost line
    # --max-cost below the first call's worst case on a priced model: one line, no 'unknown'
    stopped = cost_line({"model_calls": 0, "cost_usd": None, "unpriced_calls": 0, "estimated_usd": 0.0266,
                         "max_cost": 0.001, "stopped_by_max_cost": True})
    assert "unknown" not in stopped and "$0.0000" not in stopped and len(stopped.splitlines()) == 1
    assert stopped.startswith("cost: nothing spent: no model call was made; stopped by --max-cost $0.0010")
    assert stopped.endswith("estimated beforehand for the whole run: $0.0266") and "rerun to resume" in stopped
    unknown = cost_line({"model_calls": 5, "cost_usd": None, "unpriced_calls": 5, "input_tokens": 900,
                         "output_tokens": 40})
    assert unknown.startswith("cost: unknown (litellm has no price for the model) for 5 model calls")
    priced = cost_line({"model_calls": 5, "cost_usd": 0.0042, "unpriced_calls": 0, "input_tokens": 900,
                        "cached_tokens": 100, "output_tokens": 40, "estimated_usd": 0.005})
    assert priced == ("cost: $0.0042 for 5 model calls (900 prompt tokens, 100 of them cached, 40 output); "
                      "estimated beforehand for the whole run: $0.0050")


def test_the_live_board_names_files_shows_elapsed_and_left_and_appears_once_sessions_are_on_it():
    """File names beside ids, elapsed time and an estimate of what is left, and no
    board at all while Prefect starts (the flow has put no session on it yet)."""
    from rich.console import Console

    from flows import progress
    from flows.cli.run import LiveBoard, board_table

    a, b = "5b0e7c1a-3f2d-4e8b-9a61-2c4d7e9f0b13", "8e3f1d26-9c4b-4a7e-b0d5-71a2c6e8f394"
    progress.start([])  # what the previous run left
    progress.describe({a: {"file": "harbor-sync-long.jsonl", "entries": 300}, b: {"file": "tidewatch.jsonl",
                                                                                  "entries": 100}})
    buffer = io.StringIO()
    board = LiveBoard(Console(file=buffer, force_terminal=True, width=160, color_system=None))
    board.tick()  # Prefect is starting: nothing on the board yet, so nothing drawn
    assert not board.started and buffer.getvalue() == ""
    progress.start([a, b])
    rows = progress.snapshot()
    assert progress.timing(rows)[1] is None  # nothing done: no estimate yet
    progress.update({"session_id": b, "done": True})
    progress.update({"session_id": a, "stage": "observer", "outcome": "recorded", "position": 149, "of": 300})
    rows = progress.snapshot()
    assert progress.done_fraction(rows) == pytest.approx((100 + 150) / 400)
    start = progress._clock["start"]
    elapsed, left = progress.timing(rows, now=start + 50)
    assert elapsed == pytest.approx(50) and left == pytest.approx(30)  # 5/8 done in 50 s: 30 s to go
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(board_table(rows, 50, 30))
    text = console.file.getvalue()
    assert "0:50 elapsed" in text and "about 0:30 left" in text
    assert "5b0e7c1a harbor-sync-long" in text and "8e3f1d26 tidewatch" in text
    board.tick()
    board.tick()
    board.stop()
    assert board.started  # one Live, started once the sessions were on the board
    progress.start([])


def test_the_live_board_at_80_columns_keeps_ids_names_and_headers_and_counts_what_stages_did():
    """At 80 columns the board cut ids and names to 7 characters and its header to
    "compactio…", and its "stages" counted every stage asked (465, most of them an input answered
    before) beside the run's 35 model calls. Now: the whole short id and the start of the file name
    (Pi's name less the id it repeats), every header whole, no line past 80 columns, and what the
    stages did: how many recorded memory, how many model calls."""
    from rich.console import Console

    from flows import progress
    from flows.cli.run import LiveBoard

    a, b = "019b0a7e-5c3d-7f21-9a8e-3d2c1b0a9f8e", "8e3f1d26-9c4b-4a7e-b0d5-71a2c6e8f394"
    progress.describe({a: {"file": f"2026-02-03T09-12-44-120Z_{a}.jsonl", "entries": 1021},
                       b: {"file": "harbor-sync-long-archive.jsonl", "entries": 300}})
    progress.start([a, b])
    for position in range(0, 460):  # a reflector asked at every turn end, its input answered before
        progress.update({"session_id": a, "stage": "reflector", "outcome": "empty", "position": position,
                         "of": 1021, "calls": 0})
    for position in range(460, 465):
        progress.update({"session_id": a, "stage": "observer", "outcome": "recorded", "position": position,
                         "of": 1021, "calls": 7})
    progress.update({"session_id": a, "stage": "compaction", "outcome": "folded", "position": 464, "of": 1021})
    progress.update({"session_id": b, "stage": "observer", "outcome": "failed", "position": 10, "of": 300,
                     "calls": 3})
    console = Console(file=io.StringIO(), width=80, color_system=None)
    board = LiveBoard(console)
    shown = Console(file=io.StringIO(), width=80, color_system=None)
    shown.print(board.table())
    text = shown.file.getvalue()
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80, text
    header = next(line for line in lines if line.startswith("session"))
    for name in ("state", "entry", "recorded", "model calls", "compactions", "failed"):
        assert name in header.split("  ") or f" {name} " in f" {header} ", (name, text)
    row_a = next(line for line in lines if line.startswith(a[:8]))
    row_b = next(line for line in lines if line.startswith(b[:8]))
    assert row_a.startswith(f"{a[:8]} 2026-02"), text  # the id whole, then the name (less the id)
    assert row_b.startswith(f"{b[:8]} harbor-"), text
    assert "running" in row_a and "465/1021" in row_a, text
    # recorded 5, model calls 35, compactions 1, failed 0: not the 466 stages asked
    assert row_a.split()[-4:] == ["5", "35", "1", "0"], text
    assert row_b.split()[-4:] == ["0", "3", "0", "1"], text
    progress.start([])


def test_a_path_that_is_no_session_file_is_named_so_not_sent_to_om_ingest(two_sessions, tmp_path):
    """`om view /etc/passwd` suggested `om ingest /etc/passwd`. A file with no session
    header, or a directory, is said to be what it is; a session file not yet ingested still gets the
    suggestion (its first lines may be blank or broken, as Pi skips them)."""
    db = two_sessions["db"]
    other = tmp_path / "notes.txt"
    other.write_text("root:x:0:0:root:/root:/bin/bash\n")
    fresh = SessionBuilder("5e55e000-0000-4000-8000-00000000aaaa")
    fresh.work_turns(1, "alpha")
    later = fresh.write(tmp_path / "later.jsonl")
    later.write_text("\n{broken\n" + later.read_text())
    for args, expected in [
        (["view", str(other)], f"error: {other} is not a Pi session file (no session header in its first lines)"),
        (["status", str(tmp_path)], f"error: {tmp_path} is a directory, not a session file"),
        (["view", str(later)], f"error: {later} has not been ingested; run `om ingest {later}`"),
    ]:
        result = run_om(["--db", str(db), *args], cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().startswith(expected), result.stderr
        assert "om ingest " + str(other) not in result.stderr
