"""om_core.usecases.live and om_core.recall.tool: what a live Pi's extension gets, after the file's new lines are
ingested (the real Pi runs them in tests/test_pi_live.py). The session is the one the TypeScript
extension writes (tests/test_extension_interop.py): its records and om.folded compactions in the file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from builders import SessionBuilder
from pi_rpc import NODE, PI_HOME, missing
from test_extension_interop import E, O1, O2, R1, SID, extension_session
from typer.testing import CliRunner

from conftest import REPO, workspace
from flows.cli.main import app
from om_core.errors import EntryNotFound, OmError
from om_core.ingest import ingest
from om_core.usecases.live import CompactRequest, RecallRequest, compact_live, recall_live
from om_core.memory.compaction import compact
from om_core.settings import Settings

POOL = Settings(observationsPoolMaxTokens=160)
# the fields of the extension's recall tool details (src/tools/recall-observation.ts), every status
DETAIL_KEYS = {"status", "memoryId", "observationId", "collision", "partial", "reflections",
               "directObservationMatches", "observations", "matches", "sourceEntries",
               "unavailableSupportingObservations", "missingSourceEntryIds", "nonSourceEntryIds"}
MATCH_KEYS = {"status", "observationEntryId", "observationRecordIndex", "observation", "sourceEntryIds",
              "sourceEntries", "missingSourceEntryIds", "nonSourceEntryIds", "sourceCharacterCount"}
SOURCE_KEYS = {"id", "origin", "timestamp", "tokens", "qualifiers", "content"}


@pytest.fixture
def live_file(tmp_path):
    """The extension's session on disk, ingested up to two lines before its end (Pi wrote those since)."""
    sb = extension_session()
    path = tmp_path / "live.jsonl"
    lines = sb.lines()
    path.write_text("\n".join(lines[:-2]) + "\n")
    ws = workspace(tmp_path / "om.duckdb", POOL)
    ingest(ws, [path])
    with path.open("a") as f:
        f.write("\n".join(lines[-2:]) + "\n")
    return ws, path


def test_compact_live_ingests_the_new_lines_then_answers_like_om_compact(live_file):
    ws, path = live_file
    answer = compact_live(ws, CompactRequest(session_file=str(path), leaf=E[32], first_kept_entry_id=E[32],
                                             tokens_before=47_900))
    assert answer.session_id == SID and answer.entries_added == 2 and answer.declined is None
    expected = compact(ws, SID, E[32], E[32])
    assert answer.compaction == {"summary": expected.summary, "firstKeptEntryId": E[32], "tokensBefore": 47_900,
                                 "details": expected.details()}
    assert (answer.observations, answer.reflections) == (len(expected.observationIds), len(expected.reflectionIds))
    again = compact_live(ws, CompactRequest(session_file=str(path), leaf=E[32], first_kept_entry_id=E[32],
                                            tokens_before=47_900))
    assert again.entries_added == 0 and again.compaction == answer.compaction


def test_compact_live_declines_where_memory_is_empty(tmp_path):
    sb = SessionBuilder()
    sb.user("hello")
    first = sb.assistant("hi")
    sb.user("more")
    leaf = sb.assistant("sure")
    answer = compact_live(workspace(tmp_path / "om.duckdb"), CompactRequest(
        session_file=str(sb.write(tmp_path / "s.jsonl")), leaf=leaf, first_kept_entry_id=first, tokens_before=10))
    assert answer.compaction is None and answer.declined == f"no memory before entry {first} of this session yet"


def test_compact_live_errors_say_what_is_wrong(tmp_path, live_file):
    ws, path = live_file
    with pytest.raises(OmError, match="no session file at"):
        compact_live(ws, CompactRequest(session_file=str(tmp_path / "gone.jsonl"), leaf="x", first_kept_entry_id="x",
                                        tokens_before=0))
    with pytest.raises(EntryNotFound, match="not in session"):
        compact_live(ws, CompactRequest(session_file=str(path), leaf="ffffffff", first_kept_entry_id=E[32],
                                        tokens_before=0))
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"type": "message"}\n')
    with pytest.raises(OmError, match="cannot ingest"):
        compact_live(ws, CompactRequest(session_file=str(junk), leaf="x", first_kept_entry_id="x", tokens_before=0))


def _recall(live_file, memory_id: str, leaf: str | None = None) -> dict:
    ws, path = live_file
    return recall_live(ws, RecallRequest(session_file=str(path), leaf=leaf, id=memory_id))


def test_recall_of_an_observation_is_its_exact_source_text(live_file):
    result = _recall(live_file, O1["id"], E[32])
    details = result["details"]
    assert set(details) == DETAIL_KEYS | {"sourceCharacterCount"} and details["status"] == "ok"
    assert [m["observation"]["id"] for m in details["matches"]] == [O1["id"]]
    match = details["matches"][0]
    assert set(match) == MATCH_KEYS and match["observationEntryId"] == E[9] and match["observationRecordIndex"] == 0
    source = match["sourceEntries"][0]
    assert set(source) == SOURCE_KEYS and source["id"] == E[3] and source["origin"] == "User" and source["tokens"] > 0
    text = "We're building Acme Dashboard (Next.js 15, Supabase auth). Keep PRs small and reviewable, please."
    assert result["content"] == [{"type": "text", "text": f"[User @ 2026-01-15 14:03]: {text}"}]
    assert match["sourceCharacterCount"] == len(result["content"][0]["text"])


def test_recall_of_a_reflection_lists_its_observations_and_sources(live_file):
    result = _recall(live_file, R1["id"])
    details, text = result["details"], result["content"][0]["text"]
    assert details["status"] == "ok" and details["reflections"][0]["supportingObservationIds"] == \
        R1["supportingObservationIds"]
    assert details["matches"] == [] and {o["observation"]["id"] for o in details["observations"]} == set(
        R1["supportingObservationIds"])
    assert text.startswith(f"Reflections:\n[{R1['id']}] {R1['content']}\n\nObservations:\n")
    assert "\n\nSources:\n[User @ " in text and "[Assistant @ " in text  # O4 cites a user and an assistant message
    assert "[dropped]" in text  # O4 was dropped; its evidence stays recallable


def test_recall_of_a_dropped_observation_says_so(live_file):
    result = _recall(live_file, O2["id"])
    assert result["details"]["matches"][0]["observation"]["status"] == "dropped"
    assert result["content"][0]["text"].startswith(f"Observation {O2['id']} is dropped from active memory but "
                                                   "remains recallable.\n\n[Tool result: read @ ")
    assert [s["origin"] for s in result["details"]["sourceEntries"]] == ["Tool result: read", "Assistant"]


@pytest.mark.parametrize("memory_id,status,text", [
    ("0123456789ab", "not_found", "No observation or reflection with id 0123456789ab was found on the current branch."),
    ("XYZ", "invalid_id", "Memory id must be 12 lowercase hex characters. Received: XYZ")])
def test_recall_of_an_unknown_or_invalid_id(live_file, memory_id, status, text):
    result = _recall(live_file, memory_id)
    assert set(result["details"]) == DETAIL_KEYS | {"message"} and result["details"]["status"] == status
    assert result["content"][0]["text"] == result["details"]["message"] == text


def _cited_session(tmp_path: Path) -> tuple[Path, str, str]:
    """A session whose one observation cites every kind of source entry the extension renders apart
    (the sources' text is laid out by its rules, not om's), and a reflection on it."""
    sb = SessionBuilder(start="2026-03-08T06:56:00")  # New York's clocks go from 01:59 EST to 03:00 EDT at 07:00 UTC
    ids = [sb.user([{"type": "text", "text": "First line.\n\nSecond line."}, {"type": "image", "data": "x",
                                                                               "mimeType": "image/png"}]),
           sb.message({"role": "assistant", "content": [
               {"type": "thinking", "thinking": "weigh it", "thinkingSignature": "s"},
               {"type": "thinking", "thinking": "hidden", "redacted": True},
               {"type": "text", "text": "Plan:\n\n1. read\n\n\n2. fix"},
               {"type": "toolCall", "id": "c1", "name": "read", "arguments": {"path": "a.py", "limit": 1.0, "n": 2.5}}],
               "stopReason": "toolUse"}),
           sb.tool_result("c1", "read", "line 1\n\nline 3", images=1),
           sb.message({"role": "assistant", "content": [{"type": "thinking", "thinking": "only thought", "redacted": True}]}),
           sb.custom_message("note", "a note\n\nwith a blank"),
           sb.branch_summary("We tried X first."),
           sb.bash("ls", "a.py")]
    observation = {"id": "0badc0ffee00", "content": "The user wants a.py fixed.", "timestamp": "2026-03-08 06:40",
                   "relevance": "high", "sourceEntryIds": ids + [ids[0], "deadbeef"], "tokenCount": 20}
    reflection = {"id": "0feedfacade0", "content": "a.py matters.", "supportingObservationIds": [observation["id"],
                                                                                             "00000000abcd"],
                  "tokenCount": 5}
    sb.custom("om.observations.recorded", {"observations": [observation], "coversUpToId": ids[-1]})
    sb.custom("om.reflections.recorded", {"reflections": [reflection], "coversUpToId": ids[-1]})
    return sb.write(tmp_path / "cited.jsonl"), observation["id"], reflection["id"]


def _extension_text(time) -> str:
    """The sources as the extension's recall renders them (src/serialize.ts, renderRecallSourceEntries):
    local times, the image as a placeholder, thinking in brackets and redacted thinking left out, the
    tool call's arguments as JSON.stringify writes them (1.0 is 1), the blank lines of an assistant
    message left out (not those of a user message, a tool result or a custom message), an assistant
    message with no text left out, a bash execution as a tool result without a name."""
    return "\n\n".join([
        f"[User @ {time(1)}]: First line.\n\nSecond line.\n[non-text content omitted]",
        f"[Assistant @ {time(2)}]: [thinking: weigh it]\nPlan:\n1. read\n2. fix\n"
        '[read({"path":"a.py","limit":1,"n":2.5})]',
        f"[Tool result: read @ {time(3)}]: line 1\n\nline 3\n[non-text content omitted]",
        f"[Custom message (note) @ {time(5)}]: a note\n\nwith a blank",
        f"[Branch summary @ {time(6)}]: We tried X first.",
        f"[Tool result: undefined @ {time(7)}]: [non-text content omitted]"])


@pytest.mark.parametrize("zone,hours", [("UTC", (6, 7)), ("America/New_York", (1, 3))])
def test_recall_text_follows_the_extensions_source_text_rules(tmp_path, monkeypatch, zone, hours):
    """The recall tool's text is the extension's, byte for byte: its rendering of each kind of source
    entry (in the local time zone, as Pi's process shows it), its sentences and sections."""
    import time as clock

    monkeypatch.setenv("TZ", zone)
    clock.tzset()
    try:
        path, observation, reflection = _cited_session(tmp_path)
        ws = workspace(tmp_path / "om.duckdb")
        got = recall_live(ws, RecallRequest(session_file=str(path), id=observation))
        def time(n: int) -> str:  # entry n is at 06:56 + n minutes UTC
            return f"2026-03-08 {hours[0]:02d}:{56 + n}" if n < 4 else f"2026-03-08 {hours[1]:02d}:{n - 4:02d}"

        missing = ("Observation 0badc0ffee00 has source entries associated, but some are unavailable on the current "
                   "branch or are not source-renderable. missing: deadbeef")
        assert got["content"][0]["text"] == missing and got["details"]["status"] == "partial"
        details = got["details"]["matches"][0]
        assert details["sourceEntryIds"] == details["sourceEntryIds"][:7] + ["deadbeef"]  # the repeated one once
        assert [s["origin"] for s in details["sourceEntries"]] == [
            "User", "Assistant", "Tool result: read", "Assistant", "Custom message", "Branch summary",
            "Tool result: unknown"]
        assert details["sourceEntries"][1]["qualifiers"] == ["tool calls: read"]
        assert "content" not in details["sourceEntries"][3]  # nothing of it is shown
        text = _extension_text(time)
        assert details["sourceCharacterCount"] == len(text)
        by_reflection = recall_live(ws, RecallRequest(session_file=str(path), id=reflection))
        assert by_reflection["content"][0]["text"] == "\n\n".join([
            "Reflections:\n[0feedfacade0] a.py matters.",
            "Observations:\n[0badc0ffee00] 2026-03-08 06:40 [high] The user wants a.py fixed.",
            "Unavailable supporting observations:\nSupporting observation 00000000abcd is unavailable on the "
            "current branch.",
            "Unavailable source entries: missing: deadbeef",
            "Sources:\n" + text])
    finally:
        monkeypatch.undo()
        clock.tzset()


def test_om_live_commands_print_what_the_library_answers(live_file, isolated_home, monkeypatch):
    ws, path = live_file
    monkeypatch.setenv("OM_OBSERVATIONS_POOL_MAX_TOKENS", "160")
    runner = CliRunner()
    db = str(ws.path)
    out = runner.invoke(app, ["--db", db, "live", "compact", str(path), "--leaf", E[32], "--first-kept", E[32],
                              "--tokens-before", "5", "--json"])
    assert out.exit_code == 0, out.output
    answer = json.loads(out.stdout)
    assert answer["compaction"]["details"] == compact(ws, SID, E[32], E[32]).details()
    out = runner.invoke(app, ["--db", db, "live", "recall", O1["id"], "--file", str(path), "--json"])
    assert json.loads(out.stdout) == _recall(live_file, O1["id"])
    out = runner.invoke(app, ["--db", db, "live", "compact", str(path), "--leaf", "ffffffff", "--first-kept", E[32]])
    assert out.exit_code == 1 and "not in session" in str(out.exception)
    info = json.loads(runner.invoke(app, ["--db", db, "live", "info", "--json"]).stdout)
    assert info["db"] == str(Path(db).resolve()) and info["db_source"] == "--db" and info["endpoint"] is None
    assert info["observations_pool_max_tokens"] == 160 and Path(info["extension"]).is_file()
    assert runner.invoke(app, ["live", "info", "--extension"]).stdout.strip() == info["extension"]


def test_a_live_question_to_a_database_that_does_not_exist_creates_nothing(live_file, isolated_home, tmp_path):
    _, path = live_file
    missing_db = tmp_path / "no" / "such" / "om.duckdb"
    runner = CliRunner()
    for args in (["live", "compact", str(path), "--leaf", E[32], "--first-kept", E[32]],
                 ["live", "recall", O1["id"], "--file", str(path)]):
        out = runner.invoke(app, ["--db", str(missing_db), *args])
        assert out.exit_code == 1 and f"no om database at {missing_db.resolve()}" in str(out.exception), out.output
    assert not (tmp_path / "no").exists()  # not the folder, not a database, no quarantine
    info = json.loads(runner.invoke(app, ["--db", str(missing_db), "live", "info", "--json"]).stdout)
    assert info["db_exists"] is False


def test_the_endpoint_serving_a_sessions_folder_names_its_database(live_file, isolated_home, tmp_path):
    """Without --db or OM_DB, `om live` answers a session from the database of the endpoint that serves
    the session's folder (its announcement in this user's state folder), not from om's default."""
    from flows.endpoint import LiveEndpoint, endpoint_for_session, endpoints_folder

    ws, path = live_file
    runner = CliRunner()
    with LiveEndpoint(ws, sessions=[path.parent]) as endpoint:
        assert stat_mode(endpoints_folder()) == 0o700
        assert endpoint_for_session(path)["url"] == endpoint.url
        assert endpoint_for_session(tmp_path.parent / "elsewhere.jsonl") is None
        info = json.loads(runner.invoke(app, ["live", "info", "--json", "--session", str(path)]).stdout)
        assert info["db"] == str(ws.path.resolve()) and info["endpoint"]["url"] == endpoint.url
        assert info["db_source"] == "the endpoint serving the session's folder"
        out = runner.invoke(app, ["live", "recall", O1["id"], "--file", str(path), "--json"])
        assert out.exit_code == 0 and json.loads(out.stdout) == _recall(live_file, O1["id"])
        other = tmp_path / "other.duckdb"  # a database named explicitly wins
        info = json.loads(runner.invoke(app, ["--db", str(other), "live", "info", "--json", "--session",
                                              str(path)]).stdout)
        assert info["db"] == str(other.resolve()) and info["endpoint"] is None
    assert endpoint_for_session(path) is None  # stopped: its announcement went with it


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_custom_instructions_follow_the_memory_in_the_summary(live_file, isolated_home, monkeypatch):
    ws, path = live_file
    monkeypatch.setenv("OM_OBSERVATIONS_POOL_MAX_TOKENS", "160")
    plain = compact_live(ws, CompactRequest(session_file=str(path), leaf=E[32], first_kept_entry_id=E[32],
                                            tokens_before=1)).compaction
    asked = compact_live(ws, CompactRequest(session_file=str(path), leaf=E[32], first_kept_entry_id=E[32],
                                            tokens_before=1, custom_instructions="  Focus on the CI setup.\n")).compaction
    assert asked["summary"] == plain["summary"] + "\n\n## Instructions for this compaction\nFocus on the CI setup."
    assert asked["details"] == plain["details"]
    runner = CliRunner()
    out = runner.invoke(app, ["--db", str(ws.path), "live", "compact", str(path), "--leaf", E[32], "--first-kept",
                              E[32], "--instructions", "Focus on the CI setup.", "--json"])
    assert json.loads(out.stdout)["compaction"]["summary"] == asked["summary"]


def test_om_live_compact_imports_neither_litellm_nor_prefect(live_file):
    """Each answer of the om command path costs a Python start: the model and orchestrator libraries
    stay out of it (the ingest's tokenizer is what it needs)."""
    import subprocess
    import sys

    from test_read_paths import PROBE

    ws, path = live_file
    done = subprocess.run([sys.executable, "-c", PROBE, str(ws.path), "live", "compact", str(path), "--leaf", E[32],
                           "--first-kept", E[32], "--json"], capture_output=True, text=True, timeout=120)
    assert "HEAVY=" in done.stdout and '"compaction"' in done.stdout, done.stdout[-500:] + done.stderr
    heavy = set(done.stdout.rsplit("HEAVY=", 1)[-1].strip().split(","))
    assert not {"litellm", "prefect", "dask"} & heavy, heavy


EXTENSION_CHECKOUT = os.environ.get("PI_OM_EXTENSION")  # a checkout of elpapi42/pi-observational-memory


@pytest.mark.skipif(not EXTENSION_CHECKOUT, reason="PI_OM_EXTENSION (a checkout of pi-observational-memory, "
                    "which npm does not serve here) is not set: its own recall is not run")
@pytest.mark.skipif(missing() is not None, reason=missing() or "")
def test_recall_equals_the_real_extensions_answer(tmp_path):
    """The extension's own recall tool (run from its source by bench/conformance/extension_answers.mjs, on the file
    as Pi 1.6.0 reads it) and om's give the same text and source details for every id."""
    cited, observation, reflection = _cited_session(tmp_path)
    sessions = {cited: [observation, reflection],
                extension_session().write(tmp_path / "ext.jsonl"): [O1["id"], O2["id"], R1["id"], "0123456789ab"]}
    ws = workspace(tmp_path / "om.duckdb")
    for path, ids in sessions.items():
        request = tmp_path / "request.json"
        request.write_text(json.dumps({"file": str(path), "leaf": None, "ids": ids, "repeat": 1}))
        done = subprocess.run([str(NODE), str(REPO / "bench" / "extension_answers.mjs"), str(PI_HOME),
                               EXTENSION_CHECKOUT, str(request)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        theirs = json.loads(done.stdout)["recall"]
        for memory_id in ids:
            ours = recall_live(ws, RecallRequest(session_file=str(path), id=memory_id))
            assert ours["content"][0]["text"] == theirs[memory_id]["text"], memory_id
            fields = ("id", "origin", "timestamp", "qualifiers", "content")
            assert [{k: s.get(k) for k in fields} for s in ours["details"]["sourceEntries"]] == \
                [{k: s.get(k) for k in fields} for s in theirs[memory_id]["details"]["sourceEntries"]]
            assert ours["details"]["status"] == theirs[memory_id]["details"]["status"]
