"""The Prefect server `om run` keeps between runs (flows.server.kept_server): the first run starts it, the
next reuses it and pays only its work; it stops itself after prefectServerIdleSeconds without a run and
never while one uses it; `om server status|stop` show and end it; a server om did not start is never
used; another user gets nothing from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from other_user import as_nobody, http_as_nobody, need_another_user
from test_prefect_locked import _lookalike, _stop
from test_run_command import REPO, sessions

from flows import kept_server as server_module
from flows import server as prefect_server_module
from flows.kept_server import KEEPER_PID, LEASES, kept_server, run_lease, stop_kept
from flows.server import CREDENTIALS, PrefectServer, api_healthy, free_port, read_credentials, write_credentials

pytestmark = pytest.mark.prefect


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A user of its own: HOME and om's data folder (the server's home) in the test's folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_", "XDG_DATA_HOME"))}
    return {**env, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO), "PREFECT_LOGGING_LEVEL": "WARNING",
            **extra}


def _om(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or " Z " in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:4]:
            return True
        time.sleep(0.2)
    return False


def test_a_second_om_run_reuses_the_server_the_first_left_and_om_server_stop_ends_it(tmp_path):
    """No PREFECT_API_URL: the first `om run` starts om's server and leaves it; the second uses the same
    one (same API, same process); `om server status` shows it idle, `om server stop` ends it."""
    (tmp_path / "home").mkdir()
    folder = sessions(tmp_path / "sessions", count=1)
    env = _env(tmp_path)
    home = tmp_path / "home" / ".local" / "share" / "om" / "prefect"
    try:
        first = _om(tmp_path, "run", str(folder), "--model", "offline", "--json", env=env)
        assert first.returncode == 0, first.stderr[-3000:]
        known = read_credentials(home)
        pid = int((home / KEEPER_PID).read_text())
        assert known["PREFECT_API_URL"].startswith("http://127.0.0.1:") and api_healthy(known["PREFECT_API_URL"])
        assert oct(home.stat().st_mode & 0o777) == "0o700"
        assert oct((home / CREDENTIALS).stat().st_mode & 0o777) == "0o600"
        assert list((home / LEASES).iterdir()) == []  # the run's lease ended with it

        sessions(tmp_path / "sessions2", count=2)
        second = _om(tmp_path, "run", str(tmp_path / "sessions2"), "--model", "offline", "--json", env=env)
        assert second.returncode == 0, second.stderr[-3000:]
        assert read_credentials(home) == known and int((home / KEEPER_PID).read_text()) == pid
        # its work: the new session (the other one is the first run's, unchanged)
        assert [s["session_id"][:8] for s in json.loads(second.stdout)["sessions"]] == ["00000001"]

        status = _om(tmp_path, "server", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert (shown["running"], shown["api_url"], shown["pid"], shown["runs"]) == (
            True, known["PREFECT_API_URL"], pid, [])
        assert shown["idle_seconds"] >= 0

        stopped = _om(tmp_path, "server", "stop", env=env)
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
        assert _pid_gone(pid, 30) and not api_healthy(known["PREFECT_API_URL"])
        assert not (home / CREDENTIALS).exists()
        assert _om(tmp_path, "server", "status", env=env).returncode == 1
    finally:
        stop_kept(home)


def test_the_kept_server_stops_after_its_idle_time_never_while_a_run_uses_it_and_refuses_another_user(
        tmp_path, monkeypatch):
    """Idle time 2 s: while a run holds its lease (longer than that) the server stays; once the run ended,
    it stops itself and removes its credentials. Another local user reaches its port but gets 401, and
    cannot read its home."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    home = tmp_path / "prefect-home"
    with run_lease(server_module.private_dir(home)):
        server, started = kept_server(home, idle_seconds=2)
        pid = int((home / KEEPER_PID).read_text())
        assert started and api_healthy(server.api_url)
        try:
            if os.geteuid() == 0:
                for path in ("/flow_runs/filter", "/logs/filter"):
                    status, _, _ = http_as_nobody("POST", server.api_url + path, {"Content-Type": "application/json"},
                                                  "{}")
                    assert status == 401
                assert as_nobody("cat", str(home / CREDENTIALS)).returncode != 0
            time.sleep(6)  # three idle times, with the lease held
            assert api_healthy(server.api_url) and read_credentials(home)["PREFECT_API_URL"] == server.api_url
            # a second run in the meantime reuses it
            again, started = kept_server(home, idle_seconds=2)
            assert (again.api_url, started) == (server.api_url, False)
            # om serve does not: it needs a scheduler, which this server does not run
            served = []
            monkeypatch.setattr(prefect_server_module, "start_server", lambda host, port, **kwargs: served.append(
                port) or PrefectServer(f"http://{host}:{port}/api", None))
            assert prefect_server_module.local_server(home).api_url != server.api_url and len(served) == 1
        except BaseException:
            stop_kept(home)
            raise
    try:
        assert _pid_gone(pid, 60), "the idle server did not stop"
        assert not api_healthy(server.api_url) and not (home / CREDENTIALS).exists()
    finally:
        stop_kept(home)


def test_a_server_om_did_not_start_is_never_used_by_om_run(tmp_path, monkeypatch):
    """The credentials file names a port where an API answers without credentials (not the one om
    started), or another user's process listens: om starts its own and sends that one nothing."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    home = tmp_path / "prefect-home"
    home.mkdir(mode=0o700)
    started: list[Path] = []
    monkeypatch.setattr(server_module, "_start_kept", lambda home, idle, timeout: started.append(home) or
                        PrefectServer("http://127.0.0.1:1/api", None))
    port, auth = free_port(), "om:a-credential-om-wrote"
    write_credentials(home, PrefectServer(f"http://127.0.0.1:{port}/api", None, auth_string=auth))
    foreign = _lookalike(port, auth, open_api=True)
    try:
        kept_server(home, 600)
    finally:
        _stop(foreign)
    assert started == [home]
    need_another_user()
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no system python for nobody's server")
    theirs = _lookalike(port, auth, as_nobody=True)
    try:
        kept_server(home, 600)
    finally:
        seen = _stop(theirs)
    assert started == [home, home] and "Basic" not in seen


def test_a_kept_server_whose_home_is_removed_stops_itself(tmp_path, monkeypatch):
    """A server left by a run in a temporary home (a benchmark's, a test's) whose folder was removed: no
    run can find it again, so it stops instead of waiting for an idle time it could no longer check."""
    import shutil

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    home = tmp_path / "prefect-home"
    with run_lease(server_module.private_dir(home)):
        server, started = kept_server(home, idle_seconds=3600)
        pid = int((home / KEEPER_PID).read_text())
    assert started and api_healthy(server.api_url)
    shutil.rmtree(home)
    try:
        assert _pid_gone(pid, 60), "the server outlived its home"
    finally:
        if not _pid_gone(pid, 0.1):
            os.kill(pid, 9)
