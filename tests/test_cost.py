"""Model cost: prices from litellm's local cost map, the estimate before a run,
the budget that stops a run before it would pass --max-cost, and the cost views.

The budget tests replay a session (``replay_session``, with the run's guards holding the budget) against the fake model server (no
Prefect): the stop is clean (nothing half-done is appended) and a rerun resumes where it stopped."""

from __future__ import annotations

import math

import duckdb
import pytest
from builders import SessionBuilder
from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI

from conftest import workspace
from om_core.store import db as dbmod
from om_core.model.cost import (
    OUTPUT_ALLOWANCE,
    BudgetExceeded,
    CostBudget,
    Price,
    estimate_run,
    price_of,
    request_tokens,
)
from om_core.ingest import ingest
from om_core.replay.plan import estimate_for_targets
from om_core.model.client import RetryPolicy
from om_core.replay.engine import replay_session
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig, RunGuards, make_brain
from om_core.store.workspace import Workspace

SID = "0c057000-0000-4000-8000-000000000001"
SETTINGS = Settings(observeAfterTokens=150, reflectAfterTokens=300, compactAfterTokens=700, keepRecentTokens=200,
                    observerChunkMaxTokens=400, observationsPoolMaxTokens=40, observationsPoolTargetTokens=20)
PRICE = Price("test-model", input=1e-6, output=2e-6, cache_read=1e-7)


def session(tmp_path, db) -> None:
    b = SessionBuilder(SID)
    b.work_turns(8, "billing")
    ingest(workspace(db), [b.write(tmp_path / "s.jsonl")])


def config(server: FakeOpenAI) -> ModelConfig:
    return ModelConfig(model="openai/fake-model", api_base=server.base_url,
                       retry=RetryPolicy(attempts=1, base_seconds=0.001, max_seconds=0.002))


def replay(db, server: FakeOpenAI, budget: CostBudget | None):
    """The session replayed with the run's guards holding ``budget``; None when the budget stopped it (the
    stage runner stops the replay there, what it appended is committed, a rerun resumes it)."""
    ws = Workspace.on_connection(dbmod.connect(db), SETTINGS)
    guards = RunGuards(budget=budget)
    try:
        result = replay_session(ws, SID, make_brain(config(server), SETTINGS, guards), guards=guards, drain=True,
                                run_id="run-1")
        assert result.error is None, result.error
        return None if result.budget_stop else result.branches
    finally:
        ws.close()


def ledger(db) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT kind, covers_up_to_id, anchor_entry_id, stage_key FROM ledger ORDER BY ALL").fetchall()
    finally:
        con.close()


def calls(db) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT input_tokens, output_tokens, cached_tokens, cost, status FROM llm_calls "
                           "ORDER BY started_at").fetchall()
    finally:
        con.close()


# ------------------------------------------------------------------ prices and the estimate


def test_price_of_a_call_counts_cached_tokens_at_the_cache_read_price():
    assert PRICE.call(1000, 100) == pytest.approx(1000e-6 + 100 * 2e-6)
    assert PRICE.call(1000, 100, cached_tokens=600) == pytest.approx(400e-6 + 600e-7 + 200e-6)
    writes = Price("w", input=1e-6, output=0, cache_read=1e-7, cache_write=1.25e-6)
    assert writes.call(1000, 0, cached_tokens=600, cache_write_tokens=300) == pytest.approx(100e-6 + 60e-6 + 375e-6)
    assert PRICE.call(10, 0, cached_tokens=50) == pytest.approx(10e-7)  # never more cached than sent


def test_litellm_prices_two_common_small_models_from_its_local_map():
    mini = price_of("openai/gpt-4o-mini")
    assert mini is not None and mini.input > 0 and mini.output > mini.input and mini.cache_read < mini.input
    haiku = price_of("anthropic/claude-haiku-4-5")
    assert haiku is not None and haiku.cache_write > haiku.input > haiku.cache_read
    assert price_of("openai/fake-model") is None and price_of("offline") is None


def test_the_cost_maps_file_prices_every_model_as_litellm_does(monkeypatch):
    """price_of reads litellm's bundled map without importing litellm where it can: for every name of the
    map (as itself, as provider/name, without its prefix) it answers as litellm.get_model_info, and it
    asks litellm (the fallback) for none of the common providers' mapped models."""
    import om_core.model.cost as cost
    from om_core.model.client import _import_litellm

    litellm = _import_litellm()

    def litellm_price(name):
        try:
            info = litellm.get_model_info(name)
        except Exception:
            return None
        if info.get("input_cost_per_token") is None or info.get("output_cost_per_token") is None:
            return None
        return tuple(None if info.get(k) is None else float(info[k]) for k in
                     ("input_cost_per_token", "output_cost_per_token", "cache_read_input_token_cost",
                      "cache_creation_input_token_cost"))

    asked = []
    monkeypatch.setattr(cost, "_litellm_price_of", lambda name: asked.append(name))
    fast = 0
    for key, entry in cost._cost_map().items():
        provider = entry.get("litellm_provider")
        for name in {key, f"{provider}/{key}", key.split("/", 1)[-1]}:
            before = len(asked)
            price = price_of(name)
            if len(asked) > before:
                continue  # litellm's own answer: nothing to compare
            fast += 1
            assert price is not None, name
            assert (price.input, price.output, price.cache_read, price.cache_write) == litellm_price(name), name
        if provider in cost.PRICED_PROVIDERS and entry.get("input_cost_per_token") is not None \
                and entry.get("output_cost_per_token") is not None:
            assert key not in asked
    assert fast > 500  # the common providers' models are priced from the file


def test_estimate_is_source_tokens_times_the_prompt_ratios():
    est = estimate_run("test-model", 100_000, PRICE, prompt_per_source=1.3, uncached_per_source=1.1,
                       output_per_source=0.05)
    assert (est.prompt_tokens, est.uncached_tokens, est.output_tokens) == (130_000, 110_000, 5_000)
    assert est.usd == pytest.approx(110_000e-6 + 20_000e-7 + 5_000 * 2e-6)
    assert est.usd_without_cache == pytest.approx(130_000e-6 + 5_000 * 2e-6)
    assert estimate_run("x", 1000, None).usd is None


def test_estimate_for_targets_reads_the_backlog_from_the_database(tmp_path, db_path):
    session(tmp_path, db_path)
    con = duckdb.connect(str(db_path), read_only=True)
    source = con.execute("SELECT sum(tokens_pi) FROM entries WHERE is_source").fetchone()[0]
    con.close()
    est, backlog = estimate_for_targets(workspace(db_path), [SID], "openai/gpt-4o-mini")
    assert backlog.source_tokens == backlog.from_database == source  # nothing observed yet
    assert est.usd is not None and est.usd > 0
    # a file not ingested yet: estimated from its size
    other = SessionBuilder("0c057000-0000-4000-8000-000000000002")
    other.work_turns(3, "x")
    path = other.write(tmp_path / "other.jsonl")
    _, fresh = estimate_for_targets(workspace(db_path), [str(path)], "openai/gpt-4o-mini")
    assert fresh.from_database == 0 and fresh.from_file_size == math.ceil(path.stat().st_size * 0.16)


# ------------------------------------------------------------------ the budget


def test_budget_reserves_the_worst_case_and_refuses_a_call_that_could_pass_the_limit():
    budget = CostBudget(max_usd=0.01, price=PRICE)
    messages = [{"role": "user", "content": "x" * 4000}]
    worst = budget.worst_case(messages, None)
    assert worst == pytest.approx(request_tokens(messages, None) * 1e-6 + OUTPUT_ALLOWANCE * 2e-6)
    held = budget.reserve(worst)
    budget.settle(held, 0.002)
    assert (budget.spent, budget.reserved, budget.exhausted) == (pytest.approx(0.002), 0.0, False)
    budget.reserve(0.006)  # in flight: 0.002 spent + 0.006 reserved
    with pytest.raises(BudgetExceeded, match="rerun to resume"):
        budget.reserve(0.003)  # 0.011 > 0.01 even though nothing more was spent yet
    assert budget.exhausted


def test_max_cost_stops_a_replay_cleanly_and_a_rerun_resumes_it(tmp_path):
    clean_db, db = tmp_path / "clean.duckdb", tmp_path / "om.duckdb"
    for target in (clean_db, db):
        session(tmp_path, target)
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        replay(clean_db, server, None)
        clean_requests = len(server.requests)
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        # the whole replay costs about $0.007 here; one call's worst case (its prompt uncached plus
        # 2,048 output tokens) is about $0.0055, so $0.008 allows a few calls and then stops
        budget = CostBudget(max_usd=0.008, price=PRICE)
        replay(db, server, budget)
        first_requests = len(server.requests)
        assert budget.exhausted and budget.spent <= 0.008
        assert 0 < first_requests < clean_requests
        spent = calls(db)
        assert sum(c[3] for c in spent) == pytest.approx(budget.spent)  # each call's cost is in llm_calls
        assert all(c[4] == "ok" for c in spent)  # nothing was sent that the budget refused
        stopped = ledger(db)
        assert 0 < len(stopped) < len(ledger(clean_db))
        replay(db, server, None)  # the rerun, without a limit
        assert len(server.requests) == clean_requests  # resumed: no stage was asked twice
    assert ledger(db) == ledger(clean_db)


def test_a_run_stopped_by_the_budget_records_no_half_done_stage(tmp_path, db_path):
    session(tmp_path, db_path)
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        budget = CostBudget(max_usd=0.0001, price=PRICE)  # less than one call's worst case
        replay(db_path, server, budget)
        assert server.requests == [] and budget.exhausted
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM stages").fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM ledger").fetchone()[0] == 0
    finally:
        con.close()


# ------------------------------------------------------------------ the cost views


def test_session_costs_view_gives_cost_per_session_and_per_million_source_tokens(tmp_path):
    db = tmp_path / "om.duckdb"
    session(tmp_path, db)
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        replay(db, server, CostBudget(max_usd=100.0, price=PRICE))
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT source_tokens, model_calls, input_tokens, cached_tokens, uncached_tokens, cost_usd, "
                          "usd_per_1m_source_tokens, calls_per_stage FROM session_costs WHERE session_id = ?",
                          [SID]).fetchone()
        source, n, inp, cached, uncached, usd, per_million, per_stage = row
        assert source == con.execute("SELECT sum(tokens_pi) FROM entries WHERE is_source").fetchone()[0]
        assert n == len(calls(db)) and inp == sum(c[0] for c in calls(db)) and uncached == inp - cached
        assert cached > 0  # the fake provider served repeated prefixes from its cache
        assert usd == pytest.approx(sum(PRICE.call(c[0], c[1], c[2]) for c in calls(db)))
        assert per_million == pytest.approx(usd * 1e6 / source)
        assert per_stage == 1.0  # every clean receipt ended its stage in one call
        [(run_calls, run_usd)] = con.execute("SELECT model_calls, cost_usd FROM run_costs").fetchall()
        assert (run_calls, run_usd) == (n, pytest.approx(usd))
    finally:
        con.close()


def test_a_budget_lent_to_replays_elsewhere_never_passes_its_limit():
    """A replay on a Dask worker's process spends from a part of the run's budget set aside for it
    (CostBudget.lend; RunGuards.for_replay carries it); what it spent returns to the run (settle). Lent
    parts never add up to more than what is left, so the run never passes --max-cost."""
    import pickle

    from om_core.workers.run_config import RunGuards

    guards = RunGuards(budget=CostBudget(max_usd=1.0, price=PRICE))
    parts = [guards.budget.lend(4) for _ in range(6)]  # six replays in flight, a window of four
    assert sum(parts) <= 1.0 and parts[0] == pytest.approx(0.25)
    away = pickle.loads(pickle.dumps(guards.for_replay(parts[0])))  # what the worker gets
    assert away.budget.max_usd == parts[0] and away.budget.spent == 0
    guards.budget.settle(parts[0], 0.2)  # it spent 0.2 of its 0.25
    assert guards.budget.spent == pytest.approx(0.2)
    assert guards.budget.reserved == pytest.approx(sum(parts[1:]))
    guards.budget.exhausted = True
    assert pickle.loads(pickle.dumps(guards.for_replay(0.1))).budget.exhausted  # a spent run starts none
