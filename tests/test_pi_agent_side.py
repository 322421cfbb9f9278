"""The agent's side in the real Pi 1.6.0 (RPC mode) with om's extension (deployments/pi/om-memory.ts):
the `recall` tool given a query, and the commands /om:status, /om:view, /om:recall, /om:consolidate,
each answering within Pi (a notification), and saying so when om cannot be reached.

Pi's provider is the fake model (tests/fake_openai.py); om is the command on PATH (this venv's), its
database named in Pi's "om" settings. The session file is one om knows: observations recorded in it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import pytest
from builders import SessionBuilder
from conftest import workspace
from fake_openai import FakeOpenAI, Reply, tool_call
from pi_rpc import EXTENSION, RpcPi, agent_dir, missing, os_env, session_entries

from om_core.ingest import ingest

pytestmark = [pytest.mark.prefect, pytest.mark.skipif(missing() is not None, reason=missing() or "")]

BIN = Path(sys.executable).parent
SID = "00000001-7ec4-4000-8000-0000000000e1"
OBS = "om.observations.recorded"
RETRY = "The uploader in src/upload_client.py retries failed chunk uploads three times with exponential backoff."
THEME = "User prefers dark themes in the editor."


def mid(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def o(content: str, src: list[str]) -> dict:
    return {"id": mid(content), "content": content, "timestamp": "2026-01-15 14:30", "relevance": "medium",
            "sourceEntryIds": src, "tokenCount": 10}


@pytest.fixture(scope="module")
def pi_session(prefect_api, tmp_path_factory):
    root = tmp_path_factory.mktemp("pi-agent-side")
    home, project = root / "home", root / "project"
    project.mkdir()
    sb = SessionBuilder(SID, cwd=str(project))
    first = sb.user("Why do the uploads fail sometimes? Look at src/upload_client.py")
    second = sb.assistant("The client retries each chunk three times, then gives up.")
    sb.custom(OBS, {"observations": [o(RETRY, [first, second]), o(THEME, [first])], "coversUpToId": second})
    path = sb.write(root / "session.jsonl")
    db = (root / "om.duckdb").resolve()
    ingest(workspace(db), [path])  # a session om knows
    with FakeOpenAI(default=Reply(text="Done.")) as server:
        settings = {"om": {"db": str(db), "timeoutMs": 60000, "infoTimeoutMs": 60000}}
        agent = agent_dir(home, server.base_url, settings)
        env = os_env(PATH=f"{BIN}:{os.environ['PATH']}", PREFECT_API_URL=prefect_api)
        pi = RpcPi(home, project, env, session_file=path, extensions=(EXTENSION,))
        try:
            pi.wait_for(lambda r: r.get("method") == "notify" and "memory in" in (r.get("message") or ""), timeout=180)
            yield {"pi": pi, "server": server, "path": path, "db": db, "agent": agent, "settings": settings}
        finally:
            pi.close()


def command(pi: RpcPi, text: str, timeout: float = 180) -> str:
    """Run a slash command through RPC's prompt; the one notification it answers with."""
    since = pi.mark()
    response = pi.call({"type": "prompt", "message": text}, timeout)
    assert response["success"], response
    note = pi.wait_for(lambda r: r.get("type") == "extension_ui_request" and r.get("method") == "notify", since, timeout)
    return note["message"]


def test_the_recall_tool_takes_a_query(pi_session):
    pi, server = pi_session["pi"], pi_session["server"]
    server.add(tool_call("recall", {"query": "upload retries"}), Reply(text="Found it."))
    since = pi.prompt("How did the uploader handle failures?", timeout=180)
    end = pi.wait_for(lambda r: r.get("type") == "tool_execution_end" and r.get("toolName") == "recall", since, 180)
    result = end["result"]
    assert not end["isError"] and result["details"]["status"] == "ok", result
    assert result["details"]["hits"][0]["where"] == "branch"
    assert f"[{mid(RETRY)}] observation (this session)" in result["content"][0]["text"]
    # the id the hit names recalls its exact evidence, as before
    server.add(tool_call("recall", {"id": mid(RETRY)}), Reply(text="Recalled."))
    since = pi.prompt("Show me the exact words.", timeout=180)
    end = pi.wait_for(lambda r: r.get("type") == "tool_execution_end" and r.get("toolName") == "recall", since, 180)
    assert end["result"]["details"]["status"] == "ok" and "src/upload_client.py" in end["result"]["content"][0]["text"]


def test_om_status_view_recall_and_consolidate_answer_within_pi(pi_session):
    pi = pi_session["pi"]
    status = command(pi, "/om:status")
    assert status.startswith("om status\n") and SID in status and "observations: 2 recorded" in status
    view = command(pi, "/om:view full")
    assert view.startswith("om memory (full)\n") and f"[{mid(RETRY)}]" in view and f"[{mid(THEME)}]" in view
    assert command(pi, "/om:view sideways").startswith("om: /om:view takes")
    by_query = command(pi, "/om:recall upload retries")
    assert f"[{mid(RETRY)}] observation (this session)" in by_query
    by_id = command(pi, f"/om:recall {mid(RETRY)}")
    assert "src/upload_client.py" in by_id and "retries each chunk" in by_id
    consolidated = command(pi, "/om:consolidate", timeout=600)
    assert consolidated.startswith("om consolidate: "), consolidated
    assert "failed" not in consolidated and "unreachable" not in consolidated


def test_each_command_says_when_om_is_unreachable(pi_session):
    pi, agent, settings = pi_session["pi"], pi_session["agent"], pi_session["settings"]
    broken = {**settings, "om": {**settings["om"], "command": "om-not-installed-here"}}
    (agent / "settings.json").write_text(json.dumps(broken))
    try:
        for text in ("/om:status", "/om:view", "/om:recall upload retries", "/om:consolidate"):
            said = command(pi, text)
            assert "unreachable" in said and "om is not installed" in said, (text, said)
    finally:
        (agent / "settings.json").write_text(json.dumps(settings))


RESUME = "Task: make the uploader's retries configurable. Next: add retry_limit to src/upload_client.py and test it."


def test_compact_context_compacts_through_om_at_the_agents_breakpoint_and_warn_at_asks_once(prefect_api, tmp_path):
    """`selfCompact` on (OM_SELF_COMPACT, read at session start through `om live info`): the agent gets
    `compact_context`; a `warnAt` rule crossed asks it once to compact; the agent calls the tool with its
    resume note; once it settles Pi compacts through om's hook (om's memory: no summarizer call), the
    call and its note are in the kept tail, and a message then starts a turn pointing at the note."""
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    sb = SessionBuilder("00000001-7ec4-4000-8000-0000000000e2", cwd=str(project))
    first = sb.user("Why do the uploads fail sometimes? Look at src/upload_client.py")
    second = sb.assistant("The client retries each chunk three times, then gives up.")
    sb.custom(OBS, {"observations": [o(RETRY, [first, second])], "coversUpToId": second})
    path = sb.write(tmp_path / "session.jsonl")
    db = (tmp_path / "om.duckdb").resolve()
    ingest(workspace(db), [path])
    with FakeOpenAI(default=Reply(text="Done.")) as server:
        agent_dir(home, server.base_url, {"compaction": {"keepRecentTokens": 120},
                                          "om": {"db": str(db), "timeoutMs": 60000, "infoTimeoutMs": 60000}})
        env = os_env(PATH=f"{BIN}:{os.environ['PATH']}", PREFECT_API_URL=prefect_api,
                     OM_SELF_COMPACT="true", OM_WARN_AT="200,0.9")
        pi = RpcPi(home, project, env, session_file=path, extensions=(EXTENSION,))
        try:
            pi.wait_for(lambda r: r.get("method") == "notify" and "memory in" in (r.get("message") or ""), timeout=180)
            detail = "The uploader also logs every failed chunk with its offset and size. " * 20
            for n in range(2):  # over the first rule (200 tokens) twice: asked once
                server.add(Reply(text=f"Noted ({n}). " + detail))
                pi.prompt(f"Step {n}: " + detail, timeout=180)
            tools = [t["function"]["name"] for t in server.requests[-1]["tools"]]
            assert "compact_context" in tools and tools.count("recall") == 1
            warnings = [e for e in session_entries(path) if e.get("customType") == "om.self-compact.warning"]
            assert len(warnings) == 1 and warnings[0]["details"] == {"level": 1}, warnings
            assert "compact_context at the next clean breakpoint" in warnings[0]["content"]

            server.add(tool_call("compact_context", {"resume": RESUME}), Reply(text="Resuming from my note."))
            before = len(server.requests)
            since = pi.prompt("Please compact now and carry on afterwards.", timeout=180)
            end = pi.wait_for(lambda r: r.get("type") == "tool_execution_end" and r.get("toolName") == "compact_context", since)
            assert end["result"]["details"] == {"scheduled": True}, end
            # the compaction, then the turn the resume message starts
            pi.wait_for(lambda r: r.get("type") == "message_end" and "Resuming from my note" in json.dumps(r), since, 180)
            entries = session_entries(path)
            [compaction] = [e for e in entries if e["type"] == "compaction"]
            assert compaction["fromHook"] is True and compaction["details"]["type"] == "om.folded"  # om's: no summarizer
            assert f"[{mid(RETRY)}]" in compaction["summary"]
            ids = [e.get("id") for e in entries]
            kept = entries[ids.index(compaction["firstKeptEntryId"]):ids.index(compaction["id"])]
            calls = [b for e in kept if e["type"] == "message" for b in e["message"].get("content", [])
                     if isinstance(b, dict) and b.get("type") == "toolCall" and b.get("name") == "compact_context"]
            assert [c["arguments"]["resume"] for c in calls] == [RESUME], kept  # the note is in the kept tail
            resumed = [e for e in entries if e.get("customType") == "om.self-compact.resume"]
            assert len(resumed) == 1 and "compact_context call just above holds your resume note" in resumed[0]["content"]
            # the model's one request after the call: the resume turn, which sees the summary and the note
            after = server.requests[before:]
            assert len(after) == 2, len(after)  # the call, then the resume turn: no summarizer request
            assert RESUME in json.dumps(after[-1]) and mid(RETRY) in json.dumps(after[-1])
        finally:
            pi.close()


def _tick_stand_in(root: Path) -> tuple[Path, Path]:
    """An om command whose background tick (`om run FILE --no-drain`) runs until stopped, marking when it
    starts and stops; every other command is this venv's om. (script, marks)"""
    marks = root / "tick-marks"
    script = root / "om-with-slow-tick"
    script.write_text(f"""#!/bin/sh
case " $* " in
  *" run "*"--no-drain"*)
    echo started >> '{marks}'
    sleep 120 >/dev/null 2>&1 &
    p=$!
    trap 'kill $p; echo stopped >> "{marks}"; exit 0' TERM
    wait $p
    echo finished >> '{marks}'
    exit 0;;
esac
exec '{BIN / "om"}' "$@"
""")
    script.chmod(0o755)
    return script, marks


def test_consolidate_when_idle_stops_the_tick_when_the_agent_starts_and_passive_stops_it_all(prefect_api, tmp_path):
    """With `consolidateWhenIdle`, the tick a settle started is stopped when the agent starts its next
    turn (its status says so); with PI_OBSERVATIONAL_MEMORY_PASSIVE no tick starts, and /om:consolidate,
    an explicit command, still runs."""
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    sb = SessionBuilder("00000001-7ec4-4000-8000-0000000000e3", cwd=str(project))
    first = sb.user("Why do the uploads fail sometimes? Look at src/upload_client.py")
    second = sb.assistant("The client retries each chunk three times, then gives up.")
    sb.custom(OBS, {"observations": [o(RETRY, [first, second])], "coversUpToId": second})
    path = sb.write(tmp_path / "session.jsonl")
    db = (tmp_path / "om.duckdb").resolve()
    ingest(workspace(db), [path])
    script, marks = _tick_stand_in(tmp_path)
    with FakeOpenAI(default=Reply(text="Done.")) as server:
        agent_dir(home, server.base_url, {"om": {"db": str(db), "tick": True, "command": str(script),
                                                 "timeoutMs": 60000, "infoTimeoutMs": 60000}})
        base = os_env(PATH=f"{BIN}:{os.environ['PATH']}", PREFECT_API_URL=prefect_api)
        for env, passive in (({**base, "OM_CONSOLIDATE_WHEN_IDLE": "true"}, False),
                             ({**base, "PI_OBSERVATIONAL_MEMORY_PASSIVE": "1"}, True)):
            marks.unlink(missing_ok=True)
            pi = RpcPi(home, project, env, session_file=path, extensions=(EXTENSION,))
            try:
                pi.wait_for(lambda r: r.get("method") == "notify" and "memory in" in (r.get("message") or ""), timeout=180)
                since = pi.prompt("First step.", timeout=180)
                status = pi.wait_for(lambda r: r.get("method") == "setStatus", since, 60)["statusText"]
                if passive:
                    assert status.startswith("om: passive: no background memory work"), status
                    pi.prompt("Second step.", timeout=180)
                    assert not marks.exists()  # no tick ever started
                    consolidated = command(pi, "/om:consolidate", timeout=600)
                    assert consolidated.startswith("om consolidate: ") and "failed" not in consolidated, consolidated
                    continue
                assert status == "om: updating memory…", status
                deadline = time.monotonic() + 60
                while not (marks.exists() and "started" in marks.read_text()):
                    assert time.monotonic() < deadline, "the tick did not start"
                    time.sleep(0.2)
                since = pi.prompt("Second step.", timeout=180)  # the agent starts: the tick stops
                paused = pi.wait_for(lambda r: r.get("method") == "setStatus" and "paused" in (r.get("statusText") or ""),
                                     since, 60)["statusText"]
                assert paused == "om: memory update paused while the agent works; the next settle resumes it"
                assert marks.read_text().split()[:2] == ["started", "stopped"]  # the next settle starts another
            finally:
                pi.close()
