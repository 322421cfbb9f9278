"""The one stage runner: prepare -> exactly-once lookup -> compute with the brain -> record.

Every stage om runs goes through ``StageRunner``: `om observe`/`om reflect` on the user's database,
the tests' and benchmarks' in-process replays, and the flow's replay tasks on a task-local
in-memory database (``om_core.replay.engine``). The run's circuit breaker and its cost budget are
checked here, before a stage is prepared, and nowhere else (the model consults the same breaker
and budget before each of its calls, mid-stage). A result that cannot be kept for a storage error
(a full disk) trips the breaker here too: no stage of the run starts after the first write failure.

Exactly-once sits behind ``StageResults``: a result computed but not yet appended is found again
by its stage key, so a crash between the model's answer and the append never pays twice. A command
keeps it in the ``stage_results`` table (``TableStageResults``); a flow run keeps it in Prefect's
result storage (flows/storage.py), which every worker of a cluster reaches.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from om_core.catalog import resolve_session, resolve_tip
from om_core.circuit import CircuitBreaker
from om_core.errors import StorageError, storage_error
from om_core.sqlfiles import query
from om_core.workers.stage_kinds import STAGES, Brain, StageOutcome, StageRequest, run_in_order
from om_core.workers.stages import ComputedStage, ModelConfig, PreparedStage, compute_stage, make_brain, \
    prepare_stage, record_stage


class RunStopped(Exception):
    """A session's replay ends here: the run's circuit breaker tripped (om_core.circuit)."""


class BudgetReached(Exception):
    """The run's --max-cost stopped a stage before its model call: the replay ends there, cleanly
    (nothing half-done is recorded), and a rerun resumes it (om_core.cost)."""


class StageResults(Protocol):
    """Where a computed stage result waits for its append (exactly-once across crashes)."""

    def get(self, prepared: PreparedStage) -> ComputedStage | None:
        """The result computed earlier for this stage key, or None."""

    def put(self, prepared: PreparedStage, computed: ComputedStage) -> None:
        """Keep a computed (not failed) result, before it is recorded."""


class TableStageResults:
    """Exactly-once for a command: the ``stage_results`` table of the database the stage writes to.
    ``prepare_stage`` already read the row (``PreparedStage.cached_result``); a row is deleted in
    the transaction that appends its record (om_core.workers.stages.record_outcome)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    def get(self, prepared: PreparedStage) -> ComputedStage | None:
        if prepared.cached_result is None:
            return None
        req = prepared.request
        stage = STAGES[req.stage]
        payload = stage.payload.model_validate_json(prepared.cached_result)
        outcome = StageOutcome(req.stage, "recorded", req.session_id, req.tip, prepared.model,
                               stage_key=prepared.stage_key,
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
    outcome = StageOutcome(req.stage, "failed", req.session_id, req.tip, prepared.model, stage_key=prepared.stage_key,
                           error=f"{type(exc).__name__}: {exc}", error_kind="permanent")
    outcome.calls = computed.outcome.calls
    return ComputedStage(outcome)


class StageRunner:
    """Run one stage against a workspace: ``runner(request) -> StageOutcome``.

    ``brain`` answers (its ``breaker`` and ``budget``, when it has them, are the run's); ``results``
    is the exactly-once store; ``compute`` runs the brain on a prepared input (the flow wraps it as a
    Prefect task, to see it in the UI). Raises ``RunStopped`` once the run's breaker tripped and
    ``BudgetReached`` once its budget is reached, before anything is recorded for the stage."""

    def __init__(self, ws: Any, brain: Brain, results: StageResults | None = None, run_id: str | None = None,
                 compute: Compute | None = None) -> None:
        self.ws = ws
        self.brain = brain
        self.results = TableStageResults(ws) if results is None else results
        self.run_id = run_id
        self.compute = compute or (lambda prepared: compute_stage(prepared, brain, ws.settings))

    def check(self) -> None:
        """The run's breaker and budget: the one place a stage is refused before it starts."""
        breaker = getattr(self.brain, "breaker", None)
        if breaker is not None and breaker.tripped:
            raise RunStopped(str(breaker.reason))
        budget = getattr(self.brain, "budget", None)
        if budget is not None and budget.exhausted:
            raise BudgetReached("the run's cost budget (--max-cost) is reached; rerun to resume")

    def _stop(self, reason: StorageError) -> None:
        breaker = getattr(self.brain, "breaker", None)
        if breaker is not None:
            breaker.trip(reason)

    def __call__(self, req: StageRequest) -> StageOutcome:
        self.check()
        started = datetime.now(timezone.utc)
        with self.ws.read() as con:
            prepared, outcome = prepare_stage(con, req, self.ws.settings, self.brain.name)
        if prepared is None:
            return outcome  # nothing to do: no input, already appended, or a deliberate empty result before
        computed = self.results.get(prepared)
        if computed is None:
            computed = self.compute(prepared)
            for call in computed.outcome.calls:  # kept with the result: a resuming run records them as this run's
                call.run_id = self.run_id
            if computed.outcome.budget_stop and not computed.outcome.calls:
                # stopped before its first call: nothing to record, a rerun starts here
                raise BudgetReached(computed.outcome.reason or "the run's cost budget (--max-cost) is reached")
            if computed.outcome.outcome != "failed":
                try:
                    self.results.put(prepared, computed)
                except Exception as exc:  # e.g. result storage unreachable: fail the stage, keep its calls
                    stored = storage_error(exc)
                    if stored is not None:  # a full disk: the run's breaker stops every later stage (check)
                        self._stop(stored)
                    computed = _failed(prepared, computed, exc)
        with self.ws.write() as con:
            return record_stage(con, computed, self.run_id, started)


def execute_stage(ws: Any, req: StageRequest, brain: Brain, run_id: str | None = None) -> StageOutcome:
    """One stage now against ``ws``, exactly-once through its ``stage_results`` table."""
    return StageRunner(ws, brain, TableStageResults(ws), run_id)(req)


# ------------------------------------------------------------------ manual stages (om observe / om reflect)


def _session_and_tip(ws: Any, session: str, leaf: str | None) -> tuple[str, str]:
    with ws.read() as con:
        sid = resolve_session(con, session)
        return sid, resolve_tip(con, sid, leaf)


def observe_now(ws: Any, session: str, leaf: str | None, config: ModelConfig,
                run_id: str | None = None) -> StageOutcome:
    """One observer stage now, on the oldest uncovered chunk, even below the threshold."""
    sid, tip = _session_and_tip(ws, session, leaf)
    runner = StageRunner(ws, make_brain(config, ws.settings, [], breaker=CircuitBreaker()), run_id=run_id)
    return runner(StageRequest(sid, tip, "observer"))


def reflect_now(ws: Any, session: str, leaf: str | None, config: ModelConfig,
                run_id: str | None = None) -> list[StageOutcome]:
    """The reflector now; then the dropper if it appended reflections and the pool is over target."""
    sid, tip = _session_and_tip(ws, session, leaf)
    runner = StageRunner(ws, make_brain(config, ws.settings, [], breaker=CircuitBreaker()), run_id=run_id)
    return run_in_order(runner, StageRequest(sid, tip, "reflector"))
