"""Scheduled maintenance that runs: `om serve --live` on no configured Prefect API
starts a local Prefect server with its scheduler, every tick ingests new lines and runs the due
stages with the user's resolved settings, and stopping `om serve` stops that server; deployments
registered on a server (`python -m deployments`) carry the resolved settings from every source."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from cluster import REPO, cluster_env, ledger_snapshot

from flows.endpoint import ask, endpoint_file, running_endpoint
from other_user import as_nobody, http_as_nobody, traversable

from flows.server import CREDENTIALS, api_healthy, free_port, read_credentials, stop_process_group

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


SECRET_KEY = "sk-om-serve-key-0123456789abcdef"  # in om serve's environment only


@dataclass
class Served:
    """The one `om serve --live --archive` of this module's test_served_* tests, with the Prefect server it
    started (no PREFECT_API_URL); they run in file order on one xdist worker (conftest XDIST_GROUPS)."""
    process: subprocess.Popen
    log: Path
    db: Path
    live: Path
    archive: Path
    session: SessionBuilder
    path: Path  # the live session file
    port: int
    prefect_home: Path

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def credentials(self) -> dict[str, str]:
        return read_credentials(self.prefect_home)

    def call(self, path: str, body: dict | None = None, method: str | None = None):
        """The Prefect API with om serve's credential (what its own processes are given)."""
        return _api(self.api, path, body, method, auth=self.credentials["PREFECT_API_AUTH_STRING"])

    def deployment(self, name: str) -> dict:
        return _wait_for(f"the {name} deployment", lambda: next(
            (d for d in self.call("/deployments/filter", {}) if d["name"] == name), None), 120, self.process, self.log)

    def final_state(self, flow_run_id: str, timeout: float = 180) -> dict:
        return _wait_for("the flow run's end", lambda: (lambda state: state if state["type"] in {
            "COMPLETED", "FAILED", "CRASHED", "CANCELLED"} else None)(self.call(f"/flow_runs/{flow_run_id}")["state"]),
            timeout, self.process, self.log)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    work, live, home, archive = root / "work", root / "live", root / "home", root / "archive"
    for d in (work, live, home, archive):
        d.mkdir()
    # the default (10,000) would run no stage; the builder's assistant usage never grows: clocks on source
    (work / "om.toml").write_text('observeAfterTokens = 300\nclockBasis = "source"\n')
    session = SessionBuilder(SESSION)
    session.work_turns(1, "alpha")  # about 200 tokens: below the threshold
    path = session.write(live / "s.jsonl")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO), "PREFECT_HOME": str(root / "prefect-home"),
                "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "OM_API_KEY": SECRET_KEY})
    log = root / "serve.log"
    process = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(work / "om.duckdb"), "serve", "--live",
                                str(live), "--archive", str(archive), "--every", "2"], cwd=work, env=env,
                               stdin=subprocess.DEVNULL, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                               start_new_session=True)
    served = Served(process, log, work / "om.duckdb", live, archive, session, path, port, root / "prefect-home")
    try:
        _wait_for("Prefect UI line", lambda: f"Prefect UI: http://127.0.0.1:{port}" in log.read_text(), 150,
                  process, log)
        yield served
    finally:
        if process.poll() is None:
            stop_process_group(process)


def test_served_om_serve_runs_its_schedule_on_a_local_server_with_the_om_toml_threshold(served):
    serve, log, db, session, port, api = served.process, served.log, served.db, served.session, served.port, served.api
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
    assert served.call(f"/flow_runs/{tick.group(2)}")["id"] == tick.group(2)  # the link names a real run
    assert _query(db, "SELECT count(*) FROM stages WHERE session_id = ?", [SESSION]) == [(0,)]
    before = len(session.entries)
    session.work_turns(2, "beta")  # now about 600 tokens: the observer is due
    with served.path.open("a", encoding="utf-8") as f:
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


def test_served_the_prefect_server_refuses_anonymous_and_foreign_origin_callers(served):
    """As another local user (nobody) and as a web page would: the server om serve
    started answers nobody without the credential (nor with a wrong one), takes no cross-origin call,
    listens on 127.0.0.1 only, and its credential is in a file only this user reads."""
    import psutil

    api, log = served.api, served.log
    credentials = served.prefect_home / CREDENTIALS
    assert f"user and password in {credentials}" in log.read_text()
    assert (credentials.stat().st_mode & 0o777, credentials.stat().st_uid) == (0o600, os.geteuid())
    assert served.prefect_home.stat().st_mode & 0o777 == 0o700
    assert served.credentials["PREFECT_API_URL"] == api
    user, _, password = served.credentials["PREFECT_API_AUTH_STRING"].partition(":")
    assert user and len(password) >= 32
    with traversable(credentials):
        assert "Permission denied" in as_nobody("cat", str(credentials)).stderr  # nobody cannot read it
    listening = {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == served.port}
    assert listening == {"127.0.0.1"}
    # the credential works (the refusals below are the credential's, not a dead server's)
    maintain = served.deployment("om-maintain")
    assert SECRET_KEY not in json.dumps(served.call("/deployments/filter", {}))  # the key is no parameter
    status, _, _ = http_as_nobody("GET", f"{api}/health")
    assert status == 200  # nobody reaches the server...
    json_body = {"Content-Type": "application/json"}
    for method, path, body in [("POST", "/deployments/filter", "{}"), ("POST", "/flow_runs/filter", "{}"),
                               ("POST", f"/deployments/{maintain['id']}/create_flow_run", '{"parameters": {}}'),
                               ("GET", f"/deployments/{maintain['id']}", None), ("GET", "/admin/settings", None)]:
        for auth in ({}, {"Authorization": "Basic " + base64.b64encode(b"om:wrong").decode()}):
            status, _, text = http_as_nobody(method, api + path, {**json_body, **auth}, body)
            assert (status, json.loads(text)) == (401, {"exception_message": "Unauthorized"}), (method, path, auth)
    # a web page of another origin: the preflight gets no allowed origin, a simple request no answer
    preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    status, headers, _ = http_as_nobody("OPTIONS", f"{api}/deployments/filter", preflight)
    assert status == 400 and "access-control-allow-origin" not in headers
    status, headers, _ = http_as_nobody("POST", f"{api}/flows/filter",
                                        {"Origin": "http://evil.example", "Content-Type": "text/plain"}, "{}")
    assert status == 401 and "access-control-allow-origin" not in headers
    # its own UI's origin is allowed (the UI asks for the user and password of the credentials file)
    status, headers, _ = http_as_nobody("OPTIONS", f"{api}/deployments/filter",
                                        {**preflight, "Origin": f"http://127.0.0.1:{served.port}"})
    assert status == 200 and headers["access-control-allow-origin"] == f"http://127.0.0.1:{served.port}"


def test_served_a_flow_run_asking_for_other_folders_database_model_or_settings_is_refused(served, tmp_path):
    """A flow run of om serve's deployment with parameters of its own (here by a holder of
    the credential: on a server the user points om at, whoever may create flow runs) reads no folder,
    writes no database, calls no model and uses no result storage of its choosing; one line in its logs.
    A run as the deployment made it runs."""
    from fake_openai import FakeOpenAI

    archive = served.deployment("om-archive")
    # the 2 s ticks are done with: paused (their queued runs deleted), the archive's runs get the one slot
    served.call(f"/deployments/{served.deployment('om-maintain')['id']}/pause_deployment", {})
    accepted = served.call(f"/deployments/{archive['id']}/create_flow_run", {})
    assert served.final_state(accepted["id"])["type"] == "COMPLETED"
    secret, evil = tmp_path / "secret", tmp_path / "evil"
    secret.mkdir(mode=0o700)
    evil.mkdir()
    b = SessionBuilder("5ec7e700-aaaa-bbbb-cccc-dddddddddddd")
    b.work_turns(3, "private")
    b.write(secret / "s.jsonl")
    with FakeOpenAI() as attacker:
        asked = {"targets": [str(secret)], "db_path": str(evil / "stolen.duckdb"),
                 "model": {"model": "openai/attacker", "api_base": attacker.base_url},
                 "settings": {**archive["parameters"]["settings"], "redactSecrets": False,
                              "resultStorage": str(evil / "results")}}
        steered = served.call(f"/deployments/{archive['id']}/create_flow_run", {"parameters": asked})
        state = served.final_state(steered["id"])
        assert state["type"] == "FAILED" and state["message"].startswith(
            "refused: this flow run's db_path, model, settings, targets differ"), state
        assert attacker.requests == []  # neither the prompts nor the API key went to the caller's server
    assert list(evil.iterdir()) == []
    assert _query(served.db, "SELECT count(*) FROM sessions WHERE session_id = ?", [b.session_id]) == [(0,)]

    def refusal_logged():
        logs = served.call("/logs/filter", {"logs": {"flow_run_id": {"any_": [steered["id"]]}}})
        return [row["message"] for row in logs if "refused" in row["message"] or "Traceback" in row["message"]] or None

    assert _wait_for("the refusal in the run's logs", refusal_logged, 30, served.process, served.log) == [
        state["message"]]
    assert state["message"] in served.log.read_text()  # om serve's terminal shows it too


def test_served_another_user_reads_none_of_the_files_om_serve_wrote(served):
    """As another local user (nobody) would try it, with every folder above searchable
    (a home folder often is): the database, its lock and endpoint file, the stage results, the Prefect
    server's home (its database of flow runs' parameters and logs, the credentials, the log) are
    refused; a file of the same folder that is world-readable is read (so the refusals are the modes')."""
    db = served.db
    files = [db, endpoint_file(db), served.prefect_home / CREDENTIALS,
             served.prefect_home / "prefect.db", served.prefect_home / "om-serve-server.log"]
    files += [p for p in (db.with_name(db.name + ".wal"), db.with_name(db.name + ".lock")) if p.exists()]
    folders = [served.prefect_home] + [p for p in [db.with_name(db.name + ".stage-results")] if p.exists()]
    for path in files:
        assert path.is_file(), path
    for path in files + folders:  # this user's only (the folders above are opened below, these are not)
        assert path.stat().st_mode & 0o077 == 0, path
    readable = db.parent / "world-readable.txt"
    readable.write_text("anyone\n")
    os.chmod(readable, 0o644)
    try:
        with traversable(db), traversable(served.prefect_home / CREDENTIALS), traversable(endpoint_file(db)):
            assert as_nobody("cat", str(readable)).stdout == "anyone\n"
            for path in files:
                done = as_nobody("cat", str(path))
                assert done.returncode != 0 and "Permission denied" in done.stderr, path
            for folder in folders:
                done = as_nobody("ls", str(folder))
                assert done.returncode != 0 and "Permission denied" in done.stderr, folder
    finally:
        readable.unlink()


def test_served_stopping_om_serve_stops_the_server_it_started(served):
    serve, log = served.process, served.log
    stopping = time.monotonic()
    serve.send_signal(signal.SIGINT)
    serve.wait(60)
    assert serve.returncode == 130 and time.monotonic() - stopping < 15, log.read_text()[-2000:]
    assert "Traceback" not in log.read_text()
    assert running_endpoint(served.db) is None and not endpoint_file(served.db).exists()
    deadline = time.monotonic() + 20
    while api_healthy(served.api, timeout=0.5) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not api_healthy(served.api, timeout=0.5), "the Prefect server om serve started is still running"


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
    """The exit line said "a maintenance run in progress was ended" even with none
    in progress. An om serve with an hour between ticks (on the test session's Prefect server) makes its
    first tick at once, not an hour later; stopped after it: exit 130, one line, no run ended."""
    work, live, home = tmp_path / "work", tmp_path / "live", tmp_path / "home"
    for d in (work, live, home):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
    env.update({"HOME": str(home), "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect-home"),
                **prefect_server.client_env})
    log = tmp_path / "serve.log"
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(work / "om.duckdb"), "serve", "--live",
                              str(live), "--every", "3600", "--no-endpoint"], cwd=work, env=env,
                             stdin=subprocess.DEVNULL, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        _wait_for("the serving line", lambda: "; Ctrl-C stops" in log.read_text(), 120, serve, log)
        tick = _wait_for("the first tick's line", lambda: re.search(
            r"tick (\d\d:\d\d:\d\d): 0 sessions seen, 0 lines ingested, 0 stages recorded memory, 0 errors; "
            r"next tick (\d\d:\d\d:\d\d)", log.read_text()), 120, serve, log)
        assert tick.group(1) != tick.group(2)  # the next one an hour on
        time.sleep(3)  # the tick's flow-run process ends after its line (its run row is finished before it)
        serve.send_signal(signal.SIGINT)
        serve.wait(60)
        out = log.read_text()
        assert serve.returncode == 130, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert out.rstrip().splitlines()[-1] == "stopped (SIGINT); no maintenance run was in progress", out[-3000:]
    finally:
        if serve.poll() is None:
            stop_process_group(serve)


@pytest.mark.parametrize("command", ["serve", "run"])
@pytest.mark.parametrize("credential", ["none", "wrong"])
def test_om_serve_on_a_server_that_refuses_its_credential_says_so_in_one_line(tmp_path, prefect_server, credential,
                                                                              command):
    """PREFECT_API_URL names a locked server (the test session's) and PREFECT_API_AUTH_STRING is unset or
    wrong: `om serve` and `om run` say so in one line naming the setting, before anything is served or run."""
    live = tmp_path / "live"
    live.mkdir()
    if command == "run":
        session = SessionBuilder(SESSION)
        session.work_turns(1, "alpha")
        session.write(live / "s.jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
    env.update({"HOME": str(tmp_path), "PYTHONPATH": str(REPO), "PREFECT_API_URL": prefect_server.api_url})
    if credential == "wrong":
        env["PREFECT_API_AUTH_STRING"] = "om:not-the-credential"
    args = ["serve", "--live", str(live), "--no-endpoint"] if command == "serve" else ["run", str(live)]
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert line == (f"error: the Prefect API at {prefect_server.api_url} (PREFECT_API_URL) "
                    + ("requires a credential: set PREFECT_API_AUTH_STRING" if credential == "none" else
                       "refuses the credential in PREFECT_API_AUTH_STRING")
                    + " (a server om serve started: its om-server.env, docs/security.md)"), done.stderr
    assert "Traceback" not in done.stderr and "serving" not in done.stderr
    assert command == "serve" or not (tmp_path / "om.duckdb").exists()  # om run: before any work


def _api(api_url: str, path: str, body: dict | None = None, method: str | None = None, *, auth: str | None = None):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    request = urllib.request.Request(api_url + path, data=data, method=method or ("POST" if data else "GET"),
                                     headers=headers)
    for attempt in range(5):
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:  # a busy server's SQLite says 503: Prefect's own clients retry it
            if exc.code != 503 or attempt == 4:
                raise
            time.sleep(1 + attempt)


def _pi_settings(path: Path, values: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"observational-memory": values}))


def test_a_deployment_run_honours_a_setting_from_every_source(tmp_path, prefect_server):
    """Registered from a directory with a setting from each source, run by a worker that has none of
    them (another directory, an empty HOME, no OM_*): the run gives the ledger of `om run` given the
    same values directly."""
    api = prefect_server.api_url
    auth = prefect_server.auth_string
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
    env = cluster_env(prefect_server, HOME=str(home), OM_COMPACT_AFTER_TOKENS="700")
    db = tmp_path / "deployed.duckdb"
    pool = f"om-test-{free_port()}"
    run = lambda *args, **kw: subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=180,  # noqa: E731
                                             **kw)
    created = _api(api, "/work_pools/", {"name": pool, "type": "process"}, auth=auth)
    assert created["name"] == pool
    registered = run("-m", "deployments", "--pool", pool, "--archive", str(archive), "--db", str(db),
                     "--config", str(tmp_path / "chosen.toml"), cwd=project, env=env)
    assert registered.returncode == 0, registered.stderr[-3000:]
    [deployment] = [d for d in _api(api, "/deployments/filter", {}, auth=auth) if d["work_pool_name"] == pool]
    carried = deployment["parameters"]["settings"]
    assert (carried["observeAfterTokens"], carried["observerChunkMaxTokens"]) == (150, 400)  # --config
    assert carried["reflectAfterTokens"] == 300 and carried["keepRecentTokens"] == 200  # Pi's files
    assert carried["clockBasis"] == "source"
    assert carried["compactAfterTokens"] == 700  # OM_*
    assert carried["observationsPoolMaxTokens"] == 20_000  # a default
    assert deployment["entrypoint"] == "flows.pipeline.process_sessions"
    flow_run = _api(api, f"/deployments/{deployment['id']}/create_flow_run", {}, auth=auth)
    elsewhere, empty_home = tmp_path / "worker", tmp_path / "worker-home"
    elsewhere.mkdir()
    empty_home.mkdir()
    worker = run("-m", "prefect", "worker", "start", "--pool", pool, "--run-once", "--type", "process",
                 cwd=elsewhere, env=cluster_env(prefect_server, HOME=str(empty_home)))
    state = _api(api, f"/flow_runs/{flow_run['id']}", auth=auth)["state"]
    assert state["type"] == "COMPLETED", (state, worker.stdout[-3000:], worker.stderr[-3000:])
    deployed = ledger_snapshot(db)
    assert deployed["records"] and deployed["compactions"]  # the low thresholds were used
    # the same values given directly to `om run`
    direct_db = tmp_path / "direct.duckdb"
    direct_env = cluster_env(prefect_server, HOME=str(empty_home), OM_OBSERVE_AFTER_TOKENS="150",
                             OM_OBSERVER_CHUNK_MAX_TOKENS="400", OM_REFLECT_AFTER_TOKENS="300",
                             OM_KEEP_RECENT_TOKENS="200", OM_COMPACT_AFTER_TOKENS="700", OM_CLOCK_BASIS="source")
    direct = run("-m", "flows.cli", "--db", str(direct_db), "run", str(archive), "--json", cwd=elsewhere,
                 env=direct_env)
    assert direct.returncode == 0, direct.stderr[-3000:]
    assert ledger_snapshot(direct_db) == deployed
