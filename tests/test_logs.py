"""`om logs`: every model call, newest first, with its request as sent (after
redaction) and its response, stored in ``om_internal.llm_call_texts`` (view ``llm_call_texts``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from fake_openai import FakeOpenAI, http_error, text, tool_call
from typer.testing import CliRunner

from flows.cli.main import app
import om_cli
from conftest import workspace
from om_core.ingest import ingest

SID = "10951111-0000-4000-8000-000000000001"
OTHER = "10952222-0000-4000-8000-000000000002"
SECRET = "sk-proj-" + "A1b2C3d4E5f6G7h8" * 3

pytestmark = pytest.mark.usefixtures("isolated_home")


def two_sessions(tmp_path):
    db = tmp_path / "om.duckdb"
    paths = []
    for sid, words in ((SID, "PostgreSQL 16"), (OTHER, "Redis 7")):
        b = SessionBuilder(sid)
        b.user(f"Please use {words} for the orders service. My key is {SECRET}")
        b.assistant(f"Using {words}.")
        paths.append(b.write(tmp_path / f"{sid[:8]}.jsonl"))
    ingest(workspace(db), paths)
    return db, {SID: paths[0], OTHER: paths[1]}


def invoke(args, env=None):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200", **(env or {})})


def om_main(db, *args):
    """The command as a user runs it (main()'s one-line errors), in this process (tests/om_cli.py)."""
    return om_cli.run_om(["--db", str(db), *args], Path.cwd(), {**os.environ, "COLUMNS": "200"})


def model(server):
    return ["--model", "openai/fake-model", "--api-base", server.base_url]


def logs_json(db, *args) -> list[dict]:
    result = invoke(["--db", str(db), "logs", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def observation(sid_entry: str) -> dict:
    return {"timestamp": "2026-01-15 14:02", "content": "User wants the orders service on a database.",
            "relevance": "high", "sourceEntryIds": [sid_entry]}


def wire(messages: list[dict]) -> str:
    """Messages as litellm puts them on the wire (it leaves out keys whose value is None)."""
    return json.dumps([{k: v for k, v in m.items() if v is not None} for m in messages], sort_keys=True)


def entry_ids(db, sid) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT entry_id FROM entries WHERE session_id = ? ORDER BY line_no",
                                          [sid]).fetchall()]
    finally:
        con.close()


def test_every_call_is_listed_newest_first_with_its_request_and_response(server, tmp_path):
    db, _ = two_sessions(tmp_path)
    first = entry_ids(db, SID)[0]
    server.add(tool_call("record_observations", {"observations": [observation(first)]}), text("All recorded."))
    # the extension's closing turn kept, so the stage has two calls (a tool call, then its answer)
    assert invoke(["--db", str(db), "observe", SID, *model(server)],
                  env={"OM_AGENT_CLOSING_TURN": "true"}).exit_code == 0
    server.default = http_error(400, "messages are malformed")
    assert invoke(["--db", str(db), "observe", OTHER, *model(server)]).exit_code == 1

    calls = logs_json(db, "--full")
    assert len(calls) == len(server.requests) == 3
    assert [c["session_id"] for c in calls] == [OTHER, SID, SID]  # newest first
    assert [c["turn"] for c in calls] == [1, 2, 1]
    assert all(c["stage"] == "observer" and c["model"] == "openai/fake-model" for c in calls)
    failed, answer, asked = calls
    assert failed["status"] == "error" and "BadRequestError" in failed["error"] and failed["response"] is None
    # the request is exactly what the server received
    for call, sent in zip([asked, answer, failed], server.requests):
        assert wire(call["request"]["messages"]) == wire(sent["messages"])
        assert [t["function"]["name"] for t in call["request"]["tools"]] == ["record_observations", "record_reflections",
                                                                           "drop_observations"]
    assert asked["response"]["tool_calls"][0]["name"] == "record_observations"
    assert json.loads(asked["response"]["tool_calls"][0]["arguments"]) == {"observations": [observation(first)]}
    assert answer["response"] == {"content": "All recorded.", "tool_calls": []}
    # after redaction: the stored request holds no secret, because none was sent
    stored = json.dumps(calls)
    assert SECRET not in stored and SECRET not in server.sent_text()
    assert "PostgreSQL 16" in json.dumps(asked["request"])
    for c in (asked, answer):
        assert c["input_tokens"] > 0 and c["output_tokens"] == 20
        assert c["latency_ms"] > 0 and c["status"] == "ok"
    # the fake server caches like a provider: the closing turn repeats the first call's prompt
    assert asked["cached_tokens"] == 0 and 0 < answer["cached_tokens"] < answer["input_tokens"]

    plain = logs_json(db)
    assert [c["call_id"] for c in plain] == [c["call_id"] for c in calls]
    assert "request" not in plain[0] and "response" not in plain[0]


def test_filters_limit_and_clear_errors(server, tmp_path):
    db, paths = two_sessions(tmp_path)
    server.default = text("Nothing worth recording.")
    for sid in (SID, OTHER):
        assert invoke(["--db", str(db), "observe", sid, *model(server)]).exit_code == 0
    assert [c["session_id"] for c in logs_json(db, "--session", SID[:6])] == [SID]
    assert [c["session_id"] for c in logs_json(db, "--session", str(paths[OTHER]))] == [OTHER]
    assert len(logs_json(db, "--limit", "1")) == 1
    assert len(logs_json(db, "--limit", "0")) == 2
    assert logs_json(db, "--stage", "reflector") == []
    assert len(logs_json(db, "--stage", "observer")) == 2
    bad = om_main(db, "logs", "--stage", "observe")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: unknown --stage 'observe': use dropper, observer, reflection-dropper, reflector")
    unknown = om_main(db, "logs", "--session", "ffff")
    assert unknown.returncode != 0 and len(unknown.stderr.strip().splitlines()) == 1
    table = invoke(["--db", str(db), "logs"])
    assert table.exit_code == 0 and "observer" in table.output and "openai/fake-model" in table.output
    shown = invoke(["--db", str(db), "logs", "--full", "--session", SID])
    assert shown.exit_code == 0
    assert "--- user" in shown.output and "--- response" in shown.output
    assert "Nothing worth recording." in shown.output and "Please use PostgreSQL 16" in shown.output


def test_a_setting_turns_the_texts_off(server, tmp_path):
    db, _ = two_sessions(tmp_path)
    server.default = text("Nothing worth recording.")
    result = invoke(["--db", str(db), "observe", SID, *model(server)], env={"OM_STORE_PROMPTS": "false"})
    assert result.exit_code == 0, result.output
    [call] = logs_json(db, "--full")
    assert call["text_stored"] is False and call["request"] is None and call["response"] is None
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM llm_call_texts").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM llm_calls").fetchone()[0] == 1
    finally:
        con.close()


def test_no_calls_and_no_database(tmp_path):
    db, _ = two_sessions(tmp_path)
    empty = invoke(["--db", str(db), "logs"])
    assert empty.exit_code == 0 and "no model calls recorded" in empty.output
    assert logs_json(db) == []
    missing = om_main(tmp_path / "none.duckdb", "logs")
    assert missing.returncode == 1 and "no database at" in missing.stderr
    assert not (tmp_path / "none.duckdb").exists()


@pytest.mark.prefect
def test_om_logs_lists_every_call_of_a_run_with_stage_prompt_and_response(prefect_api, tmp_path):
    from fake_brains import ScriptedWorkers

    folder = tmp_path / "sessions"
    for n in range(2):
        b = SessionBuilder(f"0000000{n}-aaaa-bbbb-cccc-ffffffffffff", start=f"2026-03-0{n + 1}T09:00:00")
        b.work_turns(8, f"topic{n}")
        b.write(folder / f"s{n}.jsonl")
    db = tmp_path / "om.duckdb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OM_")}
    env.update({"PREFECT_API_URL": prefect_api, "OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300",
                "OM_OBSERVER_CHUNK_MAX_TOKENS": "400", "OM_OBSERVATIONS_POOL_MAX_TOKENS": "40",
                "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20", "COLUMNS": "200"})
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        done = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), "run", str(folder), *model(server)],
                              env=env, capture_output=True, text=True, timeout=300)
        sent = [wire(r["messages"]) for r in server.requests]
    assert done.returncode == 0, done.stderr[-2000:]
    listed = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), "logs", "--json", "--full",
                             "--limit", "0"], env=env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    calls = json.loads(listed.stdout)
    assert len(calls) == len(sent) > 4
    assert {c["stage"] for c in calls} >= {"observer", "reflector"}
    assert sorted(wire(c["request"]["messages"]) for c in calls) == sorted(sent)
    assert all(c["response"] is not None for c in calls if c["status"] == "ok")
    assert [c["started_at"] for c in calls] == sorted((c["started_at"] for c in calls), reverse=True)
    con = duckdb.connect(str(db), read_only=True)
    try:  # joinable: one text row per call
        assert con.execute("SELECT count(*) FROM llm_calls JOIN llm_call_texts USING (call_id)").fetchone()[0] \
            == len(calls)
    finally:
        con.close()
