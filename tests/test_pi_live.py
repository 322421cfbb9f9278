"""The whole loop with the real Pi 1.6.0 (RPC mode) and the om extension (deployments/pi/om-memory.ts):
a conversation of several turns with a fake model as Pi's provider, the extension's background tick
(`om run FILE --no-drain`) maintaining the session's memory, then compactions.

One Pi process serves every scenario, in order (the extension reads its options from Pi's settings
at each use, so a scenario changes them between compactions):
- with `om live endpoint` running, the compaction Pi writes carries om's summary and details and
  equals `om compact` at that cut point; `recall` of an id in it returns the evidence;
- a locked database, then (the endpoint stopped) the om command answering alone, om failing, om too
  slow, om missing: Pi compacts natively every time, with one line saying why.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from fake_openai import FakeOpenAI, Reply, tool_call
from pi_rpc import RpcPi, agent_dir, missing, os_env, session_entries

from om_core.live import RecallRequest, recall_live
from om_core.memory import CompactionResult, compact
from om_core.settings import Settings
from om_core.workspace import Workspace

pytestmark = [pytest.mark.prefect, pytest.mark.skipif(missing() is not None, reason=missing() or "")]

BIN = Path(sys.executable).parent
NATIVE = "Native summary: the user works on the ledger service."
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


class Live:
    def __init__(self, root: Path, prefect_api: str) -> None:
        self.root, self.home, self.project = root, root / "home", root / "project"
        self.project.mkdir()
        self.db = root / "om.duckdb"
        self.server = FakeOpenAI(default=Reply(text=NATIVE))
        self.server.start()
        self.env = os_env(PATH=f"{BIN}:{__import__('os').environ['PATH']}", OM_DB=str(self.db),
                          PREFECT_API_URL=prefect_api, **ENV)
        self.settings = {"compaction": {"keepRecentTokens": 120}, "om": {"tick": True, "timeoutMs": 30000}}
        self.agent = agent_dir(self.home, self.server.base_url, self.settings)
        self.endpoint: subprocess.Popen | None = None
        self.pi: RpcPi | None = None

    def set_om(self, **options) -> None:
        """Change the extension's options in Pi's settings (read at each compaction)."""
        self.settings["om"] = {"tick": False, "timeoutMs": 30000, **options}
        (self.agent / "settings.json").write_text(json.dumps(self.settings))

    def workspace(self) -> Workspace:
        return Workspace.open(self.db, settings=Settings())

    def om_compact(self, entry: dict) -> CompactionResult:
        """What `om compact FILE --first-kept F --leaf L` answers for a compaction entry Pi wrote (the
        library function the command prints)."""
        return compact(self.workspace(), str(self.session_file), entry["firstKeptEntryId"], entry["parentId"])

    def start_endpoint(self) -> None:
        announcement = Path(f"{self.db}.endpoint.json")
        self.endpoint = subprocess.Popen([str(BIN / "om"), "live", "endpoint", "--sessions", str(self.root / "sessions")],
                                         cwd=self.project,
                                         env={**self.env, "HOME": str(self.home)}, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not announcement.exists():
            assert self.endpoint.poll() is None, self.endpoint.stderr.read().decode()
            assert time.monotonic() < deadline, "the endpoint did not start"
            time.sleep(0.1)

    def stop_endpoint(self) -> None:
        if self.endpoint is not None and self.endpoint.poll() is None:
            self.endpoint.send_signal(signal.SIGINT)
            self.endpoint.wait(timeout=30)
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

    def compact(self) -> tuple[dict, list[str], dict]:
        """Compact now: (Pi's response data, the extension's lines, the compaction entry Pi wrote)."""
        since = self.pi.mark()
        response = self.pi.call({"type": "compact"}, timeout=180)
        assert response["success"], (response.get("error"), self.pi.notes(since))
        entry = session_entries(self.session_file)[-1]
        assert entry["type"] == "compaction", entry
        return response["data"], self.pi.notes(since), entry

    def close(self) -> None:
        if self.pi is not None:
            self.pi.close()
        self.stop_endpoint()
        self.server.stop()


@pytest.fixture(scope="module")
def live(prefect_api, tmp_path_factory):
    """The conversation, maintained by the extension's tick, with the endpoint running."""
    lv = Live(tmp_path_factory.mktemp("pi-live"), prefect_api)
    try:
        lv.start_endpoint()
        lv.pi = RpcPi(lv.home, lv.project, lv.env, session_dir=lv.root / "sessions")
        lv.start_notes = [lv.pi.wait_for(lambda r: r.get("method") == "notify", timeout=120)["message"]]
        for i, text in enumerate(PROMPTS):
            lv.server.add(Reply(text=f"Understood ({i}). " + text.lower()))
            lv.pi.prompt(text)  # the first settle starts a tick; it runs beside the next turns (never blocks them)
        lv.tick_status = lv.ticks_done()
        lv.set_om()  # no more ticks: the scenarios below hold the database or take om away
        yield lv
    finally:
        lv.close()


def test_session_start_names_the_database_and_settings(live):
    line = live.start_notes[0]
    assert line.startswith("om: memory in ") and str(live.db) in line and "(OM_DB)" in line, line
    assert "answers from the endpoint http://127.0.0.1:" in line and "background tick on" in line, line


def test_the_tick_maintains_the_session(live):
    assert re.match(r"om: memory \+[1-9]\d* observations", live.tick_status), live.tick_status
    with live.workspace().read() as con:
        assert con.execute("SELECT count(*) FROM observations").fetchone()[0] > 0


def test_compaction_from_the_endpoint_carries_om_memory_and_equals_om_compact(live):
    data, lines, entry = live.compact()
    assert len(lines) == 1 and re.fullmatch(r"om: compacted from memory \(\d+ observations, \d+ reflections\) in "
                                            r"\d+ ms, from the endpoint", lines[0]), lines
    assert entry["fromHook"] is True and entry["details"]["type"] == "om.folded"
    assert entry["summary"] == data["summary"] and entry["details"] == data["details"]
    expected = live.om_compact(entry)
    assert entry["summary"] == expected.summary and entry["details"] == expected.details()
    assert entry["details"]["observations"], "the summary holds observations"
    live.compaction = entry


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
    detail = f"One more detail: the feature flag for this change is named ledger-{len(live.pi.records)}. " * 8
    live.server.add(Reply(text="Noted. " + detail))  # a turn over keepRecentTokens: Pi has something to summarize
    live.pi.prompt(detail)
    data, lines, entry = live.compact()
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
    assert not Path(f"{live.db}.endpoint.json").exists()
    live.server.add(Reply(text="Noted: staging is ledger-staging-1. " * 6))
    live.pi.prompt("The staging box is ledger-staging-1, also in Falkenstein, and it mirrors production. " * 4)
    data, lines, entry = live.compact()
    assert len(lines) == 1 and lines[0].endswith("from the om command"), lines
    expected = live.om_compact(entry)
    assert entry["fromHook"] is True and entry["summary"] == expected.summary and entry["details"] == expected.details()


def test_om_failing_makes_pi_compact_natively(live):
    broken = live.root / "not-a-database.duckdb"
    broken.write_text("this is not a DuckDB file\n")
    live.set_om(db=str(broken))
    _native(live, "om failed: cannot open")


def test_om_too_slow_makes_pi_compact_natively(live):
    slow = live.root / "slow-om"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    live.set_om(command=str(slow), timeoutMs=1500)
    _native(live, "om did not answer within 1.5 s")


def test_om_missing_makes_pi_compact_natively(live):
    live.set_om(command=str(live.root / "no-such-om"))
    _native(live, "om is not installed")
