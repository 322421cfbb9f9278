"""The workspace a command builds once: the --db file and its settings, resolved when first used."""

from __future__ import annotations

import pytest
from builders import SessionBuilder
from typer.testing import CliRunner

from flows.cli.main import app
from conftest import workspace
from om_core.errors import OmError
from om_core.ingest import ingest
from om_core.settings import Settings
from om_core.store.workspace import FileDatabase, Workspace


def test_open_resolves_settings_only_when_used(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ws = Workspace.open(tmp_path / "om.duckdb", config=tmp_path / "missing.toml")  # nothing read yet
    assert isinstance(ws.db, FileDatabase) and ws.path == tmp_path / "om.duckdb"
    with pytest.raises(OmError, match="missing.toml"):
        ws.settings  # noqa: B018
    flagged = Workspace.open(tmp_path / "om.duckdb", flags={"keepRecentTokens": 1234})
    assert flagged.settings.keepRecentTokens == 1234
    assert flagged.resolved.sources["keepRecentTokens"] == "flag"
    given = Workspace.open(tmp_path / "om.duckdb", settings=Settings(keepRecentTokens=99))
    assert given.settings.keepRecentTokens == 99 and given.resolved is None


def test_commands_that_read_no_setting_ignore_a_bad_settings_source(tmp_path, monkeypatch):
    """As before the workspace: `om sql` and `om view` never read settings, `om status` does."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OM_DB", raising=False)
    b = SessionBuilder()
    b.user("hello")
    b.assistant("hi")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [b.write(tmp_path / "s.jsonl")])
    base = ["--db", str(db), "--config", str(tmp_path / "missing.toml")]
    runner = CliRunner()
    sql = runner.invoke(app, [*base, "sql", "SELECT count(*) AS n FROM sessions", "--csv"])
    assert sql.exit_code == 0 and sql.stdout == "n\n1\n", sql.output
    assert runner.invoke(app, [*base, "view", b.session_id]).exit_code == 0
    status = runner.invoke(app, [*base, "status", b.session_id])
    assert status.exit_code != 0 and "missing.toml" in str(status.exception)
