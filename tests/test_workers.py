"""The memory workers of SPEC §8: observer, reflector and dropper as tool-calling
runs through litellm against the fake OpenAI-compatible server, with code (not the model) making ids,
token counts, validation and the dropper's selection.

Entry ids are the builder's: the n-th entry is ``f"{n:08x}"``, stamped 2026-01-15 14:00 + n minutes.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
from fake_openai import FakeOpenAI, Reply, http_error, text, tool_call
from conftest import workspace
from om_core.store import db as dbmod
from om_core.store.catalog import resolve_tip
from flows.cli.main import app
from om_core.ingest import ingest
from om_core.ledger.records import RECORD_MODELS, append_record
from om_core.memory.views import active_memory, clocks, ledger_rows
from om_core.model.client import RetryPolicy
from om_core.workers.prompts import TRUNCATION_MARKER, WORKER_SYSTEM
from om_core.recall.evidence import recall
from om_core.settings import Settings
from om_core.workers.inputs import dropper_input, max_drops
from om_core.store.workspace import Workspace
from om_core.replay.stage_runner import observe_now, reflect_now
from om_core.workers.run_config import ModelConfig

SID = "0b5e1111-0000-4000-8000-000000000001"
OBS, REFL, DROP = "om.observations.recorded", "om.reflections.recorded", "om.observations.dropped"
E = {n: f"{n:08x}" for n in range(1, 40)}


def mid(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()[:12]


def pi_tokens(line: str) -> int:
    return math.ceil(len(line) / 4)  # ASCII only here, so UTF-16 length == len


# ------------------------------------------------------------------ fixtures and helpers


pytestmark = pytest.mark.usefixtures("isolated_home")


def config(server: FakeOpenAI, attempts: int = 1) -> ModelConfig:
    return ModelConfig(model="openai/fake-model", api_base=server.base_url,
                       retry=RetryPolicy(attempts=attempts, base_seconds=0.001, max_seconds=0.002))


def load(b: SessionBuilder, tmp_path, db) -> None:
    ingest(workspace(db), [b.write(tmp_path / "session.jsonl")])


def rows(db, sql: str, params: list | None = None) -> list[tuple]:
    with dbmod.reading(db) as con:
        return con.execute(sql, params or []).fetchall()


def records(db) -> list[tuple]:
    return rows(db, "SELECT kind, covers_up_to_id, anchor_entry_id, origin, ledger_id FROM ledger "
                    "WHERE session_id = ? ORDER BY append_seq", [SID])


def observations_of(db, ledger_id: str) -> list[dict]:
    got = rows(db, "SELECT obs_id, content, ts, relevance, source_entry_ids, token_count FROM observations "
                   "WHERE session_id = ? AND ledger_id = ? ORDER BY item_index", [SID, ledger_id])
    return [dict(zip(("id", "content", "timestamp", "relevance", "sourceEntryIds", "tokenCount"), r)) for r in got]


def observer_watermark(db) -> str | None:
    with dbmod.reading(db) as con:
        tip = resolve_tip(con, SID, None)
        return clocks(con, SID, tip, Settings())["observer"].watermark_entry_id


def memory(db):
    with dbmod.reading(db) as con:
        return active_memory(ledger_rows(con, SID, resolve_tip(con, SID, None)))


def stages(db) -> list[dict]:
    got = rows(db, "SELECT stage, outcome, records, items, rejected, error_kind, error, chunk_first_id, chunk_last_id "
                   "FROM stages WHERE session_id = ? ORDER BY started_at, finished_at", [SID])
    keys = ("stage", "outcome", "records", "items", "rejected", "error_kind", "error", "chunk_first_id", "chunk_last_id")
    return [dict(zip(keys, r)) for r in got]


def llm_calls(db) -> list[dict]:
    got = rows(db, "SELECT stage, turn, attempt, status, error_kind, input_tokens, output_tokens, cached_tokens, "
                   "latency_ms, model FROM llm_calls WHERE session_id = ? ORDER BY started_at, turn, attempt", [SID])
    keys = ("stage", "turn", "attempt", "status", "error_kind", "input_tokens", "output_tokens", "cached_tokens",
            "latency_ms", "model")
    return [dict(zip(keys, r)) for r in got]


def prompt(server: FakeOpenAI, i: int = 0) -> str:
    """The user message of request i (the worker's input)."""
    [user] = [m for m in server.requests[i]["messages"] if m["role"] == "user"]
    return user["content"] if isinstance(user["content"], str) else json.dumps(user["content"])


def tool_messages(server: FakeOpenAI, i: int) -> list[str]:
    return [m["content"] for m in server.requests[i]["messages"] if m["role"] == "tool"]


def append(db, kind: str, payload: dict, anchor: str) -> str:
    with dbmod.writing(db) as con, dbmod.transaction(con):
        return append_record(con, SID, kind, RECORD_MODELS[kind].model_validate(payload), anchor_entry_id=anchor)


def obs(content: str, src: list[str], ts: str = "2026-01-15 14:01", rel: str = "medium", tokens: float = 10) -> dict:
    return {"id": mid(content), "content": content, "timestamp": ts, "relevance": rel, "sourceEntryIds": src,
            "tokenCount": tokens}


def refl(content: str, supports: list[str]) -> dict:
    return {"id": mid(content), "content": content, "supportingObservationIds": supports, "tokenCount": 5}


def item(content: str, src: list[str], ts: str = "2026-01-15 14:02", rel: str = "high") -> dict:
    """One observation as the model proposes it."""
    return {"timestamp": ts, "content": content, "relevance": rel, "sourceEntryIds": src}


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


# ------------------------------------------------------------------ sessions


def story() -> SessionBuilder:
    """Every kind of source entry once, plus two entries that are not sources."""
    b = SessionBuilder(SID)
    b.system("You are Pi, a coding agent.")  # E1: not a source entry
    b.user("Please use PostgreSQL 16 for the orders service.")  # E2 @ 14:02
    b.assistant("Let me look at the config.", thinking="The user wants Postgres; read the config first.",
                tool_calls=[("call_1", "read", {"path": "config/db.yaml"})])  # E3
    b.tool_result("call_1", "read", "engine: mysql\nversion: 8", images=1)  # E4
    b.bash("make test", "3 passed", 0)  # E5
    b.model_change()  # E6: not a source entry
    b.user([{"type": "text", "text": "Here is the screenshot of the error."},
            {"type": "image", "data": "QUJDREVGR0g=", "mimeType": "image/jpeg"}])  # E7
    b.assistant("Switched config/db.yaml to PostgreSQL 16.")  # E8 @ 14:08
    return b


def blocks(n: int) -> SessionBuilder:
    """n alternating user/assistant messages of 400 characters each (100 tokens by Pi's estimate)."""
    b = SessionBuilder(SID)
    for i in range(1, n + 1):
        body = f"M{i} " + "lorem ipsum " * 40
        body = body[:400]
        (b.user if i % 2 else b.assistant)(body)
    return b


# ------------------------------------------------------------------ observer: input


def test_observer_input_labels_every_source_entry_with_id_role_and_time(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    server.add(text("Nothing to record."))
    observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    body = server.requests[0]
    assert body["messages"][0]["role"] == "system"  # the stable prompt comes first
    # the three workers' request head is the same: one system prompt, all three tools
    assert body["messages"][0]["content"] == WORKER_SYSTEM
    assert [t["function"]["name"] for t in body["tools"]] == ["record_observations", "record_reflections",
                                                              "drop_observations"]
    sent = prompt(server)
    # the date once, then each entry labelled with its id, role and time
    assert f"=== 2026-01-15 ===\n\n[{E[2]} User 14:02] Please use PostgreSQL 16 for the orders service." in sent
    assert sent.count("=== 2026-01-15 ===") == 1
    assert (f"[{E[3]} Assistant 14:03] (thinking) The user wants Postgres; read the "
            "config first.\nLet me look at the config.\n(tool call) read({\"path\":\"config/db.yaml\"})") in sent
    assert "call_1" not in sent  # tool-call ids cost tokens and tell the observer nothing
    assert f"[{E[4]} Tool result 14:04] (read) engine: mysql\nversion: 8\n[image: image/png]" in sent
    assert f"[{E[5]} User ran a command 14:05] $ make test\n3 passed" in sent
    assert f"[{E[7]} User 14:07] Here is the screenshot of the error.\n[image: image/jpeg]" in sent
    assert f"[{E[8]} Assistant 14:08] Switched config/db.yaml to PostgreSQL 16." in sent
    # not source entries: the system prompt and the model change
    assert E[1] not in sent and "You are Pi, a coding agent." not in sent
    assert E[6] not in sent
    # images are placeholders, never their data
    assert "QUJDREVGR0g=" not in server.sent_text() and "iVBORw0KGgo=" not in server.sent_text()
    assert f"## New entries ({E[2]} to {E[8]})" in sent
    assert "Current time (a fallback only): 2026-01-15 14:08" in sent
    # layout for prefix caches: memory first, then the task with the volatile time, then the chunk last
    assert sent.startswith("## Memory\n(empty)\n\n## Task: observe\n")
    assert sent.index("## Task: observe") < sent.index("Current time") < sent.index("## New entries")


def test_observer_input_labels_extension_messages_and_branch_summaries(server, tmp_path, db_path):
    b = SessionBuilder(SID)
    b.user("Continue with the cache work.")  # E1
    b.custom_message("plan-reminder", "Remember: tests before merge.")  # E2
    b.branch_summary("Explored a Redis cache on another branch; rejected for latency.")  # E3
    b.label(E[1], "checkpoint")  # E4: not a source entry
    load(b, tmp_path, db_path)
    server.add(text("nothing"))
    observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    sent = prompt(server)
    assert f"[{E[2]} Extension message (plan-reminder) 14:02] Remember: tests before merge." in sent
    assert f"[{E[3]} Branch summary 14:03] Explored a Redis cache on another branch; rejected for latency." in sent
    assert f"[{E[4]} " not in sent and f"({E[1]} to {E[3]})" in sent


def test_observer_input_shows_current_reflections_and_active_observations(server, tmp_path, db_path):
    load(blocks(6), tmp_path, db_path)
    o1, o2, o3 = (obs("User wants PostgreSQL 16.", [E[1]], "2026-01-15 14:01", "critical"),
                  obs("Assistant read config/db.yaml.", [E[2]], "2026-01-15 14:02", "low"),
                  obs("A note that was dropped later.", [E[2]], "2026-01-15 14:02", "medium"))
    append(db_path, OBS, {"observations": [o1, o2, o3], "coversUpToId": E[2]}, E[2])
    append(db_path, REFL, {"reflections": [refl("The project standardizes on PostgreSQL 16.", [o1["id"]])],
                           "coversUpToId": E[2]}, E[2])
    append(db_path, DROP, {"observationIds": [o3["id"]], "coversUpToId": E[2]}, E[2])
    server.add(text("nothing"))
    observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    sent = prompt(server)
    # one memory list in ledger order (the order items were recorded): it only grows at its end; a
    # dropped line stays (the memory is laid out anew at a full fold only), its id listed after it
    assert sent.startswith(
        f"## Memory\n[{o1['id']}] 2026-01-15 14:01 [critical] User wants PostgreSQL 16.\n"
        f"[{o2['id']}] 2026-01-15 14:02 [low] Assistant read config/db.yaml.\n"
        f"[{o3['id']}] 2026-01-15 14:02 [medium] A note that was dropped later.\n"
        f"[{mid('The project standardizes on PostgreSQL 16.')}] reflection: The project standardizes on PostgreSQL 16. "
        f"(supports: {o1['id']})"  # each reflection's supporting ids on its own line
        f"\n\n## Dropped since\n{o3['id']}\n\n## Task: observe")
    # the chunk starts after the observation watermark E2
    assert f"({E[3]} to {E[6]})" in sent
    assert f"[{E[2]} " not in sent.split("## New entries")[1]
    # the entries before the chunk are shown as context, marked as already observed
    assert f"## Context (before this chunk, already observed)\n=== 2026-01-15 ===\n\n[{E[1]} User 14:01]" in sent


@pytest.mark.parametrize("cap, last", [(256, 3), (299, 3), (300, 4), (301, 4)])
def test_chunk_cap_boundary(server, tmp_path, db_path, cap, last):
    """Whole entries of 100 tokens each (the first entry is E1, so E{last} - 1 entries fit)."""
    load(blocks(5), tmp_path, db_path)
    server.add(text("nothing"))
    outcome = observe_now(Workspace.open(db_path, settings=Settings(observerChunkMaxTokens=cap)), SID, None, config(server))
    assert outcome.chunk == (E[1], E[last - 1])
    assert outcome.outcome == "empty"


def test_chunk_cap_limits_the_chunk_to_whole_entries(server, tmp_path, db_path):
    load(blocks(5), tmp_path, db_path)
    server.add(tool_call("record_observations", {"observations": [item("First two blocks seen.", [E[1], E[2]])]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings(observerChunkMaxTokens=256)), SID, None, config(server))
    sent = prompt(server)
    assert f"[{E[1]} User 14:01]" in sent and f"[{E[2]} Assistant 14:02]" in sent
    assert f"[{E[3]} " not in sent  # 100 + 100 + 100 > 256
    assert outcome.chunk == (E[1], E[2])
    [(kind, covers, anchor, origin, _)] = records(db_path)
    assert (kind, covers, anchor, origin) == (OBS, E[2], E[5], "pipeline")  # watermark = chunk end; anchor = tip
    assert observer_watermark(db_path) == E[2]
    assert stages(db_path)[0]["chunk_first_id"] == E[1] and stages(db_path)[0]["chunk_last_id"] == E[2]
    # the next stage reads the next chunk
    server.add(text("nothing here"))
    observe_now(Workspace.open(db_path, settings=Settings(observerChunkMaxTokens=256)), SID, None, config(server))
    assert f"({E[3]} to {E[4]})" in prompt(server, 1)


def test_an_entry_alone_over_the_cap_is_sent_as_a_marked_head_tail_excerpt(server, tmp_path, db_path):
    b = SessionBuilder(SID)
    big = "HEAD-START " + "alpha " * 600 + "MIDDLE-SECRET-WORD " + "omega " * 600 + "TAIL-END"
    b.user(big)  # E1: about 1,850 tokens, alone over the 256 cap
    b.assistant("ok")  # E2
    load(b, tmp_path, db_path)
    raw_before = rows(db_path, "SELECT raw FROM entries WHERE session_id = ? AND entry_id = ?", [SID, E[1]])[0][0]
    server.add(tool_call("record_observations", {"observations": [item("User pasted a long log.", [E[1]])]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings(observerChunkMaxTokens=256)), SID, None, config(server))
    sent = prompt(server)
    assert outcome.chunk == (E[1], E[1])  # at least the first entry, and nothing after it
    assert "HEAD-START" in sent and "TAIL-END" in sent
    assert "MIDDLE-SECRET-WORD" not in sent
    # 256 tokens ~ 1,024 characters kept: the marker names how many were left out
    assert f"[… {len(big) - 1024} characters omitted from the middle of this entry" in sent
    assert f"[{E[2]} " not in sent
    assert records(db_path)[0][1] == E[1]
    # the stored entry is unchanged, and recall shows it whole
    assert rows(db_path, "SELECT raw FROM entries WHERE session_id = ? AND entry_id = ?",
                [SID, E[1]])[0][0] == raw_before
    assert json.loads(raw_before)["message"]["content"][0]["text"] == big
    found = recall(workspace(db_path), mid("User pasted a long log."), SID)
    assert found.observations[0].sources[0].text == big


# ------------------------------------------------------------------ observer: records


def test_valid_observations_are_recorded_with_code_made_ids_and_token_counts(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    first = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    second = item("Assistant switched config/db.yaml from MySQL 8 to PostgreSQL 16.", [E[4], E[8], E[4]],
                  ts="2026-01-15 14:08")
    server.add(tool_call("record_observations", {"observations": [first, second]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert (outcome.outcome, outcome.items, outcome.rejected, outcome.duplicates) == ("recorded", 2, 0, 0)
    assert len(server.requests) == 1  # a clean receipt ends the stage: no closing turn
    [(kind, covers, anchor, origin, ledger_id)] = records(db_path)
    assert (kind, covers, anchor, origin) == (OBS, E[8], E[8], "pipeline")
    stored = observations_of(db_path, ledger_id)
    assert stored == [
        {"id": "24878c7131e3", "content": first["content"], "timestamp": "2026-01-15 14:02",
         "relevance": "critical", "sourceEntryIds": [E[2]], "tokenCount": 24},
        {"id": "901ca7ddd8b1", "content": second["content"], "timestamp": "2026-01-15 14:08",
         "relevance": "high", "sourceEntryIds": [E[4], E[8]], "tokenCount": 26},
    ]
    for o in stored:
        assert o["id"] == mid(o["content"])
        assert o["tokenCount"] == pi_tokens(f"[{o['id']}] {o['timestamp']} [{o['relevance']}] {o['content']}")
    assert observer_watermark(db_path) == E[8]
    [receipt] = outcome.receipts  # kept in om_internal.stages; no request carries it back to the model
    assert "1. recorded [24878c7131e3]" in receipt and "2. recorded [901ca7ddd8b1]" in receipt
    [stage] = stages(db_path)
    assert (stage["stage"], stage["outcome"], stage["records"], stage["items"], stage["rejected"]) == (
        "observer", "recorded", 1, 2, 0)
    calls = llm_calls(db_path)
    assert [(c["stage"], c["turn"], c["attempt"], c["status"]) for c in calls] == [
        ("observer", 1, 1, "ok")]
    assert all(c["input_tokens"] > 0 and c["output_tokens"] == 20 and c["latency_ms"] > 0 for c in calls)


def test_every_rejection_rule_and_its_receipt(server, tmp_path, db_path):
    load(blocks(4), tmp_path, db_path)
    existing = obs("User wants PostgreSQL 16.", [E[1]])
    append(db_path, OBS, {"observations": [existing], "coversUpToId": E[2]}, E[2])
    long_content = "Assistant pasted the full migration plan: " + "step " * 2100
    assert len(long_content) > 10_000
    fresh = "User asked for the orders table to be partitioned by month."
    proposals = [
        42,                                                                    # 1 not an object
        item("   ", [E[3]]),                                                   # 2 empty content
        item("A timestamp that is not one.", [E[3]], ts="yesterday"),          # 3 bad timestamp
        item("A relevance that is not one.", [E[3]], rel="urgent"),            # 4 bad relevance
        item("No sources at all.", []),                                        # 5 empty sourceEntryIds
        {"timestamp": "2026-01-15 14:03", "content": "Sources missing.", "relevance": "low"},  # 6 missing
        item("Cites an entry of the context.", [E[1]]),                        # 7 context: citable
        item("Cites an entry that does not exist.", [E[3], "feedbeef"]),       # 8 unknown id
        item(existing["content"], [E[3]]),                                     # 9 duplicate of a recorded id
        item(fresh, [E[3]]),                                                   # 10 recorded
        item(fresh, [E[4]], rel="low"),                                        # 11 duplicate within the call
        item(long_content, [E[4]], rel="medium"),                              # 12 truncated, recorded
    ]
    server.add(tool_call("record_observations", {"observations": proposals}), text("Thanks."))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert (outcome.items, outcome.rejected, outcome.duplicates) == (3, 7, 2)

    [receipt] = tool_messages(server, 1)
    lines = receipt.splitlines()
    assert lines[0] == "record_observations receipt:"
    expect = {
        1: ("rejected", "not an object"), 2: ("rejected", "content"), 3: ("rejected", "timestamp"),
        4: ("rejected", "relevance"), 5: ("rejected", "sourceEntryIds"), 6: ("rejected", "sourceEntryIds"),
        7: ("recorded", mid("Cites an entry of the context.")), 8: ("rejected", "feedbeef"), 9: ("duplicate", existing["id"]),
        10: ("recorded", mid(fresh)), 11: ("duplicate", mid(fresh)),
    }
    for n, (verdict, detail) in expect.items():
        assert lines[n].startswith(f"{n}. {verdict}"), lines[n]
        assert detail in lines[n], lines[n]
    assert E[3] not in lines[8]  # only the offending id is named
    truncated = long_content[:10_000] + TRUNCATION_MARKER
    assert lines[12] == f"12. recorded [{mid(truncated)}]"

    ledger_id = records(db_path)[-1][4]
    stored = observations_of(db_path, ledger_id)
    assert [o["content"] for o in stored] == ["Cites an entry of the context.", fresh, truncated]
    assert stored[2]["id"] == mid(truncated)
    assert len(stored[2]["content"]) == 10_000 + len(TRUNCATION_MARKER)
    assert stored[2]["tokenCount"] == pi_tokens(f"[{mid(truncated)}] 2026-01-15 14:02 [medium] {truncated}")
    [stage] = stages(db_path)
    assert (stage["outcome"], stage["items"], stage["rejected"]) == ("recorded", 3, 7)


def test_malformed_json_and_wrong_shapes_get_receipts_and_the_loop_continues(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    good = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    server.add(Reply(tool_calls=[("record_observations", '{"observations": [{"content": "cut off')]),
               tool_call("record_observations", {"items": [good]}),
               tool_call("record_observations", {"observations": [good]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert len(server.requests) == 3  # two rejected calls got receipts; the clean third ends the stage
    assert tool_messages(server, 1)[0].startswith("rejected: the arguments were not valid JSON")
    assert tool_messages(server, 2)[1] == 'rejected: expected {"observations": [...]}'
    assert outcome.receipts[2] == f"record_observations receipt:\n1. recorded [{mid(good['content'])}]"
    # each receipt answers its own call
    msgs = server.requests[1]["messages"]
    assert msgs[-1]["tool_call_id"] == msgs[-2]["tool_calls"][0]["id"]
    assert (outcome.outcome, outcome.items, outcome.turns) == ("recorded", 1, 3)
    assert [o.id for o in memory(db_path).observations] == [mid(good["content"])]


def test_an_unknown_tool_gets_a_receipt(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    good = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    server.add(Reply(tool_calls=[("record_reflections", {"reflections": []}),
                                 ("record_observations", {"observations": [good]})]),
               text("Done."))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    unknown, receipt = tool_messages(server, 1)
    # offered (every worker request carries the three tools), but not this task's
    assert "not this task's tool 'record_reflections'" in unknown and "record_observations" in unknown
    assert receipt.endswith(f"1. recorded [{mid(good['content'])}]")
    assert outcome.outcome == "recorded" and outcome.items == 1


# ------------------------------------------------------------------ observer: empty, failure, turn cap


def test_a_deliberate_empty_run_appends_nothing_and_keeps_the_watermark(server, tmp_path, db_path):
    load(blocks(4), tmp_path, db_path)
    append(db_path, OBS, {"observations": [obs("Earlier note.", [E[1]])], "coversUpToId": E[2]}, E[2])
    server.add(text("Nothing worth keeping in this chunk."))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert (outcome.outcome, outcome.items, outcome.error) == ("empty", 0, None)
    assert len(records(db_path)) == 1
    assert observer_watermark(db_path) == E[2]
    [stage] = stages(db_path)
    assert (stage["stage"], stage["outcome"], stage["records"], stage["chunk_first_id"], stage["chunk_last_id"]) == (
        "observer", "empty", 0, E[3], E[4])
    assert [(c["status"], c["turn"]) for c in llm_calls(db_path)] == [("ok", 1)]


@pytest.mark.parametrize("status, message, kind, requests", [
    (500, "upstream exploded", "transient", 3),  # retried on every attempt, then the stage fails
    (401, "Incorrect API key provided", "permanent", 1),
])
def test_a_failure_appends_nothing_and_moves_no_watermark(server, tmp_path, db_path, status, message, kind, requests):
    load(blocks(4), tmp_path, db_path)
    append(db_path, OBS, {"observations": [obs("Earlier note.", [E[1]])], "coversUpToId": E[2]}, E[2])
    server.default = http_error(status, message)
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server, attempts=3))
    assert len(server.requests) == requests
    assert (outcome.outcome, outcome.error_kind) == ("failed", kind)
    assert message in outcome.error
    assert len(records(db_path)) == 1  # only the record from before
    assert observer_watermark(db_path) == E[2]
    [stage] = stages(db_path)
    assert (stage["outcome"], stage["records"], stage["items"], stage["error_kind"]) == ("failed", 0, 0, kind)
    assert stage["error"] == outcome.error
    calls = llm_calls(db_path)
    assert [(c["attempt"], c["status"], c["error_kind"]) for c in calls] == [
        (n, "error", kind) for n in range(1, requests + 1)]


def test_a_failure_on_the_second_turn_still_appends_nothing(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    good = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    outside = item("Cites an entry outside the chunk.", ["ffffffff"])
    server.add(tool_call("record_observations", {"observations": [good, outside]}), http_error(401, "key revoked"))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert outcome.outcome == "failed" and "key revoked" in outcome.error
    assert records(db_path) == []
    assert memory(db_path).observations == []
    assert observer_watermark(db_path) is None
    assert [s["outcome"] for s in stages(db_path)] == ["failed"]
    assert [(c["turn"], c["status"]) for c in llm_calls(db_path)] == [(1, "ok"), (2, "error")]


@pytest.mark.parametrize("cap", [1, 3])
def test_the_turn_cap_stops_the_loop_after_exactly_n_model_calls(server, tmp_path, db_path, cap):
    load(story(), tmp_path, db_path)
    # every answer has a rejected item, so every receipt asks for another turn
    server.default = tool_call("record_observations", {"observations": [item("User wants PostgreSQL 16.", [E[2]]),
                                                                        item("Outside the chunk.", ["ffffffff"])]})
    outcome = observe_now(Workspace.open(db_path, settings=Settings(agentMaxTurns=cap)), SID, None, config(server))
    assert len(server.requests) == cap
    assert outcome.turns == cap and outcome.turn_cap_reached is True
    assert [c["turn"] for c in llm_calls(db_path)] == list(range(1, cap + 1))


def test_observer_through_a_streaming_model(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    good = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    server.add(Reply(tool_calls=[("record_observations", {"observations": [good]})], prompt_tokens=900,
                     completion_tokens=40, cached_tokens=768),
               Reply(text="done", prompt_tokens=950, completion_tokens=3, cached_tokens=896))
    cfg = config(server)
    cfg.stream = True
    outcome = observe_now(Workspace.open(db_path, settings=Settings(agentClosingTurn=True)), SID, None, cfg)
    assert all(body.get("stream") is True for body in server.requests)
    assert (outcome.outcome, outcome.items) == ("recorded", 1)
    assert [o.id for o in memory(db_path).observations] == [mid(good["content"])]
    calls = llm_calls(db_path)
    assert [(c["turn"], c["input_tokens"], c["output_tokens"], c["cached_tokens"], c["model"]) for c in calls] == [
        (1, 900, 40, 768, "openai/fake-model"), (2, 950, 3, 896, "openai/fake-model")]


def test_observe_a_chosen_leaf_is_branch_local(server, tmp_path, db_path):
    b = SessionBuilder(SID)
    b.user("Start the orders service.")  # E1
    b.assistant("Started.")  # E2
    b.user("Side question on a branch that was abandoned.")  # E3
    b.go(E[2])
    b.user("Now add a health check.")  # E4
    b.assistant("Added /healthz.")  # E5: the current leaf
    load(b, tmp_path, db_path)
    server.add(tool_call("record_observations", {"observations": [item("User asked a side question.", [E[3]])]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, E[3], config(server))
    assert outcome.chunk == (E[1], E[3]) and outcome.outcome == "recorded"
    assert f"[{E[4]} " not in prompt(server)
    [(_, covers, anchor, _, _)] = records(db_path)
    assert (covers, anchor) == (E[3], E[3])
    # the record is on the side branch only: the current branch is still wholly uncovered
    assert observer_watermark(db_path) is None
    server.add(text("nothing"))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert outcome.chunk == (E[1], E[5])
    sent = prompt(server, 1)
    assert f"[{E[3]} " not in sent and "User asked a side question." not in sent


# ------------------------------------------------------------------ observer through the CLI


def test_cli_observe_and_reflect_happy_path(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    good = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    server.add(tool_call("record_observations", {"observations": [good]}))
    base = ["--db", str(db_path)]
    model = ["--model", "openai/fake-model", "--api-base", server.base_url]
    result = invoke([*base, "observe", SID, *model])
    assert result.exit_code == 0, result.output
    assert "observer: appended 1 item(s)" in result.output
    assert f"covers up to {E[8]}" in result.output
    assert "offline" not in result.output

    reflection = "The orders service runs on PostgreSQL 16."
    server.add(tool_call("record_reflections", {"reflections": [
        {"content": reflection, "supportingObservationIds": [mid(good["content"])]}]}))
    result = invoke([*base, "reflect", SID, *model, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["offline"] is False
    assert [(s["stage"], s["outcome"], s["items"]) for s in data["stages"]] == [
        ("reflector", "recorded", 1), ("dropper", "skipped", 0)]
    assert [r.id for r in memory(db_path).reflections] == [mid(reflection)]


def test_cli_takes_model_and_api_base_from_the_environment(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    server.add(text("Nothing to record."))
    result = CliRunner().invoke(app, ["--db", str(db_path), "observe", SID, "--json"],
                                env={"OM_MODEL": "openai/fake-model", "OM_API_BASE": server.base_url})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["outcome"], data["model"], data["offline"], data["model_calls"]) == (
        "empty", "openai/fake-model", False, 1)
    assert len(server.requests) == 1


def test_cli_observe_failure_exits_non_zero_with_the_reason(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    server.default = http_error(401, "Incorrect API key provided: sk-test")
    result = invoke(["--db", str(db_path), "observe", SID, "--model", "openai/fake-model",
                     "--api-base", server.base_url])
    assert result.exit_code != 0
    assert "observer failed (permanent)" in result.output
    assert "Incorrect API key provided" in result.output
    assert len(server.requests) == 1
    assert records(db_path) == []
    assert [s["outcome"] for s in stages(db_path)] == ["failed"]


# ------------------------------------------------------------------ reflector


def coverage_session(tmp_path, db_path) -> dict[str, dict]:
    """O1 strong (cited twice), O2 partial, O3 and O4 none, O5 dropped; the latest observation
    watermark is E3 (anchored at E4), older than the tip E6."""
    load(blocks(6), tmp_path, db_path)
    o = {
        "O1": obs("User wants PostgreSQL 16 for orders.", [E[1]], "2026-01-15 14:01", "critical"),
        "O2": obs("Assistant chose pgx as the driver.", [E[2]], "2026-01-15 14:02", "high"),
        "O3": obs("User prefers small pull requests.", [E[1]], "2026-01-15 14:01", "medium"),
        "O4": obs("Tests run with pytest -q.", [E[3]], "2026-01-15 14:03", "low"),
        "O5": obs("A stale note about MySQL.", [E[2]], "2026-01-15 14:02", "low"),
    }
    append(db_path, OBS, {"observations": [o["O1"], o["O2"], o["O3"], o["O5"]], "coversUpToId": E[2]}, E[2])
    append(db_path, REFL, {"reflections": [refl("Orders run on PostgreSQL 16.", [o["O1"]["id"], o["O2"]["id"]]),
                                           refl("The user is exacting about the database.", [o["O1"]["id"]])],
                           "coversUpToId": E[2]}, E[2])
    append(db_path, DROP, {"observationIds": [o["O5"]["id"]], "coversUpToId": E[2]}, E[2])
    append(db_path, OBS, {"observations": [o["O4"]], "coversUpToId": E[3]}, E[4])
    return o


def test_reflector_input_shows_coverage_tiers(server, tmp_path, db_path):
    o = coverage_session(tmp_path, db_path)
    server.add(text("Nothing new."))
    [outcome] = reflect_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert outcome.outcome == "empty"
    sent = prompt(server)
    line = lambda key: f"[{o[key]['id']}] {o[key]['timestamp']} [{o[key]['relevance']}] {o[key]['content']}"  # noqa: E731
    reflection = lambda c, *ids: f"[{mid(c)}] reflection: {c} (supports: {', '.join(o[i]['id'] for i in ids)})"  # noqa: E731
    # the memory in ledger order, exactly as the observer reads it; the drop of O5 came before any
    # full fold of the workers' memory, so its line stays and the id is listed after it; then the task
    assert sent.startswith("## Memory\n" + "\n".join([
        line("O1"), line("O2"), line("O3"), line("O5"), reflection("Orders run on PostgreSQL 16.", "O1", "O2"),
        reflection("The user is exacting about the database.", "O1"), line("O4")])
        + f"\n\n## Dropped since\n{o['O5']['id']}\n\n## Task: reflect\n")
    assert sent.endswith(f"## Coverage\nstrong: {o['O1']['id']}\npartial: {o['O2']['id']}\n"
                         "none: every other active observation\n\n"
                         # recorded after the last reflections: what the reflector has not seen yet
                         f"## New since the last reflections\n{o['O4']['id']}")
    assert [t["function"]["name"] for t in server.requests[0]["tools"]] == ["record_observations", "record_reflections",
                                                                          "drop_observations"]
    assert len(records(db_path)) == 4  # an empty reflector run appends nothing


def test_reflector_rejections_and_record_watermark(server, tmp_path, db_path):
    o = coverage_session(tmp_path, db_path)
    good = "The user wants small, well-tested changes."
    proposals = [
        {"content": "Cites a dropped observation.", "supportingObservationIds": [o["O5"]["id"]]},       # 1
        {"content": "Cites an unknown observation.", "supportingObservationIds": ["ffffffffffff"]},     # 2
        {"content": "Cites one active and one dropped.", "supportingObservationIds": [o["O1"]["id"], o["O5"]["id"]]},
        {"content": "Line one.\nLine two.", "supportingObservationIds": [o["O3"]["id"]]},              # 4
        {"content": "Orders run on PostgreSQL 16.", "supportingObservationIds": [o["O1"]["id"]]},       # 5 dup
        {"content": "No support.", "supportingObservationIds": []},                                     # 6
        "not an object",                                                                                # 7
        {"content": good, "supportingObservationIds": [o["O3"]["id"], o["O4"]["id"]]},                 # 8
    ]
    server.add(tool_call("record_reflections", {"reflections": proposals}), text("done"))
    outcome, dropper = reflect_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert dropper.outcome == "skipped"  # a pool of 40 tokens is within the default target
    [receipt] = tool_messages(server, 1)
    lines = receipt.splitlines()
    assert lines[0] == "record_reflections receipt:"
    assert lines[1].startswith("1. rejected") and o["O5"]["id"] in lines[1]
    assert lines[2].startswith("2. rejected") and "ffffffffffff" in lines[2]
    assert lines[3].startswith("3. rejected") and o["O5"]["id"] in lines[3] and o["O1"]["id"] not in lines[3]
    assert lines[4].startswith("4. rejected") and "single line" in lines[4]
    assert lines[5].startswith("5. duplicate") and mid("Orders run on PostgreSQL 16.") in lines[5]
    assert lines[6].startswith("6. rejected") and "supportingObservationIds" in lines[6]
    assert lines[7].startswith("7. rejected") and "not an object" in lines[7]
    assert lines[8] == f"8. recorded [{mid(good)}]"
    assert (outcome.outcome, outcome.items, outcome.rejected, outcome.duplicates) == ("recorded", 1, 6, 1)
    kind, covers, anchor, origin, ledger_id = records(db_path)[-1]
    assert (kind, covers, anchor, origin) == (REFL, E[3], E[6], "pipeline")  # = latest observation watermark
    stored = rows(db_path, "SELECT refl_id, content, supporting_observation_ids, token_count FROM reflections "
                           "WHERE ledger_id = ?", [ledger_id])
    assert stored == [(mid(good), good, [o["O3"]["id"], o["O4"]["id"]], pi_tokens(good))]


def test_reflector_does_not_run_without_an_observation_watermark(server, tmp_path, db_path):
    load(blocks(2), tmp_path, db_path)
    [outcome] = reflect_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert outcome.outcome == "skipped"
    assert server.requests == []
    assert outcome.reason and "observer" in outcome.reason


# ------------------------------------------------------------------ dropper


def test_max_drops_by_hand():
    # pool 105 over 4 observations (average 26.25), target 50: ceil(55 / 26.25) = ceil(2.095) = 3
    assert max_drops(105, 50, 4) == 3
    # pool 70 over 7 (average 10), target 50: ceil(20 / 10) = 2
    assert max_drops(70, 50, 7) == 2
    # just over target: at least 1
    assert max_drops(100, 99, 2) == 1
    # never more than the pool
    assert max_drops(30, 1, 3) == 3
    assert max_drops(0, 10, 0) == 0


def pool_session(tmp_path, db_path, specs: list[tuple[str, str, float]], cites: list[list[int]]) -> list[dict]:
    """Observations from (content, relevance, tokens), oldest first; each inner list of ``cites`` is
    one reflection citing those observation indexes. Watermark E2, tip E6."""
    load(blocks(6), tmp_path, db_path)
    made = [obs(c, [E[1]], f"2026-01-15 14:{10 + i:02d}", rel, tokens) for i, (c, rel, tokens) in enumerate(specs)]
    append(db_path, OBS, {"observations": made, "coversUpToId": E[2]}, E[2])
    if cites:
        append(db_path, REFL, {"reflections": [refl(f"Reflection {n}.", [made[i]["id"] for i in c])
                                               for n, c in enumerate(cites)], "coversUpToId": E[2]}, E[2])
    return made


def new_reflection(support: str) -> Reply:
    return tool_call("record_reflections", {"reflections": [{"content": "A fresh durable conclusion.",
                                                             "supportingObservationIds": [support]}]})


def dropped_ids(db) -> list[str]:
    return [r[0] for r in rows(db, "SELECT obs_id FROM drops WHERE session_id = ? ORDER BY item_index", [SID])]


def test_dropper_input_and_maximum(server, tmp_path, db_path):
    made = pool_session(tmp_path, db_path, [("Alpha note.", "low", 10), ("Beta note.", "medium", 20),
                                            ("Gamma note.", "high", 30), ("Delta note.", "critical", 45)],
                        [[0]])
    server.add(new_reflection(made[1]["id"]),
               tool_call("drop_observations", {"ids": [m["id"] for m in made], "reason": "pool too big"}))
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=50)
    reflector, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    assert (reflector.outcome, dropper.outcome) == ("recorded", "recorded")
    sent = prompt(server, 1)
    assert ("Active observations: 4 using 105 tokens; target 50 tokens, so 55 tokens to shed. Drop at most 3, "
            "only what is safe. Guard: never dropped, as critical notes of the user's own words that no "
            f"reflection cites: {made[3]['id']}.") in sent
    # the current time, and each active observation's age and coverage, oldest first
    assert "## Task: drop\nCurrent time: 2026-01-15 14:06." in sent
    assert f"[{made[0]['id']}] 2026-01-15 14:10 [low] Alpha note." in sent
    assert f"[{made[2]['id']}] 2026-01-15 14:12 [high] Gamma note." in sent
    # Alpha by the older reflection, Beta by the same run's one
    # (id, age in minutes, relevance, tokens, coverage, citing reflections)
    older, fresh = mid("Reflection 0."), mid("A fresh durable conclusion.")
    assert sent.endswith("## Active observations: id, age (minutes), relevance, tokens, coverage, citing "
                         f"reflections\n{made[0]['id']} 0 low 10 partial {older}\n"
                         f"{made[1]['id']} 0 medium 20 partial {fresh}\n{made[2]['id']} 0 high 30 none -\n"
                         f"{made[3]['id']} 0 critical 45 none -")
    assert (f"[{mid('A fresh durable conclusion.')}] reflection: A fresh durable conclusion. "
            f"(supports: {made[1]['id']})") in sent
    # the dropper's request starts as the reflector's did: same head, the same memory, then its own task
    reflector = prompt(server, 0)
    assert sent.startswith(reflector[: reflector.index("\n\n## Task: reflect")] + "\n")
    assert server.requests[1]["tools"] == server.requests[0]["tools"]
    assert len(dropped_ids(db_path)) == 3
    kind, covers, anchor, _, _ = records(db_path)[-1]
    assert (kind, covers, anchor) == (DROP, E[2], E[6])


@pytest.mark.parametrize("limit, expected", [
    # strong+high beat strong+critical (relevance) and the partial/none ones (coverage); oldest first
    (2, ["D", "E"]),
    # all strong (high before critical), then partial low before partial critical
    (5, ["D", "E", "F", "C", "G"]),
    # then partial critical before none low: coverage outranks relevance
    (6, ["D", "E", "F", "C", "G", "B"]),
])
def test_dropper_keeps_the_safest_when_too_many_are_proposed(server, tmp_path, db_path, limit, expected):
    names = ["A", "B", "C", "D", "E", "F", "G"]
    specs = [("A: none, low.", "low", 10), ("B: partial, critical.", "critical", 10),
             ("C: strong, critical.", "critical", 10), ("D: strong, high, oldest.", "high", 10),
             ("E: strong, high.", "high", 10), ("F: strong, high, newest.", "high", 10),
             ("G: partial, low.", "low", 10)]
    made = pool_session(tmp_path, db_path, specs, [[2, 3, 4, 5, 1], [2, 3, 4, 5, 6]])
    by_name = {n: m["id"] for n, m in zip(names, made)}
    # the same run's reflection cites C, already strong: coverage stays as designed
    server.add(new_reflection(by_name["C"]),
               tool_call("drop_observations", {"ids": [by_name[n] for n in reversed(names)]}))
    target = 70 - 10 * limit  # over = 10·limit, average 10: max drops = limit
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=target)
    _, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    assert f"Drop at most {limit}," in prompt(server, 1)
    assert dropper.outcome == "recorded"
    assert sorted(dropped_ids(db_path)) == sorted(by_name[n] for n in expected)
    active = {o.id for o in memory(db_path).observations}
    assert active == {by_name[n] for n in names} - {by_name[n] for n in expected}


def test_dropper_ignores_ids_that_are_not_active(server, tmp_path, db_path):
    made = pool_session(tmp_path, db_path, [("One.", "low", 30), ("Two.", "low", 30), ("Three.", "low", 30)],
                        [[0]])
    append(db_path, DROP, {"observationIds": [made[2]["id"]], "coversUpToId": E[2]}, E[2])
    server.add(new_reflection(made[0]["id"]),
               tool_call("drop_observations", {"ids": [made[2]["id"], "ffffffffffff", 7, made[1]["id"]]}),
               text("ok"))  # ignored ids make the receipt unclean: the model gets another turn
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=40)
    _, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    assert len(server.requests) == 3
    [receipt] = tool_messages(server, 2)
    lines = receipt.splitlines()
    assert lines[1].startswith("ignored") and made[2]["id"] in lines[1]
    assert lines[2].startswith("ignored") and "ffffffffffff" in lines[2]
    assert lines[3].startswith("ignored") and "7" in lines[3]
    assert lines[4] == f"proposed [{made[1]['id']}]"
    assert (dropper.outcome, dropper.items, dropper.rejected) == ("recorded", 1, 3)
    assert dropped_ids(db_path) == [made[2]["id"], made[1]["id"]]  # the earlier drop, then this run's


def test_dropper_does_not_run_when_the_reflector_appended_nothing(server, tmp_path, db_path):
    pool_session(tmp_path, db_path, [("One.", "low", 60), ("Two.", "low", 60)], [])
    server.add(text("No reflections are due."))
    outcomes = reflect_now(Workspace.open(db_path, settings=Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=10)), SID, None, config(server))
    assert [o.stage for o in outcomes] == ["reflector"]
    assert len(server.requests) == 1
    assert dropped_ids(db_path) == []


def test_dropper_does_not_run_when_the_pool_is_within_target(server, tmp_path, db_path):
    made = pool_session(tmp_path, db_path, [("One.", "low", 35), ("Two.", "low", 35)], [])
    server.add(new_reflection(made[0]["id"]))
    # pool 70 == target 70: not over target
    outcomes = reflect_now(Workspace.open(db_path, settings=Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=70)), SID, None, config(server))
    assert [(o.stage, o.outcome) for o in outcomes] == [("reflector", "recorded"), ("dropper", "skipped")]
    assert len(server.requests) == 1


def test_dropper_watermark_is_the_earlier_of_the_two(tmp_path, db_path):
    pool_session(tmp_path, db_path, [("One.", "low", 60), ("Two.", "low", 60)], [])
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=10)
    with dbmod.reading(db_path) as con:
        assert dropper_input(con, SID, E[6], settings, E[1]).watermark == E[1]  # reflection mark earlier
        assert dropper_input(con, SID, E[6], settings, E[5]).watermark == E[2]  # observation mark earlier
        assert dropper_input(con, SID, E[6], settings, E[2]).max_drops == 2  # ceil(110 / 60)


def test_a_dropper_failure_does_not_undo_the_reflections(server, tmp_path, db_path):
    made = pool_session(tmp_path, db_path, [("One.", "low", 60), ("Two.", "low", 60)], [])
    server.add(new_reflection(made[0]["id"]), http_error(401, "key revoked mid-run"))
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=10)
    reflector, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    assert (reflector.outcome, dropper.outcome, dropper.error_kind) == ("recorded", "failed", "permanent")
    assert [r.id for r in memory(db_path).reflections] == [mid("A fresh durable conclusion.")]
    assert dropped_ids(db_path) == []
    assert [(s["stage"], s["outcome"]) for s in stages(db_path)] == [("reflector", "recorded"),
                                                                       ("dropper", "failed")]


def test_cli_reflect_exits_non_zero_when_the_dropper_fails(server, tmp_path, db_path):
    made = pool_session(tmp_path, db_path, [("One.", "low", 12000), ("Two.", "low", 12000)], [])
    server.add(new_reflection(made[0]["id"]), http_error(400, "bad request from dropper"))
    result = invoke(["--db", str(db_path), "reflect", SID, "--model", "openai/fake-model",
                     "--api-base", server.base_url])
    assert result.exit_code != 0
    assert "reflector: appended 1 item(s)" in result.output
    assert "dropper failed (permanent)" in result.output
    assert [r.id for r in memory(db_path).reflections] == [mid("A fresh durable conclusion.")]


def test_a_result_computed_but_not_appended_is_appended_later_without_asking_again(server, tmp_path, db_path,
                                                                                    monkeypatch):
    """Exactly-once: the computed result is persisted before the append. If the append fails, the next
    run appends the persisted result and makes no model call; the persisted copy goes with the append."""
    import om_core.workers.stages as stages_module

    load(story(), tmp_path, db_path)
    server.add(tool_call("record_observations", {"observations": [item("User requires PostgreSQL 16.", [E[2]])]}))

    def failing_append(*args, **kwargs):
        raise RuntimeError("the disk filled up during the append")

    monkeypatch.setattr(stages_module, "append_record", failing_append)
    with pytest.raises(RuntimeError):
        observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert records(db_path) == [] and len(server.requests) == 1
    assert rows(db_path, "SELECT stage FROM om_internal.stage_results WHERE session_id = ?", [SID]) == [("observer",)]

    monkeypatch.setattr(stages_module, "append_record", append_record)
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert (outcome.outcome, outcome.items) == ("recorded", 1)
    assert "without calling the model again" in outcome.reason
    assert len(server.requests) == 1  # no new model call
    [(kind, covers, _, _, _)] = records(db_path)
    assert (kind, covers) == (OBS, E[8])
    assert rows(db_path, "SELECT count(*) FROM om_internal.stage_results") == [(0,)]


# ------------------------------------------------------------------ one call per stage; cached tokens


@pytest.mark.parametrize("closing_turn, calls", [(False, 1), (True, 2)])
def test_a_clean_receipt_ends_the_stage_in_one_call_unless_the_closing_turn_is_set(server, tmp_path, db_path,
                                                                                  closing_turn, calls):
    load(story(), tmp_path, db_path)
    good = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    server.add(tool_call("record_observations", {"observations": [good]}), text("Recorded."))
    outcome = observe_now(Workspace.open(db_path, settings=Settings(agentClosingTurn=closing_turn)), SID, None, config(server))
    assert (outcome.outcome, outcome.items, outcome.turns, outcome.turn_cap_reached) == ("recorded", 1, calls, False)
    assert len(server.requests) == calls
    assert [c["turn"] for c in llm_calls(db_path)] == list(range(1, calls + 1))
    if closing_turn:  # the extension's loop: the receipt goes back and the model answers in plain text
        assert tool_messages(server, 1) == [f"record_observations receipt:\n1. recorded [{mid(good['content'])}]"]


def test_a_duplicate_is_not_a_rejection_so_the_receipt_is_clean(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    existing = obs("User wants PostgreSQL 16.", [E[1]])
    append(db_path, OBS, {"observations": [existing], "coversUpToId": E[1]}, E[1])
    server.add(tool_call("record_observations", {"observations": [item("User wants PostgreSQL 16.", [E[2]])]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert (outcome.outcome, outcome.duplicates, outcome.turns) == ("empty", 1, 1)
    assert len(server.requests) == 1


@pytest.mark.parametrize("closing_turn", [False, True])
def test_a_rejection_still_gets_its_receipt_and_another_turn(server, tmp_path, db_path, closing_turn):
    load(story(), tmp_path, db_path)
    good = item("User requires PostgreSQL 16 for the orders service.", [E[2]], rel="critical")
    bad = item("Cites an entry outside the chunk.", ["ffffffff"])
    fixed = item("Assistant switched config/db.yaml to PostgreSQL 16.", [E[4]])
    server.add(tool_call("record_observations", {"observations": [good, bad]}),
               tool_call("record_observations", {"observations": [fixed]}), text("Recorded."))
    outcome = observe_now(Workspace.open(db_path, settings=Settings(agentClosingTurn=closing_turn)), SID, None, config(server))
    [receipt] = tool_messages(server, 1)
    assert "1. recorded" in receipt and "2. rejected: sourceEntryIds ffffffff are not entries of this chunk" in receipt
    assert len(server.requests) == (3 if closing_turn else 2)  # the corrected call is clean: no closing turn
    assert (outcome.outcome, outcome.items, outcome.rejected) == ("recorded", 2, 1)
    assert {o.id for o in memory(db_path).observations} == {mid(good["content"]), mid(fixed["content"])}


def test_reflector_and_dropper_end_on_a_clean_receipt_too(server, tmp_path, db_path):
    made = pool_session(tmp_path, db_path, [("One.", "low", 60), ("Two.", "low", 60)], [])
    server.add(new_reflection(made[0]["id"]), tool_call("drop_observations", {"ids": [made[0]["id"]]}),
               text("unused"))
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=10)
    reflector, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    assert [(o.outcome, o.turns) for o in (reflector, dropper)] == [("recorded", 1), ("recorded", 1)]
    assert len(server.requests) == 2
    assert dropped_ids(db_path) == [made[0]["id"]]


def test_cached_tokens_reported_by_the_provider_are_recorded(server, tmp_path, db_path):
    """The fake server reports the prefix a request shares with an earlier one, as a provider cache
    would; llm_calls keeps each call's figure, and a second stage reuses the first one's prefix."""
    load(blocks(6), tmp_path, db_path)
    server.add(tool_call("record_observations", {"observations": [item("First blocks seen.", [E[1]])]}),
               tool_call("record_observations", {"observations": [item("Later blocks seen.", [E[4]])]}))
    settings = Settings(observerChunkMaxTokens=300)
    observe_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    observe_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    first, second = llm_calls(db_path)
    assert first["cached_tokens"] == 0  # nothing was asked before it
    # the second stage repeats the system prompt, tools and the memory's start verbatim
    system_and_tools = len(json.dumps(server.requests[1]["tools"])) + len(server.requests[1]["messages"][0]["content"])
    assert second["cached_tokens"] >= system_and_tools // 4
    assert second["cached_tokens"] < second["input_tokens"]  # the new chunk is not cached


def test_consecutive_observer_prompts_share_their_memory_as_a_prefix(server, tmp_path, db_path):
    """Between two stages of a branch the memory only grows at its end, so the earlier request's
    system prompt and memory are a prefix of the next request (what a provider cache reuses)."""
    load(blocks(6), tmp_path, db_path)
    append(db_path, OBS, {"observations": [obs("User wants PostgreSQL 16.", [E[1]])], "coversUpToId": E[1]}, E[1])
    server.add(tool_call("record_observations", {"observations": [item("Blocks two and three.", [E[2]])]}),
               text("nothing"))
    settings = Settings(observerChunkMaxTokens=256)
    observe_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    observe_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    first, second = prompt(server, 0), prompt(server, 1)
    memory = first[: first.index("\n\n## Task: observe")]
    assert second.startswith(memory + "\n")  # the second memory is the first plus a line at its end
    assert second[len(memory) + 1:].startswith(f"[{mid('Blocks two and three.')}] 2026-01-15 14:02 [high] ")
    assert server.requests[0]["messages"][0] == server.requests[1]["messages"][0]


# ---------------------------------------------------------------- the stage records


def test_each_stage_kind_is_one_record_appending_its_own_ledger_kind():
    from om_core.ledger.records import LEDGER_KINDS
    from om_core.workers.stage_kinds import CLOCKED_STAGES, STAGES

    assert list(STAGES) == ["observer", "reflector", "dropper", "reflection-dropper"]
    assert [STAGES[k].record_kind for k in STAGES] == [OBS, REFL, DROP, "om.reflections.dropped"]
    assert {s.record_kind for s in STAGES.values()} == set(LEDGER_KINDS)
    for stage in STAGES.values():
        assert RECORD_MODELS[stage.record_kind] is stage.payload
    # the observer and the reflector run on their clocks at a turn end, in that order; the dropper never does
    assert [s.kind for s in CLOCKED_STAGES] == ["observer", "reflector"]
    settings = Settings(observeAfterTokens=123, reflectAfterTokens=456)
    assert [s.threshold(settings) for s in CLOCKED_STAGES] == [123, 456]


def test_the_droppers_follow_only_a_reflector_run_that_appended_reflections():
    from om_core.workers.stage_kinds import StageOutcome, StageRequest, follow_ups, run_in_order

    reflected = StageOutcome(stage="reflector", outcome="recorded", session_id=SID, tip=E[9], model="m",
                             ledger_id="rec-1", covers_up_to_id=E[5])
    assert follow_ups(reflected) == [StageRequest(SID, E[9], "dropper", reflection_watermark=E[5]),
                                     StageRequest(SID, E[9], "reflection-dropper", reflection_watermark=E[5])]
    assert follow_ups(reflected.model_copy(update=dict(ledger_id=None))) == []  # already appended by an earlier run
    assert follow_ups(reflected.model_copy(update=dict(outcome="empty", ledger_id=None))) == []
    assert follow_ups(reflected.model_copy(update=dict(outcome="failed", ledger_id=None))) == []
    assert follow_ups(reflected.model_copy(update=dict(stage="observer"))) == []
    assert follow_ups(reflected.model_copy(update=dict(stage="dropper"))) == []

    asked: list[str] = []

    def run(req: StageRequest) -> StageOutcome:
        asked.append(req.stage)
        return reflected.model_copy(update=dict(stage=req.stage))

    assert [o.stage for o in run_in_order(run, StageRequest(SID, E[9], "reflector"))] == [
        "reflector", "dropper", "reflection-dropper"]
    assert asked == ["reflector", "dropper", "reflection-dropper"]  # a recorded dropper has no follow-up


# ------------------------------------------------------------------ flawed answers, through litellm


def repaired(db) -> list[tuple]:
    return rows(db, "SELECT content, ts, ts_repaired_from FROM observations WHERE session_id = ? "
                    "ORDER BY ledger_id, item_index", [SID])


def test_a_wall_clock_time_and_the_current_time_are_replaced_by_the_cited_entrys_time(server, tmp_path, db_path):
    """The observer stamps one note with the wall clock (a 2026 summer day for a January event) and
    one with the current time (the tip's, 14:08) for an event at 14:02: both lie outside their cited
    entries' times, so each gets the first cited entry's time, recorded as repaired; a time within
    the tolerance of its entries stays as given. No rejection: the stage ends in one call."""
    load(story(), tmp_path, db_path)
    wall = item("Assistant read config/db.yaml, which still names MySQL 8.", [E[4], E[3]], ts="2026-07-03 09:12")
    now = item("User wants the orders service moved off MySQL.", [E[2]], ts="2026-01-15 14:08")
    close = item("Assistant switched config/db.yaml to PostgreSQL 16.", [E[8]], ts="2026-01-15 14:11")
    server.add(tool_call("record_observations", {"observations": [wall, now, close]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert (outcome.outcome, outcome.items, outcome.rejected, len(server.requests)) == ("recorded", 3, 0, 1)
    assert repaired(db_path) == [
        (wall["content"], "2026-01-15 14:03", "2026-07-03 09:12"),  # E3: the first cited entry in the chunk
        (now["content"], "2026-01-15 14:02", "2026-01-15 14:08"),
        (close["content"], "2026-01-15 14:11", None),  # 3 minutes after E8: within the tolerance
    ]
    [receipt] = outcome.receipts
    assert f"1. recorded [{mid(wall['content'])}], at 2026-01-15 14:03: 2026-07-03 09:12 lies outside" in receipt
    assert receipt.splitlines()[3] == f"3. recorded [{mid(close['content'])}]"
    # the stored line and its token count carry the repaired time
    line = f"[{mid(wall['content'])}] 2026-01-15 14:03 [high] {wall['content']}"
    assert rows(db_path, "SELECT token_count FROM observations WHERE obs_id = ?", [mid(wall["content"])])[0][0] == \
        pi_tokens(line)


def test_a_date_only_time_and_a_two_line_note_are_refused_and_asked_again(server, tmp_path, db_path):
    load(story(), tmp_path, db_path)
    dated = item("User asked for PostgreSQL 16 for the orders service.", [E[2]], ts="2026-01-15")
    two_lines = item("Assistant read config/db.yaml.\nIt still names MySQL 8.", [E[4]])
    fixed = [item(dated["content"], [E[2]]), item("Assistant read config/db.yaml; it still names MySQL 8.", [E[4]])]
    server.add(tool_call("record_observations", {"observations": [dated, two_lines]}),
               tool_call("record_observations", {"observations": fixed}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert len(server.requests) == 2  # the rejections got their receipt and another turn
    receipt = tool_messages(server, 1)[0].splitlines()
    assert receipt[1].startswith("1. rejected: timestamp must give the time of day")
    assert receipt[2] == "2. rejected: content must be a single line"
    assert (outcome.outcome, outcome.items, outcome.rejected) == ("recorded", 2, 2)
    assert [(c, ts) for c, ts, _ in repaired(db_path)] == [(fixed[0]["content"], "2026-01-15 14:02"),
                                                            (fixed[1]["content"], "2026-01-15 14:02")]


def test_a_near_duplicate_of_an_active_observation_is_skipped_as_a_duplicate(server, tmp_path, db_path):
    load(blocks(4), tmp_path, db_path)
    earlier = obs("User asked to run the unit tests before every commit to the main branch.", [E[1]])
    append(db_path, OBS, {"observations": [earlier], "coversUpToId": E[2]}, E[2])
    one_word = item("User asked to run all unit tests before every commit to the main branch.", [E[3]])
    other_number = item("User asked for 3 retries on the upload step of the main branch.", [E[3]])
    same_but_number = item("User asked for 5 retries on the upload step of the main branch.", [E[3]])  # the user's
    server.add(tool_call("record_observations", {"observations": [one_word, other_number, same_but_number]}))
    server.add(text("It was another fact; leaving it out."))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    lines = outcome.receipts[0].splitlines()
    assert lines[1] == f"1. duplicate [{mid(one_word['content'])}]: nearly the same as [{earlier['id']}], skipped"
    assert lines[2] == f"2. recorded [{mid(other_number['content'])}]"
    # another number in a near copy is a change of state: refused until it names the note it replaces
    # (the earlier line quoted), so the model gets another turn; a plain duplicate alone gets none
    other = mid(other_number["content"])
    assert lines[3] == (f"3. rejected: nearly the same as [{other}] \"{other_number['content']}\" but with a changed "
                        f"state: if it replaces that note, name it with (supersedes [{other}]); if it is another "
                        "fact, reword it to say so")
    assert len(server.requests) == 2
    assert (outcome.items, outcome.duplicates, outcome.rejected) == (1, 1, 1)
    assert [o.content for o in memory(db_path).observations] == [earlier["content"], other_number["content"]]


def test_a_superseding_note_names_the_earlier_one_by_id_and_recall_shows_both(server, tmp_path, db_path):
    load(blocks(4), tmp_path, db_path)
    earlier = obs("Upload retries are set to 3.", [E[1]])
    append(db_path, OBS, {"observations": [earlier], "coversUpToId": E[2]}, E[2])
    newer = f"Upload retries are now 5 (supersedes [{earlier['id']}]); the user found 3 too few."
    server.add(tool_call("record_observations", {"observations": [
                   item(newer, [earlier["id"]]),                                  # the id cited as a source
                   item("Retries follow a note that was never made (supersedes [0123456789ab]).", [E[3]])]}),
               tool_call("record_observations", {"observations": [item(newer, [E[3], E[4]])]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    first = tool_messages(server, 1)[0].splitlines()
    assert first[1].startswith(f"1. rejected: sourceEntryIds {earlier['id']} are memory ids") and \
        "(supersedes [id])" in first[1]
    assert first[2].startswith("2. rejected: content names [0123456789ab], which is no memory id")
    assert (outcome.outcome, outcome.items) == ("recorded", 1)
    found = recall(workspace(db_path), mid(newer), SID)
    [note, replaced] = found.observations
    assert (note.id, note.matched, note.supersedes) == (mid(newer), True, [earlier["id"]])
    assert (replaced.id, replaced.matched, replaced.content) == (earlier["id"], False, earlier["content"])
    assert replaced.sources[0].entry_id == E[1]  # with its evidence
    assert recall(workspace(db_path), earlier["id"], SID).observations[0].superseded_by == [mid(newer)]
    shown = invoke(["--db", str(db_path), "recall", mid(newer), "--session", SID])
    assert f"supersedes {earlier['id']}" in shown.output and "superseded observation" in shown.output


@pytest.mark.parametrize("guard", [True, False])
def test_the_only_critical_constraint_no_reflection_cites_is_never_dropped(server, tmp_path, db_path, guard):
    made = pool_session(tmp_path, db_path, [("User forbids force-pushes to main.", "critical", 40),
                                            ("Assistant listed the branches.", "low", 30),
                                            ("Assistant ran the linter.", "low", 30)], [[1]])
    server.add(new_reflection(made[2]["id"]),
               tool_call("drop_observations", {"ids": [made[0]["id"], made[1]["id"]], "reason": "old and routine"}))
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=40, keepUncitedCritical=guard)
    _, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    assert len(server.requests) == 2  # kept by the guard is no mistake: one dropper call
    lines = dropper.receipts[0].splitlines()
    if guard:
        assert lines[1] == f"kept [{made[0]['id']}]: a critical observation no reflection cites is never dropped"
        assert dropped_ids(db_path) == [made[1]["id"]]
        assert made[0]["id"] in {o.id for o in memory(db_path).observations}
    else:
        assert dropped_ids(db_path) == [made[0]["id"], made[1]["id"]]
    # the reason is stored with the drop record, a column of the drops view
    assert {r[0] for r in rows(db_path, "SELECT reason FROM drops WHERE session_id = ?", [SID])} == {"old and routine"}


@pytest.mark.parametrize("earlier, later, duplicate", [
    ("User asked to run the unit tests before every commit to main.",
     "User asked to run all the unit tests before every commit to main.", True),            # a word added
    ("The deploy script lives in scripts/deploy.sh and needs the staging profile.",
     "The deploy script lives in scripts/deploy.sh and needs the staging profile!", True),  # punctuation
    ("User wants PostgreSQL 16 for the orders service in production.",
     "User wants PostgreSQL 15 for the orders service in production.", False),              # another number
    ("The deploy script lives in scripts/deploy.sh and needs the staging profile.",
     "The deploy script lives in scripts/release.sh and needs the staging profile.", False),  # another path
    ("User said the migration must run before the release of the new billing service.",
     "User said the migration must not run before the release of the new billing service.", False),  # negation
    ("User wants the orders service.", "User wants the billing service.", False),               # a short note
])
def test_near_duplicates_by_normalised_words_numbers_and_names(earlier, later, duplicate):
    from om_core.workers.near_duplicates import NearDuplicates

    assert (NearDuplicates([("a" * 12, earlier, ())]).of(later) == "a" * 12) is duplicate


def test_a_reworded_reflection_is_a_duplicate_of_the_current_one(server, tmp_path, db_path):
    o = coverage_session(tmp_path, db_path)
    server.add(tool_call("record_reflections", {"reflections": [
        {"content": "The user is exacting about the database, always.", "supportingObservationIds": [o["O3"]["id"]]},
        {"content": "The orders service runs on PostgreSQL 16 (supersedes [ffffffffffff]).",
         "supportingObservationIds": [o["O1"]["id"]]}]}), text("done"))
    [outcome] = reflect_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    lines = outcome.receipts[0].splitlines()
    assert lines[1].startswith("1. duplicate") and mid("The user is exacting about the database.") in lines[1]
    assert lines[2].startswith("2. rejected: content names [ffffffffffff]")


# ------------------------------------------------------------------ the observer's view of tool parts


def test_long_tool_results_and_arguments_are_shortened_in_the_observers_view_only(server, tmp_path, db_path):
    """observerToolMaxTokens 100 (400 characters): a tool call's arguments, a tool result and a
    command's output over it are sent as head and tail with the cut marked with its size; a short
    result is sent whole; the stored entries, recall and the ledger keep everything."""
    key = "sk-ant-" + "Q7x2" * 10  # a secret across the cut: redacted whole before the cut
    content = "FILE-START " + "alpha " * 60 + key + " " + "omega " * 60 + "FILE-END"
    result = "RESULT-START " + "line\n" * 200 + "RESULT-END"
    b = SessionBuilder(SID)
    b.user("Write the config and run the tests.")  # E1
    b.assistant("Writing it.", tool_calls=[("c1", "write", {"path": "conf/app.toml", "content": content})])  # E2
    b.tool_result("c1", "write", "ok")  # E3: short, whole
    b.assistant(None, tool_calls=[("c2", "bash", {"command": "make test"})])  # E4
    b.tool_result("c2", "bash", result)  # E5
    b.bash("cat big.log", "LOG-START " + "x" * 900 + " LOG-END")  # E6
    load(b, tmp_path, db_path)
    server.add(text("nothing"))
    observe_now(Workspace.open(db_path, settings=Settings(observerToolMaxTokens=100)), SID, None, config(server))
    sent = prompt(server)
    args = json.dumps({"path": "conf/app.toml", "content": content}, separators=(",", ":"))
    redacted_args = args.replace(key, "[REDACTED:anthropic-key]")
    cut = len(redacted_args) - 400
    assert f'(tool call) write({redacted_args[:240]}\n[… {cut:,} characters cut from the middle …]\n' \
           f'{redacted_args[-160:]})' in sent
    assert key[:12] not in sent and key[-12:] not in sent
    assert f"[{E[3]} Tool result 14:03] (write) ok" in sent
    assert "RESULT-START" in sent and "RESULT-END" in sent and sent.count("line\n") < 100
    assert f"[… {len(result) - 400:,} characters cut from the middle …]" in sent
    assert "LOG-START" in sent and "LOG-END" in sent and "x" * 600 not in sent
    # the stored entries and recall are unchanged
    [(raw,)] = rows(db_path, "SELECT raw FROM entries WHERE session_id = ? AND entry_id = ?", [SID, E[5]])
    assert json.loads(raw)["message"]["content"][0]["text"] == result
    [(text_,)] = rows(db_path, "SELECT text FROM entry_texts WHERE session_id = ? AND entry_id = ?", [SID, E[2]])
    assert content in text_

    # 0: every part whole
    server.reset()
    server.add(text("nothing"))
    with dbmod.writing(db_path) as con:
        con.execute("DELETE FROM om_internal.stages")  # the same chunk, asked again
    observe_now(Workspace.open(db_path, settings=Settings(observerToolMaxTokens=0)), SID, None, config(server))
    assert result in prompt(server) and "characters cut from the middle" not in prompt(server)



def _row(obs_id: str, rec: int, place: int, tokens: float = 40, dropped_at: int | None = None, kind="observation"):
    return {"item_kind": kind, "id": obs_id, "rec_order": rec, "fold_order": place, "dropped": dropped_at is not None,
            "dropped_at": dropped_at, "token_count": tokens, "ts": "2026-01-15 14:00", "relevance": "low",
            "content": f"Note {obs_id}.", "supporting_observation_ids": ["a" * 12] if kind == "reflection" else None}


@pytest.mark.parametrize("pool_max, lines, dropped, later_lines, later_dropped", [
    # below the pool maximum: a dropped line stays where it was, its id listed after the memory
    (200, ["o1", "o2", "r1", "o3"], ["o1"], ["o1", "o2", "r1", "o3", "o5"], ["o1", "o5"]),
    # o3 brings the observations shown to 120: a full fold lays the memory out anew without o1; then
    # o5 keeps them under 160, so its drop is listed and its line stays
    (120, ["o2", "r1", "o3"], [], ["o2", "r1", "o3", "o5"], ["o5"]),
    # at 100 the memory is under pressure still after o5: its drop applies at once
    (100, ["o2", "r1", "o3"], [], ["o2", "r1", "o3"], []),
])
def test_the_workers_memory_keeps_dropped_lines_until_a_full_fold(pool_max, lines, dropped, later_lines,
                                                                  later_dropped):
    from om_core.workers.memory_layout import laid_out_memory

    def ids(layout) -> list[str]:
        return [line.split("] ", 1)[0][1:] for line in layout.lines]

    rows = [_row("o1", 1, 1, dropped_at=2), _row("o2", 1, 2), _row("r1", 3, 3, kind="reflection"),
            _row("o3", 4, 4), _row("o4", 5, 5, dropped_at=0)]  # o4: tombstoned before it was recorded
    layout = laid_out_memory(rows, pool_max)
    assert (ids(layout), layout.dropped) == (lines, dropped)
    later = laid_out_memory(rows + [_row("o5", 6, 6, tokens=20, dropped_at=7)], pool_max)
    assert (ids(later), later.dropped) == (later_lines, later_dropped)
