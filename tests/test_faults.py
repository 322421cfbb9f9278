"""Faults end cleanly, injected for real on a real `om run` process: a kill -9 after its
Prefect server started leaves no orphan past the next start; a SIGTERM in a retry storm leaves the
`interrupted` row and line."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import psutil
import pytest
from fake_openai import FakeOpenAI, Reply, http_error
from test_run_command import db_rows, env_for, sessions

pytestmark = pytest.mark.prefect


def om_command(tmp_path: Path, folder: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), "run", str(folder), *extra]


def lock_holder(tmp_path: Path) -> dict:
    try:
        return json.loads((tmp_path / "om.duckdb.lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


def wait_for(condition, proc: subprocess.Popen, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None and not condition():
        time.sleep(0.2)
    assert proc.poll() is None, f"the run ended first: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
    assert condition(), "timed out"


def run_row(tmp_path: Path) -> list:
    try:
        return db_rows(tmp_path / "om.duckdb", "SELECT status, child_pids FROM runs WHERE command = 'run'")
    except duckdb.Error:  # the run holds the file for a moment, or has not created it yet
        return []


def test_a_kill_9_after_the_prefect_server_started_leaves_no_orphan_past_the_next_start(tmp_path):
    """The helpers are noted before any work begins (the lock file, the run's row); after a kill -9 they
    are still running (orphans), and the next writer's start ends exactly them. The run's helper here:
    Prefect's temporary API of one run (prefectServerIdleSeconds 0; the server runs keep is no child of
    a run, and stays)."""
    folder = sessions(tmp_path / "sessions", count=2)
    one_run_api = env_for(tmp_path, OM_PREFECT_SERVER_IDLE_SECONDS="0")
    with FakeOpenAI(default=Reply(text="(slow)", delay=120)) as server:  # the run is busy when killed
        model = ["--model", "openai/fake-model", "--api-base", server.base_url]
        proc = subprocess.Popen(om_command(tmp_path, folder, *model), cwd=tmp_path, env=one_run_api,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: run_row(tmp_path) != [], proc)  # the run's row exists: the flow has started
            [(status, child_pids)] = run_row(tmp_path)
            noted = lock_holder(tmp_path)["helpers"]
            assert status == "running" and child_pids, "the run's row names no helper process"
            assert {h["pid"] for h in noted} == set(child_pids)
            assert any("uvicorn" in h["cmd"] or "prefect" in h["cmd"] for h in noted), noted
            wait_for(lambda: len(server.requests) >= 1, proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        orphans = [psutil.Process(h["pid"]) for h in noted if psutil.pid_exists(h["pid"])]
        try:
            assert orphans, "nothing outlived the kill: the test proves nothing"
            # the next start (any writer) ends them
            again = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), "ingest",
                                    str(folder)], cwd=tmp_path, env=one_run_api, capture_output=True, text=True,
                                   timeout=120)
            assert again.returncode == 0, again.stderr[-2000:]
            for orphan in orphans:
                assert not orphan.is_running(), f"pid {orphan.pid} ({orphan.cmdline()}) outlived the next start"
        finally:
            for orphan in orphans:
                with contextlib.suppress(psutil.Error):
                    orphan.kill()


def test_a_helper_pid_reused_by_another_process_is_never_ended(tmp_path):
    """The lock file names a gone holder's helper by pid and start time: a live process on that pid
    with another start time is someone else's, and stays."""
    from om_core.store import writer_lock

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # prefect uvicorn"])
    try:
        started = psutil.Process(stranger.pid).create_time()
        lock = writer_lock.lock_path(tmp_path / "om.duckdb")
        gone = {"pid": 999999, "pid_started": 1.0, "host": __import__("socket").gethostname(), "command": "run"}
        lock.write_text(json.dumps({**gone, "helpers": [{"pid": stranger.pid, "started": started - 5, "cmd": "x"}]}))
        with writer_lock.one_writer(tmp_path / "om.duckdb", "run", 1):
            pass
        assert stranger.poll() is None, "a process on a reused pid was ended"
        lock.write_text(json.dumps({**gone, "helpers": [{"pid": stranger.pid, "started": started, "cmd": "x"}]}))
        with writer_lock.one_writer(tmp_path / "om.duckdb", "run", 1):
            pass
        assert stranger.wait(10) is not None  # the very process noted: ended
    finally:
        if stranger.poll() is None:
            stranger.kill()


def test_a_helper_of_a_live_holder_is_left_alone(tmp_path):
    """`om serve`'s Prefect server is its own to stop: a writer never ends the helpers of a holder still
    running (here: this process, noted as another holder with its real start time)."""
    from om_core.store import writer_lock

    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = psutil.Process()
        lock = writer_lock.lock_path(tmp_path / "om.duckdb")
        parent = psutil.Process(me.ppid())  # a live process that is not this one
        lock.write_text(json.dumps({"pid": parent.pid, "pid_started": parent.create_time(), "command": "serve",
                                    "host": __import__("socket").gethostname(), "helpers": [
                                        {"pid": helper.pid, "started": psutil.Process(helper.pid).create_time()}]}))
        with writer_lock.one_writer(tmp_path / "om.duckdb", "run", 1):
            pass
        assert helper.poll() is None
    finally:
        helper.kill()


def test_sigterm_in_a_retry_storm_leaves_the_interrupted_row_and_line(tmp_path):
    folder = sessions(tmp_path / "sessions", count=3)
    with FakeOpenAI(default=http_error(500, "upstream down")) as server:
        model = ["--model", "openai/fake-model", "--api-base", server.base_url]
        proc = subprocess.Popen(om_command(tmp_path, folder, *model, "--concurrency", "3"), cwd=tmp_path,
                                env=env_for(tmp_path, OM_BREAKER_FAILURES="1000"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: len(server.requests) >= 4, proc)  # stages failing and being retried
            helpers = psutil.Process(proc.pid).children(recursive=True)
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 143, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("interrupted (SIGTERM): run "), err[-2000:]
    assert "Traceback" not in err
    assert [status for status, _ in run_row(tmp_path)] == ["interrupted"]
    _, alive = psutil.wait_procs(helpers, timeout=10)
    assert alive == [], [p.pid for p in alive]


# ------------------------------------------------------------------ a provider down for good (item 1)

LEDGER = ("SELECT l.session_id, l.kind, l.stage, l.stage_key, l.covers_up_to_id, l.anchor_entry_id, "
          "list(o.content ORDER BY o.item_index) FILTER (WHERE o.content IS NOT NULL) "
          "FROM ledger l LEFT JOIN observations o USING (session_id, ledger_id) WHERE l.origin = 'pipeline' "
          "GROUP BY ALL ORDER BY ALL")


def healthy_run(tmp_path: Path, folder: Path, api: str):
    from fake_brains import ScriptedWorkers

    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        done = subprocess.run(om_command(tmp_path, folder, "--model", "openai/fake-model", "--api-base",
                                         server.base_url), cwd=tmp_path, env=env_for(tmp_path, PREFECT_API_URL=api),
                              capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    return db_rows(tmp_path / "om.duckdb", LEDGER)


@pytest.fixture(scope="module")
def reference_ledger(tmp_path_factory, prefect_api):
    """The ledger of an uninterrupted run on a healthy provider."""
    tmp = tmp_path_factory.mktemp("reference")
    return healthy_run(tmp, sessions(tmp / "sessions", count=2), prefect_api)


FAULTS = {"500-forever": (http_error(500, "upstream down"), {}),
          "429-forever": (http_error(429, "slow down"), {}),
          "hang": (Reply(text="(never in time)", delay=60), {"OM_REQUEST_TIMEOUT_SECONDS": "2"})}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_provider_down_for_good_trips_the_breaker_and_a_rerun_resumes(tmp_path, fault, reference_ledger,
                                                                       prefect_api):
    # the test session's Prefect API: the run's own local one is not what this checks (10-15 s a start)
    folder = sessions(tmp_path / "sessions", count=2)
    reply, extra = FAULTS[fault]
    with FakeOpenAI(default=reply) as server:
        done = subprocess.run(om_command(tmp_path, folder, "--model", "openai/fake-model", "--api-base",
                                         server.base_url), cwd=tmp_path,
                              env=env_for(tmp_path, OM_BREAKER_FAILURES="6", PREFECT_API_URL=prefect_api, **extra),
                              capture_output=True,
                              text=True, timeout=400)
        calls = len(server.requests)
    assert done.returncode == 1, done.stderr[-2000:]
    from om_cli import progress_line

    lines = [line for line in done.stderr.splitlines()
             if line.strip() and not line.startswith("cost:") and not progress_line(line)]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("error: model calls stopped: the provider kept failing: 6 model calls in a row"), lines
    assert "Traceback" not in done.stderr
    assert 6 <= calls <= 6 + 8, calls  # the limit, plus at most the calls in flight (modelConcurrency)
    assert [s for (s, _) in run_row(tmp_path)] == ["failed"]
    assert healthy_run(tmp_path, folder, prefect_api) == reference_ledger


# ------------------------------------------------------------------ a full disk (item 2)


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs (root only): the database and Prefect's result storage on it."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass


def test_a_full_disk_stops_the_model_calls_at_once(tmp_path, small_disk):
    from fake_brains import ScriptedWorkers

    folder = sessions(tmp_path / "sessions", count=4)
    script = ScriptedWorkers(delay=0.2)
    calls = {"after": 0}

    def responder(body):
        if "filled" in calls:
            calls["after"] += 1
        elif len(server.requests) >= 3:  # the disk fills during the run
            fill(small_disk)
            calls["filled"] = True
        return script(body)

    db = small_disk / "om.duckdb"
    with FakeOpenAI(responder=responder) as server:
        done = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), "run", str(folder), "--model",
                               "openai/fake-model", "--api-base", server.base_url, "--concurrency", "2"],
                              cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=400)
    assert calls.get("filled"), "the disk never filled: the run made fewer than 3 model calls"
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    from om_cli import progress_line

    lines = [line for line in done.stderr.splitlines()
             if line.strip() and not line.startswith("cost:") and not progress_line(line)]
    assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr[-3000:]
    # no stage starts after the first write failure: only the calls already in flight (modelConcurrency 8)
    assert calls["after"] <= 8, calls
    (small_disk / "filler").unlink()
    # the run's end the full disk could not take is written by the next writer's start (from the lock file)
    after = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), "ingest", str(folder)], cwd=tmp_path,
                           env=env_for(tmp_path), capture_output=True, text=True, timeout=120)
    assert after.returncode == 0, after.stderr[-2000:]
    status = db_rows(db, "SELECT status, detail FROM runs WHERE command = 'run'")
    assert [s for s, _ in status] == ["failed"] and "No space left on device" in status[0][1], status
