"""Gap-free compaction (SPEC §13): the decisions (om_core.memory.gap_free), and the live hook's answer
(om_core.usecases.live.compact_live) when the observer is behind Pi's cut: F moved back, or the gap caught up
by observer chunks, or declined; `om compact --gap-safe` answers the same on the same ledger, and
`om gaps` finds no gap in the compaction written at om's F."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
from conftest import workspace
from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI, Reply
from flows.cli.main import app
from om_core.ingest import ingest
from om_core.memory.views import DeclineReason
from om_core.memory.gap_free import Branch, SpanEntry, decide, needs_catch_up, retained_first_kept
from om_core.memory.gaps import compaction_gaps
from om_core.usecases.live import CompactRequest, compact_live
from om_core.replay.stage_runner import observe_now
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig

pytestmark = pytest.mark.usefixtures("isolated_home")
SID = "9a9f0000-0000-4000-8000-000000000041"


# ------------------------------------------------------------------ the decisions, pure


def _branch(kinds: str, start: int = 0) -> Branch:
    """u/a/t: user, assistant (made the calls of the tool results after it), tool result; 10 tokens each."""
    entries, last_assistant = [], None
    for i, kind in enumerate(kinds):
        if kind == "a":
            last_assistant = i
        entries.append(SpanEntry(position=i, entry_id=f"e{i}", is_source=True, tokens=10, tool_result=kind == "t",
                                 call_position=last_assistant if kind == "t" else None))
    return Branch(entries=entries, context_start=start)


def test_f_moves_back_to_the_first_uncovered_entry_and_never_forward():
    b = _branch("uauauauaua")
    assert retained_first_kept(b, 3, 8) == 4  # the first entry after the watermark
    assert retained_first_kept(b, 7, 8) == 8  # nothing uncovered before F: Pi's F
    assert retained_first_kept(b, 9, 8) == 8  # a watermark past F never moves F forward
    assert needs_catch_up(b, 3, 8, 2) and not needs_catch_up(b, 3, 8, 0) and not needs_catch_up(b, None, 8, 2)


def test_a_tool_result_is_kept_with_the_assistant_message_that_made_the_call():
    b = _branch("uattttua")
    assert retained_first_kept(b, 2, 6) == 1  # e3 is a tool result of e1's calls


def test_decline_rules():
    b = _branch("ua" * 10, start=2)
    ok = decide(b, 16, 8, 30, max_retained_tokens=1000, overflow=False)
    assert ok.goes_ahead and ok.moved and ok.first_kept == 8 and ok.retained_tokens == 120 + 30
    assert ok.freed_tokens == 60
    over = decide(b, 16, 8, 30, max_retained_tokens=149, overflow=False)
    assert over.declined == DeclineReason.OVER_BUDGET and over.first_kept == 16 and not over.moved
    assert decide(b, 16, 2, 30, max_retained_tokens=1000, overflow=False).declined == DeclineReason.NOTHING_FREED
    assert decide(b, 16, 8, 30, max_retained_tokens=1000, overflow=True).declined == DeclineReason.OVERFLOW_RECOVERY
    assert decide(b, 16, 16, None, max_retained_tokens=1000, overflow=False).declined == DeclineReason.EMPTY_PROJECTION
    # at Pi's own F nothing holds it back: it goes ahead as Pi proposed, an overflow too
    assert decide(b, 16, 16, 30, max_retained_tokens=1, overflow=True).goes_ahead


# ------------------------------------------------------------------ the live hook


def conversation(turns: int = 12) -> tuple[SessionBuilder, list[str]]:
    b = SessionBuilder(SID)
    ids = []
    for i in range(turns):
        ids.append(b.user(f"Turn {i}: the ledger keeps invoices of region r{i} in table inv_{i}. " * 5))
        ids.append(b.assistant(f"Noted: inv_{i} is region r{i}'s invoice table. " * 5))
    return b, ids


def behind(tmp_path, settings: Settings, observed_chunks: int = 1):
    """A session whose observer covered only its first ``observed_chunks`` chunks (the offline baseline)."""
    b, ids = conversation()
    path = b.write(tmp_path / "live.jsonl")
    ws = workspace(tmp_path / "om.duckdb", settings)
    ingest(ws, [path])
    for _ in range(observed_chunks):
        observe_now(ws, SID, None, ModelConfig(model="offline"))
    return ws, path, ids


SMALL_CHUNKS = dict(observerChunkMaxTokens=256, compactionCatchUpMaxChunks=0)


def request(path, ids, first_kept: int, **extra) -> CompactRequest:
    return CompactRequest(session_file=str(path), leaf=ids[-1], first_kept_entry_id=ids[first_kept],
                          tokens_before=9000, **extra)


def watermark_position(ws, ids) -> int:
    with ws.read() as con:
        marks = [r[0] for r in con.execute("SELECT covers_up_to_id FROM ledger WHERE kind = "
                                           "'om.observations.recorded'").fetchall()]
    return max(ids.index(m) for m in marks)


def test_behind_the_cut_f_moves_back_to_the_first_unobserved_message(tmp_path):
    ws, path, ids = behind(tmp_path, Settings(**SMALL_CHUNKS))
    covered = watermark_position(ws, ids)
    assert covered < 18
    answer = compact_live(ws, request(path, ids, 20))
    assert answer.compaction is not None and answer.catch_up is None  # no catch-up: no model asked
    assert answer.compaction["firstKeptEntryId"] == ids[covered + 1] and answer.moved_from == ids[20]
    # om compact --gap-safe gives the same F and summary on the same ledger
    cli = CliRunner().invoke(app, ["--db", str(ws.path), "compact", SID, "--first-kept", ids[20], "--leaf", ids[-1],
                                   "--gap-safe", "--json"], env={"OM_COMPACTION_CATCH_UP_MAX_CHUNKS": "0",
                                                                 "OM_OBSERVER_CHUNK_MAX_TOKENS": "256"})
    assert cli.exit_code == 0, cli.output
    same = json.loads(cli.stdout)
    assert same["gap_free"]["first_kept_entry_id"] == answer.compaction["firstKeptEntryId"]
    assert same["summary"] == answer.compaction["summary"] and same["gap_free"]["moved"]
    # the compaction written at om's F has no gap: om gaps says no_gap
    written = _write_compaction(path, answer.compaction, ids[-1])
    ingest(ws, [path])
    with ws.read() as con:
        report = compaction_gaps(con, [SID])
    assert [c.class_ for c in report.compactions if c.compaction_id == written] == ["no_gap"]


def _write_compaction(path, compaction: dict, parent: str) -> str:
    """The compaction entry Pi writes with a hook's answer (fromHook), after ``parent``."""
    entry_id = "c0mpac7e"
    line = {"type": "compaction", "id": entry_id, "parentId": parent, "timestamp": "2026-01-15T15:00:00.000Z",
            "summary": compaction["summary"], "firstKeptEntryId": compaction["firstKeptEntryId"],
            "tokensBefore": compaction["tokensBefore"], "details": compaction["details"], "fromHook": True}
    with path.open("a") as f:
        f.write(json.dumps(line) + "\n")
    return entry_id


def test_pis_cut_with_the_gap_unfixed_is_a_gap_om_gaps_sees(tmp_path):
    """The control: the same compaction written at Pi's own cut loses raw messages (observer lag)."""
    ws, path, ids = behind(tmp_path, Settings(**SMALL_CHUNKS))
    answer = compact_live(ws, request(path, ids, 20))
    written = _write_compaction(path, {**answer.compaction, "firstKeptEntryId": ids[20]}, ids[-1])
    ingest(ws, [path])
    with ws.read() as con:
        report = compaction_gaps(con, [SID])
    assert [c.class_ for c in report.compactions if c.compaction_id == written] == ["observer_lag"]


def test_over_the_retention_budget_the_hook_declines(tmp_path):
    ws, path, ids = behind(tmp_path, Settings(**SMALL_CHUNKS, compactionMaxRetainedTokens=300))
    answer = compact_live(ws, request(path, ids, 20))
    assert answer.compaction is None and answer.declined_reason == DeclineReason.OVER_BUDGET
    assert "over compactionMaxRetainedTokens 300" in answer.declined


def test_an_overflow_recovery_is_never_held_back_by_retention(tmp_path):
    ws, path, ids = behind(tmp_path, Settings(**SMALL_CHUNKS))
    answer = compact_live(ws, request(path, ids, 20, reason="overflow"))
    assert answer.compaction is None and answer.declined_reason == DeclineReason.OVERFLOW_RECOVERY


def test_the_catch_up_closes_the_gap_with_the_model(tmp_path):
    settings = Settings(observerChunkMaxTokens=256, compactionCatchUpMaxChunks=8, model={"id": "openai/fake"},
                        compactionCatchUpSeconds=300)  # a loaded machine imports litellm slowly
    ws, path, ids = behind(tmp_path, settings)
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        ws.settings.apiBase = server.base_url
        answer = compact_live(ws, request(path, ids, 20))
    assert answer.catch_up is not None and answer.catch_up.chunks >= 1, answer.catch_up
    assert answer.catch_up.ended == "caught_up" and answer.catch_up.model == "openai/fake"
    # caught up to Pi's cut: F stays Pi's, and nothing before it is unobserved
    assert answer.compaction["firstKeptEntryId"] == ids[20] and answer.moved_from is None
    assert watermark_position(ws, ids) == 19
    with ws.read() as con:
        stages = con.execute("SELECT outcome, chunk_last_id FROM stages WHERE stage = 'observer' "
                             "ORDER BY started_at").fetchall()
    assert stages[-1] == ("recorded", ids[19])  # chunks end before F, appended like any stage


def test_a_catch_up_limited_to_one_chunk_then_keeps_the_rest(tmp_path):
    settings = Settings(observerChunkMaxTokens=256, compactionCatchUpMaxChunks=1)  # the offline baseline
    ws, path, ids = behind(tmp_path, settings)
    before = watermark_position(ws, ids)
    answer = compact_live(ws, request(path, ids, 20))
    assert answer.catch_up.chunks == 1 and answer.catch_up.ended == "chunk_limit"
    after = watermark_position(ws, ids)
    assert before < after < 19
    assert answer.compaction["firstKeptEntryId"] == ids[after + 1] and answer.moved_from == ids[20]


def test_a_catch_up_model_that_hangs_does_not_hang_the_hook(tmp_path):
    settings = Settings(observerChunkMaxTokens=256, compactionCatchUpMaxChunks=2, model={"id": "openai/slow"},
                        compactionCatchUpSeconds=2)
    ws, path, ids = behind(tmp_path, settings)
    with FakeOpenAI(default=Reply(text="late", delay=30)) as server:
        ws.settings.apiBase = server.base_url
        answer = compact_live(ws, request(path, ids, 20))
    # the model's answer would take 30 s: the catch-up stopped at its limit and the hook answered
    assert answer.catch_up.ended == "time_limit" and answer.catch_up.chunks == 0, answer.catch_up
    assert answer.compaction is not None and answer.moved_from == ids[20]


@pytest.mark.parametrize("budget", [None, 300])
def test_a_simulated_compaction_and_om_compact_answer_as_the_live_hook(tmp_path, budget):
    """One service: on the same ledger, the replay's simulated compaction at Pi's cut keeps from the same F
    with the same summary as the live hook (or declines where it declines), and `om compact --gap-safe`
    agrees."""
    from om_core.replay.compaction import simulate_compaction

    settings = Settings(**SMALL_CHUNKS, compactionMaxRetainedTokens=budget)
    ws, path, ids = behind(tmp_path, settings)
    live = compact_live(ws, request(path, ids, 20))
    simulated = simulate_compaction(ws, SID, tip=ids[-1], anchor=ids[-1], first_kept=ids[20], trigger="proactive",
                                    settings=ws.settings)
    with ws.read() as con:
        [(kept, summary)] = con.execute("SELECT first_kept_entry_id, summary FROM om_internal.compactions "
                                        "WHERE compaction_id = ?", [simulated.compaction_id]).fetchall()
    if live.compaction is None:
        assert budget == 300 and simulated.native_fallback and summary is None and kept == ids[20]
        return
    assert (kept, summary) == (live.compaction["firstKeptEntryId"], live.compaction["summary"])
    assert simulated.kept_first == kept != ids[20]
