"""`om run` under interruption and in its first seconds (a real process, real signals, the fake model):
Ctrl-C stops it cleanly and a rerun resumes; a missing path and a rerun with nothing to do start no
orchestrator; failed stages are listed under the closing table.

A run talks to the test session's API (``prefect_api``: the server `om run` keeps, in the session's data
folder), given as PREFECT_API_URL or found as a user's second run finds it: starting a local API costs a
run 10-15 s under load. A run on Prefect's temporary API (prefectServerIdleSeconds 0) gets, in its fresh
HOME, a copy of one Prefect database migrated once per test process (``prefect server database
upgrade``), as a user's second run finds it: migrating a new one is 9 CPU-s of every first run."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import tempfile
import time
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI, http_error

pytestmark = pytest.mark.prefect

REPO = Path(__file__).resolve().parent.parent
SETTINGS_ENV = {"OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300", "OM_COMPACT_AFTER_TOKENS": "700",
                "OM_KEEP_RECENT_TOKENS": "200", "OM_OBSERVER_CHUNK_MAX_TOKENS": "400",
                "OM_OBSERVATIONS_POOL_MAX_TOKENS": "40", "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20"}
# no Prefect API to reach: a command that starts no orchestrator must not need one
NO_API = {"PREFECT_API_URL": "http://127.0.0.1:9/api"}


def sessions(folder: Path, count: int = 3) -> Path:
    for n in range(count):
        b = SessionBuilder(session_id=f"0000000{n}-cccc-bbbb-cccc-dddddddddddd", start=f"2026-04-0{n + 1}T09:00:00")
        b.work_turns(8 + n, f"topic{n}")
        b.write(folder / f"s{n}.jsonl")
    return folder


@functools.cache
def migrated_prefect_database() -> Path:
    """A Prefect database at the installed Prefect's latest migration, made once per test process."""
    home = Path(tempfile.mkdtemp(prefix="om-prefect-template-"))
    atexit.register(shutil.rmtree, home, True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    subprocess.run([str(Path(sys.executable).parent / "prefect"), "server", "database", "upgrade", "-y"],
                   env={**env, "PREFECT_HOME": str(home)}, check=True, capture_output=True, timeout=300)
    return home / "prefect.db"


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    prefect_home = tmp_path / "home" / ".prefect"  # Prefect keeps its local API's database under HOME
    if extra.get("OM_PREFECT_SERVER_IDLE_SECONDS") == "0" and "PREFECT_API_URL" not in extra and not prefect_home.exists():
        prefect_home.mkdir(parents=True, mode=0o700)
        shutil.copy(migrated_prefect_database(), prefect_home / "prefect.db")
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_API_URL"))}
    return {**env, **SETTINGS_ENV, "HOME": str(tmp_path / "home"), "OPENAI_API_KEY": "not-needed",
            "PYTHONPATH": str(REPO), **extra}


def om(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), *args],
                          cwd=tmp_path, env=env or env_for(tmp_path), capture_output=True, text=True, timeout=timeout)


def om_here(tmp_path: Path, *args: str, env: dict[str, str]):
    """`om --db tmp_path/om.duckdb ARGS` in this process (tests/om_cli.py), for tests whose point is what the
    run does and says, not the process: no new interpreter's start and Prefect import (4-5 CPU-s a run)."""
    from om_cli import run_om

    return run_om(["--db", str(tmp_path / "om.duckdb"), *args], tmp_path, env)


def db_rows(db: Path, sql: str):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_sigint_mid_run_stops_cleanly_and_a_rerun_resumes(tmp_path, prefect_api):
    folder = sessions(tmp_path / "sessions")
    script = ScriptedWorkers(delay=0.3)
    sent: dict = {}

    def responder(body):
        if "at" in sent:
            sent.setdefault("after", []).append(time.monotonic())
        return script(body)

    with FakeOpenAI(responder=responder) as server:
        model = ["--model", "openai/fake-model", "--api-base", server.base_url]
        command = [sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), "run", str(folder),
                   "--concurrency", "2", *model]
        proc = subprocess.Popen(command, cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 240
        while len(server.requests) < 6 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before the interruption"
        import psutil

        # the processes the run started (its Prefect API is the server runs keep: none of them)
        helpers = psutil.Process(proc.pid).children(recursive=True)
        # stages answered well before the signal are persisted; one whose answer is in flight may not be
        early = set(script.completed)
        time.sleep(1.0)
        sent["at"] = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent["at"]
        assert proc.returncode == 130, err[-2000:]
        assert took < 15, f"Ctrl-C took {took:.1f} s"
        assert "Traceback" not in err and "EventsWorker" not in err
        assert "interrupted (SIGINT)" in err and "rerun the same command to resume" in err
        # a call already in flight may still land; none starts once the signal is handled
        late = [t for t in sent.get("after", []) if t > sent["at"] + 1.0]
        assert late == [], f"{len(late)} model call(s) started after the interruption"
        db = tmp_path / "om.duckdb"
        assert db_rows(db, "SELECT status FROM runs WHERE command = 'run'") == [("interrupted",)]
        # nothing the run started is left running
        _, alive = psutil.wait_procs(helpers, timeout=5)
        assert alive == []
        # the rerun resumes: it completes, and no stage is appended twice
        before, answered_before = len(server.requests), len(script.answered)
        resumed = subprocess.run(command + ["--json"], cwd=tmp_path, env=env_for(tmp_path), capture_output=True,
                                 text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert len(server.requests) > before
        made_after = len(server.requests) - before
    # each model call counts under the run that made it: the stages the interrupted run computed (their
    # results persisted, recorded by the resumed run) stay the interrupted run's calls and cost
    runs = dict(db_rows(db, "SELECT status, run_id FROM runs WHERE command = 'run'"))
    calls = dict(db_rows(db, "SELECT run_id, count(*) FROM llm_calls GROUP BY run_id"))
    assert set(calls) <= {runs["interrupted"], runs["ok"]}
    assert calls.get(runs["ok"], 0) == made_after
    assert calls.get(runs["interrupted"], 0) >= len(early) > 0
    assert dict(db_rows(db, "SELECT run_id, model_calls FROM run_costs")) == calls
    dup = db_rows(db, "SELECT stage_key, count(*) FROM ledger WHERE origin = 'pipeline' GROUP BY ALL HAVING count(*) > 1")
    assert dup == []
    # no stage computed before the interruption was asked again
    assert not early & set(script.answered[answered_before:])


def test_a_missing_path_fails_in_one_line_before_anything_starts(tmp_path):
    (tmp_path / "home").mkdir()
    sessions(tmp_path / "sessions", count=1)
    result = om_here(tmp_path, "run", str(tmp_path / "sessions"), str(tmp_path / "nope" / "gone.jsonl"),
                     env=env_for(tmp_path, **NO_API))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    # one line: not the offline baseline's banner first
    assert len(lines) == 1 and lines[0].startswith("error:") and "gone.jsonl: no such file or directory" in lines[0]
    assert "orchestrator" not in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "om.duckdb").exists()  # nothing was ingested either


def test_om_run_notes_a_stray_file_in_a_folder_and_takes_exclude(tmp_path):
    folder = sessions(tmp_path / "sessions", count=1)
    (folder / "tool.log.jsonl").write_text('{"level": "info"}\n')
    env = env_for(tmp_path, OM_PASSIVE="true", **NO_API)  # ingest only: no orchestrator
    done = om_here(tmp_path, "run", str(folder), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    notes = [line for line in done.stderr.splitlines() if "tool.log.jsonl" in line]
    assert len(notes) == 1 and "not a Pi session file" in notes[0]
    done = om_here(tmp_path, "run", str(folder), "--exclude", "*.log.jsonl", env=env)
    assert done.returncode == 0 and "tool.log.jsonl" not in done.stderr, done.stderr[-2000:]


def test_a_rerun_with_nothing_to_do_starts_no_orchestrator(tmp_path, prefect_api):
    folder = sessions(tmp_path / "sessions", count=2)
    api = env_for(tmp_path, PREFECT_API_URL=prefect_api)
    first = om_here(tmp_path, "run", str(folder), "--json", env=api)  # the offline baseline
    assert first.returncode == 0, first.stderr[-2000:]
    again = om(tmp_path, "run", str(folder), "--json", env=env_for(tmp_path, **NO_API), timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    body = json.loads(again.stdout)
    assert body["run_id"] is None and body["sessions"] == [] and len(body["skipped"]) == 2
    # a new line makes that session due again (and only that one)
    path = folder / "s0.jsonl"
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    path.write_text("\n".join(lines + [json.dumps({"type": "message", "id": "feedbeef", "parentId": last["id"],
                                                    "timestamp": "2026-04-01T12:00:00.000Z",
                                                    "message": {"role": "user", "content": "One more thing.",
                                                                "timestamp": 1775044800000}})]) + "\n")
    third = om_here(tmp_path, "run", str(folder), "--json", env=api)
    assert third.returncode == 0, third.stderr[-2000:]
    body = json.loads(third.stdout)
    assert [s["session_id"] for s in body["sessions"]] == ["00000000-cccc-bbbb-cccc-dddddddddddd"]


def test_failed_stages_are_listed_and_the_exit_code_is_1(tmp_path, prefect_api):
    folder = sessions(tmp_path / "sessions", count=2)
    api = env_for(tmp_path, PREFECT_API_URL=prefect_api)
    script = ScriptedWorkers()

    def responder(body):
        if "topic1" in json.dumps(body["messages"]):
            return http_error(400, "messages[1].content is malformed")  # this session's stages fail
        return script(body)

    with FakeOpenAI(responder=responder) as server:
        result = om_here(tmp_path, "run", str(folder), "--json", "--model", "openai/fake-model",
                         "--api-base", server.base_url, env=api)
        assert result.returncode == 1, result.stderr[-2000:]
        body = json.loads(result.stdout)
        assert body["failures"] and {f["session_id"] for f in body["failures"]} == {"00000001-cccc-bbbb-cccc-dddddddddddd"}
        assert all("BadRequestError" in f["error"] for f in body["failures"])
        table = om_here(tmp_path, "run", str(folder), "--model", "openai/fake-model", "--api-base", server.base_url,
                        env=api)
    assert "failed stages" in table.stderr  # the failed session is still due: it runs (and fails) again


LEDGER = "SELECT session_id, kind, covers_up_to_id, anchor_entry_id, stage_key FROM ledger ORDER BY ALL"


def test_a_run_whose_429s_were_retried_exits_0_with_the_ledger_of_a_clean_run(tmp_path, prefect_api):
    """Three 429s at the start of a run, retried: every stage succeeds, so the run does
    (exit 0, no failure listed); the failed attempts stay recorded as attempts (llm_calls rows)."""
    folder = sessions(tmp_path / "sessions", count=3)
    script, lock, seen = ScriptedWorkers(), threading.Lock(), []

    def responder(body):
        with lock:
            seen.append(1)
            first = len(seen) <= 3
        return http_error(429, "rate limited") if first else script(body)

    with FakeOpenAI(responder=responder) as server:
        result = om_here(tmp_path, "run", str(folder), "--json", "--model", "openai/fake-model",
                         "--api-base", server.base_url, env=env_for(tmp_path, PREFECT_API_URL=prefect_api))
    assert result.returncode == 0, result.stderr[-2000:]
    body = json.loads(result.stdout)
    assert body["failures"] == [] and body["errors"] == [] and all(s["error"] is None for s in body["sessions"])
    db = tmp_path / "om.duckdb"
    attempts = db_rows(db, "SELECT error_kind, attempt FROM llm_calls WHERE status = 'error'")
    assert [kind for kind, _ in attempts] == ["transient"] * 3
    assert db_rows(db, "SELECT count(*) FROM stages WHERE outcome = 'failed'") == [(0,)]
    # every failed attempt is followed, in its stage, by the attempt that succeeded
    assert db_rows(db, "SELECT count(*) FROM llm_calls e WHERE e.status = 'error' AND NOT EXISTS (SELECT 1 FROM "
                       "llm_calls ok WHERE ok.stage_run_id = e.stage_run_id AND ok.status = 'ok' "
                       "AND ok.attempt > e.attempt)") == [(0,)]
    assert body["cost"]["model_calls"] == len(seen) - 3  # the calls answered; the 429s are attempts
    clean = tmp_path / "clean"
    clean.mkdir()
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        again = om_here(clean, "run", str(folder), "--json", "--model", "openai/fake-model", "--api-base",
                        server.base_url, env=env_for(clean, PREFECT_API_URL=prefect_api))
    assert again.returncode == 0, again.stderr[-2000:]
    assert db_rows(db, LEDGER) == db_rows(clean / "om.duckdb", LEDGER)  # the ledger of a run without 429s


def test_a_run_row_left_running_by_a_killed_process_is_marked(tmp_path, prefect_api):
    from om_core.store.runs import start_run
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace

    from om_core.ingest import ingest

    folder = sessions(tmp_path / "sessions", count=1)
    ws = Workspace.open(tmp_path / "om.duckdb", settings=Settings())
    assert ingest(ws, [folder]).files  # in this process: only the run is the command under test
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # prefect stand-in"])
    try:
        with ws.write() as con:
            start_run(con, "killed-run", "run", {})
            con.execute("UPDATE om_internal.runs SET pid = 999999, child_pids = [?] WHERE run_id = 'killed-run'", [helper.pid])
        assert om_here(tmp_path, "run", str(folder), "--json",
                       env=env_for(tmp_path, PREFECT_API_URL=prefect_api)).returncode == 0
        helper.wait(timeout=10)  # ended: its command line names what the run started (prefect)
    finally:
        if helper.poll() is None:
            helper.kill()
    assert db_rows(tmp_path / "om.duckdb", "SELECT status FROM runs WHERE run_id = 'killed-run'") == [("abandoned",)]


def test_two_runs_started_at_once_on_one_database_one_runs_the_other_exits_3(tmp_path, prefect_api):
    """Two `om run` on one database, started together (with the Prefect server runs keep): the one that
    takes the writer lock first runs; the other waits a few seconds, then exits 3 in one line, before any
    Prefect starts. Then a kill -9 of a run leaves no lock behind (not even held by a process it started):
    the next run runs."""
    folder = sessions(tmp_path / "sessions", count=2)
    command = [sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), "run", str(folder),
               "--model", "offline"]
    # a slow model keeps the winner writing well past the loser's wait: a warm offline run of two
    # small sessions ends within that wait, and the loser would then get the lock and run
    with FakeOpenAI(responder=ScriptedWorkers(delay=1.5)) as server:
        racing = [*command[:-2], "--model", "openai/fake-model", "--api-base", server.base_url]
        procs = [subprocess.Popen(racing, cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        done = [(p.wait(300), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in done)
    assert codes == [0, 3], [(code, err[-2000:]) for code, _, err in done]
    refused = next(err for code, _, err in done if code == 3)
    lines = [line for line in refused.splitlines() if line.strip() and "offline baseline" not in line]
    assert len(lines) == 1 and lines[0].startswith("error: another om process is writing "), refused
    assert all("Traceback" not in err for _, _, err in done)
    ran = next(out for code, out, _ in done if code == 0)
    assert "run " in ran and "total" in ran
    assert len(db_rows(tmp_path / "om.duckdb", "SELECT run_id FROM runs WHERE command = 'run'")) == 1

    # kill -9 in the middle of a run (its orchestrator started), then the same command again
    for n in range(2, 4):
        b = SessionBuilder(session_id=f"0000000{n}-cccc-bbbb-cccc-dddddddddddd", start=f"2026-04-0{n + 1}T09:00:00")
        b.work_turns(16, f"topic{n}")
        b.write(folder / f"s{n}.jsonl")
    proc = subprocess.Popen(command, cwd=tmp_path, env=env_for(tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:  # until the flow has started
        try:
            if db_rows(tmp_path / "om.duckdb", "SELECT count(*) FROM runs WHERE command = 'run'")[0][0] == 2:
                break
        except duckdb.IOException:  # the run holds the file for a moment
            pass
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be killed"
    import psutil

    helpers = psutil.Process(proc.pid).children(recursive=True)  # its Prefect API server
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    try:
        # none of the helpers the kill left behind holds the writer lock, and the next start ends them
        again = subprocess.run(command, cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "another om process" not in again.stderr
        assert [h.pid for h in helpers if h.is_running()] == []
    finally:
        for helper in helpers:
            with contextlib.suppress(psutil.Error):
                helper.kill()
