"""Rewritten session files: what a rewrite took away is reported by file name
(entries, and this project's memory records now without their evidence); the records stay in the
ledger, marked in the orphaned_records view, and om recall says their source is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder

from conftest import workspace
from om_core.store import db as dbmod
from om_core.ingest import ingest
from om_core.recall.evidence import recall
from om_core.replay.engine import replay_session
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig, make_brain
from om_core.store.workspace import Workspace

SID = "5ea5e000-1111-4222-8333-444444444444"
OTHER = "0be70000-5555-4666-8777-888888888888"
SETTINGS = Settings(observeAfterTokens=120, reflectAfterTokens=250, compactAfterTokens=600, keepRecentTokens=150,
                    observationsPoolMaxTokens=400, observationsPoolTargetTokens=200)


def q(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def bump_mtime(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


@pytest.fixture
def replayed(tmp_path):
    """A session of 16 work turns, ingested and replayed with the offline baseline (records of om's own)."""
    b = SessionBuilder(SID)
    b.user("We must never call the network from the tests; always use DuckDB for storage.")
    b.work_turns(16, "ledger")
    path = b.write(tmp_path / "s.jsonl")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [path])
    con = dbmod.connect(db)
    try:
        replay_session(Workspace.on_connection(con, SETTINGS), SID, make_brain(ModelConfig(model="offline"), SETTINGS))
    finally:
        con.close()
    records = q(db, "SELECT ledger_id, anchor_entry_id FROM ledger WHERE origin = 'pipeline'")
    assert len(records) >= 4, "the replay recorded too little to cut through"
    return b, path, db


def ledger_rows(db: Path) -> dict[str, int]:
    return {t: q(db, f"SELECT count(*) FROM {t}")[0][0] for t in ("ledger", "observations", "reflections", "drops")}


def evidence_gone(db: Path, kept: set[str]) -> set[str]:
    """Records of om's own whose anchor or some observation's source is not among ``kept`` (in Python)."""
    gone = {ledger_id for ledger_id, anchor in q(db, "SELECT ledger_id, anchor_entry_id FROM ledger "
                                                     "WHERE origin = 'pipeline'") if anchor not in kept}
    for ledger_id, sources in q(db, "SELECT ledger_id, source_entry_ids FROM observations"):
        if not set(sources) <= kept:
            gone.add(ledger_id)
    return gone


def test_truncating_a_file_reports_the_lost_entries_and_orphans_its_records_without_deleting_them(replayed):
    b, path, db = replayed
    before = ledger_rows(db)
    lines = b.lines()
    half = len(lines) // 2
    path.write_text("\n".join(lines[:half]) + "\n")
    kept = {json.loads(line)["id"] for line in lines[1:half]}
    expected = evidence_gone(db, kept)
    assert expected, "the cut should take some records' evidence"

    [report] = ingest(workspace(db), [path]).files
    assert report.status == "rewritten"
    [loss] = report.replaced
    assert (loss.session_id, loss.now_session_id) == (SID, SID)
    assert (loss.entries_before, loss.entries_lost, loss.entries_changed) == (len(lines) - 1, len(lines) - half, 0)
    assert set(loss.orphaned_ledger_ids) == expected
    assert loss.describe().startswith(f"rewritten: {len(lines) - half} of {len(lines) - 1} entries are no longer")
    # nothing left the ledger; the view marks exactly those records, each with its reason
    assert ledger_rows(db) == before
    marked = dict(q(db, "SELECT ledger_id, reason FROM orphaned_records"))
    assert set(marked) == expected
    anchors = dict(q(db, "SELECT ledger_id, anchor_entry_id FROM ledger"))
    assert marked == {i: "sources_gone" if anchors[i] in kept else "anchor_gone" for i in expected}
    # the rewrite is noted for good: a later append (which re-derives the tree's notes) keeps it
    notes = q(db, "SELECT file_path, session_id, detail FROM ingest_notes WHERE kind = 'rewritten'")
    assert notes == [(str(path), SID, loss.describe())]
    with path.open("a") as f:
        f.write("\n".join(lines[half:half + 2]) + "\n")
    assert ingest(workspace(db), [path]).files[0].status == "appended"
    assert q(db, "SELECT detail FROM ingest_notes WHERE kind = 'rewritten'") == [(loss.describe(),)]


def test_recall_of_an_orphaned_id_says_its_source_is_gone(replayed):
    b, path, db = replayed
    lines = b.lines()
    half = len(lines) // 2
    kept = {json.loads(line)["id"] for line in lines[1:half]}
    path.write_text("\n".join(lines[:half]) + "\n")
    ingest(workspace(db), [path])
    off_branch = [(obs_id, ledger_id) for obs_id, ledger_id, anchor in
                  q(db, "SELECT obs_id, ledger_id, anchor_entry_id FROM observations") if anchor not in kept]
    on_branch = [obs_id for obs_id, anchor in q(db, "SELECT obs_id, anchor_entry_id FROM observations")
                 if anchor in kept]
    assert off_branch and on_branch
    obs_id, ledger_id = off_branch[0]
    ws = workspace(db)
    for result in (recall(ws, obs_id), recall(ws, obs_id, session=SID)):
        assert result.status == "orphaned" and not result.observations
        [orphan] = [o for o in result.orphaned if o.ledger_id == ledger_id]
        assert (orphan.kind, orphan.reason, orphan.session_id) == ("observation", "anchor_gone", SID)
        assert "source is gone" in result.message and "no longer in the file" in result.message
    found = recall(ws, on_branch[0])
    assert found.status == "found" and not found.orphaned


def test_a_file_replaced_by_another_session_orphans_every_record_of_the_old_one(replayed, tmp_path):
    b, path, db = replayed
    before = ledger_rows(db)
    old_records = {i for (i,) in q(db, "SELECT ledger_id FROM ledger WHERE origin = 'pipeline'")}
    other = SessionBuilder(OTHER)
    other.user("hello")
    other.assistant("hi")
    other.write(path)
    bump_mtime(path)

    [report] = ingest(workspace(db), [path]).files
    assert (report.status, report.session_id) == ("rewritten", OTHER)
    [loss] = report.replaced
    assert (loss.session_id, loss.now_session_id, loss.entries_lost) == (SID, OTHER, len(b.entries))
    assert set(loss.orphaned_ledger_ids) == old_records
    assert loss.describe().startswith(f"rewritten: now holds session {OTHER}; session {SID} and its ")
    assert ledger_rows(db) == before
    assert q(db, "SELECT DISTINCT session_id, reason FROM orphaned_records") == [(SID, "session_gone")]
    obs_id = q(db, "SELECT obs_id FROM observations LIMIT 1")[0][0]
    result = recall(workspace(db), obs_id)
    assert result.status == "orphaned"
    assert result.message.endswith(f"session {SID} is no longer in any session file")


def test_an_edited_line_is_a_changed_entry(replayed):
    b, path, db = replayed
    lines = b.lines()
    edited = json.loads(lines[2])
    edited["message"]["content"] = [{"type": "text", "text": "something else entirely"}]
    lines[2] = json.dumps(edited)
    path.write_text("\n".join(lines) + "\n")
    bump_mtime(path)
    [report] = ingest(workspace(db), [path]).files
    [loss] = report.replaced
    assert (loss.entries_lost, loss.entries_changed, loss.orphaned_ledger_ids) == (0, 1, [])
    assert loss.describe() == f"rewritten: 0 of {len(lines) - 1} entries are no longer in the file and 1 changed"
    assert q(db, "SELECT count(*) FROM orphaned_records") == [(0,)]


def test_a_rewrite_that_changed_nothing_stored_reports_no_loss(tmp_path):
    """A file rewritten with the same entries (as bytes differ only in the header) loses nothing."""
    b = SessionBuilder(SID)
    b.user("q")
    b.assistant("a")
    path = b.write(tmp_path / "s.jsonl")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [path])
    header = json.loads(b.lines()[0])
    header["cwd"] = "/elsewhere"
    path.write_text("\n".join([json.dumps(header), *b.lines()[1:]]) + "\n")
    [report] = ingest(workspace(db), [path]).files
    assert report.status == "rewritten" and report.replaced == []
    assert q(db, "SELECT count(*) FROM ingest_notes WHERE kind = 'rewritten'") == [(0,)]


def test_the_commands_say_it(replayed, tmp_path):
    """om ingest names the file and what was lost (stderr, exit 0); om recall shows the
    orphaned record and that its source is gone."""
    b, path, db = replayed
    lines = b.lines()
    half = len(lines) // 2
    path.write_text("\n".join(lines[:half]) + "\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("OM_")}, "COLUMNS": "400"}

    def om(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), *args], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)

    done = om("ingest", str(path))
    assert done.returncode == 0, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if line.startswith("warning")]
    assert warning.startswith(f"warning {path}: rewritten: {len(lines) - half} of {len(lines) - 1} entries")
    assert "lost their evidence: kept, marked orphaned (the orphaned_records view)" in warning
    [ledger_id] = q(db, "SELECT ledger_id FROM orphaned_records WHERE reason = 'anchor_gone' LIMIT 1")[0]
    obs_id, content = q(db, "SELECT obs_id, content FROM observations WHERE ledger_id = ?", [ledger_id])[0]
    shown = om("recall", obs_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"{obs_id}: its source is gone (the session file was rewritten)")
    assert content in shown.stdout and f"orphaned, record {ledger_id}" in shown.stdout
    assert "source gone: the entries it was recorded after are no longer in the file" in shown.stdout
    as_json = json.loads(om("recall", obs_id, "--json").stdout)
    assert as_json["status"] == "orphaned" and as_json["orphaned"][0]["reason"] == "anchor_gone"
