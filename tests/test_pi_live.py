"""The whole loop with the real Pi 1.6.0 (RPC mode) and the om extension (deployments/pi/om-memory.ts):
a conversation of several turns with a fake model as Pi's provider, the extension's background tick
(`om run FILE --no-drain`) maintaining the session's memory, then compactions.

Nothing names om's database to Pi or to the extension: `om --db DB live endpoint --sessions DIR` (later
the README's `om --db DB serve --live DIR`) announces itself in this user's state folder, and the
extension finds the database of the endpoint serving the session's folder.

One Pi process serves the conversation's scenarios, in order (the extension reads its options from
Pi's settings at each use, so a scenario changes them between compactions):
- the compaction Pi writes carries om's summary and details, the user's /compact instructions after
  the memory, and equals `om compact` at that cut point; another extension sees it pending and done;
  `recall` of an id in it returns the evidence;
- a locked database, then (the endpoint stopped) the om command answering alone, an endpoint answering
  garbage (never written: the om command answers), om failing, om too slow, om missing, a database
  named that does not exist: Pi compacts natively every time, with one line saying why;
- the README's `om serve` example with no om settings at all: om's memory reaches the agent; eight
  sessions compacting at once through it; an archived v1 file om maintained, opened (Pi migrates it)
  and compacted in Pi, answered from om's memory.
Then Pi processes of their own: pi-observational-memory loaded too (Pi starts, one recall tool, the
other's; om's compaction stands whenever the other gives none; said once), in either order, with om
installed by `pi install ./deployments/pi`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import pytest
from fake_openai import FakeOpenAI, Reply, tool_call
from pi_rpc import EXTENSION, NODE, PI_CLI, REPO, RpcPi, agent_dir, missing, os_env, session_entries

from flows.endpoint import endpoint_file, running_endpoint
from om_core.usecases.export import export_session
from om_core.usecases.live import RecallRequest, recall_live
from om_core.memory.views import CompactionResult
from om_core.memory.compaction import compact
from om_core.store.private_files import private_dir, write_private
from om_core.memory.render import with_instructions
from om_core.settings import Settings
from om_core.store.workspace import Workspace

pytestmark = [pytest.mark.prefect, pytest.mark.skipif(missing() is not None, reason=missing() or "")]

BIN = Path(sys.executable).parent
TESTS = Path(__file__).resolve().parent
WATCHER = TESTS / "pi_compaction_watcher.ts"
# pi-observational-memory itself when PI_OM_EXTENSION names a checkout (npm does not serve it here),
# else a stand-in registering what it registers (tests/pi_other_memory.ts)
REAL_OTHER = os.environ.get("PI_OM_EXTENSION")
OTHER = Path(REAL_OTHER) / "src" / "index.ts" if REAL_OTHER else TESTS / "pi_other_memory.ts"
OTHER_SUMMARY = "The other memory extension's summary."
NATIVE = "Native summary: the user works on the ledger service."
INSTRUCTIONS = "Keep the deploy target and the release tag format."
PROMPTS = [
    "We are building the ledger service in Rust. The database is PostgreSQL 16 and it listens on port 5433. "
    "Please remember that the schema lives in migrations/0001_init.sql.",
    "The user decided that every API response uses snake_case keys, and that errors carry a stable code field. "
    "We also agreed that the retry budget of the payment client is three attempts with jittered backoff.",
    "Next, the deploy target is a single Hetzner box in Falkenstein named ledger-prod-1; CI runs on GitHub "
    "Actions and the release tag format is vYYYY.MM.DD. The on-call rotation is weekly.",
    "Finally, the user wants the audit log kept for seven years in object storage, encrypted with age keys, "
    "and a nightly job that verifies every archive can be restored.",
]
ENV = {"OM_OBSERVE_AFTER_TOKENS": "60", "OM_REFLECT_AFTER_TOKENS": "100000", "OM_CLOCK_BASIS": "source"}
ANSWERED = r"om: compacted from memory \(\d+ observations, \d+ reflections\) in (\d+) ms, from "


class Live:
    def __init__(self, root: Path, prefect_api: str) -> None:
        self.root, self.home, self.project = root, root / "home", root / "project"
        self.project.mkdir()
        self.sessions = root / "sessions"
        self.db = (root / "om.duckdb").resolve()
        self.watch = root / "watched.jsonl"
        self.server = FakeOpenAI(default=Reply(text=NATIVE))
        self.server.start()
        # no OM_DB: the extension finds the database through the endpoint's announcement
        self.env = os_env(PATH=f"{BIN}:{os.environ['PATH']}", PREFECT_API_URL=prefect_api,
                          OM_TEST_WATCH_FILE=str(self.watch), **ENV)
        self.settings = {"compaction": {"keepRecentTokens": 120}, "om": {"tick": True, "timeoutMs": 30000}}
        self.agent = agent_dir(self.home, self.server.base_url, self.settings)
        self.endpoint: subprocess.Popen | None = None
        self.serve: subprocess.Popen | None = None
        self.pi: RpcPi | None = None

    def set_om(self, **options) -> None:
        """Change the extension's options in Pi's settings (read at each compaction)."""
        self.settings["om"] = {"tick": False, "timeoutMs": 30000, **options}
        (self.agent / "settings.json").write_text(json.dumps(self.settings))

    def no_om_settings(self) -> None:
        """Pi's settings with no "om" key at all (the README: "Configure. Nothing")."""
        self.settings.pop("om", None)
        (self.agent / "settings.json").write_text(json.dumps(self.settings))

    def workspace(self) -> Workspace:
        return Workspace.open(self.db, settings=Settings())

    def om_compact(self, entry: dict, path: Path | None = None) -> CompactionResult:
        """What `om compact FILE --first-kept F --leaf L` answers for a compaction entry Pi wrote (the
        library function the command prints)."""
        return compact(self.workspace(), str(path or self.session_file), entry["firstKeptEntryId"], entry["parentId"])

    def _started(self, process: subprocess.Popen, what: str) -> None:
        deadline = time.monotonic() + 120
        while running_endpoint(self.db) is None:
            assert process.poll() is None, f"{what} exited: {process.stderr.read().decode()[-3000:]}"
            assert time.monotonic() < deadline, f"{what} did not announce itself"
            time.sleep(0.1)

    def start_endpoint(self) -> None:
        self.endpoint = subprocess.Popen([str(BIN / "om"), "--db", str(self.db), "live", "endpoint", "--sessions",
                                          str(self.sessions)], cwd=self.project,
                                         env={**self.env, "HOME": str(self.home)}, stderr=subprocess.PIPE)
        self._started(self.endpoint, "om live endpoint")

    def start_serve(self) -> None:
        """The README's example: `om --db /data/om.duckdb serve --live ~/.pi/agent/sessions` (its Prefect
        API: the test session's; its first maintenance tick is ten minutes away)."""
        self.serve = subprocess.Popen([str(BIN / "om"), "--db", str(self.db), "serve", "--live", str(self.sessions)],
                                      cwd=self.project, env={**self.env, "HOME": str(self.home)},
                                      stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._started(self.serve, "om serve")

    @staticmethod
    def _stop(process: subprocess.Popen | None) -> None:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop_endpoint(self) -> None:
        self._stop(self.endpoint)
        self.endpoint = None

    @property
    def session_file(self) -> Path:
        return Path(self.pi.call({"type": "get_state"})["data"]["sessionFile"])

    def ticks_done(self, timeout: float = 300) -> str:
        """Wait until no tick runs (the footer's latest status is a result, not "updating"); that result."""
        time.sleep(2)  # a settle's handler sets "updating" right after Pi reports the settle
        deadline = time.monotonic() + timeout
        while True:
            statuses = self.pi.notes(method="setStatus")
            if statuses and "updating" not in statuses[-1]:
                return statuses[-1]
            assert time.monotonic() < deadline, f"the ticks did not end: {statuses}"
            time.sleep(0.5)

    def close(self) -> None:
        if self.pi is not None:
            self.pi.close()
        self.stop_endpoint()
        self._stop(self.serve)
        self.server.stop()


def turn(pi: RpcPi, server: FakeOpenAI, text: str | None = None) -> None:
    """One more turn, over keepRecentTokens: Pi has something to compact after its latest compaction."""
    detail = text or f"One more detail: the feature flag for this change is named ledger-{len(pi.records)}. " * 8
    server.add(Reply(text="Noted. " + detail))
    pi.prompt(detail)


def compact_now(pi: RpcPi, instructions: str | None = None) -> tuple[dict, list[str], dict]:
    """Compact now: (Pi's response data, the extension's lines, the compaction entry Pi wrote)."""
    since = pi.mark()
    command = {"type": "compact", **({"customInstructions": instructions} if instructions else {})}
    response = pi.call(command, timeout=180)
    assert response["success"], (response.get("error"), pi.notes(since))
    file = Path(pi.call({"type": "get_state"})["data"]["sessionFile"])
    entry = session_entries(file)[-1]
    assert entry["type"] == "compaction", entry
    return response["data"], pi.notes(since), entry


@pytest.fixture(scope="module")
def live(prefect_api, tmp_path_factory):
    """The conversation, maintained by the extension's tick, with the endpoint running."""
    lv = Live(tmp_path_factory.mktemp("pi-live"), prefect_api)
    try:
        lv.start_endpoint()
        lv.pi = RpcPi(lv.home, lv.project, lv.env, session_dir=lv.sessions, extensions=(EXTENSION, WATCHER))
        lv.start_notes = [lv.pi.wait_for(lambda r: r.get("method") == "notify", timeout=120)["message"]]
        for i, text in enumerate(PROMPTS):
            lv.server.add(Reply(text=f"Understood ({i}). " + text.lower()))
            lv.pi.prompt(text)  # the first settle starts a tick; it runs beside the next turns (never blocks them)
        lv.tick_status = lv.ticks_done()
        lv.set_om()  # no more ticks: the scenarios below hold the database or take om away
        yield lv
    finally:
        lv.close()


def test_session_start_finds_the_database_through_the_endpoint(live):
    line = live.start_notes[0]
    assert line.startswith(f"om: memory in {live.db} (the endpoint serving the session's folder)"), line
    assert "answers from the endpoint http://127.0.0.1:" in line and "background tick on" in line, line


def test_the_tick_maintains_the_session(live):
    assert re.match(r"om: memory \+[1-9]\d* observations", live.tick_status), live.tick_status
    with live.workspace().read() as con:
        assert con.execute("SELECT count(*) FROM observations").fetchone()[0] > 0


def test_compaction_from_the_endpoint_carries_om_memory_and_the_users_instructions(live):
    data, lines, entry = compact_now(live.pi, INSTRUCTIONS)
    assert len(lines) == 1 and re.fullmatch(ANSWERED + "the endpoint", lines[0]), lines
    assert entry["fromHook"] is True and entry["details"]["type"] == "om.folded"
    assert entry["summary"] == data["summary"] and entry["details"] == data["details"]
    expected = live.om_compact(entry)
    assert entry["summary"] == with_instructions(expected.summary, INSTRUCTIONS) != expected.summary
    assert entry["summary"].endswith(f"\n\n## Instructions for this compaction\n{INSTRUCTIONS}")
    assert entry["details"] == expected.details() and entry["details"]["observations"], "om's memory, whole"
    live.compaction = entry
    # another extension saw it pending (and could ask for it), then done
    seen = [json.loads(line) for line in live.watch.read_text().splitlines()]
    pending = {"state": "pending", "sessionFile": str(live.session_file), "firstKeptEntryId": entry["firstKeptEntryId"],
               "reason": "manual"}
    assert seen[0] == {"event": pending} and {"query": entry["firstKeptEntryId"]} in seen, seen
    outcome = {"compacted": True, "fromExtension": True, "aborted": False}
    assert {"done": outcome} in seen and {"event": {**pending, "state": "finished", **outcome}} in seen, seen


def test_recall_of_an_id_in_the_summary_returns_the_evidence(live):
    observation = live.compaction["details"]["observations"][0]
    assert f"[{observation['id']}]" in live.compaction["summary"]
    live.server.add(tool_call("recall", {"id": observation["id"]}), Reply(text="Recalled."))
    since = live.pi.prompt("What exactly did I say about the database?")
    end = live.pi.wait_for(lambda r: r.get("type") == "tool_execution_end" and r.get("toolName") == "recall", since)
    result = end["result"]
    assert not end["isError"] and result["details"]["status"] == "ok", result
    assert result["details"]["matches"][0]["observation"]["id"] == observation["id"]
    sources = {s["id"] for s in result["details"]["sourceEntries"]}
    assert sources == set(observation["sourceEntryIds"])
    by_id = {e.get("id"): e for e in session_entries(live.session_file)}
    for entry_id in observation["sourceEntryIds"]:  # the exact text of each source entry
        texts = [b["text"] for b in by_id[entry_id]["message"]["content"] if b.get("type") == "text"]
        assert all(t in result["content"][0]["text"] for t in texts)
    again = recall_live(live.workspace(), RecallRequest(session_file=str(live.session_file), id=observation["id"]))
    assert again["content"] == result["content"]


def _native(live, because: str) -> None:
    """One more turn, then a compaction Pi makes with its own summarizer, and the one line why."""
    turn(live.pi, live.server)
    data, lines, entry = compact_now(live.pi)
    assert entry["fromHook"] is False and NATIVE in entry["summary"] and NATIVE in data["summary"]
    assert len(lines) == 1 and because in lines[0] and lines[0].endswith("Pi's own summarizer runs"), lines


def test_a_locked_database_makes_pi_compact_natively(live):
    holder = duckdb.connect(str(live.db))  # another process writing the database, for as long as it takes
    try:
        _native(live, "is being written by another process")
    finally:
        holder.close()


def test_without_the_endpoint_the_om_command_answers(live):
    live.stop_endpoint()
    assert running_endpoint(live.db) is None and not endpoint_file(live.db).exists()
    live.set_om(db=str(live.db))  # no endpoint announces it now: the settings name it
    turn(live.pi, live.server, "The staging box is ledger-staging-1, also in Falkenstein, and it mirrors production. " * 4)
    data, lines, entry = compact_now(live.pi)
    assert len(lines) == 1 and re.fullmatch(ANSWERED + "the om command", lines[0]), lines
    expected = live.om_compact(entry)
    assert entry["fromHook"] is True and entry["summary"] == expected.summary and entry["details"] == expected.details()


class _GarbageEndpoint:
    """An endpoint of this user's for the database that answers each request with the next garbage."""

    def __init__(self, db: Path, sessions: Path, answers: list[tuple[int, dict]]) -> None:
        self.answers, self.requests = list(answers), []
        garbage = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                garbage.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                status, body = garbage.answers.pop(0)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.file = endpoint_file(db)
        private_dir(self.file.parent)
        write_private(self.file, json.dumps({"url": f"http://127.0.0.1:{self.server.server_address[1]}", "token": "t",
                                             "pid": os.getpid(), "db": str(db), "sessions": [str(sessions)],
                                             "started": time.time()}).encode())

    def stop(self) -> None:
        self.file.unlink(missing_ok=True)
        self.server.shutdown()
        self.server.server_close()


def test_a_garbage_endpoint_answer_is_never_written(live):
    """What the endpoint answers is checked before Pi writes it: a summary for another cut, a number for a
    summary and a string for tokensBefore, an HTTP 500; each time the om command answers instead."""
    def at(cut: str) -> dict:
        return {"result": {"compaction": {"summary": "Garbage that must not reach the agent.", "firstKeptEntryId": cut,
                                          "tokensBefore": 1, "details": {}}, "observations": 1}}

    garbage = _GarbageEndpoint(live.db, live.sessions, [
        (200, at("nope")),
        (200, {"result": {"compaction": {"summary": 12345, "firstKeptEntryId": "x", "tokensBefore": "x"}}}),
        (500, {"error": "InternalError: boom"})])
    why = ['the endpoint answered a compaction at "nope", not at Pi\'s cut ',
           "the endpoint answered an empty summary", "the endpoint answered HTTP 500: InternalError: boom"]
    try:
        for because in why:
            turn(live.pi, live.server)
            _, lines, entry = compact_now(live.pi)
            assert len(lines) == 1 and re.match(ANSWERED + r"the om command \(before it, ", lines[0]), lines
            assert because in lines[0], lines
            expected = live.om_compact(entry)
            assert entry["summary"] == expected.summary and "Garbage" not in entry["summary"]
            assert entry["details"] == expected.details()
    finally:
        garbage.stop()
    assert len(garbage.requests) == 3 and garbage.requests[0]["cwd"] == str(live.project)


def test_om_failing_makes_pi_compact_natively(live):
    broken = live.root / "not-a-database.duckdb"
    broken.write_text("this is not a DuckDB file\n")
    live.set_om(db=str(broken))
    _native(live, "om failed: cannot open")


def test_om_too_slow_makes_pi_compact_natively(live):
    slow = live.root / "slow-om"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    live.set_om(db=str(live.db), command=str(slow), timeoutMs=1500)
    _native(live, "om did not answer within 1.5 s")


def test_om_missing_makes_pi_compact_natively(live):
    live.set_om(db=str(live.db), command=str(live.root / "no-such-om"))
    _native(live, "om is not installed")


def test_a_database_named_that_does_not_exist_is_one_line_and_nothing_is_created(live):
    nowhere = live.root / "no-such-folder" / "om.duckdb"
    live.set_om(db=str(nowhere))
    _native(live, f"om: no om database at {nowhere} (the om settings' db)")
    assert not nowhere.parent.exists()


def test_the_readme_om_serve_example_reaches_the_agent(live):
    """`om --db DB serve --live DIR` and no om settings at all: the extension finds the endpoint om serve
    runs for that folder, and the agent gets om's memory."""
    live.no_om_settings()
    live.start_serve()
    turn(live.pi, live.server)
    _, lines, entry = compact_now(live.pi)
    assert len(lines) == 1 and re.fullmatch(ANSWERED + "the endpoint", lines[0]), lines
    expected = live.om_compact(entry)
    assert entry["fromHook"] is True and entry["summary"] == expected.summary and entry["details"] == expected.details()


def test_eight_sessions_compacting_at_once_are_all_answered_from_memory(live):
    """Eight Pi processes, each on a copy of the conversation with its memory (om export), compact at the
    same moment through om serve's endpoint: each gets om's memory, none falls back to Pi's summarizer."""
    live.set_om()  # a generous deadline: the measure of the wait is bench/perf/live_compaction.py's
    ws = live.workspace()
    with ws.read() as con:
        [sid] = [r[0] for r in con.execute("SELECT session_id FROM sessions WHERE file_path = ?",
                                           [str(live.session_file.resolve())]).fetchall()]
    exported = live.root / "exported.jsonl"
    export_session(ws, sid, exported)
    header, *rest = exported.read_text().splitlines()
    copies = []
    for n in range(8):
        copy = live.sessions / f"copy-{n}.jsonl"
        copy.write_text("\n".join([json.dumps({**json.loads(header), "id": f"c0b1e5{n:02d}-aaaa-4bbb-8ccc-000000000000"}),
                                   *rest]) + "\n")
        copies.append(copy)
    pis = [RpcPi(live.home, live.project, live.env, session_file=copy, extensions=(EXTENSION,)) for copy in copies]
    try:
        for pi in pis:
            pi.wait_for(lambda r: r.get("method") == "notify", timeout=120)
            turn(pi, live.server)
        marks = [pi.mark() for pi in pis]
        sent = [pi.send({"type": "compact"}) for pi in pis]  # all at once
        for pi, mark, cid in zip(pis, marks, sent):
            response = pi.wait_for(lambda r, cid=cid: r.get("type") == "response" and r.get("id") == cid, mark, 300)
            assert response["success"], (response.get("error"), pi.notes(mark))
        waited = []
        for pi, mark, copy in zip(pis, marks, copies):
            lines = pi.notes(mark)
            assert len(lines) == 1 and re.fullmatch(ANSWERED + "the endpoint", lines[0]), lines
            waited.append(int(re.match(ANSWERED, lines[0]).group(1)))
            entry = session_entries(copy)[-1]
            expected = live.om_compact(entry, copy)
            assert entry["fromHook"] is True and entry["summary"] == expected.summary
            assert entry["details"] == expected.details()
        print(f"eight at once: Pi waited {sorted(waited)} ms")
    finally:
        for pi in pis:
            pi.close()


def test_an_archived_v1_file_om_maintained_is_answered_from_memory_in_pi(live):
    """A v1 session om maintained (its records anchored to the ids om minted), opened in Pi (which
    migrates it in place, new ids) and compacted there: om follows the migration and answers with its
    memory, equal to `om compact` at Pi's cut; recall of an id in it finds the evidence."""
    from test_migration import maintain, old_session

    archived = old_session(None)
    archived.header["cwd"] = str(live.project)
    path = archived.write(live.sessions / "archived-v1.jsonl")
    maintain(path, live.db)
    with live.workspace().read() as con:
        assert con.execute("SELECT count(*) FROM ledger WHERE origin = 'pipeline'").fetchone()[0] > 0
    pi = RpcPi(live.home, live.project, live.env, session_file=path, extensions=(EXTENSION,))
    try:
        pi.wait_for(lambda r: r.get("method") == "notify", timeout=120)
        assert json.loads(path.read_text().split("\n", 1)[0])["version"] == 3  # Pi migrated it
        turn(pi, live.server)
        _, lines, entry = compact_now(pi)
        assert len(lines) == 1 and re.fullmatch(ANSWERED + "the endpoint", lines[0]), lines
        expected = live.om_compact(entry, path)
        assert entry["fromHook"] is True and entry["summary"] == expected.summary
        assert entry["details"] == expected.details() and entry["details"]["observations"]
        with live.workspace().read() as con:
            assert con.execute("SELECT count(*) FROM entry_id_map").fetchone()[0] > 0  # re-anchored to Pi's ids
            assert con.execute("SELECT count(*) FROM orphaned_records").fetchone() == (0,)
        first = entry["details"]["observations"][0]
        live.server.add(tool_call("recall", {"id": first["id"]}), Reply(text="Recalled."))
        since = pi.prompt("What did we decide about storage?")
        end = pi.wait_for(lambda r: r.get("type") == "tool_execution_end" and r.get("toolName") == "recall", since)
        assert end["result"]["details"]["status"] == "ok", end["result"]
        assert {s["id"] for s in end["result"]["details"]["sourceEntries"]} == set(first["sourceEntryIds"])
    finally:
        pi.close()


# ------------------------------------------------------------------ pi-observational-memory loaded too

BESIDE = ("its recall tool and commands are the ones in this session; for compactions Pi keeps the answer of the one "
          "loaded last that gives one, so om's stands whenever the other gives none")


def _recall_tools(server: FakeOpenAI) -> list[dict]:
    """The recall tools Pi offered the model in its latest request."""
    return [t["function"] for t in server.requests[-1].get("tools", []) if t["function"]["name"] == "recall"]


def _beside_the_other(pi: RpcPi, server: FakeOpenAI) -> str:
    """Pi starts with both loaded; om says once that the other's tool and commands are the ones; one
    recall tool, the other's. The line."""
    first = pi.wait_for(lambda r: r.get("method") == "notify", timeout=120)["message"]
    assert first.startswith("om: another memory extension is loaded (a recall tool from ") and str(OTHER) in first
    assert first.endswith(BESIDE), first
    # then where om's memory is (`om live info`)
    pi.wait_for(lambda r: r.get("method") == "notify" and re.match(r"om: (memory in|no om database at) ", r.get("message") or ""),
                timeout=180)
    turn(pi, server)
    [tool] = _recall_tools(server)  # one recall tool: Pi started, nothing conflicts
    assert tool["description"] != "" and "12-character id" not in tool["description"]  # not om's
    return first


def _the_other_answers(pi: RpcPi, server: FakeOpenAI) -> None:
    """No om memory for this session: the other's answer is written, and om says so once."""
    first = _beside_the_other(pi, server)
    turn(pi, server)
    _, lines, entry = compact_now(pi)
    assert "om.folded" not in json.dumps(entry.get("details"))
    if not REAL_OTHER:
        assert entry["fromHook"] is True and entry["summary"] == OTHER_SUMMARY
        assert len(lines) == 1 and lines[0].startswith("om: no om database at "), lines
        assert lines[0].endswith(f"; the other memory extension answered (a recall tool from {OTHER})"), lines
    turn(pi, server)
    _, again, _ = compact_now(pi)
    assert again == [] and [n for n in pi.notes() if n.startswith("om: another")] == [first]  # each said once


def test_both_extensions_loaded_pi_starts_and_one_answers(tmp_path):
    """om's extension installed the way Pi users install extensions (`pi install ./deployments/pi`), and
    pi-observational-memory loaded too: Pi starts (no "Tool recall conflicts"), one recall tool (the
    other's), om says once what answers; with no om memory for the session the other's compaction is
    written. Then with om loaded first by -e. Then om installed alone: it loads and answers for itself
    (its line at session start)."""
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    with FakeOpenAI(default=Reply(text=NATIVE)) as server:
        agent = agent_dir(home, server.base_url, {"compaction": {"keepRecentTokens": 120}})
        env = os_env(PATH=f"{BIN}:{os.environ['PATH']}")
        pi_env = {**env, "HOME": str(home), "PI_CODING_AGENT_DIR": str(agent)}
        installed = subprocess.run([str(NODE), str(PI_CLI), "install", str(REPO / "deployments" / "pi")], env=pi_env,
                                   cwd=project, capture_output=True, text=True, timeout=120)
        assert installed.returncode == 0, installed.stdout + installed.stderr
        [listed] = json.loads((agent / "settings.json").read_text())["packages"]  # relative to the settings file
        assert (agent / listed).resolve() == (REPO / "deployments" / "pi").resolve()
        for extensions in ((OTHER,), (EXTENSION, OTHER)):  # installed + -e; then -e om first, -e the other
            pi = RpcPi(home, project, env, session_dir=tmp_path / "sessions", extensions=extensions)
            try:
                _the_other_answers(pi, server)
            finally:
                pi.close()
        alone = RpcPi(home, project, env, session_dir=tmp_path / "sessions", extensions=())
        try:
            line = alone.wait_for(lambda r: r.get("method") == "notify", timeout=120)["message"]
            assert line.startswith("om: no om database at ") and "another memory extension" not in line, line
            assert alone.call({"type": "get_state"})["success"]
        finally:
            alone.close()


@pytest.mark.skipif(REAL_OTHER is not None, reason="the stand-in declines on demand; the real one by its own rules")
def test_beside_the_other_oms_answer_stands_when_the_other_gives_none(prefect_api, tmp_path):
    """A session om maintained, pi-observational-memory loaded too and declining (the real one finds no
    ledger of its own in the file): in either load order, the compaction Pi writes is om's (its memory,
    equal to `om compact` at Pi's cut), said in om's one line; one recall tool, the other's. Then,
    the other answering and loaded after om, its answer is written, and om says so once."""
    from builders import SessionBuilder
    from conftest import workspace

    from om_core.ingest import ingest

    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    db = (tmp_path / "om.duckdb").resolve()
    with FakeOpenAI(default=Reply(text=NATIVE)) as server:
        agent_dir(home, server.base_url, {"compaction": {"keepRecentTokens": 120},
                                          "om": {"db": str(db), "timeoutMs": 60000, "infoTimeoutMs": 60000}})
        env = os_env(PATH=f"{BIN}:{os.environ['PATH']}", PREFECT_API_URL=prefect_api)
        for n, (extensions, declines) in enumerate((((OTHER, EXTENSION), True), ((EXTENSION, OTHER), True),
                                                   ((EXTENSION, OTHER), False))):
            sb = SessionBuilder(f"00000002-7ec4-4000-8000-00000000000{n}", cwd=str(project))
            asked = sb.user("Where does the ledger service keep its schema? " + PROMPTS[0])
            told = sb.assistant("In migrations/0001_init.sql; PostgreSQL 16 listens on port 5433.")
            content = "The ledger schema lives in migrations/0001_init.sql; PostgreSQL 16 listens on port 5433."
            sb.custom("om.observations.recorded", {"observations": [{
                "id": hashlib.sha256(content.encode()).hexdigest()[:12], "content": content,
                "timestamp": "2026-01-15 14:30", "relevance": "high", "sourceEntryIds": [asked, told],
                "tokenCount": 20}], "coversUpToId": told})
            path = sb.write(tmp_path / f"maintained-{n}.jsonl")
            ingest(workspace(db), [path])
            pi = RpcPi(home, project, {**env, **({"PI_OTHER_MEMORY_DECLINES": "1"} if declines else {})},
                       session_file=path, extensions=extensions)
            try:
                first = _beside_the_other(pi, server)
                turn(pi, server)
                _, lines, entry = compact_now(pi)
                if declines:
                    assert len(lines) == 1 and re.fullmatch(ANSWERED + "the om command", lines[0]), lines
                    assert entry["fromHook"] is True and entry["details"]["type"] == "om.folded"
                    assert content in entry["summary"]
                    expected = compact(Workspace.open(db, settings=Settings()), str(path), entry["firstKeptEntryId"],
                                       entry["parentId"])
                    assert entry["summary"] == expected.summary and entry["details"] == expected.details()
                else:  # loaded after om, the other's answer replaces om's: said once
                    assert entry["summary"] == OTHER_SUMMARY, entry
                    assert lines == [f"om: the other memory extension answered (a recall tool from {OTHER}): it is loaded "
                                     "after om, so its answer replaces om's whenever it gives one"], lines
                    turn(pi, server)
                    assert compact_now(pi)[1] == []
                assert [x for x in pi.notes() if x.startswith("om: another")] == [first]
            finally:
                pi.close()
