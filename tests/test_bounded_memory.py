"""Memory that stays bounded on a session that runs for weeks (SPEC §13), through litellm's real HTTP
path against the fake model server: the scripted model records a new reflection on every reflector
pass, so memory keeps growing. The reflection dropper holds the active reflections within one pass
of reflectionsPoolTargetTokens; every compaction summary (simulated, om compact, om export
--compact, the live hook) fits compactionSummaryMaxTokens and says what it left out; the reflection
drops round-trip through om export and ingest."""

from __future__ import annotations

import json
import math

import pytest

from builders import SessionBuilder
from conftest import workspace
from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI
from om_core.ingest import ingest
from om_core.memory import views as memory
from om_core.memory.compaction import compact, summary_tokens
from om_core.ledger.lines import reflection_line
from om_core.model.client import RetryPolicy
from om_core.usecases.export import export_session
from om_core.usecases.live import CompactRequest, compact_live
from om_core.replay.engine import replay_session
from om_core.settings import Settings
from om_core.store import db as dbmod
from om_core.store.workspace import Workspace
from om_core.workers.run_config import ModelConfig, make_brain

SID = "0b0dded0-0000-4000-8000-000000000013"
# the summary's own preamble is about 320 tokens: the budget leaves room for a few records only
SUMMARY_BUDGET = 450
SETTINGS = Settings(observeAfterTokens=200, reflectAfterTokens=300, compactAfterTokens=3_000, keepRecentTokens=400,
                    observationsPoolMaxTokens=600, observationsPoolTargetTokens=300,
                    reflectionsPoolTargetTokens=40, compactionSummaryMaxTokens=SUMMARY_BUDGET, clockBasis="source",
                    workerMemoryMaxTokens=250)
LEFT_OUT = f"left out to keep this summary within {SUMMARY_BUDGET} tokens"


def weeks_long_session(turns: int) -> SessionBuilder:
    """``turns`` rounds of work, a few hours apart: about three weeks."""
    b = SessionBuilder(SID, start="2026-01-05T09:00:00", step_seconds=1_800)  # 2 hours a turn
    b.work_turns(turns, "ledger")
    return b


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("weeks")
    path = weeks_long_session(60).write(tmp / "long.jsonl")
    db = tmp / "om.duckdb"
    ingest(workspace(db, SETTINGS), [path])
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        ws = Workspace.on_connection(dbmod.connect(db), SETTINGS)
        try:
            config = ModelConfig(model="openai/fake-model", api_base=server.base_url,
                                 retry=RetryPolicy(attempts=1, base_seconds=0.001, max_seconds=0.002))
            result = replay_session(ws, SID, make_brain(config, SETTINGS), drain=True, run_id="weeks")
            assert result.error is None, result.error
        finally:
            ws.close()
        requests = list(server.requests)
    return db, path, tmp, requests


def _tip(db) -> str:
    with dbmod.reading(db) as con:
        return dbmod.scalar(con, "session_leaf", {"session_id": SID})


def test_active_reflections_end_within_one_pass_of_their_target(replayed):
    db, _, _, _ = replayed
    tip = _tip(db)
    with dbmod.reading(db) as con:
        rows = memory.ledger_rows(con, SID, tip)
        recorded = con.execute("SELECT count(*) FROM reflections").fetchone()[0]
        dropped = con.execute("SELECT count(*) FROM reflection_drops WHERE origin = 'pipeline'").fetchone()[0]
        passes = con.execute("SELECT max(n) FROM (SELECT count(*) AS n FROM om_internal.reflections "
                             "GROUP BY ledger_id)").fetchone()[0]
    active = [r for r in rows if r["item_kind"] == "reflection" and not r["dropped"]]
    size = [math.ceil(len(reflection_line(r["id"], r["content"])) / 4) for r in rows if r["item_kind"] == "reflection"]
    pool = sum(math.ceil(len(reflection_line(r["id"], r["content"])) / 4) for r in active)
    assert recorded >= 6 and dropped > 1, (recorded, dropped)
    assert pool <= SETTINGS.reflectionsPoolTargetTokens + passes * max(size), (pool, passes, max(size))
    grown_unbounded = sum(size)
    assert grown_unbounded > 2 * SETTINGS.reflectionsPoolTargetTokens  # without the dropper it would be


def test_every_compaction_summary_fits_its_budget_and_says_what_it_left_out(replayed):
    db, path, tmp, _ = replayed
    tip = _tip(db)
    with dbmod.reading(db) as con:
        simulated = [r[0] for r in con.execute("SELECT summary FROM om_internal.compactions WHERE origin = "
                                               "'simulated' AND summary IS NOT NULL").fetchall()]
    assert len(simulated) >= 2
    summaries = {f"simulated {i}": s for i, s in enumerate(simulated)}
    ws = workspace(db, SETTINGS)
    summaries["om compact"] = compact(ws, SID, tip, tip).summary
    report = export_session(ws, SID, tmp / "out.jsonl", overwrite=True, compact=True)
    assert report.compaction is not None, report.compaction_skipped
    summaries["export"] = json.loads((tmp / "out.jsonl").read_text().splitlines()[-1])["summary"]
    live = compact_live(ws, CompactRequest(session_file=str(path), leaf=tip, first_kept_entry_id=tip,
                                           tokens_before=50_000))
    summaries["live"] = live.compaction["summary"]
    for where, text in summaries.items():
        assert summary_tokens(text, SETTINGS) <= SUMMARY_BUDGET, where
    assert all(LEFT_OUT in summaries[k] for k in ("om compact", "export", "live")), summaries["live"][-300:]
    assert sum(LEFT_OUT in s for s in simulated) >= 1


def test_reflection_drops_round_trip_through_export_and_import(replayed):
    db, _, tmp, _ = replayed
    tip = _tip(db)
    export_session(workspace(db, SETTINGS), SID, tmp / "round.jsonl", overwrite=True)
    written = [json.loads(x) for x in (tmp / "round.jsonl").read_text().splitlines()[1:]]
    drops = [x["data"] for x in written if x.get("customType") == "om.reflections.dropped"]
    assert drops and all(set(d) == {"reflectionIds", "coversUpToId"} for d in drops)
    again = tmp / "again.duckdb"
    ingest(workspace(again, SETTINGS), [tmp / "round.jsonl"])
    with dbmod.reading(db) as before, dbmod.reading(again) as after:
        want = memory.full_memory(before, SID, tip)
        # the records the export appended after the old leaf are the new file's leaf
        got = memory.full_memory(after, SID, dbmod.scalar(after, "session_leaf", {"session_id": SID}))
        assert [r.id for r in got.reflections] == [r.id for r in want.reflections]
        assert [o.id for o in got.observations] == [o.id for o in want.observations]
        assert after.execute("SELECT count(*) FROM reflection_drops").fetchone()[0] == before.execute(
            "SELECT count(*) FROM reflection_drops").fetchone()[0]


def test_what_each_worker_request_carries_stops_growing_at_its_budget(replayed):
    from fake_brains import stage_of, user_text

    _, _, _, requests = replayed
    sizes: dict[str, list[int]] = {}
    for body in requests:
        if body["messages"][-1]["role"] == "tool":
            continue
        block = user_text(body).split("## Memory\n", 1)[1].split("\n\n## ", 1)[0]
        lines = [line for line in block.splitlines() if line.startswith("[")]
        sizes.setdefault(stage_of(body), []).append(sum(math.ceil(len(line) / 4) + 1 for line in lines))
    assert {"observer", "reflector", "reflection-dropper"} <= set(sizes)
    for stage, seen in sizes.items():
        assert max(seen) <= 250, stage
    assert max(sizes["observer"]) > 200  # it grew up to the budget, and no further
    assert sizes["observer"][-1] > 200
