"""The session stages' runner: prepare -> exactly-once lookup -> compute with the brain -> record.

Every session stage om runs goes through ``StageRunner``, which gives its steps (``SessionSteps``)
to the one runner every stage kind shares (``om_core.workers.stages.run_stage``; the project stage
gives its own): `om observe`/`om reflect` on the user's database,
and every replay (the flow's tasks, `om eval`, tests and benchmarks) on a replay's in-memory copy of
a session (``om_core.replay.engine``). The run's guards (``RunGuards``: circuit breaker, cost budget,
call gate) are one value the runner is given; the breaker and the budget are checked by ``run_stage``,
before a stage is prepared, and nowhere else (the model consults the same guards before each of its calls,
mid-stage). A result that cannot be kept for a storage error
(a full disk) trips the breaker here too: no stage of the run starts after the first write failure.

Exactly-once sits behind ``StageResults``: a result computed but not yet appended is found again
by its stage key, so a crash between the model's answer and the append never pays twice. A command
keeps it in the ``stage_results`` table (``TableStageResults``); a flow run keeps it in Prefect's
result storage (flows/storage.py), which every worker of a cluster reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import duckdb

from om_core.store.catalog import resolve_session, resolve_tip
from om_core.store.db import scalar
from om_core.errors import storage_error
from om_core.model.window import memory_window, sized_for
from om_core.settings import Settings
from om_core.store.sqlfiles import query
from om_core.workers.stage_kinds import STAGES, Brain, StageOutcome, StageRequest, run_in_order
from om_core.workers.run_config import BudgetReached, ModelConfig, RunGuards, make_brain
from om_core.workers.stages import (
    ComputedStage,
    PreparedStage,
    compute_stage,
    prepare_stage,
    record_stage,
    run_stage,
    stage_model,
)

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

__all__ = ["SessionSteps", "StageResults", "StageRunner", "TableStageResults",
           "observe_now", "reflect_now"]


class StageResults(Protocol):
    """Where a computed stage result waits for its append (exactly-once across crashes)."""

    def get(self, prepared: PreparedStage) -> ComputedStage | None:
        """The result computed earlier for this stage key, or None."""

    def put(self, prepared: PreparedStage, computed: ComputedStage) -> None:
        """Keep a computed (not failed) result, before it is recorded."""


class TableStageResults:
    """Exactly-once for a command: the ``stage_results`` table of ``ws``, the user's database (also when
    the stage itself runs on a replay's in-memory copy of it). A kept result is deleted once its record
    is in the ledger: in the append's transaction (om_core.workers.stages.record_outcome) or, for a
    replay, in its commit's (om_core.replay.engine.commit_replay)."""

    def __init__(self, ws: Workspace) -> None:
        self.ws = ws

    def get(self, prepared: PreparedStage) -> ComputedStage | None:
        req = prepared.request
        with self.ws.read() as con:
            kept = scalar(con, "stage_result", {"session_id": req.session_id, "stage_key": prepared.stage_key})
        if kept is None:
            return None
        stage = STAGES[req.stage]
        payload = stage.payload.model_validate_json(kept)
        outcome = StageOutcome(stage=req.stage, outcome="recorded", session_id=req.session_id, tip=req.tip,
                               model=prepared.model, stage_key=prepared.stage_key,
                               reason="computed by an earlier run; appended without calling the model again",
                               covers_up_to_id=payload.coversUpToId, items=stage.items(payload))
        return ComputedStage(outcome, payload)

    def put(self, prepared: PreparedStage, computed: ComputedStage) -> None:
        if computed.payload is None:  # an empty result is kept by its stages row (prepare_stage's was_empty)
            return
        req = prepared.request
        # in its own transaction, before the append's: a crash in between does not pay twice
        with self.ws.write() as con:
            con.execute(query("put_stage_result"), {"session_id": req.session_id, "stage_key": prepared.stage_key,
                                                    "stage": req.stage, "result": computed.payload.model_dump_json()})


Compute = Callable[[PreparedStage], ComputedStage]


def _failed(prepared: PreparedStage, computed: ComputedStage, exc: BaseException) -> ComputedStage:
    """A result that could not be kept (its storage failed): the stage fails; its model calls stay recorded."""
    req = prepared.request
    outcome = StageOutcome(stage=req.stage, outcome="failed", session_id=req.session_id, tip=req.tip, model=prepared.model,
                           stage_key=prepared.stage_key,
                           error=f"{type(exc).__name__}: {exc}", error_kind="permanent")
    outcome.calls = computed.outcome.calls
    return ComputedStage(outcome)


class StageRunner:
    """Run one stage against a workspace: ``runner(request) -> StageOutcome``.

    ``brain`` answers; ``results`` is the exactly-once store (default: ``ws``'s own ``stage_results``);
    ``guards`` are the run's breaker, budget and call gate (the brain's model was built with the same
    ones: om_core.workers.run_config.make_brain); ``compute`` runs the brain on a prepared input (the flow
    wraps it as a Prefect task, to see it in the UI). Raises ``RunStopped`` once the run's breaker
    tripped and ``BudgetReached`` once its budget is reached, before anything is recorded for the stage.
    ``kept`` lists the stage keys whose results this runner found or put in ``results``: once the
    replay's rows are committed, nothing asks for them again."""

    def __init__(self, ws: Workspace, brain: Brain, results: StageResults | None = None, run_id: str | None = None,
                 compute: Compute | None = None, guards: RunGuards | None = None) -> None:
        self.ws = ws
        self.brain = brain
        self.results = TableStageResults(ws) if results is None else results
        self.run_id = run_id
        self.guards = guards if guards is not None else RunGuards()
        self.compute = compute or (lambda prepared: compute_stage(prepared, brain, ws.settings))
        self.kept: list[str] = []
        self._sized: dict[str, Settings] = {}

    def settings_for(self, stage: str) -> Settings:
        """The settings a stage's input is read with: ``workerMemoryMaxTokens`` from the window of the
        model that answers it (SPEC §13), asked once per model (litellm's card only for a real model)."""
        model = stage_model(self.brain, stage)
        if model not in self._sized:
            self._sized[model] = sized_for(self.ws.settings, memory_window(model, self.ws.settings))
        return self._sized[model]

    def check(self) -> None:
        """The run's breaker and budget: the one place a stage is refused before it starts."""
        self.guards.check()

    def __call__(self, req: StageRequest) -> StageOutcome:
        return run_stage(self.ws, SessionSteps(self, req), run_id=self.run_id, guards=self.guards)


class SessionSteps:
    """A session stage's steps for the one runner (``om_core.workers.stages.run_stage``): its input
    read from the session's ledger, its result kept in the runner's ``results``, its record appended
    to the session's ledger."""

    def __init__(self, runner: StageRunner, req: StageRequest) -> None:
        self.runner = runner
        self.req = req

    def prepare(self, con: duckdb.DuckDBPyConnection) -> tuple[PreparedStage | None, StageOutcome]:
        runner, req = self.runner, self.req
        return prepare_stage(con, req, runner.settings_for(req.stage), stage_model(runner.brain, req.stage))

    def kept(self, prepared: PreparedStage) -> ComputedStage | None:
        computed = self.runner.results.get(prepared)
        if computed is not None:
            self.runner.kept.append(prepared.stage_key)
        return computed

    def compute(self, prepared: PreparedStage) -> ComputedStage:
        computed = self.runner.compute(prepared)
        for call in computed.outcome.calls:  # kept with the result: a resuming run records them as this run's
            call.run_id = self.runner.run_id
        return computed

    def unrecorded(self, computed: ComputedStage) -> StageOutcome | None:
        if computed.outcome.budget_stop and not computed.outcome.calls:
            # stopped before its first call: nothing to record, a rerun starts here
            raise BudgetReached(computed.outcome.reason or "the run's cost budget (--max-cost) is reached")
        return None

    def keep(self, prepared: PreparedStage, computed: ComputedStage) -> ComputedStage:
        if computed.outcome.outcome == "failed":
            return computed
        try:
            self.runner.results.put(prepared, computed)
            self.runner.kept.append(prepared.stage_key)
        except Exception as exc:  # e.g. result storage unreachable: fail the stage, keep its calls
            stored = storage_error(exc)
            if stored is not None:  # a full disk: the run's breaker stops every later stage (check)
                self.runner.guards.breaker.trip(stored)
            computed = _failed(prepared, computed, exc)
        return computed

    def record(self, con: duckdb.DuckDBPyConnection, computed: ComputedStage, run_id: str | None,
               started_at: datetime) -> StageOutcome:
        return record_stage(con, computed, run_id, started_at)


# ------------------------------------------------------------------ manual stages (om observe / om reflect)


def _session_and_tip(ws: Workspace, session: str, leaf: str | None) -> tuple[str, str]:
    with ws.read() as con:
        sid = resolve_session(con, session)
        return sid, resolve_tip(con, sid, leaf)


def observe_now(ws: Workspace, session: str, leaf: str | None, config: ModelConfig,
                run_id: str | None = None) -> StageOutcome:
    """One observer stage now, on the oldest uncovered chunk, even below the threshold."""
    sid, tip = _session_and_tip(ws, session, leaf)
    guards = RunGuards()
    runner = StageRunner(ws, make_brain(config, ws.settings, guards), run_id=run_id, guards=guards)
    return runner(StageRequest(sid, tip, "observer"))


def reflect_now(ws: Workspace, session: str, leaf: str | None, config: ModelConfig,
                run_id: str | None = None) -> list[StageOutcome]:
    """The reflector now; then the dropper if it appended reflections and the pool is over target."""
    sid, tip = _session_and_tip(ws, session, leaf)
    guards = RunGuards()
    runner = StageRunner(ws, make_brain(config, ws.settings, guards), run_id=run_id, guards=guards)
    return run_in_order(runner, StageRequest(sid, tip, "reflector"))
