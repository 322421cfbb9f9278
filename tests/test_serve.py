"""Scheduled maintenance that runs (issue 11, item 7): `om serve --live` on no configured Prefect API
starts a local Prefect server with its scheduler, every tick ingests new lines and runs the due
stages with the user's resolved settings, and stopping `om serve` stops that server; deployments
registered on a server (`python -m deployments`) carry the resolved settings from every source."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from cluster import REPO, cluster_env, ledger_snapshot

from flows.endpoint import ask, endpoint_file, running_endpoint
from flows.server import api_healthy, free_port, stop_process_group

pytestmark = pytest.mark.cluster
SESSION = "5e55e000-aaaa-bbbb-cccc-dddddddddddd"


def _query(db: Path, sql: str, params: list | None = None, timeout: float = 30.0) -> list[tuple]:
    """Read while `om serve`'s flow runs may hold the file: DuckDB refuses a second process then."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            con = duckdb.connect(str(db), read_only=True)
        except duckdb.Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        try:
            return con.execute(sql, params or []).fetchall()
        finally:
            con.close()


def _wait_for(what: str, check, timeout: float, process: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"om serve exited ({process.returncode}) before {what}: {log.read_text()[-3000:]}")
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"no {what} within {timeout:.0f} s: {log.read_text()[-3000:]}")


def test_om_serve_runs_its_schedule_on_a_local_server_with_the_om_toml_threshold(tmp_path):
    work, live, home = tmp_path / "work", tmp_path / "live", tmp_path / "home"
    for d in (work, live, home):
        d.mkdir()
    # the default (10,000) would run no stage; the builder's assistant usage never grows: clocks on source
    (work / "om.toml").write_text('observeAfterTokens = 300\nclockBasis = "source"\n')
    session = SessionBuilder(SESSION)
    session.work_turns(1, "alpha")  # about 200 tokens: below the threshold
    path = session.write(live / "s.jsonl")
    db = work / "om.duckdb"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect-home"),
                "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(db), "serve", "--live", str(live),
                              "--every", "2"], cwd=work, env=env, stdin=subprocess.DEVNULL,
                             stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    api = f"http://127.0.0.1:{port}/api"
    try:
        _wait_for("Prefect UI line", lambda: f"Prefect UI: http://127.0.0.1:{port}" in log.read_text(), 150,
                  serve, log)
        assert api_healthy(api)

        def entries() -> int:
            if not db.exists():
                return 0
            return _query(db, "SELECT count(*) FROM entries WHERE session_id = ?", [SESSION])[0][0]

        first = len(session.entries)
        _wait_for("first ingest", lambda: entries() == first, 120, serve, log)
        # it names what the workers run on, and says what each tick did and when the next one is due
        assert "using the offline baseline" in log.read_text()
        # ... and where its flow run is in Prefect's UI
        tick = _wait_for("a tick line", lambda: re.search(
            r"tick \d\d:\d\d:\d\d: 1 session seen, (\d+) lines? ingested, 0 stages recorded memory, 0 errors; "
            rf"next tick \d\d:\d\d:\d\d; http://127\.0\.0\.1:{port}/runs/flow-run/([0-9a-f-]{{36}})$",
            log.read_text(), re.M), 60, serve, log)
        assert int(tick.group(1)) == first
        assert _api(api, f"/flow_runs/{tick.group(2)}")["id"] == tick.group(2)  # the link names a real run
        assert _query(db, "SELECT count(*) FROM stages WHERE session_id = ?", [SESSION]) == [(0,)]
        before = len(session.entries)
        session.work_turns(2, "beta")  # now about 600 tokens: the observer is due
        with path.open("a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in session.lines()[1 + before:]))

        def observed():
            if entries() != len(session.entries):
                return None
            return _query(db, "SELECT stage, outcome FROM stages WHERE session_id = ?", [SESSION])

        stages = _wait_for("observer stage after the appended lines", observed, 120, serve, log)
        assert ("observer", "recorded") in stages
        _wait_for("the observer's tick line", lambda: re.search(r"tick [\d:]+: 1 session seen, \d+ lines? ingested, "
                                                                r"[1-9]\d* stages? recorded memory, 0 errors", log.read_text()),
                  60, serve, log)
        assert _query(db, "SELECT count(*) FROM observations WHERE session_id = ?", [SESSION])[0][0] > 0
        announced = running_endpoint(db)  # it answers a live Pi too (the om extension finds it there)
        assert announced and ask(announced, "info")["db"] == str(db.resolve())
        # stopping om serve (Ctrl-C) stops the server it started
        stopping = time.monotonic()
        serve.send_signal(signal.SIGINT)
        serve.wait(60)
        assert serve.returncode == 130 and time.monotonic() - stopping < 15, log.read_text()[-2000:]
        assert "Traceback" not in log.read_text()
        assert running_endpoint(db) is None and not endpoint_file(db).exists()
        deadline = time.monotonic() + 20
        while api_healthy(api, timeout=0.5) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not api_healthy(api, timeout=0.5), "the Prefect server om serve started is still running"
    finally:
        if serve.poll() is None:
            stop_process_group(serve)


def test_ctrl_c_of_om_serve_during_a_tick_marks_its_run_interrupted_and_prints_no_traceback(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: om serve, and the flow run's own process
    in the middle of a model call. Pressed three times, it leaves one line, exit 130, no traceback (from
    either process), and the maintenance run's row ``interrupted``, not ``running``."""
    from fake_openai import FakeOpenAI, Reply

    work, live, home = tmp_path / "work", tmp_path / "live", tmp_path / "home"
    for d in (work, live, home):
        d.mkdir()
    (work / "om.toml").write_text('observeAfterTokens = 300\nclockBasis = "source"\n')
    session = SessionBuilder(SESSION)
    session.work_turns(3, "alpha")  # about 600 tokens: the observer is due at the first tick
    session.write(live / "s.jsonl")
    db = work / "om.duckdb"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect-home"),
                "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    log = tmp_path / "serve.log"
    with FakeOpenAI(default=Reply(text="{}", delay=300)) as fake:  # the model call outlasts the test
        serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(db), "serve", "--live", str(live),
                                  "--every", "5", "--no-endpoint", "--model", "openai/fake-model",
                                  "--api-base", fake.base_url], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                 stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            _wait_for("the model line", lambda: f"model: openai/fake-model at {fake.base_url}" in log.read_text(),
                      150, serve, log)
            _wait_for("the tick's first model call", lambda: fake.requests, 180, serve, log)
            assert _query(db, "SELECT status FROM runs WHERE command = 'maintain'") == [("running",)]
            for _ in range(3):  # Ctrl-C, and again, and again: the whole group, as a terminal sends it
                os.killpg(serve.pid, signal.SIGINT)
                time.sleep(0.3)
            serve.wait(60)
            out = log.read_text()
            assert serve.returncode == 130, out[-3000:]
            assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
            [(run_id, status, signal_name)] = _query(
                db, "SELECT run_id, status, detail->>'signal' FROM runs WHERE command = 'maintain'")
            assert (status, signal_name) == ("interrupted", "SIGINT")
            assert out.rstrip().splitlines()[-1] == (f"stopped (SIGINT); the maintenance run in progress ({run_id}) "
                                                     "was ended and its next tick redoes it"), out[-3000:]
        finally:
            if serve.poll() is None:
                stop_process_group(serve)


def test_ctrl_c_of_an_idle_om_serve_says_no_run_was_in_progress(tmp_path, prefect_server):
    """Issue 33 item 5: the exit line said "a maintenance run in progress was ended" even with none
    in progress. An om serve whose first tick is an hour away (on the test session's Prefect server)
    stopped at once: exit 130, one line, no run ended."""
    work, live, home = tmp_path / "work", tmp_path / "live", tmp_path / "home"
    for d in (work, live, home):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect-home"),
                "PREFECT_API_URL": prefect_server.api_url})
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(work / "om.duckdb"), "serve", "--live",
                              str(live), "--every", "3600", "--no-endpoint"], cwd=work, env=env,
                             stdin=subprocess.DEVNULL, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        _wait_for("the serving line", lambda: "; Ctrl-C stops" in log.read_text(), 120, serve, log)
        time.sleep(2)  # the runner is serving
        serve.send_signal(signal.SIGINT)
        serve.wait(60)
        out = log.read_text()
        assert serve.returncode == 130, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert out.rstrip().splitlines()[-1] == "stopped (SIGINT); no maintenance run was in progress", out[-3000:]
    finally:
        if serve.poll() is None:
            stop_process_group(serve)


def _api(api_url: str, path: str, body: dict | None = None, method: str | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(api_url + path, data=data, method=method or ("POST" if data else "GET"),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def _pi_settings(path: Path, values: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"observational-memory": values}))


def test_a_deployment_run_honours_a_setting_from_every_source(tmp_path, prefect_server):
    """Registered from a directory with a setting from each source, run by a worker that has none of
    them (another directory, an empty HOME, no OM_*): the run gives the ledger of `om run` given the
    same values directly."""
    api = prefect_server.api_url
    archive = tmp_path / "archive"
    for n in range(2):
        b = SessionBuilder(f"de910e0{n}-aaaa-bbbb-cccc-dddddddddddd", start=f"2026-05-0{n + 1}T09:00:00")
        b.work_turns(6 + n, f"topic{n}")
        b.write(archive / f"s{n}.jsonl")
    project, home = tmp_path / "project", tmp_path / "home"
    _pi_settings(home / ".pi" / "agent" / "settings.json", {"keepRecentTokens": 200, "reflectAfterTokens": 9999,
                                                               "clockBasis": "source"})
    _pi_settings(project / ".pi" / "settings.json", {"reflectAfterTokens": 300})  # the project's file wins
    (tmp_path / "chosen.toml").write_text("observeAfterTokens = 150\nobserverChunkMaxTokens = 400\n")
    (project / "om.toml").write_text("observeAfterTokens = 5000\n")  # --config wins over ./om.toml
    env = cluster_env(api, HOME=str(home), OM_COMPACT_AFTER_TOKENS="700")
    db = tmp_path / "deployed.duckdb"
    pool = f"om-test-{free_port()}"
    run = lambda *args, **kw: subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180,  # noqa: E731
                                             **kw)
    created = _api(api, "/work_pools/", {"name": pool, "type": "process"})
    assert created["name"] == pool
    registered = run("-m", "deployments", "--pool", pool, "--archive", str(archive), "--db", str(db),
                     "--config", str(tmp_path / "chosen.toml"), cwd=project, env=env)
    assert registered.returncode == 0, registered.stderr[-3000:]
    [deployment] = [d for d in _api(api, "/deployments/filter", {}) if d["work_pool_name"] == pool]
    carried = deployment["parameters"]["settings"]
    assert (carried["observeAfterTokens"], carried["observerChunkMaxTokens"]) == (150, 400)  # --config
    assert carried["reflectAfterTokens"] == 300 and carried["keepRecentTokens"] == 200  # Pi's files
    assert carried["clockBasis"] == "source"
    assert carried["compactAfterTokens"] == 700  # OM_*
    assert carried["observationsPoolMaxTokens"] == 20_000  # a default
    assert deployment["entrypoint"] == "flows.pipeline.process_sessions"
    flow_run = _api(api, f"/deployments/{deployment['id']}/create_flow_run", {})
    elsewhere, empty_home = tmp_path / "worker", tmp_path / "worker-home"
    elsewhere.mkdir()
    empty_home.mkdir()
    worker = run("-m", "prefect", "worker", "start", "--pool", pool, "--run-once", "--type", "process",
                 cwd=elsewhere, env=cluster_env(api, HOME=str(empty_home)))
    state = _api(api, f"/flow_runs/{flow_run['id']}")["state"]
    assert state["type"] == "COMPLETED", (state, worker.stdout[-3000:], worker.stderr[-3000:])
    deployed = ledger_snapshot(db)
    assert deployed["records"] and deployed["compactions"]  # the low thresholds were used
    # the same values given directly to `om run`
    direct_db = tmp_path / "direct.duckdb"
    direct_env = cluster_env(api, HOME=str(empty_home), OM_OBSERVE_AFTER_TOKENS="150",
                             OM_OBSERVER_CHUNK_MAX_TOKENS="400", OM_REFLECT_AFTER_TOKENS="300",
                             OM_KEEP_RECENT_TOKENS="200", OM_COMPACT_AFTER_TOKENS="700", OM_CLOCK_BASIS="source")
    direct = run("-m", "flows.cli", "--db", str(direct_db), "run", str(archive), "--json", cwd=elsewhere,
                 env=direct_env)
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert ledger_snapshot(direct_db) == deployed
