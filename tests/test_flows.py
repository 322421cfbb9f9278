"""The Prefect pipeline end to end: several sessions against the fake model server with injected
429s, a kill -9 and resume, a rerun that changes nothing, and the same flow on a local Dask cluster.

Prefect's ephemeral API is started once for the test session (the ``prefect_api`` fixture)."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from fake_brains import ScriptedWorkers, stage_key
from fake_openai import FakeOpenAI, http_error

from conftest import workspace
from flows.run_result import RunResult
from om_core.ledger.records import parse_folded, parse_record
from om_core.settings import Settings

pytestmark = pytest.mark.prefect

SETTINGS = Settings(observeAfterTokens=150, reflectAfterTokens=300, compactAfterTokens=700, keepRecentTokens=200,
                    observerChunkMaxTokens=400, observationsPoolMaxTokens=40, observationsPoolTargetTokens=20)
SETTINGS_ENV = {"OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300", "OM_COMPACT_AFTER_TOKENS": "700",
                "OM_KEEP_RECENT_TOKENS": "200", "OM_OBSERVER_CHUNK_MAX_TOKENS": "400",
                "OM_OBSERVATIONS_POOL_MAX_TOKENS": "40", "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20"}
FAST_RETRIES = {"attempts": 6, "base_seconds": 0.02, "max_seconds": 0.4}  # the model call's RetryPolicy


def make_sessions(folder: Path, count: int = 4) -> list[Path]:
    paths = []
    for n in range(count):
        b = SessionBuilder(session_id=f"0000000{n}-aaaa-bbbb-cccc-dddddddddddd", start=f"2026-03-0{n + 1}T09:00:00")
        b.work_turns(6 + n, f"topic{n}")
        if n == 1:  # a branch: go back two turns and continue differently
            fork = b.entries[-9]["id"]
            b.go(fork)
            b.branch_summary("Tried another approach first; it was abandoned.")
            b.work_turns(3, "detour")
        paths.append(b.write(folder / f"s{n}.jsonl"))
    return paths


def snapshot(db: Path) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {
            "records": con.execute("SELECT session_id, kind, covers_up_to_id, anchor_entry_id, stage_key FROM ledger "
                                   "ORDER BY ALL").fetchall(),
            "observations": con.execute("SELECT session_id, obs_id FROM observations ORDER BY ALL").fetchall(),
            "compactions": con.execute("SELECT session_id, compaction_id, first_kept_entry_id, folded, full_fold "
                                       "FROM compactions WHERE origin = 'simulated' ORDER BY ALL").fetchall(),
        }
    finally:
        con.close()


def run_flow(paths, db: Path, server: FakeOpenAI | None, runner: str = "threads", concurrency: int = 4) -> RunResult:
    from flows.runner import run_pipeline

    model = ({"model": "openai/fake-model", "api_base": server.base_url, "retry": FAST_RETRIES} if server
             else {"model": "offline"})
    return run_pipeline([str(p) for p in paths], db_path=str(db), model=model, settings=SETTINGS.model_dump(),
                        concurrency=concurrency, runner=runner)


def assert_ledger_sound(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        # no duplicate records: one record per stage input
        dup = con.execute("SELECT stage_key, count(*) FROM ledger WHERE origin = 'pipeline' GROUP BY ALL "
                          "HAVING count(*) > 1").fetchall()
        assert dup == []
        # every record valid, exactly as the wire format demands
        for session_id, ledger_id, kind in con.execute("SELECT session_id, ledger_id, kind FROM ledger").fetchall():
            if kind == "om.observations.recorded":
                items = con.execute("SELECT obs_id, content, ts, relevance, source_entry_ids, token_count FROM observations "
                                    "WHERE session_id = ? AND ledger_id = ? ORDER BY item_index", [session_id, ledger_id]).fetchall()
                data = {"observations": [{"id": i, "content": c, "timestamp": t, "relevance": r, "sourceEntryIds": s,
                                          "tokenCount": n} for i, c, t, r, s, n in items]}
            elif kind == "om.reflections.recorded":
                items = con.execute("SELECT refl_id, content, supporting_observation_ids, token_count FROM reflections "
                                    "WHERE session_id = ? AND ledger_id = ? ORDER BY item_index", [session_id, ledger_id]).fetchall()
                data = {"reflections": [{"id": i, "content": c, "supportingObservationIds": s, "tokenCount": n}
                                        for i, c, s, n in items]}
            else:
                data = {"observationIds": [r[0] for r in con.execute(
                    "SELECT obs_id FROM drops WHERE session_id = ? AND ledger_id = ? ORDER BY item_index",
                    [session_id, ledger_id]).fetchall()]}
            covers = con.execute("SELECT covers_up_to_id FROM ledger WHERE session_id = ? AND ledger_id = ?",
                                 [session_id, ledger_id]).fetchall()[0][0]
            assert parse_record(kind, {**data, "coversUpToId": covers}) is not None, (kind, data)
        # observation watermarks strictly increase along every branch
        for session_id, leaf in con.execute("SELECT DISTINCT session_id, leaf_id FROM branch_entries").fetchall():
            marks = [r[0] for r in con.execute(
                "SELECT wm_pos FROM branch_records(?, ?) WHERE kind = 'om.observations.recorded' ORDER BY rec_order",
                [session_id, leaf]).fetchall()]
            assert marks == sorted(set(marks)), (session_id, leaf, marks)
        # simulated compactions carry om.folded details (or say why not)
        folds = con.execute("SELECT session_id, compaction_id, folded, full_fold, note FROM compactions "
                            "WHERE origin = 'simulated'").fetchall()
        assert folds, "the replay simulated no compaction"
        for session_id, compaction_id, folded, full_fold, note in folds:
            if not folded:
                assert note and "native" in note
                continue
            items = con.execute("SELECT item_kind, id, content, ts, relevance, source_entry_ids, "
                                "supporting_observation_ids, token_count FROM compaction_items "
                                "WHERE session_id = ? AND compaction_id = ? ORDER BY item_kind, item_index",
                                [session_id, compaction_id]).fetchall()
            details = {"type": "om.folded", "version": 1, "fullFold": full_fold,
                       "observations": [{"id": i, "content": c, "timestamp": t, "relevance": r, "sourceEntryIds": s,
                                         "tokenCount": n} for k, i, c, t, r, s, _, n in items if k == "observation"],
                       "reflections": [{"id": i, "content": c, "supportingObservationIds": p, "tokenCount": n}
                                       for k, i, c, _, _, _, p, n in items if k == "reflection"]}
            assert parse_folded(details) is not None
    finally:
        con.close()


def test_pipeline_with_429s_then_a_rerun_changes_nothing(prefect_api, tmp_path):
    paths = make_sessions(tmp_path / "sessions")
    db = tmp_path / "om.duckdb"
    script = ScriptedWorkers(fail_every=7)
    with FakeOpenAI(responder=script) as server:
        summary = run_flow(paths, db, server)
        assert summary.errors == [] and all(s.error is None for s in summary.sessions)
        assert script.failed > 0  # 429s were injected and retried
        first = snapshot(db)
        assert len(first["observations"]) > 10
        # no repeated model call for a computed stage (a 429 mid-stage retries that unfinished stage)
        assert script.completed and script.asked_after_completion == []
        starts = [stage_key(r) for r in server.requests if r["messages"][-1]["role"] != "tool"]
        assert_ledger_sound(db)
        requests_before = len(server.requests)
        again = run_flow(paths, db, server)
        assert all(s.error is None for s in again.sessions)
        assert len(server.requests) == requests_before  # the rerun called no model
        assert snapshot(db) == first  # and appended nothing
        assert starts  # the scripted model really was used


def om_run_command(sessions: Path, server: FakeOpenAI, *extra: str) -> list[str]:
    """`om run` of the sessions one stage at a time, on a model litellm has a price for, served by the
    fake server."""
    return [sys.executable, "-m", "flows.cli", "run", str(sessions), "--concurrency", "1", "--model",
            "openai/gpt-4o-mini", "--api-base", server.base_url, *extra]


def om_env(prefect_api: str, db: Path) -> dict[str, str]:
    return {**os.environ, **SETTINGS_ENV, "PREFECT_API_URL": prefect_api, "OM_DB": str(db)}


@pytest.fixture(scope="module")
def clean_run(prefect_api, tmp_path_factory) -> dict:
    """The uninterrupted `om run` of three sessions that the kill -9 and --max-cost tests' runs must end
    at: run once for the module (the tests run on the same session files, which they only read)."""
    root = tmp_path_factory.mktemp("clean-run")
    make_sessions(root / "sessions", count=3)
    db = root / "clean.duckdb"
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        done = subprocess.run(om_run_command(root / "sessions", server, "--json"), env=om_env(prefect_api, db),
                              capture_output=True, text=True, timeout=300)
        requests = len(server.requests)
    assert done.returncode == 0, done.stderr[-2000:]
    # a stage's kept result goes once its record is committed; a finished run leaves none
    assert not list(Path(f"{db}.stage-results").glob("*.json"))
    return {"sessions": root / "sessions", "requests": requests, "cost": json.loads(done.stdout)["cost"],
            "snapshot": snapshot(db)}


def test_kill_9_then_resume(prefect_api, tmp_path, clean_run):
    db = tmp_path / "om.duckdb"
    env = om_env(prefect_api, db)
    script = ScriptedWorkers()
    victim: dict = {}

    def responder(body):
        if len(script.answered) == 9 and "proc" in victim and not victim.get("killed"):
            victim["killed"] = True
            os.kill(victim["proc"].pid, signal.SIGKILL)  # kill -9 while a stage waits for the model
            victim["proc"].wait()
            return json_error(500)  # nobody is left to read it; not an answer
        return script(body)

    with FakeOpenAI(responder=responder) as server:
        command = om_run_command(clean_run["sessions"], server, "--json")
        victim["proc"] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        victim["proc"].wait(timeout=300)
        assert victim.get("killed"), "the run finished before the kill"
        assert victim["proc"].returncode == -signal.SIGKILL
        computed_before = set(script.completed)
        answered_before = len(script.answered)
        resumed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        after = script.answered[answered_before:]
        assert not computed_before & set(after), "a stage computed before the kill was asked again"
        assert script.asked_after_completion == []
        assert_ledger_sound(db)
        resumed_state = snapshot(db)
        # the results the killed run kept served the resumed run, and went once their records were committed
        assert not list(Path(f"{db}.stage-results").glob("*.json"))
    # the interrupted-and-resumed run ends where an uninterrupted one does
    clean_state = clean_run["snapshot"]
    assert [r[:4] for r in resumed_state["records"]] == [r[:4] for r in clean_state["records"]]
    assert resumed_state["observations"] == clean_state["observations"]


def test_max_cost_stops_om_run_and_a_rerun_resumes_it(prefect_api, tmp_path, clean_run):
    """`om run --max-cost` prints the estimate, stops before a call could pass the limit (exit 4),
    keeps nothing half-done, and a plain rerun ends where an unlimited run does."""
    db = tmp_path / "om.duckdb"
    clean_requests, clean_cost = clean_run["requests"], clean_run["cost"]
    assert clean_cost["cost_usd"] > 0 and clean_cost["stopped_by_max_cost"] is False
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        # one call's worst case at gpt-4o-mini's price is about $0.0015: this allows a few calls only
        stopped = subprocess.run(om_run_command(clean_run["sessions"], server, "--max-cost", "0.0025"),
                                 env=om_env(prefect_api, db), capture_output=True, text=True, timeout=300)
        assert stopped.returncode == 4, stopped.stderr[-2000:]
        assert "estimate:" in stopped.stderr and "stops before $0.0025" in stopped.stderr
        assert "stopped by --max-cost" in stopped.stderr and "rerun to resume" in stopped.stderr
        first_requests = len(server.requests)
        assert 0 < first_requests < clean_requests
        con = duckdb.connect(str(db), read_only=True)
        spent = con.execute("SELECT sum(cost) FROM llm_calls").fetchone()[0]
        con.close()
        assert 0 < spent <= 0.0025
        assert 0 < len(snapshot(db)["records"]) < len(clean_run["snapshot"]["records"])
        resumed = subprocess.run(om_run_command(clean_run["sessions"], server, "--json"), env=om_env(prefect_api, db),
                                 capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert len(server.requests) == clean_requests  # no stage was asked twice
    assert_ledger_sound(db)
    assert [r[:5] for r in snapshot(db)["records"]] == [r[:5] for r in clean_run["snapshot"]["records"]]


def test_a_failing_session_does_not_stop_the_others(prefect_api, tmp_path):
    make_sessions(tmp_path / "sessions", count=3)
    # named, not found by the walk: a file with no session header is then an error for that file
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"type": "message"}\nnot json\n')
    db = tmp_path / "om.duckdb"
    script = ScriptedWorkers()

    def responder(body):
        if "topic2" in body["messages"][1]["content"]:
            # a permanent error of this session's requests only (a 401 would stop the whole run)
            return http_error(400, "messages[1].content is malformed")
        return script(body)

    with FakeOpenAI(responder=responder) as server:
        summary = run_flow([tmp_path / "sessions", broken], db, server)
    assert any("broken.jsonl" in e for e in summary.errors)
    con = duckdb.connect(str(db), read_only=True)
    per_session = dict(con.execute("SELECT session_id, count(*) FROM observations GROUP BY ALL").fetchall())
    failed = con.execute("SELECT DISTINCT session_id, error_kind FROM stages WHERE outcome = 'failed'").fetchall()
    con.close()
    assert failed == [("00000002-aaaa-bbbb-cccc-dddddddddddd", "permanent")]
    assert per_session.get("00000000-aaaa-bbbb-cccc-dddddddddddd") and per_session.get("00000001-aaaa-bbbb-cccc-dddddddddddd")
    from om_core.usecases.status import status

    shown = status(workspace(db), "00000002")
    assert shown.last_errors and "BadRequestError" in shown.last_errors[0]["detail"]


def json_error(status: int):
    from fake_openai import http_error

    return http_error(status, "invalid api key")


def test_same_flow_on_a_local_dask_cluster(prefect_api, tmp_path):
    paths = make_sessions(tmp_path / "sessions", count=2)
    db = tmp_path / "om.duckdb"
    summary = run_flow(paths, db, None, runner="dask", concurrency=2)
    assert summary.errors == [] and all(s.error is None for s in summary.sessions)
    assert_ledger_sound(db)
    threads_db = tmp_path / "threads.duckdb"
    run_flow(paths, threads_db, None, runner="threads", concurrency=2)
    assert snapshot(db)["observations"] == snapshot(threads_db)["observations"]


@pytest.mark.real_sessions
def test_om_run_on_a_real_session_with_the_offline_baseline(prefect_api, tmp_path, before_compaction):
    from typer.testing import CliRunner

    from flows.cli.main import app

    db = tmp_path / "om.duckdb"
    result = CliRunner().invoke(app, ["--db", str(db), "run", str(before_compaction), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    [row] = summary["sessions"]
    assert row["observations"] > 50 and row["reflections"] > 0 and row["compactions"] >= 2
    assert_ledger_sound(db)


def test_om_run_on_a_full_disk_ends_with_one_line(prefect_api, tmp_path, small_fs):
    from builders import incompressible_sessions

    mount, _ = small_fs
    incompressible_sessions(tmp_path / "in")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OM_")}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(mount / "om.duckdb"), "run",
                           str(tmp_path / "in")], env={**env, "PREFECT_API_URL": prefect_api, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=300)  # the timeout: nothing waits for ever
    assert done.returncode == 1, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip() and "offline baseline" not in line]
    assert len(lines) == 1, done.stderr[-3000:]
    assert str(mount) in lines[0] and "No space left on device" in lines[0]
    con = duckdb.connect(str(mount / "om.duckdb"), read_only=True)  # what was committed is readable
    try:
        assert con.execute("SELECT count(*) FROM sessions").fetchone()[0] > 0
    finally:
        con.close()


def test_the_flows_and_deployments_take_exclude_globs(tmp_path):
    from flows.deployments import archive_deployment, maintenance_deployment
    from flows.pipeline import maintain_sessions

    root = tmp_path / "live"
    make_sessions(root, count=1)
    (root / "tool.log.jsonl").write_text('{"level": "info"}\n')
    db = str(tmp_path / "om.duckdb")
    passive = Settings(passive=True).model_dump()  # ingest only: no task is submitted, no API is needed
    seen = lambda result: sorted(Path(f["path"]).name for f in result.ingest["files"])  # noqa: E731
    result = maintain_sessions.fn(str(root), db, {"model": "offline"}, passive)
    assert seen(result) == ["s0.jsonl", "tool.log.jsonl"] and result.errors == []  # skipped, with a note
    assert seen(maintain_sessions.fn(str(root), db, {"model": "offline"}, passive, exclude=["*.log.jsonl"])) == [
        "s0.jsonl"]
    for deployment in (archive_deployment(root, db, {}, passive, ["*.log.jsonl"]),
                       maintenance_deployment(root, db, {}, passive, 60, ["*.log.jsonl"])):
        assert deployment.parameters["exclude"] == ["*.log.jsonl"]


# ------------------------------------------------------------------ ticks of om serve's maintenance flow


@pytest.fixture
def flow_log(capfd, caplog):
    """The flow run's log lines (level, message): what Prefect's console handler wrote (what `om serve`
    shows) and what reached the root logger (Prefect's handlers differ with its logging setup)."""
    def lines() -> list[tuple[str, str]]:
        out = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("prefect.flow_runs")]
        for line in capfd.readouterr().err.splitlines():
            parts = line.split(" | ", 2)
            if len(parts) == 3:
                out.append((parts[1].strip(), parts[2].split(" - ", 1)[-1]))
        caplog.clear()
        return list(dict.fromkeys(out))
    return lines


def tick(live: Path, db: Path) -> RunResult:
    from flows.pipeline import maintain_sessions

    return maintain_sessions(str(live), db_path=str(db), model={"model": "offline"}, settings=SETTINGS.model_dump())


def runs_of(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT command, status FROM runs ORDER BY started_at").fetchall()
    finally:
        con.close()


def test_a_tick_notes_a_copied_session_file_and_warns_of_a_rewrite_and_ends_ok(prefect_api, tmp_path, flow_log):
    live, db = tmp_path / "live", tmp_path / "om.duckdb"
    [path] = make_sessions(live, count=1)
    first = tick(live, db)
    assert first.errors == [] and first.sessions[0].error is None
    observed = runs_of(db)
    # Pi's user copies a session file in the live folder, and another one is cut to half its lines
    (live / "copy.jsonl").write_bytes(path.read_bytes())
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:len(lines) // 2]) + "\n")
    flow_log()
    second = tick(live, db)
    assert second.errors == []
    new_runs = runs_of(db)[len(observed):]  # the flow's row and its ingest's
    assert sorted(new_runs) == [("maintain", "ok"), (f"maintain {second.run_id}", "ok")]
    logged = flow_log()
    [warning] = [m for level, m in logged if level == "WARNING"]
    assert warning.startswith(f"{path}: rewritten: {len(lines) - len(lines) // 2} of {len(lines) - 1} entries")


def test_a_tick_beside_another_writer_is_skipped_with_a_line(prefect_api, tmp_path, flow_log):
    """`om run` holds the database (here a process holding its writer lock): the tick waits a few
    seconds, then ends ok without touching the database, and says so; the next tick does the work."""
    live, db = tmp_path / "live", tmp_path / "om.duckdb"
    make_sessions(live, count=1)
    hold = ("import sys, time\nfrom om_core.store.writer_lock import one_writer\n"
            "with one_writer(sys.argv[1], 'run', 0):\n    print('held', flush=True)\n    time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        skipped = tick(live, db)
    finally:
        holder.kill()
        holder.wait(30)
    assert skipped.errors == [] and skipped.run_id is None and not db.exists()
    assert skipped.busy.startswith(f"another om process is writing {db} (om run, pid {holder.pid} ")
    assert ("WARNING", "skipped: " + skipped.busy) in flow_log()
    done = tick(live, db)
    assert done.errors == [] and done.sessions[0].error is None


def test_prefect_s_ui_alone_tells_what_a_run_did(prefect_api, tmp_path):
    """, read through the Prefect client as the UI reads it: task runs named by what
    they do (``replay · <file>``, ``observer · <file> · entries a–b``), the replay tasks tagged with the
    session id and ``stage:replay`` (only they, since Prefect asks its API for concurrency slots for every
    tagged task run), and the run's summary in the flow run's logs; and no more: Prefect's event feed is
    not kept (it was most of what a run left in Prefect's database)."""
    import asyncio
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    paths = make_sessions(tmp_path / "sessions", count=2)
    result = run_flow(paths, tmp_path / "om.duckdb", None)
    assert result.errors == [] and result.flow_run_id

    async def read():
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[result.flow_run_id])))
            logs = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[result.flow_run_id])))
            events = await client.read_events(limit=10)
        return runs, logs, events

    deadline = time.monotonic() + 30
    while True:  # logs reach the API in batches
        runs, logs, events = asyncio.run(read())
        if any("sessions replayed" in log.message for log in logs) or time.monotonic() > deadline:
            break
        time.sleep(1)
    # what the UI shows of a run is all it keeps: not Prefect's event feed (flows/runner.LEAN_SERVER)
    assert events.total == 0 and events.events == [], [e.event for e in events.events]
    names = sorted(r.name for r in runs)
    assert "replay · s0.jsonl" in names and "replay · s1.jsonl" in names, names
    observers = [r for r in runs if r.name.startswith("observer · ")]
    assert observers and all(re.fullmatch(r"observer · s[01]\.jsonl · entries [0-9a-f]{8}–[0-9a-f]{8}", r.name)
                             for r in observers), [r.name for r in observers]
    stages = {r.name.split(" · ")[0] for r in runs}
    assert {"replay", "observer", "reflector"} <= stages, stages
    for r in runs:
        sid = "00000000-aaaa-bbbb-cccc-dddddddddddd" if "s0.jsonl" in r.name else "00000001-aaaa-bbbb-cccc-dddddddddddd"
        if r.name.startswith("replay · "):
            assert sorted(r.tags) == [f"session:{sid}", "stage:replay"], (r.name, r.tags)
        else:  # a stage: its name says its session's file
            assert r.tags == [], (r.name, r.tags)
    summary = [log.message for log in logs if "sessions replayed" in log.message]
    assert summary and summary[0].startswith(f"run {result.run_id}: 2 sessions replayed"), [m.message for m in logs]
    per_session = [log.message for log in logs if log.message.startswith("s0.jsonl (00000000):")]
    assert per_session and "observer " in per_session[0] and "stages run" in per_session[0], per_session


def test_om_run_plans_once_and_fingerprints_each_session_once(prefect_api, tmp_path, monkeypatch):
    """Om run's RunPlan and WorkspaceSpec reach the flow as values: one plan for the
    run (the CLI's; the flow plans nothing again) and one fingerprint per session, which the flow
    records when the replay completes (a rerun then has nothing to do)."""
    import flows.pipeline
    import om_core.replay.plan as planmod
    from om_cli import run_om

    paths = make_sessions(tmp_path / "sessions", count=3)
    plans: list = []
    printed: list[str] = []
    real_plan, real_prints = planmod.plan_run, planmod.fingerprints

    def plan_spy(*args, **kwargs):
        plans.append(args[1].paths)  # the checked targets (om_core.replay.plan.Targets)
        return real_plan(*args, **kwargs)

    def prints_spy(con, session_ids, *args, **kwargs):
        printed.extend(session_ids)
        return real_prints(con, session_ids, *args, **kwargs)

    monkeypatch.setattr(planmod, "plan_run", plan_spy)
    monkeypatch.setattr(flows.pipeline, "plan_run", plan_spy)
    monkeypatch.setattr(planmod, "fingerprints", prints_spy)
    monkeypatch.setattr(flows.pipeline, "fingerprints", prints_spy, raising=False)  # where a flow took its own
    db = tmp_path / "om.duckdb"
    env = {**os.environ, **SETTINGS_ENV, "PREFECT_API_URL": prefect_api, "OM_DB": str(db)}
    result = run_om(["run", str(tmp_path / "sessions"), "--json", "--model", "offline"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    body = json.loads(result.stdout)
    assert len(body["sessions"]) == 3 and all(s["error"] is None for s in body["sessions"])
    assert plans == [[str(tmp_path / "sessions")]]  # one plan, the command's
    assert sorted(printed) == sorted(s["session_id"] for s in body["sessions"])  # one fingerprint each
    con = duckdb.connect(str(db), read_only=True)
    try:
        recorded = con.execute("SELECT count(*) FROM om_internal.session_replays").fetchone()[0]
    finally:
        con.close()
    assert recorded == len(paths)  # the plan's fingerprints were recorded: a rerun replays nothing


def test_om_run_builds_one_model_config_and_the_flow_carries_it_to_every_replay(prefect_api, tmp_path, monkeypatch):
    """The model config is one typed value: built once from the settings by `om run` (with its
    model-call limit and --max-cost), taken by the flow as that value (not validated again from a
    dict) and handed to each session's replay task, whose brain is made from it (no rebuilding)."""
    import flows.pipeline
    from om_cli import run_om
    from om_core.workers.run_config import ModelConfig

    make_sessions(tmp_path / "sessions", count=3)
    built: list[ModelConfig] = []
    validated: list = []
    brains: list[ModelConfig] = []
    real_from_settings, real_validate, real_brain = ModelConfig.from_settings, ModelConfig.model_validate, \
        flows.pipeline._brain

    def from_settings_spy(cls, *args, **kwargs):
        built.append(real_from_settings(*args, **kwargs))
        return built[-1]

    def validate_spy(cls, *args, **kwargs):
        validated.append(args)
        return real_validate(*args, **kwargs)

    def brain_spy(config, settings, guards):
        brains.append(config)
        return real_brain(config, settings, guards)

    monkeypatch.setattr(ModelConfig, "from_settings", classmethod(from_settings_spy))
    monkeypatch.setattr(ModelConfig, "model_validate", classmethod(validate_spy))
    monkeypatch.setattr(flows.pipeline, "_brain", brain_spy)
    db = tmp_path / "om.duckdb"
    env = {**os.environ, **SETTINGS_ENV, "PREFECT_API_URL": prefect_api, "OM_DB": str(db),
           "OPENAI_API_KEY": "not-needed"}
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        base_url = server.base_url
        result = run_om(["run", str(tmp_path / "sessions"), "--json", "--model", "openai/gpt-4o-mini",
                         "--api-base", base_url, "--max-cost", "5"], cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr[-2000:]
        assert server.requests  # the model was called through the config's base URL
    body = json.loads(result.stdout)
    assert len(body["sessions"]) == 3 and all(s["error"] is None for s in body["sessions"])
    assert len(built) == 1 and validated == []  # built once by the command; the flow validated no dict
    (config,) = built
    assert (config.model, config.api_base, config.limit, config.max_cost) == (
        "openai/gpt-4o-mini", base_url, "process", 5.0)
    assert len(brains) == 3 and all(b is config for b in brains)  # a replay task per session, each given that value


def test_a_flow_run_records_om_run_s_parameters_as_prefect_would_without_fastapi():
    """What the UI shows of an `om run` flow run's parameters is what Prefect's own encoder gives (the
    model without its key, the plan and the spec as JSON, the guards by their type), encoded without
    importing FastAPI into the run; the flow keeps that encoder through ``with_options``."""
    code = """
import json, sys
from prefect.flows import Flow
from flows.pipeline import process_sessions
from flows.runner import task_runner
from om_core.replay.plan import RunPlan
from om_core.settings import Settings
from om_core.store.workspace import WorkspaceSpec
from om_core.workers.run_config import ModelConfig, RunGuards

flow = process_sessions.with_options(task_runner=task_runner("threads", 2))
params = {"targets": ["s.jsonl"], "db_path": "/tmp/om.duckdb", "settings": None, "drain": True, "window": 8,
          "model": ModelConfig(model="openai/fake-model", api_key="sk-secret-value"),
          "plan": RunPlan(session_ids=("a", "b"), due=("a",), notes=("a note",), fingerprints={"a": "f"}),
          "spec": WorkspaceSpec(db_path="/tmp/om.duckdb", settings=Settings()), "guards": RunGuards()}
ours = flow.serialize_parameters(params)
fastapi = "fastapi" in sys.modules
print(json.dumps({"ours": ours, "prefect": Flow.serialize_parameters(flow, params), "fastapi": fastapi}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["fastapi"] is False
    assert got["ours"] == got["prefect"]
    assert got["ours"]["plan"]["due"] == ["a"] and got["ours"]["guards"] == "<RunGuards>"
    assert "sk-secret-value" not in done.stdout


def test_a_model_config_travels_as_json_without_its_key_and_a_bad_one_is_one_line():
    """What a deployment carries: the ModelConfig's JSON (retry policy included, never the API key),
    which the flow validates back into the same config; a mistyped field is one clear error."""
    from flows.deployments import archive_deployment
    from flows.pipeline import _model
    from om_core.errors import InvalidArgument
    from om_core.model.client import RetryPolicy
    from om_core.workers.run_config import ModelConfig

    config = ModelConfig(model="openai/fake-model", api_base="http://127.0.0.1:9/v1", api_key="sk-secret-value",
                         retry=RetryPolicy(attempts=2, base_seconds=0.5), limit="prefect", max_cost=1.5)
    carried = archive_deployment(Path("/tmp"), "/tmp/om.duckdb", config, Settings().model_dump(mode="json"))
    as_json = carried.parameters["model"]
    assert json.loads(json.dumps(as_json)) == as_json and "sk-secret-value" not in json.dumps(as_json)
    back = _model(as_json)
    assert back.api_key is None and back.key is None
    assert back.model_dump(exclude={"api_key"}) == config.model_dump(exclude={"api_key"})
    assert (back.retry.attempts, back.retry.base_seconds, back.limit, back.max_cost) == (2, 0.5, "prefect", 1.5)
    assert _model(config) is config  # om run's value is taken as it is
    assert _model(None).offline and _model({"model": "offline"}).name == "offline"
    with pytest.raises(InvalidArgument) as bad:
        _model({"model": "openai/fake-model", "limit": "everywhere", "retries": 3})
    message = str(bad.value)
    assert "\n" not in message and "limit" in message and "retries" in message


@pytest.mark.parametrize("brain", ["offline", "fake model"])
def test_om_run_runs_the_project_stage_when_its_clock_says_so(prefect_api, tmp_path, brain):
    """After a run's sessions are committed, a project whose sessions' reflections grew
    by projectReflectAfterTokens gets its stage, a task of its own ("project · …") under the run's guards,
    with the offline baseline and with a model (the fake server, through litellm's HTTP path); a second
    run with nothing new runs none; below the threshold it does not run."""
    from flows.runner import run_pipeline

    paths = []
    for n in range(2):  # both in /home/dev/project: one project; each with a rule the user states
        b = SessionBuilder(session_id=f"0000000{n}-eeee-bbbb-cccc-dddddddddddd", start=f"2026-03-0{n + 1}T09:00:00")
        b.user("Never force-push to main: the CI needs a linear history.")
        b.assistant("Understood, no force-pushes to main.")
        b.work_turns(5, f"topic{n}")
        paths.append(b.write(tmp_path / "sessions" / f"s{n}.jsonl"))
    db = tmp_path / "om.duckdb"

    def run(server, **settings):
        model = ({"model": "openai/fake-model", "api_base": server.base_url, "retry": FAST_RETRIES} if server
                 else {"model": "offline"})
        return run_pipeline([str(p) for p in paths], db_path=str(db), model=model,
                            settings=SETTINGS.model_copy(update={"reflectAfterTokens": 60, **settings}).model_dump(),
                            concurrency=2)

    def stage_rows():
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute("SELECT run_id, project_id, model, outcome, records FROM project_stages "
                               "ORDER BY started_at").fetchall()
        finally:
            con.close()

    project_requests: list[int] = []  # per run with the fake model: its requests of the project stage

    def go(**settings):
        if brain == "offline":
            return run(None, **settings)
        with FakeOpenAI(responder=ScriptedWorkers()) as server:
            result = run(server, **settings)
        project_requests.append(len([b for b in server.requests
                                     if "record_project_reflections" in json.dumps(b.get("tools") or [])]))
        return result

    first = go(projectReflectAfterTokens=1)
    assert first.errors == [], first.errors
    assert [p["outcome"] for p in first.projects] == ["recorded"], first.projects
    assert first.projects[0]["project_id"] == "/home/dev/project" and first.projects[0]["reflections"]
    rows = stage_rows()
    assert [(r[0], r[1], r[3]) for r in rows] == [(first.run_id, "/home/dev/project", "recorded")]
    if brain == "fake model":
        assert project_requests[0] >= 1 and rows[0][2] == "openai/fake-model"
        assert all(r["content"].startswith("Across sessions: ") for r in first.projects[0]["reflections"])
    else:
        assert rows[0][2] == "offline"
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async def task_names():
        async with get_client() as client:
            return [r.name for r in await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[first.flow_run_id])))]

    named = [n for n in asyncio.run(task_names()) if n.startswith("project · ")]
    assert named and all(n.startswith("project · /home/dev/project · ") for n in named), named
    again = go(projectReflectAfterTokens=1)  # nothing new: no session replayed, no project stage
    assert again.projects == [] and len(stage_rows()) == 1


def test_the_project_stage_waits_for_its_threshold(prefect_api, tmp_path):
    paths = make_sessions(tmp_path / "sessions", count=1)
    from flows.runner import run_pipeline

    result = run_pipeline([str(p) for p in paths], db_path=str(tmp_path / "om.duckdb"), model={"model": "offline"},
                          settings=SETTINGS.model_copy(update={"projectReflectAfterTokens": 10**9}).model_dump())
    assert result.errors == [] and result.projects == []
