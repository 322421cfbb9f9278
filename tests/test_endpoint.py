"""flows/endpoint.py: the live endpoint answers what the library answers, only to its token; it is
the database's writer only while it answers, so a busy file makes it say "busy" within its wait,
several sessions asking at once are all answered, and an analyst's `om sql` reads in between."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import duckdb

import pytest
from test_extension_interop import E, O1, extension_session

from conftest import REPO, workspace
from flows.endpoint import LiveEndpoint, ask, endpoint_file, running_endpoint
from om_core.errors import OmError
from om_core.usecases.live import CompactRequest, RecallRequest, compact_live, recall_live
from om_core.store.private_files import private_dir
from om_core.settings import Settings

POOL = Settings(observationsPoolMaxTokens=160)


@pytest.fixture
def served(tmp_path):
    path = extension_session().write(tmp_path / "live.jsonl")
    ws = workspace(tmp_path / "om.duckdb", POOL)
    lines: list[str] = []
    with LiveEndpoint(ws, wait_seconds=1.0, sessions=[tmp_path], on_answer=lines.append) as endpoint:
        endpoint.lines = lines
        yield endpoint, ws, path


def compact_payload(path, leaf=E[32], first_kept=E[32]) -> dict:
    return {"session_file": str(path), "leaf": leaf, "first_kept_entry_id": first_kept, "tokens_before": 1000}


def test_it_answers_what_the_library_answers(served):
    endpoint, ws, path = served
    announcement = running_endpoint(ws.path)
    assert announcement["url"] == endpoint.url and announcement["db"] == str(ws.path.resolve())
    assert stat.S_IMODE(endpoint_file(ws.path).stat().st_mode) == 0o600  # the token: this user only
    got = ask(announcement, "compact", compact_payload(path))
    assert got["entries_added"] == 32  # it ingested the file
    again = compact_live(ws, CompactRequest(**compact_payload(path))).model_dump(mode="json")
    assert got == {**again, "entries_added": 32}
    assert got["compaction"]["summary"] and endpoint.lines[-1].startswith(f"compact {got['session_id']} at {E[32]}: ")
    recalled = ask(announcement, "recall", {"session_file": str(path), "id": O1["id"]})
    assert recalled == recall_live(ws, RecallRequest(session_file=str(path), id=O1["id"]))
    assert ask(announcement, "info")["observationsPoolMaxTokens"] == 160


def test_errors_come_back_as_one_line(served, tmp_path):
    endpoint, ws, path = served
    announcement = running_endpoint(ws.path)
    with pytest.raises(OmError, match="not in session"):
        ask(announcement, "compact", compact_payload(path, leaf="ffffffff"))
    with pytest.raises(OmError, match="bad compact request: leaf: Field required"):
        ask(announcement, "compact", {"session_file": str(path), "first_kept_entry_id": "x", "tokens_before": 1})
    with pytest.raises(OmError, match="unknown request"):
        ask(announcement, "drop-everything", {})
    with pytest.raises(OmError, match="wrong token"):
        ask({**announcement, "token": "guess"}, "compact", compact_payload(path))
    request = urllib.request.Request(f"{endpoint.url}/compact", data=b"not json", method="POST",
                                     headers={"Authorization": f"Bearer {endpoint.token}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400


HOLD = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_busy_database_is_answered_busy_within_the_wait(served):
    endpoint, ws, path = served
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ws.path), "30"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(OmError, match="is being written by another process"):
            ask(running_endpoint(ws.path), "compact", compact_payload(path))
        assert time.monotonic() - started < 5  # the endpoint's wait (1 s), then its answer
    finally:
        holder.kill()
        holder.wait()
    assert ask(running_endpoint(ws.path), "compact", compact_payload(path))["compaction"] is not None


def test_several_sessions_at_once_and_an_analyst_between_them(tmp_path):
    files = []
    for n in range(4):
        sb = extension_session()
        sb.header["id"] = f"{n}" + sb.header["id"][1:]
        files.append(sb.write(tmp_path / f"live{n}.jsonl"))
    ws = workspace(tmp_path / "om.duckdb", POOL)
    with LiveEndpoint(ws, wait_seconds=30, sessions=[tmp_path]) as endpoint:
        announcement = running_endpoint(ws.path)
        answers: dict[int, dict] = {}
        threads = [threading.Thread(target=lambda n=n: answers.__setitem__(
            n, ask(announcement, "compact", compact_payload(files[n]), timeout=60))) for n in range(4)]
        for t in threads:
            t.start()
        analyst = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(ws.path), "sql",
                                  "SELECT count(*) AS n FROM sessions", "--json"],
                                 capture_output=True, text=True, timeout=120, cwd=REPO)
        for t in threads:
            t.join(60)
        assert endpoint.url
    assert sorted(answers) == [0, 1, 2, 3]
    assert len({a["compaction"]["summary"] for a in answers.values()}) == 1  # the same memory in each copy
    assert len({a["session_id"] for a in answers.values()}) == 4
    assert analyst.returncode == 0, analyst.stderr
    assert json.loads(analyst.stdout)[0]["n"] in range(0, 5)


def test_requests_share_one_open_and_wait_only_for_their_own_file(tmp_path):
    """Requests for different session files are answered side by side on one open of the database; only
    a request for the same file waits (its new lines are ingested one request at a time)."""
    files = []
    for n in range(4):
        sb = extension_session()
        sb.header["id"] = f"{n}" + sb.header["id"][1:]
        files.append(sb.write(tmp_path / f"live{n}.jsonl"))
    with LiveEndpoint(workspace(tmp_path / "om.duckdb", POOL), wait_seconds=30, sessions=[tmp_path]) as endpoint:
        announcement = running_endpoint(endpoint.db_path)
        answers: dict[int, dict] = {}

        def ask_for(n: int) -> threading.Thread:
            thread = threading.Thread(target=lambda: answers.__setitem__(
                n, ask(announcement, "compact", compact_payload(files[n]), timeout=120)))
            thread.start()
            return thread

        busy = endpoint._file_lock(files[0].resolve())
        with endpoint.db.holding():  # the file open, as for a request in progress
            with busy:  # and file 0 being answered
                waiting = ask_for(0)
                others = [ask_for(n) for n in (1, 2, 3)]
                for t in others:
                    t.join(120)
                assert sorted(answers) == [1, 2, 3]  # answered, while the request for file 0 waits for its turn
                assert waiting.is_alive()
            waiting.join(120)
            assert sorted(answers) == [0, 1, 2, 3] and len({a["session_id"] for a in answers.values()}) == 4
        assert endpoint.db.opens == 1  # all on one open
        ask(announcement, "compact", compact_payload(files[1]))
        assert endpoint.db.opens == 1  # a request right after the burst finds the file still open (HOLD_SECONDS)
        deadline = time.monotonic() + 30
        while endpoint.db.is_open:  # let go once the hold has passed with no request
            assert time.monotonic() < deadline, "the endpoint kept the file open"
            time.sleep(0.1)
        ask(announcement, "compact", compact_payload(files[1]))
        assert endpoint.db.opens == 2  # a later request opens it again


def test_a_request_naming_its_folder_gets_that_projects_settings(tmp_path):
    """The extension hands om the session's cwd: the endpoint answers with the settings an om command run
    there would use (that folder's om.toml), not its own."""
    from flows.cli.live import project_settings

    path = extension_session().write(tmp_path / "live.jsonl")
    project = tmp_path / "project"
    project.mkdir()
    (project / "om.toml").write_text("observationsPoolMaxTokens = 160\n")
    with LiveEndpoint(workspace(tmp_path / "om.duckdb"), sessions=[tmp_path], settings_for=project_settings) as endpoint:
        announcement = running_endpoint(endpoint.db_path)
        own = ask(announcement, "compact", compact_payload(path))
        there = ask(announcement, "compact", {**compact_payload(path), "cwd": str(project)})
        assert own["compaction"]["details"] == compact_live(workspace(tmp_path / "om.duckdb"), CompactRequest(
            **compact_payload(path))).compaction["details"]
        assert there["compaction"]["details"] == compact_live(workspace(tmp_path / "om.duckdb", POOL), CompactRequest(
            **compact_payload(path))).compaction["details"] != own["compaction"]["details"]
        with pytest.raises(OmError, match="must be an existing absolute path"):
            ask(announcement, "compact", {**compact_payload(path), "cwd": "relative/dir"})


def test_one_endpoint_per_database_and_its_announcement_goes_with_it(tmp_path):
    ws = workspace(tmp_path / "om.duckdb")
    other = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(ws.path), "live", "endpoint"],
                             stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while running_endpoint(ws.path) is None:
            assert other.poll() is None and time.monotonic() < deadline, other.stderr.read()
            time.sleep(0.1)
        with pytest.raises(OmError, match=f"already running \\(pid {other.pid}"):
            LiveEndpoint(ws).start()
    finally:
        other.terminate()
        other.wait(timeout=30)
    assert not endpoint_file(ws.path).exists()  # removed on the way out
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    endpoint_file(ws.path).write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "t", "pid": int(gone.stdout),
                                                  "db": str(ws.path.resolve()), "sessions": [str(tmp_path)]}))
    endpoint_file(ws.path).chmod(0o600)
    assert running_endpoint(ws.path) is None  # a killed endpoint's announcement
    with LiveEndpoint(ws) as endpoint:  # is replaced
        assert running_endpoint(ws.path)["url"] == endpoint.url
    assert running_endpoint(ws.path) is None


# ------------------------------------------------------------------ what another local process may send


def _send(url: str, raw: bytes, timeout: float = 20.0, shut: bool = False) -> tuple[int, dict]:
    """``raw`` bytes to the endpoint on one connection, and its answer (status, JSON)."""
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
            if shut:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it answered and closed before taking the rest: what a refused body should get
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read() or b"{}")


def _post(op: str, body: bytes, headers: dict[str, str]) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"POST /{op} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode() + body


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def real_endpoint(tmp_path_factory):
    """A real `om live endpoint --sessions DIR` process, its stderr kept."""
    root = tmp_path_factory.mktemp("real-endpoint")
    sessions = root / "sessions"
    sessions.mkdir()
    path = extension_session().write(sessions / "live.jsonl")
    db = root / "om.duckdb"
    log = root / "endpoint.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OM_")}
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(db), "live", "endpoint",
                                    "--sessions", str(sessions)], cwd=root, env={**env, "HOME": str(root)},
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while running_endpoint(db) is None:
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield SimpleNamespace(announcement=running_endpoint(db), db=db, path=path, sessions=sessions, root=root,
                              log=log, process=process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_request_body_is_read_only_with_the_token_and_only_up_to_1_mb(real_endpoint):
    """Without the token the answer is 401 before a byte of the body is read (8 x 50 MB, sent anyway, do not
    grow the process); with it, a body over 1 MB is refused unread (413)."""
    url, token = real_endpoint.announcement["url"], real_endpoint.announcement["token"]
    big = 50 * 1024 * 1024
    # the headers alone: an endpoint that read the body first would wait for it and never answer
    assert _send(url, _post("compact", b"", {"Content-Length": str(big)}))[0] == 401
    assert _send(url, _post("compact", b"", {"Content-Length": str(big), "Authorization": "Bearer guess"}))[0] == 401
    status, answer = _send(url, _post("compact", b"", {"Content-Length": str(big), "Authorization": f"Bearer {token}"}))
    assert status == 413 and "at most 1048576" in answer["error"]
    before = _rss_kb(real_endpoint.process.pid)
    body = b'{"session_file": "' + b"x" * big + b'"}'
    results: list[int] = []

    def flood(auth: dict[str, str]) -> None:
        try:
            results.append(_send(url, _post("compact", body, {"Content-Length": str(len(body)), **auth}))[0])
        except OSError:
            results.append(0)  # closed on us mid-send: also not read

    threads = [threading.Thread(target=flood, args=({"Authorization": f"Bearer {token}"} if n % 2 else {},))
               for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(results) <= {401, 413, 0} and len(results) == 8
    assert _rss_kb(real_endpoint.process.pid) - before < 40_000, "the endpoint read the bodies"


@pytest.mark.parametrize("headers, body, status, says", [
    ({"Content-Length": "abc"}, b"{}", 400, "bad Content-Length"),
    ({"Content-Length": "-1"}, b"{}", 400, "bad Content-Length"),
    ({"Content-Length": "100"}, b"{}", 400, "ended before its Content-Length"),
    ({"Transfer-Encoding": "chunked"}, b"2\r\n{}\r\n0\r\n\r\n", 411, "Content-Length"),
    ({}, b"[" * 200_000, 400, "nested too deeply"),
    ({}, b'{"session_file": "\xff\xfe"}', 400, "not JSON"),
    ({}, b"not json", 400, "not JSON"),
])
def test_a_malformed_request_is_a_400_with_no_traceback(real_endpoint, headers, body, status, says):
    token = real_endpoint.announcement["token"]
    headers = {"Authorization": f"Bearer {token}", "Content-Length": str(len(body)), **headers}
    if "Transfer-Encoding" in headers:
        del headers["Content-Length"]
    got, answer = _send(real_endpoint.announcement["url"], _post("compact", body, headers), shut=True)
    assert (got, says in answer["error"]) == (status, True), answer
    assert real_endpoint.process.poll() is None
    assert "Traceback" not in real_endpoint.log.read_text()


def test_only_a_pi_session_file_under_the_served_folders_is_read_and_nothing_else_is_kept(real_endpoint):
    """The endpoint, given its token, reads no file of the user's it does not serve: not /etc/shadow,
    not its own /proc/PID/environ, not a link in the session folder to a file outside it, not a file in
    the folder that is no Pi session; none of them reaches the database (its quarantine included). A
    session file under the folder is answered."""
    a = real_endpoint.announcement
    link = real_endpoint.sessions / "passwd.jsonl"
    link.symlink_to("/etc/passwd")
    notes = real_endpoint.sessions / "notes.jsonl"
    notes.write_text("password = hunter2-correct-horse\n")
    refused = {
        "/etc/shadow": "is not under the session folders",
        f"/proc/{real_endpoint.process.pid}/environ": "is not under the session folders",
        str(link): "is not under the session folders",
        str(notes): "is not a Pi session file",
        "live.jsonl": "must be an absolute path",
        str(real_endpoint.sessions / "missing.jsonl"): "no session file",
    }
    for name, says in refused.items():
        for op, body in (("recall", {"session_file": name, "id": O1["id"]}), ("compact", compact_payload(name))):
            with pytest.raises(OmError, match=says):
                ask(a, op, body)
    assert ask(a, "compact", compact_payload(real_endpoint.path))["compaction"] is not None
    deadline = time.monotonic() + 30
    while True:  # the endpoint let go of the file after its answer
        try:
            con = duckdb.connect(str(real_endpoint.db), read_only=True)
            break
        except duckdb.Error:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    try:
        assert con.execute("SELECT count(*) FROM om_internal.quarantine").fetchone() == (0,)
        assert con.execute("SELECT file_path FROM om_internal.session_files").fetchall() == [
            (str(real_endpoint.path.resolve()),)]
    finally:
        con.close()
    assert "Traceback" not in real_endpoint.log.read_text()


def test_idle_connections_are_closed_and_a_burst_of_200_is_answered(tmp_path):
    """Sockets time out (an idle connection is closed, never held); 200 concurrent requests are all
    answered, none reset (the listen backlog fits them)."""
    path = extension_session().write(tmp_path / "live.jsonl")
    with LiveEndpoint(workspace(tmp_path / "om.duckdb", POOL), sessions=[tmp_path], socket_seconds=1.0) as endpoint:
        parsed = urllib.parse.urlsplit(endpoint.url)
        idle = [socket.create_connection((parsed.hostname, parsed.port), timeout=10) for _ in range(50)]
        try:
            time.sleep(1.5)
            assert all(s.recv(1) == b"" for s in idle)  # closed by the endpoint
        finally:
            for s in idle:
                s.close()
        request = f"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {endpoint.token}\r\n\r\n".encode()
        barrier = threading.Barrier(200)
        outcomes: list[object] = []

        def one() -> None:
            barrier.wait(30)
            try:
                outcomes.append(_send(endpoint.url, request)[0])
            except OSError as exc:
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=one) for _ in range(200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert outcomes.count(200) == 200, sorted(map(str, outcomes))[:5]
        assert ask(running_endpoint(endpoint.db_path), "recall", {"session_file": str(path), "id": O1["id"]})


def test_om_trusts_only_this_user_s_own_endpoint_file(tmp_path):
    """`om live info` (running_endpoint) applies the extension's rules: a file others can read, owned by
    another user, naming another host or another database is no endpoint (a process not this user's:
    tests/test_pi_trust.py)."""
    db = tmp_path / "om.duckdb"
    path = endpoint_file(db)
    private_dir(path.parent)
    valid = {"url": "http://127.0.0.1:9", "token": "t", "pid": os.getpid(), "db": str(db.resolve()),
             "sessions": [str(tmp_path)]}

    def planted(mode: int = 0o600, owner: int | None = None, **changes):
        path.unlink(missing_ok=True)
        path.write_text(json.dumps({**valid, **changes}))
        path.chmod(mode)
        if owner is not None:
            os.chown(path, owner, owner)
        return running_endpoint(db)

    assert planted() == valid
    assert planted(0o644) is None and planted(0o640) is None
    assert planted(url="http://192.0.2.7:9") is None and planted(url="http://localhost.example:9") is None
    assert planted(db=str(tmp_path / "other.duckdb")) is None
    if os.geteuid() == 0:  # root can chown: a file of another user's
        assert planted(owner=65534) is None
    assert planted(sessions="everything") is None  # not what om's endpoint writes
    planted()
    path.parent.chmod(0o777)  # a folder anyone could plant an announcement in
    try:
        assert running_endpoint(db) is None
    finally:
        path.parent.chmod(0o700)
