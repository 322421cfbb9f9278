"""The reflection dropper's own clock (SPEC §13): it runs when the active reflections are over
``reflectionsPoolTargetTokens`` and ``reflectAfterTokens`` of source passed since its own last
record, without needing the reflector to record anything in the same pass; and the memory model's
window and ``agentMaxTokens`` (litellm's model card, else ``contextWindow``, else the SPEC's
fallbacks), through litellm's real HTTP path against the fake model server."""

from __future__ import annotations

import pytest

from conftest import workspace
from fake_brains import ScriptedWorkers, stage_of
from fake_openai import FakeOpenAI
from om_core.ingest import ingest
from om_core.model.client import RetryPolicy
from om_core.model.window import WindowSource, memory_window, sized_for
from om_core.replay.engine import replay_session
from om_core.settings import Settings
from om_core.store import db as dbmod
from om_core.store.workspace import Workspace
from om_core.workers.run_config import ModelConfig, make_brain
from test_bounded_memory import SID, weeks_long_session

BASE = dict(observeAfterTokens=200, reflectAfterTokens=300, compactAfterTokens=3_000, keepRecentTokens=400,
            observationsPoolMaxTokens=600, observationsPoolTargetTokens=300, clockBasis="source",
            workerMemoryMaxTokens=250)
UNBOUNDED = Settings(**BASE, reflectionsPoolTargetTokens=100_000)


def _replay(db, settings: Settings, server: FakeOpenAI, run_id: str) -> list[str]:
    """Replay the session with ``settings``; the stages the model was asked for, in order."""
    before = len(server.requests)
    ws = Workspace.on_connection(dbmod.connect(db), settings)
    try:
        config = ModelConfig(model="openai/fake-model", api_base=server.base_url,
                             retry=RetryPolicy(attempts=1, base_seconds=0.001, max_seconds=0.002))
        result = replay_session(ws, SID, make_brain(config, settings), drain=True, run_id=run_id)
        assert result.error is None, result.error
    finally:
        ws.close()
    return [stage_of(body) for body in server.requests[before:] if body["messages"][-1]["role"] != "tool"]


def _records(db, run_id: str) -> dict[str, int]:
    """The records a run appended, by kind."""
    with dbmod.reading(db) as con:
        return dict(con.execute("SELECT kind, count(*) FROM om_internal.ledger WHERE run_id = ? GROUP BY kind",
                                [run_id]).fetchall())


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A weeks-long session replayed with no reflection target worth the name: reflections only grow."""
    tmp = tmp_path_factory.mktemp("clock")
    path = weeks_long_session(30).write(tmp / "long.jsonl")
    db = tmp / "om.duckdb"
    ingest(workspace(db, UNBOUNDED), [path])
    server = FakeOpenAI(responder=ScriptedWorkers())
    server.start()
    try:
        asked = _replay(db, UNBOUNDED, server, "grown")
        yield db, server, asked
    finally:
        server.stop()


def _copy(db, tmp_path):
    target = tmp_path / "copy.duckdb"
    target.write_bytes(db.read_bytes())
    return target


def test_the_first_replay_grew_reflections_and_dropped_none(grown):
    db, _, asked = grown
    assert asked.count("reflector") >= 4
    assert "reflection-dropper" not in asked and "om.reflections.dropped" not in _records(db, "grown")


def test_over_target_it_runs_on_its_own_clock_without_the_reflector(grown, tmp_path):
    db, server, _ = grown
    db = _copy(db, tmp_path)
    asked = _replay(db, Settings(**BASE, reflectionsPoolTargetTokens=40), server, "bounded")
    # every reflector input was answered by the first replay: nothing is asked of it again, nothing recorded
    assert "reflector" not in asked
    assert asked.count("reflection-dropper") >= 2, asked
    appended = _records(db, "bounded")
    assert appended.get("om.reflections.dropped", 0) >= 2 and "om.reflections.recorded" not in appended, appended


def test_its_clock_holds_it_until_reflect_after_tokens_of_source_passed(grown, tmp_path):
    db, server, _ = grown
    db = _copy(db, tmp_path)
    patient = Settings(**{**BASE, "reflectAfterTokens": 10**9}, reflectionsPoolTargetTokens=40)
    asked = _replay(db, patient, server, "patient")
    assert "reflection-dropper" not in asked and "om.reflections.dropped" not in _records(db, "patient")


def test_the_memory_window_comes_from_the_model_card_then_context_window_then_the_fallback():
    card = memory_window("gpt-4o-mini", Settings())
    assert card.source is WindowSource.MODEL_CARD and card.tokens and card.tokens > 100_000
    assert card.output_tokens and card.agent_max_tokens(Settings()) == min(32_000, card.output_tokens)
    assert sized_for(Settings(), card).workerMemoryMaxTokens == card.tokens // 4
    assert sized_for(Settings(workerMemoryMaxTokens=123), card).workerMemoryMaxTokens == 123
    unknown = memory_window("openai/fake-model", Settings(contextWindow=64_000))
    assert unknown.source is WindowSource.CONTEXT_WINDOW and unknown.worker_memory_max_tokens(Settings()) == 16_000
    assert sized_for(Settings(contextWindow=64_000), unknown).workerMemoryMaxTokens == 16_000
    assert sized_for(Settings(contextWindow=40_000), memory_window("openai/fake-model", Settings(
        contextWindow=40_000))).workerMemoryMaxTokens == 10_000
    none = memory_window("offline", Settings())
    assert none.source is WindowSource.UNKNOWN and none.worker_memory_max_tokens(Settings()) == 16_000
    assert none.agent_max_tokens(Settings(agentMaxTokens=500)) == 500


def test_every_worker_request_reserves_agent_max_tokens(grown):
    _, server, _ = grown
    sent = {body.get("max_tokens") for body in server.requests}
    assert sent == {32_000}
