"""flows/endpoint.py: the live endpoint answers what the library answers, only to its token; it is
the database's writer only while it answers, so a busy file makes it say "busy" within its wait,
several sessions asking at once are all answered, and an analyst's `om sql` reads in between."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from test_extension_interop import E, O1, extension_session

from conftest import REPO, workspace
from flows.endpoint import LiveEndpoint, ask, endpoint_file, running_endpoint
from om_core.errors import OmError
from om_core.live import CompactRequest, RecallRequest, compact_live, recall_live
from om_core.settings import Settings

POOL = Settings(observationsPoolMaxTokens=160)


@pytest.fixture
def served(tmp_path):
    path = extension_session().write(tmp_path / "live.jsonl")
    ws = workspace(tmp_path / "om.duckdb", POOL)
    lines: list[str] = []
    with LiveEndpoint(ws, wait_seconds=1.0, on_answer=lines.append) as endpoint:
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
    with LiveEndpoint(ws, wait_seconds=30) as endpoint:
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
    endpoint_file(ws.path).write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "t", "pid": int(gone.stdout)}))
    assert running_endpoint(ws.path) is None  # a killed endpoint's announcement
    with LiveEndpoint(ws) as endpoint:  # is replaced
        assert running_endpoint(ws.path)["url"] == endpoint.url
    assert running_endpoint(ws.path) is None
