"""om_core.live and om_core.recall_tool: what a live Pi's extension gets, after the file's new lines are
ingested (the real Pi runs them in tests/test_pi_live.py). The session is the one the TypeScript
extension writes (tests/test_extension_interop.py): its records and om.folded compactions in the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import SessionBuilder
from test_extension_interop import E, O1, O2, R1, SID, extension_session
from typer.testing import CliRunner

from conftest import workspace
from flows.cli.main import app
from om_core.errors import EntryNotFound, OmError
from om_core.ingest import ingest
from om_core.live import CompactRequest, RecallRequest, compact_live, recall_live
from om_core.memory import compact
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
    assert result["content"][0]["text"].startswith(f"Observation {O2['id']} was dropped from active memory")
    assert [s["origin"] for s in result["details"]["sourceEntries"]] == ["Tool result: read", "Assistant"]


@pytest.mark.parametrize("memory_id,status", [("0123456789ab", "not_found"), ("XYZ", "invalid_id")])
def test_recall_of_an_unknown_or_invalid_id(live_file, memory_id, status):
    result = _recall(live_file, memory_id)
    assert set(result["details"]) == DETAIL_KEYS | {"message"} and result["details"]["status"] == status
    assert result["content"][0]["text"] == result["details"]["message"]


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
