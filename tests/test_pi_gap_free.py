"""Gap-free compaction with the real Pi 1.6.0 (RPC mode, as tests/test_pi_live.py runs it) and om's
extension (SPEC §13): a session whose observer is behind Pi's cut compacts through om with no raw
message lost: F moved back (Pi writes om's F verbatim), or the gap caught up by the observer on the fake
model first; `om gaps` on the file Pi wrote says no_gap. A catch-up model that hangs does not hang Pi;
over compactionMaxRetainedTokens the hook declines and Pi's own summarizer runs.

One Pi process and one conversation; the endpoint is restarted with each scenario's settings (the
extension finds it again at each compaction)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI, Reply
from pi_rpc import EXTENSION, RpcPi, agent_dir, missing, os_env, session_entries

from conftest import workspace
from flows.endpoint import running_endpoint
from om_core.ingest import ingest
from om_core.memory.gaps import gaps
from om_core.replay.stage_runner import observe_now
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

BIN = Path(sys.executable).parent
WATCHER = Path(__file__).resolve().parent / "pi_compaction_watcher.ts"
NATIVE = "Native summary: the user works on the ledger service."
COMPACTED = r"om: compacted from memory \(\d+ observations, \d+ reflections\) in \d+ ms, from the endpoint"


class Session:
    def __init__(self, root: Path) -> None:
        self.root, self.home, self.project = root, root / "home", root / "project"
        self.project.mkdir()
        self.sessions = root / "sessions"
        self.db = (root / "om.duckdb").resolve()
        self.watch = root / "watched.jsonl"
        self.pi_model = FakeOpenAI(default=Reply(text=NATIVE))
        self.om_model = FakeOpenAI()
        self.pi_model.start()
        self.om_model.start()
        self.env = os_env(PATH=f"{BIN}:{os.environ['PATH']}", OM_TEST_WATCH_FILE=str(self.watch))
        self.agent = agent_dir(self.home, self.pi_model.base_url, {"compaction": {"keepRecentTokens": 120},
                                                                  "om": {"timeoutMs": 60000}})
        self.endpoint: subprocess.Popen | None = None
        self.pi: RpcPi | None = None

    def start_endpoint(self, **settings: str) -> None:
        """`om live endpoint` for the sessions' folder, with these OM_* settings (its workers' model: the
        om model server)."""
        self.stop_endpoint()
        env = {**self.env, "HOME": str(self.home), "OM_MODEL": "openai/om-worker", "OM_API_BASE": self.om_model.base_url,
               **settings}
        self.endpoint = subprocess.Popen([str(BIN / "om"), "--db", str(self.db), "live", "endpoint", "--sessions",
                                          str(self.sessions)], cwd=self.project, env=env, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while running_endpoint(self.db) is None:
            assert self.endpoint.poll() is None, self.endpoint.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the endpoint did not announce itself"
            time.sleep(0.1)

    def stop_endpoint(self) -> None:
        if self.endpoint is not None and self.endpoint.poll() is None:
            self.endpoint.send_signal(signal.SIGINT)
            try:
                self.endpoint.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.endpoint.kill()
                self.endpoint.wait()
        self.endpoint = None

    @property
    def file(self) -> Path:
        return Path(self.pi.call({"type": "get_state"})["data"]["sessionFile"])

    def turns(self, n: int, tag: str) -> None:
        for i in range(n):
            text = f"Step {tag}{i}: the ledger keeps the invoices of region {tag}{i} in table inv_{tag}{i}. " * 3
            self.pi_model.add(Reply(text=f"Noted ({tag}{i}). " + text.lower()))
            self.pi.prompt(text)

    def observe_one_chunk(self) -> None:
        """The observer reads only the oldest small chunk (the offline baseline): it is behind Pi's cut."""
        ws = workspace(self.db, Settings(observerChunkMaxTokens=256))
        ingest(ws, [self.file])
        observe_now(ws, str(self.file), None, ModelConfig(model="offline"))

    def compact(self) -> tuple[list[str], dict, str]:
        """Compact now: the extension's lines, the entry Pi wrote, and Pi's own cut (what the extension saw
        pending, through the watcher)."""
        self.watch.write_text("")
        since = self.pi.mark()
        response = self.pi.call({"type": "compact"}, timeout=240)
        assert response["success"], (response.get("error"), self.pi.notes(since))
        entry = session_entries(self.file)[-1]
        assert entry["type"] == "compaction", entry
        pending = [json.loads(line)["event"] for line in self.watch.read_text().splitlines()
                   if "event" in json.loads(line)]
        return self.pi.notes(since), entry, pending[0]["firstKeptEntryId"]

    def gap_class(self, entry: dict) -> str:
        """`om gaps` on the file Pi wrote: the class of that compaction."""
        ws = workspace(self.db)
        ingest(ws, [self.file])
        report = gaps(ws, [str(self.file)])
        [found] = {c.class_ for c in report.compactions if c.compaction_id == entry["id"]}
        return found

    def close(self) -> None:
        if self.pi is not None:
            self.pi.close()
        self.stop_endpoint()
        self.pi_model.stop()
        self.om_model.stop()


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    s = Session(tmp_path_factory.mktemp("pi-gap-free"))
    try:
        s.pi = RpcPi(s.home, s.project, s.env, session_dir=s.sessions, extensions=(EXTENSION, WATCHER))
        s.pi.wait_for(lambda r: r.get("method") == "notify", timeout=120)
        s.turns(6, "a")
        s.observe_one_chunk()
        yield s
    finally:
        s.close()


def test_behind_the_cut_pi_keeps_from_oms_f_and_no_message_is_lost(session):
    session.start_endpoint(OM_COMPACTION_CATCH_UP_MAX_CHUNKS="0")
    lines, entry, pis_cut = session.compact()
    assert len(lines) == 1 and re.match(COMPACTED, lines[0]), lines
    assert "before Pi's cut, so no message is lost" in lines[0], lines
    assert entry["fromHook"] is True and entry["details"]["type"] == "om.folded"
    ids = [e.get("id") for e in session_entries(session.file)]
    assert ids.index(entry["firstKeptEntryId"]) < ids.index(pis_cut)  # Pi wrote om's F verbatim
    assert session.om_model.requests == []  # no catch-up: no model asked
    assert session.gap_class(entry) == "no_gap"


def test_the_catch_up_observes_the_gap_with_the_model_first(session):
    session.turns(4, "b")
    session.om_model.responder = ScriptedWorkers()
    session.start_endpoint(OM_COMPACTION_CATCH_UP_MAX_CHUNKS="4")
    lines, entry, pis_cut = session.compact()
    assert len(lines) == 1 and re.fullmatch(COMPACTED, lines[0]), lines  # at Pi's own cut: caught up
    assert entry["fromHook"] is True and entry["firstKeptEntryId"] == pis_cut
    assert session.om_model.requests, "the catch-up asked the model"
    assert session.gap_class(entry) == "no_gap"


def test_over_the_retention_budget_the_hook_declines(session):
    session.stop_endpoint()
    session.turns(4, "d")
    session.observe_one_chunk()  # coverage past where the context starts now, still behind Pi's cut
    session.start_endpoint(OM_COMPACTION_CATCH_UP_MAX_CHUNKS="0", OM_COMPACTION_MAX_RETAINED_TOKENS="50")
    lines, entry, _ = session.compact()
    assert entry["fromHook"] is False and NATIVE in entry["summary"]
    assert len(lines) == 1 and "over compactionMaxRetainedTokens 50" in lines[0], lines
    assert lines[0].endswith("Pi's own summarizer runs")


def test_a_catch_up_model_that_hangs_does_not_hang_pi(session):
    session.turns(4, "c")
    session.om_model.reset()
    session.om_model.default = Reply(text="too late", delay=120)
    session.start_endpoint(OM_COMPACTION_CATCH_UP_MAX_CHUNKS="2", OM_COMPACTION_CATCH_UP_SECONDS="3")
    lines, entry, _ = session.compact()  # Pi's call returns: the catch-up stopped at its limit
    assert session.om_model.requests, "the catch-up asked the model"
    assert len(lines) == 1, lines
    # the hook answered without the catch-up: kept from om's F, or declined to Pi's own summarizer
    assert re.match(COMPACTED, lines[0]) or lines[0].endswith("Pi's own summarizer runs"), lines
    if entry["fromHook"]:
        assert session.gap_class(entry) == "no_gap"
