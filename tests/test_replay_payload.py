"""One writer, many workers (om_core.replay.payload, om_core.replay.engine): a session's replay on an
in-memory copy of its rows, its payload carried across a process boundary and its rows committed by
the writer, appends exactly what the one-call replay (``replay_session``) appends, and the commit of
those rows is idempotent and keeps the ledger's order."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import duckdb
import pytest
from builders import SessionBuilder
from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI

from conftest import workspace
from flows.storage import PrefectStageResults, dump_stage_result, load_stage_result, stage_result_name
from om_core.ingest import ingest
from om_core.replay.engine import commit_replay, replay_payload, replay_session
from om_core.replay.payload import payload_workspace, read_session_payload
from om_core.store.runs import mark_abandoned_runs, start_run
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig, RunGuards, make_brain
from om_core.store.workspace import Workspace

SETTINGS = Settings(observeAfterTokens=150, reflectAfterTokens=300, compactAfterTokens=700, keepRecentTokens=200,
                    observerChunkMaxTokens=400, observationsPoolMaxTokens=40, observationsPoolTargetTokens=20)
SID = "0000000a-aaaa-bbbb-cccc-dddddddddddd"

LEDGER = ("SELECT kind, covers_up_to_id, anchor_entry_id, stage_key, ledger_id FROM ledger "
          "WHERE origin = 'pipeline' ORDER BY append_seq")
ITEMS = "SELECT ledger_id, item_index, obs_id, content FROM observations ORDER BY ALL"
FOLDS = ("SELECT compaction_id, anchor_entry_id, first_kept_entry_id, folded, full_fold, summary FROM om_internal.compactions "
         "WHERE origin = 'simulated' ORDER BY append_seq")


def session(tmp_path, with_extension_record: bool = False):
    b = SessionBuilder(session_id=SID, start="2026-03-01T09:00:00")
    b.work_turns(5, "alpha")
    if with_extension_record:  # a record the extension itself wrote, in the middle of the branch
        b.custom("om.observations.recorded", {"observations": [{
            "id": "0123456789ab", "content": "User wants alpha first.", "timestamp": "2026-03-01 09:00",
            "relevance": "high", "sourceEntryIds": [b.entries[1]["id"]], "tokenCount": 9}],
            "coversUpToId": b.entries[2]["id"]})
    b.work_turns(5, "beta")
    path = b.write(tmp_path / "s.jsonl")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [path])
    return db


def rows(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def replay_now(db, run_id):
    """The one call: payload, replay, commit, exactly-once through the database's stage_results."""
    result = replay_session(Workspace.open(db, settings=SETTINGS), SID, make_brain(ModelConfig(model="offline"),
                                                                                 SETTINGS), run_id=run_id)
    assert result.error is None and result.complete, result.error


class KeptResults:
    """StageResults in a dict, in the flow's format (flows.storage): exactly-once across replays."""

    def __init__(self) -> None:
        self.kept: dict[str, bytes] = {}

    def get(self, prepared):
        return load_stage_result(prepared, self.kept[prepared.stage_key]) if prepared.stage_key in self.kept else None

    def put(self, prepared, computed):
        self.kept[prepared.stage_key] = dump_stage_result(prepared, computed)


def replay_task(db, run_id, brain=None, results=None, commit=True):
    """What the flow and its replay task do, without Prefect: read the payload, run the replay engine
    (om_core.replay.engine, the replay task's own code) on it, commit the rows."""
    with Workspace.open(db, settings=SETTINGS).read() as con:
        payload = read_session_payload(con, SID)
    payload = pickle.loads(pickle.dumps(payload))  # it crosses a process boundary on a cluster
    brain = brain or make_brain(ModelConfig(model="offline"), SETTINGS)
    result = replay_payload(payload, SETTINGS, brain, results or KeptResults(), drain=True, run_id=run_id)
    result = pickle.loads(pickle.dumps(result))  # and so does its result
    assert result.error is None, result.error
    if commit:
        with Workspace.open(db, settings=SETTINGS).write() as con:
            commit_replay(con, result)
    return result


def replay_on_payload(db, run_id):
    return replay_task(db, run_id)


@pytest.mark.parametrize("with_extension_record", [False, True])
def test_a_replay_task_appends_what_a_replay_now_appends(tmp_path, with_extension_record):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    direct = session(tmp_path / "a", with_extension_record)
    via_payload = session(tmp_path / "b", with_extension_record)
    replay_now(direct, "run-direct")
    result = replay_on_payload(via_payload, "run-payload").rows
    assert result.rows["om_internal.ledger"] > 3 and result.rows["om_internal.compactions"] >= 1
    assert rows(via_payload, LEDGER) == rows(direct, LEDGER)  # record for record, in ledger order
    assert rows(via_payload, ITEMS) == rows(direct, ITEMS)
    assert rows(via_payload, FOLDS) == rows(direct, FOLDS)
    # the full memory the views fold from both databases is the same
    leaf = rows(direct, f"SELECT leaf_id FROM sessions WHERE session_id = '{SID}'")[0][0]
    fold = f"SELECT * FROM full_projection('{SID}', '{leaf}', '{leaf}') ORDER BY ALL"
    assert rows(via_payload, fold) == rows(direct, fold)
    # every appended row carries the run id, and stage runs come along
    assert rows(via_payload, "SELECT DISTINCT run_id FROM ledger WHERE origin = 'pipeline'") == [("run-payload",)]
    assert rows(via_payload, "SELECT count(*) FROM stages WHERE run_id = 'run-payload'")[0][0] > 0


def test_a_result_committed_twice_changes_nothing(tmp_path):
    db = session(tmp_path)
    result = replay_on_payload(db, "run-1")
    before = (rows(db, LEDGER), rows(db, ITEMS), rows(db, FOLDS), rows(db, "SELECT count(*) FROM stages"))
    with Workspace.open(db, settings=SETTINGS).write() as con:
        written = commit_replay(con, result)
    assert "om_internal.ledger" not in written and "om_internal.compactions" not in written
    assert (rows(db, LEDGER), rows(db, ITEMS), rows(db, FOLDS), rows(db, "SELECT count(*) FROM stages")) == before


def test_a_second_replay_of_a_replayed_session_appends_nothing(tmp_path):
    db = session(tmp_path)
    replay_on_payload(db, "run-1")
    before = rows(db, LEDGER)
    again = replay_on_payload(db, "run-2").rows
    assert again.rows["om_internal.ledger"] == 0 and again.rows["om_internal.compactions"] == 0
    assert rows(db, LEDGER) == before


def test_new_records_come_after_everything_already_in_the_ledger(tmp_path):
    """append_seq is renumbered inside the task and taken fresh from the database's sequence on commit."""
    db = session(tmp_path, with_extension_record=True)
    # another session's records push the database's sequence far ahead of this session's
    other = SessionBuilder(session_id="0000000b-aaaa-bbbb-cccc-dddddddddddd", start="2026-03-02T09:00:00")
    other.work_turns(4, "gamma")
    ingest(workspace(db), [other.write(tmp_path / "other.jsonl")])
    imported = rows(db, f"SELECT max(append_seq) FROM ledger WHERE session_id = '{SID}'")[0][0]
    replay_on_payload(db, "run-1")
    seqs = [r[0] for r in rows(db, f"SELECT append_seq FROM ledger WHERE session_id = '{SID}' "
                                   "AND origin = 'pipeline' ORDER BY append_seq")]
    assert seqs and min(seqs) > imported and len(set(seqs)) == len(seqs)
    fold_seqs = [r[0] for r in rows(db, "SELECT append_seq FROM om_internal.compactions WHERE origin = 'simulated'")]
    assert not set(fold_seqs) & set(seqs)


def test_the_payload_holds_only_the_sessions_rows(tmp_path):
    db = session(tmp_path, with_extension_record=True)
    other = SessionBuilder(session_id="0000000b-aaaa-bbbb-cccc-dddddddddddd", start="2026-03-02T09:00:00")
    other.work_turns(4, "gamma")
    ingest(workspace(db), [other.write(tmp_path / "other.jsonl")])
    with Workspace.open(db, settings=SETTINGS).read() as con:
        payload = read_session_payload(con, SID)
    assert payload.rows["om_internal.sessions"] == 1 and payload.rows["om_internal.ledger"] == 1
    assert payload.rows["om_internal.entries"] == rows(db, f"SELECT count(*) FROM entries WHERE session_id = '{SID}'")[0][0]
    ws = payload_workspace(payload, SETTINGS)
    try:
        with ws.read() as con:
            assert con.execute("SELECT DISTINCT session_id FROM entries").fetchall() == [(SID,)]
    finally:
        ws.close()


def test_a_run_whose_process_is_gone_is_marked_abandoned(tmp_path):
    db = session(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    with Workspace.open(db, settings=SETTINGS).write() as con:
        start_run(con, "run-dead", "run", {})
        con.execute("UPDATE om_internal.runs SET pid = ? WHERE run_id = 'run-dead'", [dead_pid])
        assert mark_abandoned_runs(con) == ["run-dead"]
        con.execute("UPDATE om_internal.runs SET status = 'running' WHERE run_id = 'run-dead'")
        start_run(con, "run-alive", "run", {})  # a run start marks what is gone; this process is alive
        assert mark_abandoned_runs(con) == []
    status = dict(rows(db, "SELECT run_id, status FROM runs WHERE run_id LIKE 'run-%'"))
    assert status == {"run-dead": "abandoned", "run-alive": "running"}
    assert os.getpid() == rows(db, "SELECT pid FROM runs WHERE run_id = 'run-alive'")[0][0]


def test_a_workspace_resolves_settings_from_every_source(tmp_path, isolated_home, monkeypatch):
    (tmp_path / "om.toml").write_text("observeAfterTokens = 1234\n")
    monkeypatch.setenv("OM_REFLECT_AFTER_TOKENS", "4321")
    ws = Workspace.open(tmp_path / "om.duckdb")
    assert (ws.settings.observeAfterTokens, ws.settings.reflectAfterTokens) == (1234, 4321)
    spec = ws.spec()
    assert Workspace.from_spec(spec.model_dump()).settings == ws.settings  # what flows and deployments carry


def test_a_replay_task_lost_before_its_commit_is_redone_without_a_model_call(tmp_path):
    """The replay engine's exactly-once (the flow's, with its results in Prefect's result storage): a
    replay whose rows were never committed (a worker lost, the flow killed) is replayed again, and
    every stage it computed comes from the results, not from the model; the ledger is a clean run's."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    lost, clean = session(tmp_path / "a"), session(tmp_path / "b")
    config = ModelConfig(model="openai/fake-model", api_key="not-needed")
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        config.api_base = server.base_url
        replay_task(clean, "run-clean", make_brain(config, SETTINGS))
        asked = len(server.requests)
    results = PrefectStageResults(tmp_path / "a" / "om.duckdb.stage-results")  # the flow's own, on a folder
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        config.api_base = server.base_url
        replay_task(lost, "run-1", make_brain(config, SETTINGS), results, commit=False)
        kept = sorted(results.storage.iterdir())
        assert len(server.requests) == asked and len(kept) > 3
        assert all(p.suffix == ".json" and p.stat().st_mode & 0o777 == 0o600 for p in kept)
        assert results.storage.stat().st_mode & 0o777 == 0o700  # this user's only
        assert rows(lost, LEDGER) == []  # nothing reached the database
        replay_task(lost, "run-2", make_brain(config, SETTINGS), results)
        assert len(server.requests) == asked  # the rerun called no model
    strip = lambda found: [r[:4] for r in found]  # noqa: E731 - ledger ids are random per run
    assert strip(rows(lost, LEDGER)) == strip(rows(clean, LEDGER))


class _Bomb:
    """Unpickled, it leaves a file: what a payload planted in the result storage would run."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_pickled_or_foreign_stage_result_is_never_run_and_the_stage_is_computed_again(tmp_path):
    """The result storage of an interrupted run (rows not committed) is replaced by
    what an attacker would plant under each stage key: Prefect's own pickled result record (what the
    flow wrote before, cloudpickle: the name the old form used), raw pickle bytes under the JSON name,
    another stage's result, and text that does not parse. The rerun unpickles nothing (no marker),
    treats each as a miss, asks the model again for exactly those stages, and ends at a clean run's
    ledger (exactly-once still holds through the ledger)."""
    import pickle

    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultStore

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    attacked, clean = session(tmp_path / "a"), session(tmp_path / "b")
    config = ModelConfig(model="openai/fake-model", api_key="not-needed")
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        config.api_base = server.base_url
        replay_task(clean, "run-clean", make_brain(config, SETTINGS))
        asked = len(server.requests)
    folder = tmp_path / "a" / "om.duckdb.stage-results"
    results = PrefectStageResults(folder)
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        config.api_base = server.base_url
        replay_task(attacked, "run-1", make_brain(config, SETTINGS), results, commit=False)
    kept = sorted(folder.glob("*.json"))
    assert len(kept) > 3
    marker = tmp_path / "code-ran"
    store = ResultStore(result_storage=LocalFileSystem(basepath=str(folder)), cache_result_in_memory=False)
    other = kept[-1].read_bytes()
    for n, path in enumerate(kept):
        key = path.name.removesuffix(".json")
        assert path.name == stage_result_name(key)
        store.write(_Bomb(marker), key=key)  # Prefect's record, its serializer cloudpickle, under the bare key
        planted = [pickle.dumps(_Bomb(marker)), other, b'{"format": "om-stage-result/1", "outcome": [[[',
                   b"\x80\x04not json"][n % 4]
        if path != kept[-1]:
            path.write_bytes(planted)
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        config.api_base = server.base_url
        replay_task(attacked, "run-2", make_brain(config, SETTINGS), results)
        assert not marker.exists(), "a planted pickle was unpickled"
        # every planted stage was computed again; the one result left as it was came from the storage
        assert 0 < len(server.requests) < asked
    strip = lambda found: [r[:4] for r in found]  # noqa: E731 - ledger ids are random per run
    assert strip(rows(attacked, LEDGER)) == strip(rows(clean, LEDGER))


def test_a_stage_result_round_trips_through_its_json_with_its_model_calls(tmp_path):
    """The format keeps what a resumed run needs: the outcome with each model call (run id, tokens,
    texts) and the accepted payload, equal after the round trip."""
    db = session(tmp_path)
    config = ModelConfig(model="openai/fake-model", api_key="not-needed")
    results = KeptResults()
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        config.api_base = server.base_url
        replay_task(db, "run-1", make_brain(config, SETTINGS), results, commit=False)
    seen = []

    class Spy(KeptResults):
        def get(self, prepared):
            found = super().get(prepared)
            seen.append((prepared, found))
            return found

    spy = Spy()
    spy.kept = results.kept
    replay_task(db, "run-2", make_brain(ModelConfig(model="openai/fake-model", api_base="http://127.0.0.1:9", api_key="x"),
                                        SETTINGS), spy)
    assert seen and all(found is not None for _, found in seen)
    for prepared, found in seen:
        assert found.outcome.calls and all(c.run_id == "run-1" and c.status == "ok" for c in found.outcome.calls)
        assert found.outcome.stage_key == prepared.stage_key and found.payload is not None
        assert load_stage_result(prepared, dump_stage_result(prepared, found)) == found


class FullDisk(KeptResults):
    """Result storage on a disk that fills after ``room`` results."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room
        self.refused = 0

    def put(self, prepared, computed):
        if len(self.kept) >= self.room:
            self.refused += 1
            raise OSError(28, "No space left on device")
        super().put(prepared, computed)


def test_a_result_storage_write_failure_stops_every_later_stage_at_the_stage_runner(tmp_path):
    """In the one stage runner, the first stage whose result cannot be kept fails
    (its model calls stay recorded), the run's breaker trips with the storage error, and no stage
    starts after it (RunStopped at the runner's check: the replay ends 'stopped')."""
    db = session(tmp_path)
    with Workspace.open(db, settings=SETTINGS).read() as con:
        payload = read_session_payload(con, SID)
    guards = RunGuards()
    brain = make_brain(ModelConfig(model="offline"), SETTINGS, guards)
    results = FullDisk(room=1)
    result = replay_payload(payload, SETTINGS, brain, results, drain=True, run_id="run-full", guards=guards)
    assert results.refused == 1  # no stage was computed after the failed write
    assert guards.breaker.tripped and "No space left on device" in str(guards.breaker.reason)
    assert [f for branch in result.branches for f in branch.failures], result.branches
    # the run's next stage (here: another replay task of the run) is refused at the runner's check
    again = replay_payload(payload, SETTINGS, brain, results, drain=True, run_id="run-full", guards=guards)
    assert again.stopped and "No space left on device" in again.error and results.refused == 1
    with Workspace.open(db, settings=SETTINGS).write() as con:
        commit_replay(con, result)
    stages = rows(db, "SELECT stage, outcome, error FROM om_internal.stages WHERE run_id = 'run-full' "
                      "ORDER BY started_at")
    assert [outcome for _, outcome, _ in stages] == ["recorded", "failed"], stages  # nothing after the failure
    assert "No space left on device" in stages[-1][2]
