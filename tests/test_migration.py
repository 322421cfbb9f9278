"""Memory follows Pi's own rewrites (pi-sessions.md §1.5): a v1 file om maintained,
then migrated in place by Pi (new random ids, parent ids, hookMessage renamed), keeps every record of
om's on its entries: nothing orphaned, the fold, the projections, the compactions and the clocks at
every point of the branch equal to before (through the map of ids), recall unchanged, and om run has
nothing to replay. The same for a v2 file (its ids kept) and for pi --fork copies. A rewrite that is
no migration stays a rewrite: records kept, orphaned, named. The real Pi 1.6.0 does the migration in
the last tests (skipped with a reason where it is not installed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from memory_points import memory_at_every_point, recalls, translate
from pi_migrate import fork_file, migrate_file

from conftest import shared_session, workspace
from om_core.store import db as dbmod
from om_core.store.catalog import branch_for_cut_point
from om_core.pi.cutpoint import compaction_cut_point
from om_core.ingest import ingest
from om_core.usecases.live import CompactRequest, RecallRequest, compact_live, recall_live
from om_core.memory.compaction import compact
from om_core.replay.engine import replay_session
from om_core.replay.plan import due_sessions, fingerprints, record_replay
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig, make_brain
from om_core.store.workspace import Workspace

SID = "5ea5e000-aaaa-4bbb-8ccc-000000000001"
FORK = "5ea5e000-aaaa-4bbb-8ccc-00000000f0f0"
SETTINGS = Settings(observeAfterTokens=120, reflectAfterTokens=250, compactAfterTokens=600, keepRecentTokens=150,
                    observationsPoolMaxTokens=400, observationsPoolTargetTokens=200)


def q(db: Path, sql: str, params: list | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def old_session(version: int | None) -> SessionBuilder:
    """Work turns with what Pi's migration touches: a compaction (a v1 one by firstKeptEntryIndex) and an
    extension's hookMessage."""
    b = SessionBuilder(SID, version=version)
    b.user("We must never call the network from the tests; always use DuckDB for storage.")
    b.work_turns(6, "ledger")
    b.message({"role": "hookMessage", "customType": "reminder", "content": "Remember the storage rule.",
               "display": True, "timestamp": b.ms()})
    if version is None:
        b.append({"type": "compaction", "summary": "Earlier: ledger steps 0-5.", "firstKeptEntryIndex": 14,
                  "tokensBefore": 4000})
    else:
        b.compaction("Earlier: ledger steps 0-5.", b.entries[13]["id"], tokens_before=4000)
    b.work_turns(8, "export")
    if version is None:  # a v1 file's entries have no ids (the builder gives every entry one)
        b.entries = [{k: v for k, v in e.items() if k not in ("id", "parentId")} for e in b.entries]
    return b


def maintain(path: Path, db: Path) -> None:
    """What `om run` does to the file: ingest, replay with the offline baseline, record the replay."""
    ingest(workspace(db), [path])
    con = dbmod.connect(db)
    try:
        [sid] = [r[0] for r in con.execute("SELECT session_id FROM sessions WHERE file_path = ?",
                                           [str(path.resolve())]).fetchall()]
        replay_session(Workspace.on_connection(con, SETTINGS), sid, make_brain(ModelConfig(model="offline"), SETTINGS))
        [(_, printed)] = fingerprints(con, [sid], SETTINGS, "offline", True).items()
        record_replay(con, sid, printed.now, "run-1")
    finally:
        con.close()


def memory(db: Path, sid: str = SID, every: int = 1) -> tuple[list, dict]:
    con = dbmod.connect(db)
    try:
        return memory_at_every_point(con, sid, SETTINGS, every), recalls(con, sid)
    finally:
        con.close()


def every(points: list, n: int) -> list:
    """The points ``memory(..., every=n)`` reads, out of those read at every point."""
    return [points[i] for i in sorted(set(range(0, len(points), n)) | {len(points) - 1})]


def id_map(db: Path, sid: str = SID) -> dict[str, str]:
    return dict(q(db, "SELECT old_id, new_id FROM entry_id_map WHERE session_id = ?", [sid]))


def counts(db: Path) -> dict[str, int]:
    return {t: q(db, f"SELECT count(*) FROM {t}")[0][0] for t in ("ledger", "observations", "reflections", "drops",
                                                                     "compaction_items")}


@pytest.fixture(scope="module")
def maintained_once(tmp_path_factory):
    """A v1 file om maintained, its database, and its memory at every point (built once for the module)."""
    root = tmp_path_factory.mktemp("maintained")
    path = old_session(None).write(root / "s.jsonl")
    db = root / "om.duckdb"
    maintain(path, db)
    assert q(db, "SELECT version FROM sessions") == [(1,)]
    records = q(db, "SELECT count(*) FROM ledger WHERE origin = 'pipeline'")[0][0]
    simulated = q(db, "SELECT count(*) FROM compactions WHERE origin = 'simulated'")[0][0]
    assert records >= 4 and simulated >= 1, "the replay recorded too little to follow"
    return path, db, memory(db)


@pytest.fixture
def maintained_v1(maintained_once, tmp_path):
    """A copy of it for one test (the file, and the database, as `om run` left them)."""
    path, db, before = maintained_once
    shutil.copy(path, tmp_path / "s.jsonl")
    shutil.copy(db, tmp_path / "om.duckdb")
    with dbmod.writing(tmp_path / "om.duckdb") as con:  # the file sits elsewhere now: follow it there
        con.execute("UPDATE om_internal.session_files SET file_path = ?", [str((tmp_path / "s.jsonl").resolve())])
        con.execute("UPDATE om_internal.sessions SET file_path = ?", [str((tmp_path / "s.jsonl").resolve())])
    return tmp_path / "s.jsonl", tmp_path / "om.duckdb", before


def test_a_v1_file_migrated_by_pi_keeps_its_memory_at_every_point(maintained_v1):
    path, db, (before, recalled) = maintained_v1
    minted = [r[0] for r in q(db, "SELECT entry_id FROM entries ORDER BY entry_index")]
    rows = counts(db)
    assert migrate_file(path, seed=7)
    pi_ids = [json.loads(line)["id"] for line in path.read_text().splitlines()[1:]]
    assert set(pi_ids).isdisjoint(minted)

    [report] = ingest(workspace(db), [path]).files
    assert report.status == "rewritten" and report.replaced == []  # no loss reported
    [done] = report.followed
    records = q(db, "SELECT count(*) FROM ledger WHERE origin = 'pipeline'")[0][0]
    simulated = q(db, "SELECT count(*) FROM compactions WHERE origin = 'simulated'")[0][0]
    assert (done.how, done.from_version, done.entries, done.appended, done.ids_changed) == (
        "migrated", 1, len(minted), 0, len(minted))
    assert (done.records, done.records_reanchored, done.compactions, done.compactions_reanchored, done.orphaned) == (
        records, records, simulated, simulated, 0)
    assert done.describe().startswith(f"migrated by Pi (v1 → v3): its {len(minted)} entries got Pi's ids; "
                                      f"{records} of {records} memory record(s) and {simulated} of {simulated}")
    assert id_map(db) == dict(zip(minted, pi_ids))
    assert q(db, "SELECT count(*) FROM orphaned_records") == [(0,)]
    assert counts(db) == rows  # nothing added, nothing removed: the same records, re-anchored
    after, recalled_after = memory(db)
    assert len(after) == len(minted) and after == translate(before, id_map(db))  # every point of the branch
    assert recalled_after == translate(recalled, id_map(db))
    assert q(db, "SELECT count(*) FROM om_internal.replaced_entries") == [(0,)]
    notes = q(db, "SELECT kind, detail FROM ingest_notes WHERE kind IN ('migrated', 'rewritten')")
    assert notes == [("migrated", done.describe())]
    # the replay would start from the same session: om run replays nothing
    with dbmod.reading(db) as con:
        assert due_sessions(con, [SID], SETTINGS, "offline", True)[0] == []
    # and a replay anyway appends nothing (every stage finds its input answered or not due)
    con = dbmod.connect(db)
    try:
        replay_session(Workspace.on_connection(con, SETTINGS), SID, make_brain(ModelConfig(model="offline"), SETTINGS))
    finally:
        con.close()
    assert counts(db) == rows
    # a later ingest of the unchanged file changes nothing, and an append is an append
    assert ingest(workspace(db), [path]).files[0].status == "unchanged"


def test_entries_pi_appended_after_its_migration_are_new_entries(maintained_v1):
    path, db, (before, _) = maintained_v1
    n = len(q(db, "SELECT entry_id FROM entries"))
    migrate_file(path, seed=3)
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])["id"]
    extra = [{"type": "thinking_level_change", "id": "feedf00d", "parentId": last,
              "timestamp": "2026-03-01T10:00:00.000Z", "thinkingLevel": "high"}]
    path.write_text("\n".join(lines + [json.dumps(e) for e in extra]) + "\n")
    [report] = ingest(workspace(db), [path]).files
    [done] = report.followed
    assert (done.entries, done.appended, done.orphaned) == (n, 1, 0)
    after, _ = memory(db, every=4)
    # every fourth earlier point (the tip moved on: one point more)
    assert after[:-1] == translate(every(before, 4), id_map(db))[:-1]


def test_a_v2_file_migrated_by_pi_keeps_its_ids_and_its_memory(tmp_path):
    path = old_session(2).write(tmp_path / "s.jsonl")
    db = tmp_path / "om.duckdb"
    maintain(path, db)
    before = memory(db, every=4)
    rows = counts(db)
    migrate_file(path)
    assert '"role":"custom"' in path.read_text() and '"version":3' in path.read_text().splitlines()[0]
    [report] = ingest(workspace(db), [path]).files
    [done] = report.followed
    assert (done.how, done.from_version, done.ids_changed, done.orphaned) == ("migrated", 2, 0, 0)
    assert "kept their ids" in done.describe() and report.replaced == []
    assert memory(db, every=4) == before and counts(db) == rows and id_map(db) == {}
    assert q(db, "SELECT version FROM sessions") == [(3,)]
    with dbmod.reading(db) as con:
        assert due_sessions(con, [SID], SETTINGS, "offline", True)[0] == []


def test_a_rewrite_that_is_no_migration_stays_a_rewrite(maintained_v1):
    """New ids and one entry's text changed: not Pi's migration. The records stay, orphaned, named, and
    the warning says why it is no migration."""
    path, db, _ = maintained_v1
    records = q(db, "SELECT count(*) FROM ledger WHERE origin = 'pipeline'")[0][0]
    migrate_file(path, seed=5)
    lines = path.read_text().splitlines()
    entry = json.loads(lines[5])
    entry["message"]["content"] = [{"type": "text", "text": "an edited answer"}]
    lines[5] = json.dumps(entry)
    path.write_text("\n".join(lines) + "\n")
    [report] = ingest(workspace(db), [path]).files
    assert report.followed == []
    [loss] = report.replaced
    assert loss.not_a_migration == "entry 5 (" + q(db, "SELECT old_id FROM entry_id_map LIMIT 1")[0][0] + ") changed" \
        if id_map(db) else loss.not_a_migration.startswith("entry 5 (")
    assert "(not Pi's migration: entry 5 (" in loss.describe() and len(loss.orphaned_ledger_ids) == records
    assert q(db, "SELECT count(*) FROM orphaned_records") == [(records,)]
    assert id_map(db) == {} and q(db, "SELECT count(*) FROM om_internal.replaced_entries") == [(0,)]


def test_a_v1_file_rewritten_as_v1_is_no_migration(maintained_v1):
    """Another program re-wrote the v1 file with the same entries (other spacing): not Pi's migration
    (Pi writes v3); om mints the same ids again, so nothing is orphaned and nothing is mapped."""
    path, db, (before, _) = maintained_v1
    lines = [json.dumps(json.loads(line), separators=(",", ":")) for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")
    [report] = ingest(workspace(db), [path]).files
    assert report.status == "rewritten" and report.followed == []
    [loss] = report.replaced  # every line changed (its bytes), no entry lost, no record orphaned
    assert (loss.entries_lost, loss.orphaned_ledger_ids) == (0, [])
    assert loss.not_a_migration == "the file is still v1: Pi's migration writes v3"
    assert id_map(db) == {} and memory(db, every=4)[0] == every(before, 4)


def test_a_failed_ingest_keeps_what_it_needs_to_follow_the_migration_next_time(maintained_v1, monkeypatch):
    path, db, (before, _) = maintained_v1
    migrate_file(path, seed=11)
    import om_core.ingest.file_ingest as file_ingest

    def broken(*args, **kwargs):
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(file_ingest, "follow_migration", broken)
    [failed] = ingest(workspace(db), [path]).files
    assert failed.error and "the disk went away" in failed.error
    monkeypatch.undo()
    [report] = ingest(workspace(db), [path]).files
    assert report.followed and report.followed[0].orphaned == 0
    assert memory(db, every=4)[0] == translate(every(before, 4), id_map(db))


def test_a_fork_of_a_maintained_file_gets_its_memory(maintained_v1, tmp_path):
    """pi --fork of the file after Pi migrated it: the fork's entries are the source's; the source's
    records and simulated compactions are copied to the fork, which reads the same memory everywhere."""
    path, db, _ = maintained_v1
    migrate_file(path, seed=13)
    ingest(workspace(db), [path])
    source = memory(db, every=4)
    fork = fork_file(path, tmp_path / "fork" / "f.jsonl", FORK)
    [report] = ingest(workspace(db), [fork]).files
    [done] = report.followed
    records = q(db, "SELECT count(*) FROM ledger WHERE session_id = ? AND origin = 'pipeline'", [SID])[0][0]
    assert (done.how, done.from_session_id, done.ids_changed, done.records, done.orphaned) == (
        "forked", SID, 0, records, 0)
    assert done.describe().startswith(f"a copy of session {SID} (pi --fork)")
    assert memory(db, FORK, every=4) == translate(source, {SID: FORK})
    # once: a later ingest of the grown fork does not copy again
    with fork.open("a") as f:
        last = json.loads(fork.read_text().splitlines()[-1])["id"]
        f.write(json.dumps({"type": "label", "id": "1abe1abe", "parentId": last, "timestamp": "2026-03-01T11:00:00Z",
                            "targetId": last, "label": "here"}) + "\n")
    [again] = ingest(workspace(db), [fork]).files
    assert again.status == "appended" and again.followed == []
    assert q(db, "SELECT count(*) FROM ledger WHERE session_id = ?", [FORK]) == [(records,)]


def test_a_fork_of_a_v1_file_om_knows_before_pi_opened_it(maintained_v1, tmp_path):
    """pi --fork of a v1 file copies its entries raw under a v3 header: none of them has an id, so Pi's
    fork holds no tree to put memory on (pi-sessions.md §1.5); it is said so, nothing is copied."""
    path, db, _ = maintained_v1
    fork = fork_file(path, tmp_path / "fork" / "f.jsonl", FORK)
    [report] = ingest(workspace(db), [fork]).files
    assert report.followed == [] and report.entries_added == 0
    assert any(note.startswith(f"not a copy of session {SID}") for note in report.notes), report.notes
    assert q(db, "SELECT count(*) FROM ledger WHERE session_id = ?", [FORK]) == [(0,)]


def test_om_ingest_and_om_run_say_what_they_reanchored(maintained_once, tmp_path):
    from typer.testing import CliRunner

    from flows.cli.main import app
    from om_core.replay.plan import check_targets, ingest_targets, plan_run

    seen = {}
    for how in ("human", "json", "run"):
        folder = tmp_path / how
        folder.mkdir()
        path, db = folder / "s.jsonl", folder / "om.duckdb"
        shutil.copy(maintained_once[0], path)
        shutil.copy(maintained_once[1], db)
        with dbmod.writing(db) as con:
            for table in ("session_files", "sessions"):
                con.execute(f"UPDATE om_internal.{table} SET file_path = ?", [str(path.resolve())])
        migrate_file(path, seed=17)
        if how == "run":  # om run's plan: the line among its notes, and nothing to replay
            ws = Workspace.open(db, settings=SETTINGS)
            targets = check_targets(ws, [str(path)])
            plan = plan_run(ws, targets, ingest_targets(ws, targets), model="offline", drain=True)
            [note] = [n for n in plan.notes if "migrated by Pi" in n]
            assert note.startswith(f"{path.resolve()}: migrated by Pi (v1 → v3)") and plan.warnings == ()
            assert plan.session_ids == (SID,) and plan.due == ()
            continue
        result = CliRunner().invoke(app, ["--db", str(db), "ingest", str(path), *(["--json"] if how == "json" else [])],
                                    env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        seen[how] = result.stdout
    data = json.loads(seen["json"])
    [done] = data["reanchored"]
    assert done["path"] == str((tmp_path / "json" / "s.jsonl").resolve()) and done["how"] == "migrated"
    assert done["orphaned"] == 0 and done["records_reanchored"] == done["records"] > 0
    assert data["files"][0]["followed"][0] == {k: v for k, v in done.items() if k != "path"}
    assert data["rewrites"] == []
    line = [ln for ln in seen["human"].splitlines() if "migrated by Pi" in ln]
    assert line and f"migrated by Pi (v1 → v3): its {done['entries']} entries got Pi's ids; " \
        f"{done['records']} of {done['records']} memory record(s)" in line[0] and "none orphaned" in line[0]
    assert "warning" not in seen["human"]


# ------------------------------------------------------------------ the real sessions, the real Pi

REAL_SETTINGS = Settings()  # om's defaults, as the shared replay of before-compaction (conftest) has them


def real_pi_opens(path: Path, home: Path) -> None:
    """The real Pi 1.6.0 opens the file in RPC mode (no extension, its provider a dead port) and quits:
    opening it migrates it in place (pi-sessions.md §1.5)."""
    import pi_rpc

    why = pi_rpc.missing()
    if why:
        pytest.skip(why)
    pi_rpc.agent_dir(home, "http://127.0.0.1:9/v1", {})
    pi = pi_rpc.RpcPi(home, Path(json.loads(path.read_text().split("\n", 1)[0])["cwd"]), pi_rpc.os_env(),
                      session_file=path, extensions=())
    try:
        assert pi.call({"type": "get_state"})["success"]
    finally:
        pi.close()


def real_copy(name: str, folder: Path) -> Path:
    """A copy of a real session with its header's cwd moved to a folder that exists (Pi's RPC mode
    exits when it does not); the entries are the real ones."""
    lines = shared_session(name).read_bytes().split(b"\n")
    header = json.loads(lines[0])
    header["cwd"] = str(folder / "cwd")
    (folder / "cwd").mkdir(parents=True, exist_ok=True)
    lines[0] = json.dumps(header).encode()
    path = folder / name
    path.write_bytes(b"\n".join(lines))
    return path


@pytest.mark.parametrize("name", ["before-compaction.jsonl", "large-session.jsonl"])
def test_a_real_session_om_maintained_then_opened_in_the_real_pi_keeps_every_record(name, tmp_path, request):
    """A real v1 session, maintained by om (the offline baseline), opened by the real Pi 1.6.0 (which
    migrates it in place), read again: every record and simulated compaction re-anchored, none orphaned,
    the fold, projections, compactions and clocks equal at every 25th point and at the tip, recall equal.
    before-compaction's replay is the one the test run shares (conftest: before_compaction_maintained)."""
    import pi_rpc

    why = pi_rpc.missing()  # before om's half a minute of work on the session, not after it
    if why:
        pytest.skip(why)
    if name == "before-compaction.jsonl":
        path, db, _ = request.getfixturevalue("before_compaction_maintained")
    else:
        path = real_copy(name, tmp_path)
        db = tmp_path / "om.duckdb"
        ingest(workspace(db), [path])
    con = dbmod.connect(db)
    try:
        [sid] = [r[0] for r in con.execute("SELECT session_id FROM sessions").fetchall()]
        if name != "before-compaction.jsonl":
            replay_session(Workspace.on_connection(con, REAL_SETTINGS), sid,
                           make_brain(ModelConfig(model="offline"), REAL_SETTINGS))
        [(_, printed)] = fingerprints(con, [sid], REAL_SETTINGS, "offline", True).items()
        record_replay(con, sid, printed.now, "run-1")  # as om run records a complete replay
        before = memory_at_every_point(con, sid, REAL_SETTINGS, every=25), recalls(con, sid)
        minted = [r[0] for r in con.execute("SELECT entry_id FROM entries ORDER BY entry_index").fetchall()]
        # what `om compact` answers at Pi's cut, compacting at the tip (the extension's question)
        old_leaf = minted[-1]
        cut = compaction_cut_point(branch_for_cut_point(con, sid, old_leaf), REAL_SETTINGS.keepRecentTokens)
    finally:
        con.close()
    answered = compact(Workspace.open(db, settings=REAL_SETTINGS), sid, cut.firstKeptEntryId, old_leaf)
    assert answered.summary, "no memory before Pi's cut: nothing to compare"
    records = q(db, "SELECT count(*) FROM ledger WHERE origin = 'pipeline'")[0][0]
    simulated = q(db, "SELECT count(*) FROM compactions WHERE origin = 'simulated'")[0][0]
    assert records > 10 and simulated > 0
    real_pi_opens(path, tmp_path / "home")
    rewritten = path.read_text().splitlines()
    assert json.loads(rewritten[0])["version"] == 3 and "id" in json.loads(rewritten[1])
    [report] = ingest(workspace(db), [path]).files
    [done] = report.followed
    assert (done.how, done.entries, done.ids_changed, done.records, done.records_reanchored, done.compactions,
            done.compactions_reanchored, done.orphaned) == (
        "migrated", len(minted), len(minted), records, records, simulated, simulated, 0)
    assert q(db, "SELECT count(*) FROM orphaned_records") == [(0,)]
    con = dbmod.connect(db)
    try:
        mapping = dict(con.execute("SELECT old_id, new_id FROM entry_id_map").fetchall())
        assert sorted(mapping) == sorted(minted)
        after = memory_at_every_point(con, sid, REAL_SETTINGS, every=25), recalls(con, sid)
        assert after == translate(before, mapping)
        assert due_sessions(con, [sid], REAL_SETTINGS, "offline", True)[0] == []  # om run: nothing to replay
        new_cut = compaction_cut_point(branch_for_cut_point(con, sid, mapping[old_leaf]), REAL_SETTINGS.keepRecentTokens)
    finally:
        con.close()
    # the om side of the extension's compaction in Pi: at Pi's cut (the same entry, Pi's id now), the
    # answer is om's memory, equal to `om compact` before; recall of an id in it finds its evidence
    assert new_cut.firstKeptEntryId == mapping[cut.firstKeptEntryId]
    ws = Workspace.open(db, settings=REAL_SETTINGS)
    live = compact_live(ws, CompactRequest(session_file=str(path), leaf=mapping[old_leaf],
                                           first_kept_entry_id=new_cut.firstKeptEntryId, tokens_before=1))
    assert live.compaction is not None and live.compaction["summary"] == answered.summary
    assert live.compaction["details"] == translate(answered.details(), mapping)
    first = (answered.reflectionIds + answered.observationIds)[0]
    found = recall_live(ws, RecallRequest(session_file=str(path), leaf=mapping[old_leaf], id=first))
    assert found["details"]["status"] == "ok" and found["details"]["memoryId"] == first, found
