"""Two worlds (SPEC §4): `om compact` folds what the session file holds, exactly as the extension
folds the file `om export` writes; `--replayed` adds the compactions the replay simulated.

A generated session is replayed with the offline baseline under a small pool, so the replay
simulates full folds (fullFold true, the replayed world's M). Then, for every cut point Pi can
choose on the exported file (its own cut at many keepRecentTokens, om's record entries among
them), `om compact` in the replay database equals the same command on the exported file
re-ingested; every compaction `om export --compact` writes equals `om compact` on the written file
at its own cut point; and the replayed world still differs where a simulated full fold sets M.
"""

from __future__ import annotations

import json

import pytest
from builders import SessionBuilder
from typer.testing import CliRunner

from conftest import workspace
from flows.cli.main import app
from om_core.store import db as dbmod
from om_core.store.catalog import PiDeclines, cut_point
from om_core.errors import EntryNotFound
from om_core.ingest import ingest
from om_core.memory.compaction import compact
from om_core.replay.engine import replay_session
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig, make_brain
from om_core.store.workspace import Workspace

SETTINGS = Settings(observeAfterTokens=80, reflectAfterTokens=160, compactAfterTokens=300, keepRecentTokens=200,
                    observationsPoolMaxTokens=40, observationsPoolTargetTokens=20)
KEEP_RECENT = range(50, 3_000, 50)
POOL_ENV = {"OM_OBSERVATIONS_POOL_MAX_TOKENS": "40", "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20"}  # as SETTINGS


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """(replay database, exported file re-ingested, session id, exported file)."""
    tmp = tmp_path_factory.mktemp("worlds")
    b = SessionBuilder("d7a1c0de-0000-4000-8000-000000000022")
    b.system("You are Pi, a coding agent.")
    b.user("We must never call the network from the tests; always use DuckDB for storage.")
    b.work_turns(10, "ledger")
    path = b.write(tmp / "session.jsonl")
    db_path = tmp / "replay.duckdb"
    sid = ingest(workspace(db_path), [path]).files[0].session_id
    con = dbmod.connect(db_path)
    try:
        replay_session(Workspace.on_connection(con, SETTINGS), sid, make_brain(ModelConfig(model="offline"), SETTINGS))
    finally:
        con.close()
    out = tmp / "exported.jsonl"
    result = CliRunner().invoke(app, ["--db", str(db_path), "export", sid, "--out", str(out)])
    assert result.exit_code == 0, result.output
    fresh = tmp / "fresh.duckdb"
    ingest(workspace(fresh), [out])
    return Workspace.open(db_path, settings=SETTINGS), Workspace.open(fresh, settings=SETTINGS), sid, out


def file_cut_points(ws: Workspace, sid: str) -> list[str]:
    """Pi's own first kept entries on the exported file, one per distinct keepRecentTokens outcome."""
    points = []
    for keep in KEEP_RECENT:
        try:
            f = cut_point(ws, sid, keep_recent_tokens=keep).firstKeptEntryId
        except PiDeclines:
            continue
        if f not in points:
            points.append(f)
    return points


def test_the_replay_simulated_full_folds(worlds):
    replay, _, sid, _ = worlds
    with replay.read() as con:
        (full_folds,) = con.execute("SELECT count(*) FROM compactions WHERE session_id = ? AND origin = 'simulated' "
                                    "AND folded AND full_fold", [sid]).fetchone()
    assert full_folds >= 1  # else the two worlds could not differ


def test_every_cut_point_of_the_file_folds_alike_in_the_replay_database(worlds):
    replay, fresh, sid, _ = worlds
    points = file_cut_points(fresh, sid)
    with fresh.read() as con:
        records = {r[0] for r in con.execute("SELECT entry_id FROM entries WHERE session_id = ? AND entry_type = "
                                             "'custom' AND raw ->> '$.customType' LIKE 'om.%'", [sid]).fetchall()}
    assert len(points) >= 8 and records & set(points), "no cut point at one of om's record entries"
    differ_replayed = 0
    for f in points:
        in_file = compact(fresh, sid, f).as_json()
        assert compact(replay, sid, f).as_json() == in_file, f
        differ_replayed += compact(replay, sid, f, replayed=True).as_json() != in_file
    assert differ_replayed >= 1, "the replayed world never differs: its simulated full folds set no M"


def test_pis_cut_point_is_the_one_on_the_exported_file(worlds):
    """`om cutpoint` (and so `om compact` without --first-kept) answers for the file om export writes:
    Pi's absorption can end on one of om's records there."""
    replay, fresh, sid, _ = worlds
    answers = []
    for keep in KEEP_RECENT:
        pair = []
        for ws in (replay, fresh):
            try:
                pair.append(cut_point(ws, sid, keep_recent_tokens=keep).as_json())
            except PiDeclines as exc:
                pair.append(exc.reason)
        assert pair[0] == pair[1], keep
        answers.append(pair[0])
    env = {"OM_KEEP_RECENT_TOKENS": "200", **POOL_ENV}
    a = CliRunner().invoke(app, ["--db", str(replay.path), "compact", sid, "--json"], env=env)
    b = CliRunner().invoke(app, ["--db", str(fresh.path), "compact", sid, "--json"], env=env)
    assert a.exit_code == b.exit_code == 0 and json.loads(a.stdout) == json.loads(b.stdout)


def test_a_cut_at_an_om_record_entry_is_accepted(worlds):
    """Pi can keep one of om's own records first in the exported file; in the replay database (where
    that record is a ledger row, not an entry) the command answers the same, via the CLI."""
    replay, fresh, sid, _ = worlds
    entries = {e["entry_id"] for e in replay.rows("export_entries", {"session_id": sid})}
    record = next(f for f in file_cut_points(fresh, sid) if f not in entries)
    args = ["compact", sid, "--first-kept", record, "--json"]
    a = CliRunner().invoke(app, ["--db", str(replay.path), *args])
    b = CliRunner().invoke(app, ["--db", str(fresh.path), *args])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    assert json.loads(a.stdout) == json.loads(b.stdout)
    assert json.loads(a.stdout)["world"] == "file"
    safe = [CliRunner().invoke(app, ["--db", str(ws.path), *args, "--gap-safe"]) for ws in (replay, fresh)]
    assert all(r.exit_code == 0 for r in safe), safe[0].output + safe[1].output
    assert json.loads(safe[0].stdout) == json.loads(safe[1].stdout)
    unknown = CliRunner().invoke(app, ["--db", str(replay.path), "compact", sid, "--first-kept", "feedbeef"])
    assert isinstance(unknown.exception, EntryNotFound) and "not on the branch" in str(unknown.exception)


def test_export_compact_writes_what_the_extension_makes_of_the_written_file(worlds, tmp_path):
    replay, _, sid, _ = worlds
    written = 0
    for keep in (100, 250, 400, 800, 1600):
        out = tmp_path / f"compacted-{keep}.jsonl"
        result = CliRunner().invoke(app, ["--db", str(replay.path), "export", sid, "--out", str(out), "--compact",
                                          "--force"], env={"OM_KEEP_RECENT_TOKENS": str(keep), **POOL_ENV})
        assert result.exit_code == 0, result.output
        entry = json.loads(out.read_text().splitlines()[-1])
        if entry["type"] != "compaction":
            continue
        written += 1
        db = tmp_path / f"compacted-{keep}.duckdb"
        ws = workspace(db)
        ingest(ws, [out])
        again = compact(Workspace.open(db, settings=SETTINGS), sid, entry["firstKeptEntryId"], entry["parentId"])
        assert (again.summary, again.details()) == (entry["summary"], entry["details"]), keep
    assert written >= 3
