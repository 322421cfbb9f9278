"""A Prefect API om starts requires its credential, beyond the server `om serve` starts
(tests/test_serve.py's test_served_*): the local API Prefect starts for `om run`, and which running
server om reuses (only one it started, still this user's, still locked)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from fake_openai import FakeOpenAI, Reply
from other_user import NOBODY, http_as_nobody, need_another_user
from test_run_command import env_for, sessions

from flows import server as prefect_server_module
from flows.server import CREDENTIALS, PrefectServer, free_port, local_server, read_credentials, write_credentials

# A stand-in for a locked Prefect API (stdlib only: nobody runs it with the system's python): 200 to the
# credential given, 401 to anyone else; every request's Authorization header printed as it comes.
LOOKALIKE = r"""
import base64, http.server, sys
wanted = "Basic " + base64.b64encode(sys.argv[2].encode()).decode()
class Answer(http.server.BaseHTTPRequestHandler):
    def _send(self, code):
        print(self.command, self.path, self.headers.get("Authorization"), flush=True)
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"[]")
    def do_GET(self):
        self._send(200)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(200 if sys.argv[3] == "open" or self.headers.get("Authorization") == wanted else 401)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
"""


def _lookalike(port: int, auth: str, *, as_nobody: bool = False, open_api: bool = False) -> subprocess.Popen:
    python = [*NOBODY, "/usr/bin/python3"] if as_nobody else [sys.executable]
    process = subprocess.Popen([*python, "-c", LOOKALIKE, str(port), auth, "open" if open_api else "locked"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/")
    deadline = time.monotonic() + 20
    while not any(c.laddr.port == port and c.status == "LISTEN" for c in psutil.net_connections("tcp")):
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.1)
    return process


def _stop(process: subprocess.Popen) -> str:
    """Its output: the requests it saw."""
    process.kill()
    out, _ = process.communicate(timeout=10)
    return out


def test_a_running_server_is_reused_only_when_om_started_it_and_it_is_still_this_users_and_locked(tmp_path):
    """The credentials file names a server om started. It is reused while a process of this user's answers
    there, to that credential and to nobody else; never when another user's process took the port (it
    gets no request with the credential), when the API there is open, or when the file is not private."""
    home = tmp_path / "prefect-home"
    home.mkdir(mode=0o700)
    port, auth = free_port(), "om:the-credential-of-a-server-om-started"
    url = f"http://127.0.0.1:{port}/api"
    write_credentials(home, PrefectServer(url, None, auth_string=auth))
    assert oct((home / CREDENTIALS).stat().st_mode & 0o777) == "0o600"
    assert read_credentials(home) == {"PREFECT_API_URL": url, "PREFECT_API_AUTH_STRING": auth}

    ours = _lookalike(port, auth)
    try:
        reused = local_server(home)
        assert (reused.api_url, reused.auth_string, reused.started_here) == (url, auth, False)
        os.chmod(home / CREDENTIALS, 0o644)  # readable by others: not this user's credential any more
        assert read_credentials(home) == {}
        os.chmod(home / CREDENTIALS, 0o600)
    finally:
        _stop(ours)
    started = []

    def start_server(host, port, **kwargs):  # noqa: ANN001 - a real one takes 10-25 s: only where it starts
        started.append((host, port))
        return PrefectServer(f"http://{host}:{port}/api", None)

    open_api = _lookalike(port, auth, open_api=True)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(prefect_server_module, "start_server", start_server)
            local_server(home)
    finally:
        _stop(open_api)
    assert started and started[-1][0] == "127.0.0.1"  # an open API where ours was: a new server

    need_another_user()
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no system python for nobody's server")
    theirs = _lookalike(port, auth, as_nobody=True)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(prefect_server_module, "start_server", start_server)
            local_server(home)
    finally:
        seen = _stop(theirs)
    assert len(started) == 2  # another user's process on its port: a new server
    assert "Basic" not in seen  # the credential never went to another user's process


def test_a_server_om_did_not_start_on_prefect_s_port_is_never_used(tmp_path, monkeypatch):
    """An API already answering on PREFECT_SERVER_API_PORT (4200 by default) that om did not start (no
    credentials of it): not reused, however it answers; om serve starts its own on a free port."""
    port = free_port()
    foreign = _lookalike(port, "", open_api=True)
    started = []
    monkeypatch.setenv("PREFECT_SERVER_API_PORT", str(port))
    monkeypatch.setattr(prefect_server_module, "start_server",
                        lambda host, port, **kwargs: started.append((host, port, kwargs["home"])) or
                        PrefectServer(f"http://{host}:{port}/api", None))
    try:
        local_server(tmp_path / "prefect-home")
    finally:
        seen = _stop(foreign)
    assert len(started) == 1 and started[0][0] == "127.0.0.1" and started[0][1] != port
    assert started[0][2] == tmp_path / "prefect-home"
    assert "/api/flows/filter" not in seen  # not even asked


@pytest.mark.prefect
def test_om_run_s_own_prefect_api_requires_its_credential_and_takes_no_cross_origin_call(tmp_path):
    """`om run` without PREFECT_API_URL talks to a local API Prefect starts (uvicorn on 127.0.0.1:8000-8999):
    it answered anyone (the run's parameters, its logs, its states to set) until om gave it a credential of
    the run's own. Asked as nobody while the run waits on its model: 401, and no origin is allowed. (With
    prefectServerIdleSeconds 0: the server a run keeps for the next, locked alike, is tests/test_kept_server.py's.)"""
    need_another_user()
    folder = sessions(tmp_path / "sessions", count=1)
    with FakeOpenAI(default=Reply(text="(slow)", delay=120)) as model:
        run = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(tmp_path / "om.duckdb"), "run",
                                str(folder), "--model", "openai/fake-model", "--api-base", model.base_url],
                               cwd=tmp_path, env=env_for(tmp_path, OM_PREFECT_SERVER_IDLE_SECONDS="0"),
                               stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 240
            while not model.requests:  # the run is under way: its API is up
                assert run.poll() is None, run.stderr.read()[-2000:]
                assert time.monotonic() < deadline, "no model call"
                time.sleep(0.3)
            [api_port] = {int(m.group(1)) for child in psutil.Process(run.pid).children(recursive=True)
                          if (m := re.search(r"uvicorn .*--host 127\.0\.0\.1 --port (\d+)", " ".join(child.cmdline())))}
            api = f"http://127.0.0.1:{api_port}/api"
            status, _, _ = http_as_nobody("GET", f"{api}/health")
            assert status == 200  # reachable by another user...
            for path in ("/flow_runs/filter", "/task_runs/filter", "/logs/filter"):
                status, _, text = http_as_nobody("POST", api + path, {"Content-Type": "application/json"}, "{}")
                assert status == 401, (path, text[:300])  # ...who gets nothing
            status, headers, _ = http_as_nobody("OPTIONS", f"{api}/flow_runs/filter", {
                "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
            assert status == 400 and "access-control-allow-origin" not in headers
        finally:
            os.killpg(run.pid, signal.SIGINT)
            try:
                run.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait(10)
