"""One worker stage against the database: read the input, run the worker, append the result.

The database is open only to read the input and to write the result; the model runs in between
with the file released, so an analyst's `om sql` works during long runs. A model or API failure is
an error, never "nothing to record": nothing is appended, no watermark moves, and the failure is
kept in ``stage_runs`` (shown by `om status`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

import duckdb
import pyarrow as pa

from om_core import db as dbmod
from om_core.circuit import CircuitBreaker
from om_core.ledger import (
    OBSERVATIONS_DROPPED,
    OBSERVATIONS_RECORDED,
    REFLECTIONS_RECORDED,
    ObservationsDropped,
    ObservationsRecorded,
    ReflectionsRecorded,
    append_record,
)
from om_core.cost import BudgetExceeded, CostBudget
from om_core.model import OFFLINE, CallRecord, LiteLLMModel, ModelError, RetryPolicy
from om_core.settings import Settings
from om_core.sqlfiles import query
from om_core.tokens import count_text_tokens
from om_core.workers.checks import DropCheck, ObservationCheck, ReflectionCheck, pi_token_counter
from om_core.workers.inputs import dropper_input, observer_input, reflector_input
from om_core.workers.llm import LoopResult, ModelBrain
from om_core.workers.offline import OfflineBrain

Outcome = Literal["recorded", "empty", "failed", "skipped"]


class Brain(Protocol):
    name: str
    offline: bool

    def observe(self, inp: Any, check: ObservationCheck) -> LoopResult: ...

    def reflect(self, inp: Any, check: ReflectionCheck) -> LoopResult: ...

    def drop(self, inp: Any, check: DropCheck) -> LoopResult: ...


@dataclass
class StageOutcome:
    stage: str
    outcome: Outcome
    session_id: str
    tip: str
    model: str
    reason: str | None = None  # why it was skipped
    ledger_id: str | None = None
    covers_up_to_id: str | None = None
    items: int = 0
    duplicates: int = 0
    rejected: int = 0
    turns: int = 0
    turn_cap_reached: bool = False
    error: str | None = None
    error_kind: str | None = None
    receipts: list[str] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    stage_key: str | None = None
    chunk: tuple[str, str] | None = None
    budget_stop: bool = False  # the run's --max-cost stopped this stage before it could pass it

    def as_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "calls"}
        data["model_calls"] = len(self.calls)
        return data


@dataclass
class ModelConfig:
    """Which model the workers use; ``offline`` (or nothing configured) means the extractive baseline."""

    model: str | None = None
    api_base: str | None = None
    api_key: str | None = None
    thinking: str = "off"
    timeout: float = 120.0
    stream: bool = False
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    @classmethod
    def from_settings(cls, settings: Settings, model: str | None = None, api_base: str | None = None) -> ModelConfig:
        chosen = model or (settings.model.litellm_name if settings.model else None)
        return cls(model=chosen, api_base=api_base or settings.apiBase,
                   thinking=settings.model.thinking if settings.model else "off",
                   timeout=settings.requestTimeoutSeconds)

    @property
    def offline(self) -> bool:
        return not self.model or self.model == OFFLINE

    def preflight(self) -> None:
        """Fail before anything starts on what can be checked offline (om_core.circuit)."""
        if not self.offline:
            from om_core.circuit import preflight_model

            preflight_model(self.model, self.api_base, self.api_key)


def make_brain(config: ModelConfig, settings: Settings, calls: list[CallRecord] | None = None,
               gate: Any = None, breaker: Any = None, budget: CostBudget | None = None) -> Brain:
    """The offline baseline or a model brain; a model brain keeps its call records in ``brain.calls``
    and consults ``breaker`` (om_core.circuit) and ``budget`` (a run's --max-cost, om_core.cost)
    before every call."""
    if config.offline:
        return OfflineBrain(redact_secrets=settings.redactSecrets)
    calls = [] if calls is None else calls
    model = LiteLLMModel(config.model, api_base=config.api_base, api_key=config.api_key, thinking=config.thinking,
                         timeout=config.timeout, stream=config.stream, retry=config.retry, record=calls.append,
                         gate=gate, breaker=breaker, keep_texts=settings.storePrompts, budget=budget)
    brain = ModelBrain(model, max_turns=settings.agentMaxTurns, redact_secrets=settings.redactSecrets,
                       closing_turn=settings.agentClosingTurn)
    brain.calls = calls
    brain.budget = budget
    return brain


def token_counter(settings: Settings):
    return pi_token_counter if settings.tokenCounter == "pi" else count_text_tokens


# ------------------------------------------------------------------ writing results


def _write_calls(con: duckdb.DuckDBPyConnection, outcome: StageOutcome, stage_run_id: str, run_id: str | None) -> None:
    if not outcome.calls:
        return
    rows = outcome.calls
    table = pa.table({
        "call_id": [c.call_id for c in rows],
        "run_id": pa.array([run_id] * len(rows), pa.string()),
        "stage_run_id": [stage_run_id] * len(rows),
        "session_id": [outcome.session_id] * len(rows),
        "stage": [outcome.stage] * len(rows),
        "model": [c.model for c in rows],
        "turn": pa.array([c.turn for c in rows], pa.int32()),
        "input_tokens": pa.array([c.input_tokens for c in rows], pa.int32()),
        "output_tokens": pa.array([c.output_tokens for c in rows], pa.int32()),
        "cached_tokens": pa.array([c.cached_tokens for c in rows], pa.int32()),
        "cost": pa.array([c.cost for c in rows], pa.float64()),
        "latency_ms": pa.array([c.latency_ms for c in rows], pa.float64()),
        "status": [c.status for c in rows],
        "error_kind": pa.array([c.error_kind for c in rows], pa.string()),
        "error": pa.array([c.error for c in rows], pa.string()),
        "attempt": pa.array([c.attempt for c in rows], pa.int32()),
        "started_at": pa.array([c.started_at for c in rows], pa.timestamp("us", tz="UTC")),
    })
    dbmod.insert_arrow(con, "call_batch", table, "insert_model_calls")
    texts = [c for c in rows if c.request is not None]
    if texts:
        dbmod.insert_arrow(con, "text_batch", pa.table({
            "call_id": [c.call_id for c in texts], "run_id": pa.array([run_id] * len(texts), pa.string()),
            "request": [c.request for c in texts], "response": pa.array([c.response for c in texts], pa.string()),
        }), "insert_model_call_texts")


def record_outcome(con: duckdb.DuckDBPyConnection, outcome: StageOutcome, payload: Any, kind: str | None,
                   run_id: str | None, started_at: datetime) -> None:
    """Append the stage's record (if any), its stage_runs row and its model calls, in one transaction."""
    with dbmod.transaction(con):
        if payload is not None and kind is not None:
            if outcome.stage_key and dbmod.scalar(con, "ledger_has_stage_key",
                                                  {"session_id": outcome.session_id, "stage_key": outcome.stage_key}):
                outcome.reason = "already appended by an earlier run"
            else:
                outcome.ledger_id = append_record(con, outcome.session_id, kind, payload, anchor_entry_id=outcome.tip,
                                                  run_id=run_id, stage=outcome.stage, stage_key=outcome.stage_key)
        stage_run_id = uuid.uuid4().hex[:16]
        con.execute(query("insert_stage_run"), {
            "stage_run_id": stage_run_id, "run_id": run_id, "session_id": outcome.session_id,
            "stage": outcome.stage, "stage_key": outcome.stage_key or "", "tip_entry_id": outcome.tip,
            "chunk_first_id": outcome.chunk[0] if outcome.chunk else None,
            "chunk_last_id": outcome.chunk[1] if outcome.chunk else None,
            "model": outcome.model, "outcome": outcome.outcome, "records": 1 if outcome.ledger_id else 0,
            "items": outcome.items, "rejected": outcome.rejected, "error_kind": outcome.error_kind,
            "error": outcome.error, "receipts": "\n\n".join(outcome.receipts)[:20_000] or None,
            "started_at": started_at,
        })
        _write_calls(con, outcome, stage_run_id, run_id)
        if payload is not None and outcome.stage_key:
            # a result persisted for this append is gone exactly when the append is there
            con.execute(query("delete_stage_result"), {"session_id": outcome.session_id, "stage_key": outcome.stage_key})


# ------------------------------------------------------------------ the three stages


def _fail(outcome: StageOutcome, error: ModelError) -> StageOutcome:
    outcome.outcome = "failed"
    outcome.error = str(error)
    outcome.error_kind = error.kind
    return outcome


def _stop(outcome: StageOutcome, exc: BudgetExceeded) -> StageOutcome:
    outcome.outcome, outcome.reason, outcome.budget_stop = "skipped", str(exc), True
    return outcome


def _run_check(outcome: StageOutcome, run: Any, check: Any, make_payload: Any) -> tuple[StageOutcome, Any]:
    """Run a worker against its check; the payload holds what the check accepted (None: nothing)."""
    try:
        loop = run(check)
    except BudgetExceeded as exc:
        return _stop(outcome, exc), None
    except ModelError as exc:
        return _fail(outcome, exc), None
    outcome.receipts, outcome.turns, outcome.turn_cap_reached = loop.receipts, loop.turns, not loop.finished
    outcome.items, outcome.duplicates, outcome.rejected = len(check.accepted), check.duplicates, check.rejected
    if not check.accepted:
        outcome.outcome = "empty"
        return outcome, None
    outcome.outcome = "recorded"
    return outcome, make_payload(check.accepted)


def run_observer(inp, brain: Brain, settings: Settings, outcome: StageOutcome) -> tuple[StageOutcome, ObservationsRecorded | None]:
    outcome.stage_key = inp.stage_key(brain.name)
    outcome.chunk = (inp.first_id, inp.last_id)
    outcome.covers_up_to_id = inp.last_id
    check = ObservationCheck(chunk_ids=inp.chunk_ids, known_ids=inp.known_observation_ids,
                             count_tokens=token_counter(settings))
    return _run_check(outcome, lambda c: brain.observe(inp, c), check,
                      lambda items: ObservationsRecorded(observations=items, coversUpToId=inp.last_id))


def run_reflector(inp, brain: Brain, settings: Settings, outcome: StageOutcome) -> tuple[StageOutcome, ReflectionsRecorded | None]:
    outcome.stage_key = inp.stage_key(brain.name)
    outcome.covers_up_to_id = inp.observation_watermark
    check = ReflectionCheck(active_ids=inp.active_ids, existing_ids={r.id for r in inp.reflections},
                            count_tokens=token_counter(settings))
    return _run_check(outcome, lambda c: brain.reflect(inp, c), check,
                      lambda items: ReflectionsRecorded(reflections=items, coversUpToId=inp.observation_watermark))


def run_dropper(inp, brain: Brain, outcome: StageOutcome) -> tuple[StageOutcome, ObservationsDropped | None]:
    outcome.stage_key = inp.stage_key(brain.name)
    outcome.covers_up_to_id = inp.watermark
    order = {c.observation.id: i for i, c in enumerate(inp.covered)}
    check = DropCheck(active=inp.active, max_drops=inp.max_drops, order=order)
    try:
        loop = brain.drop(inp, check)
    except BudgetExceeded as exc:
        return _stop(outcome, exc), None
    except ModelError as exc:
        return _fail(outcome, exc), None
    outcome.receipts, outcome.turns, outcome.turn_cap_reached = loop.receipts, loop.turns, not loop.finished
    chosen = check.selected()
    outcome.items, outcome.rejected = len(chosen), check.ignored
    if not chosen:
        outcome.outcome = "empty"
        return outcome, None
    outcome.outcome = "recorded"
    return outcome, ObservationsDropped(observationIds=chosen, coversUpToId=inp.watermark)


KINDS = {"observer": OBSERVATIONS_RECORDED, "reflector": REFLECTIONS_RECORDED, "dropper": OBSERVATIONS_DROPPED}


# ------------------------------------------------------------------ one stage: prepare, compute, record


@dataclass
class StageRequest:
    session_id: str
    tip: str
    stage: Literal["observer", "reflector", "dropper"]
    reflection_watermark: str | None = None  # dropper: the same run's reflection watermark
    chunk_until: int | None = None  # observer: the chunk ends at or before this branch position (the drain)


_PAYLOADS = {"observer": ObservationsRecorded, "reflector": ReflectionsRecorded, "dropper": ObservationsDropped}


def _input(con: duckdb.DuckDBPyConnection, req: StageRequest, settings: Settings):
    if req.stage == "observer":
        return (observer_input(con, req.session_id, req.tip, settings, until_position=req.chunk_until),
                "no uncovered source entries on this branch" + (
                    f" up to position {req.chunk_until}" if req.chunk_until is not None else ""))
    if req.stage == "reflector":
        return reflector_input(con, req.session_id, req.tip), "no observation watermark yet: run the observer first"
    return (dropper_input(con, req.session_id, req.tip, settings, req.reflection_watermark),
            "the active observation pool is within its target")


@dataclass
class PreparedStage:
    """A stage's whole input, read from the database: what a stage task needs to call the model."""

    request: StageRequest
    input: Any  # ObserverInput | ReflectorInput | DropperInput
    stage_key: str
    model: str
    cached_result: str | None = None  # a result computed earlier but not appended (commands only)


@dataclass
class ComputedStage:
    """What the model run gave: the outcome (with its model calls) and the accepted payload, if any."""

    outcome: StageOutcome
    payload: Any = None


def prepare_stage(con: duckdb.DuckDBPyConnection, req: StageRequest, settings: Settings,
                  model: str) -> tuple[PreparedStage | None, StageOutcome]:
    """The stage's input, or (None, outcome) when there is nothing to do: no input, already
    appended, or this exact input gave a deliberate empty result before (exactly-once)."""
    outcome = StageOutcome(req.stage, "skipped", req.session_id, req.tip, model)
    inp, why_not = _input(con, req, settings)
    if inp is None:
        outcome.reason = why_not
        return None, outcome
    key = inp.stage_key(model)
    appended, was_empty, cached = dbmod.one(con, "stage_state", {"session_id": req.session_id, "stage_key": key})
    outcome.stage_key = key
    if appended:
        outcome.reason = "already appended by an earlier run"
        return None, outcome
    if was_empty:
        outcome.outcome = "empty"
        outcome.reason = "this exact input gave a deliberate empty result before; not asked again"
        return None, outcome
    return PreparedStage(req, inp, key, model, cached), outcome


def compute_stage(prepared: PreparedStage, brain: Brain, settings: Settings) -> ComputedStage:
    """Run the worker on a prepared input; no database is touched."""
    req = prepared.request
    calls: list[CallRecord] = getattr(brain, "calls", None) if getattr(brain, "calls", None) is not None else []
    calls_before = len(calls)
    outcome = StageOutcome(req.stage, "skipped", req.session_id, req.tip, brain.name)
    if req.stage == "observer":
        outcome, payload = run_observer(prepared.input, brain, settings, outcome)
    elif req.stage == "reflector":
        outcome, payload = run_reflector(prepared.input, brain, settings, outcome)
    else:
        outcome, payload = run_dropper(prepared.input, brain, outcome)
    outcome.calls = calls[calls_before:]
    if outcome.budget_stop and outcome.calls:
        # --max-cost stopped it after a rejected turn: the calls made are kept; nothing is appended
        outcome.outcome, outcome.error, outcome.error_kind = "failed", outcome.reason, "permanent"
    return ComputedStage(outcome, payload)


def budget_stopped(req: StageRequest, model: str) -> StageOutcome:
    """A stage not run because the run's --max-cost is reached (nothing is recorded for it)."""
    return StageOutcome(req.stage, "skipped", req.session_id, req.tip, model, budget_stop=True,
                        reason="the run's cost budget (--max-cost) is reached; rerun to resume")


def _from_cached(prepared: PreparedStage) -> ComputedStage:
    req = prepared.request
    payload = _PAYLOADS[req.stage].model_validate_json(prepared.cached_result)
    outcome = StageOutcome(req.stage, "recorded", req.session_id, req.tip, prepared.model, stage_key=prepared.stage_key,
                           reason="computed by an earlier run; appended without calling the model again",
                           covers_up_to_id=payload.coversUpToId)
    outcome.items = len(getattr(payload, "observations", None) or getattr(payload, "reflections", None)
                        or getattr(payload, "observationIds", []))
    return ComputedStage(outcome, payload)


def record_stage(con: duckdb.DuckDBPyConnection, computed: ComputedStage, run_id: str | None,
                 started_at: datetime) -> StageOutcome:
    record_outcome(con, computed.outcome, computed.payload, KINDS[computed.outcome.stage], run_id, started_at)
    return computed.outcome


def execute_stage(ws: Any, req: StageRequest, brain: Brain, run_id: str | None = None) -> StageOutcome:
    """Read the input, run the worker (unless this exact input was already computed), append.

    Exactly-once for a command (the one process that writes the database): a record already
    appended for this stage key is not appended again, and a result computed but not yet appended
    (a crash in between) is persisted in ``stage_results`` and appended without calling the model
    again. The pipeline has its own form of this (Prefect's result storage, flows/pipeline.py).
    """
    started = datetime.now(timezone.utc)
    budget = getattr(brain, "budget", None)
    if budget is not None and budget.exhausted:  # the run reached --max-cost: stop here, resumable
        return budget_stopped(req, brain.name)
    with ws.read() as con:
        prepared, outcome = prepare_stage(con, req, ws.settings, brain.name)
    if prepared is None:
        return outcome
    computed = _from_cached(prepared) if prepared.cached_result is not None else compute_stage(prepared, brain, ws.settings)
    if computed.outcome.budget_stop and not computed.outcome.calls:
        return computed.outcome  # stopped before its first call: nothing to record, a rerun starts here
    with ws.write() as con:
        if computed.payload is not None and prepared.cached_result is None:
            # persisted first, in its own transaction: a crash before the append does not pay twice
            con.execute(query("put_stage_result"), {"session_id": req.session_id, "stage_key": prepared.stage_key,
                                                    "stage": req.stage, "result": computed.payload.model_dump_json()})
        return record_stage(con, computed, run_id, started)


# ------------------------------------------------------------------ manual stages (om observe / om reflect)


def _session_and_tip(ws: Any, session: str, leaf: str | None) -> tuple[str, str]:
    from om_core.catalog import resolve_session, resolve_tip

    with ws.read() as con:
        sid = resolve_session(con, session)
        return sid, resolve_tip(con, sid, leaf)


def observe_now(ws: Any, session: str, leaf: str | None, config: ModelConfig,
                run_id: str | None = None) -> StageOutcome:
    """One observer stage now, on the oldest uncovered chunk, even below the threshold."""
    sid, tip = _session_and_tip(ws, session, leaf)
    brain = make_brain(config, ws.settings, [], breaker=CircuitBreaker())
    return execute_stage(ws, StageRequest(sid, tip, "observer"), brain, run_id)


def reflect_now(ws: Any, session: str, leaf: str | None, config: ModelConfig,
                run_id: str | None = None) -> list[StageOutcome]:
    """The reflector now; then the dropper if it appended reflections and the pool is over target."""
    sid, tip = _session_and_tip(ws, session, leaf)
    brain = make_brain(config, ws.settings, [], breaker=CircuitBreaker())
    outcome = execute_stage(ws, StageRequest(sid, tip, "reflector"), brain, run_id)
    results = [outcome]
    if outcome.outcome == "recorded" and outcome.ledger_id:
        results.append(execute_stage(ws, StageRequest(sid, tip, "dropper", outcome.covers_up_to_id), brain, run_id))
    return results
