"""One worker stage against the database: read the input, run the worker, append the result.

The database is open only to read the input and to write the result; the model runs in between
with the file released, so an analyst's `om sql` works during long runs. A model or API failure is
an error, never "nothing to record": nothing is appended, no watermark moves, and the failure is
kept in ``om_internal.stages`` (shown by `om status`).

``run_stage`` is the one runner every stage kind goes through (prepare -> exactly-once lookup ->
compute -> keep -> record), each kind giving its steps as a ``StageSteps``: the session stages
(observer, reflector, dropper, reflection dropper) through ``om_core.replay.stage_runner``, whose
parts are here (prepare, compute, record); the project stage through ``om_core.project.stage``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import duckdb

from om_core.ledger.records import append_record
from om_core.model.client import CallRecord
from om_core.settings import Settings
from om_core.store import db as dbmod
from om_core.store.sqlfiles import query
from om_core.workers.stage_kinds import STAGES, Brain, StageOutcome, StageRequest

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace
    from om_core.workers.run_config import RunGuards


def stage_model(brain: Brain, stage: str) -> str:
    """The name a stage's key and its stages row carry: the routed stage's own model."""
    primary = getattr(brain, "primary_for", None)
    return primary(stage).name if primary is not None else brain.name


# ------------------------------------------------------------------ writing results

# om_internal.llm_calls columns taken from each call record (the rest are the stage's)
CALL_COLUMNS = ("call_id", "model", "turn", "input_tokens", "output_tokens", "cached_tokens", "cost", "latency_ms",
                 "status", "error_kind", "error", "attempt", "started_at", "fallback")
TEXT_COLUMNS = ("call_id", "request", "response")


def call_columns(calls: list[CallRecord], columns: tuple[str, ...], run_id: str | None,
                 **same: str | None) -> dict[str, list[Any]]:
    """The parameters of ``insert_model_calls`` (or of its texts'): one list per column, one element per
    call: ``columns`` read off each call record, ``same`` repeated, and the run that made the call
    (``run_id``, the recording run, when the record names none)."""
    params: dict[str, list[Any]] = {name: [value] * len(calls) for name, value in same.items()}
    params["run_id"] = [getattr(c, "run_id", None) or run_id for c in calls]
    params.update({name: [getattr(c, name) for c in calls] for name in columns})
    return params


def record_calls(con: duckdb.DuckDBPyConnection, calls: list[CallRecord], *, stage_run_id: str,
                 run_id: str | None, stage: str, session_id: str | None = None) -> None:
    """A stage's model calls (and their texts, where kept) as ``om_internal.llm_calls`` rows: every
    stage's, the session stages' and the project stage's (``session_id`` None) alike."""
    if not calls:
        return
    con.execute(query("insert_model_calls"), call_columns(calls, CALL_COLUMNS, run_id=run_id,
                                                          stage_run_id=stage_run_id, session_id=session_id,
                                                          stage=stage))
    texts = [c for c in calls if c.request is not None]
    if texts:
        con.execute(query("insert_model_call_texts"), call_columns(texts, TEXT_COLUMNS, run_id=run_id))


def record_outcome(con: duckdb.DuckDBPyConnection, outcome: StageOutcome, payload: Any, run_id: str | None,
                   started_at: datetime) -> None:
    """Append the stage's record (if any), its om_internal.stages row and its model calls, in one transaction."""
    with dbmod.transaction(con):
        if payload is not None:
            if outcome.stage_key and dbmod.scalar(con, "ledger_has_stage_key",
                                                  {"session_id": outcome.session_id, "stage_key": outcome.stage_key}):
                outcome.reason = "already appended by an earlier run"
            else:
                outcome.ledger_id = append_record(con, outcome.session_id, STAGES[outcome.stage].record_kind, payload,
                                                  anchor_entry_id=outcome.tip, run_id=run_id, stage=outcome.stage,
                                                  stage_key=outcome.stage_key)
                for kind, companion in STAGES[outcome.stage].companions(payload):
                    append_record(con, outcome.session_id, kind, companion, anchor_entry_id=outcome.tip, run_id=run_id,
                                  stage=outcome.stage, stage_key=outcome.stage_key)
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
        record_calls(con, outcome.calls, stage_run_id=stage_run_id, run_id=run_id, stage=outcome.stage,
                     session_id=outcome.session_id)
        if payload is not None and outcome.stage_key:
            # a result persisted for this append is gone exactly when the append is there
            con.execute(query("delete_stage_result"), {"session_id": outcome.session_id, "stage_key": outcome.stage_key})


# ------------------------------------------------------------------ one stage: prepare, compute, record


@dataclass
class PreparedStage:
    """A stage's whole input, read from the database: what a stage task needs to call the model."""

    request: StageRequest
    input: Any  # ObserverInput | ReflectorInput | DropperInput
    stage_key: str
    model: str


@dataclass
class ComputedStage:
    """What the model run gave: the outcome (with its model calls) and the accepted payload, if any."""

    outcome: StageOutcome
    payload: Any = None


def prepare_stage(con: duckdb.DuckDBPyConnection, req: StageRequest, settings: Settings,
                  model: str) -> tuple[PreparedStage | None, StageOutcome]:
    """The stage's input, or (None, outcome) when there is nothing to do: no input, already
    appended, or this exact input gave a deliberate empty result before (exactly-once)."""
    stage = STAGES[req.stage]
    outcome = StageOutcome(stage=req.stage, outcome="skipped", session_id=req.session_id, tip=req.tip, model=model)
    inp = stage.read_input(con, req, settings)
    if inp is None:
        outcome.reason = stage.not_due(req)
        return None, outcome
    key = inp.stage_key(model)
    (state,) = dbmod.rows_as_dicts(con.execute(query("stage_state"), {"session_id": req.session_id, "stage_key": key}))
    outcome.stage_key = key
    if state["appended"]:
        outcome.reason = "already appended by an earlier run"
        return None, outcome
    if state["was_empty"]:
        outcome.outcome = "empty"
        outcome.reason = "this exact input gave a deliberate empty result before; not asked again"
        return None, outcome
    return PreparedStage(req, inp, key, model), outcome


def compute_stage(prepared: PreparedStage, brain: Brain, settings: Settings) -> ComputedStage:
    """Run the worker on a prepared input; no database is touched."""
    req = prepared.request
    calls = brain.calls
    calls_before = len(calls)
    outcome = StageOutcome(stage=req.stage, outcome="skipped", session_id=req.session_id, tip=req.tip,
                           model=stage_model(brain, req.stage))
    outcome, payload = STAGES[req.stage].run(prepared.input, brain, settings, outcome)
    outcome.calls = calls[calls_before:]
    if outcome.budget_stop and outcome.calls:
        # --max-cost stopped it after a rejected turn: the calls made are kept; nothing is appended
        outcome.outcome, outcome.error, outcome.error_kind = "failed", outcome.reason, "permanent"
    return ComputedStage(outcome, payload)


def record_stage(con: duckdb.DuckDBPyConnection, computed: ComputedStage, run_id: str | None,
                 started_at: datetime) -> StageOutcome:
    record_outcome(con, computed.outcome, computed.payload, run_id, started_at)
    return computed.outcome


# ------------------------------------------------------------------ the one runner

Prepared = TypeVar("Prepared")
Computed = TypeVar("Computed")
Done = TypeVar("Done")


class StageSteps(Protocol[Prepared, Computed, Done]):
    """One stage's steps for ``run_stage``: what differs between a session stage and the project stage
    (where the input is read from, where a computed result waits, which rows record it)."""

    def prepare(self, con: duckdb.DuckDBPyConnection) -> tuple[Prepared | None, Done]:
        """The stage's input, or (None, what it came to) when there is nothing to do: no input, or its
        work was done before (exactly-once by its stage key)."""

    def kept(self, prepared: Prepared) -> Computed | None:
        """The result an earlier run computed for this stage key and did not append yet, or None."""

    def compute(self, prepared: Prepared) -> Computed:
        """Run the worker on the input; touches no database."""

    def unrecorded(self, computed: Computed) -> Done | None:
        """What the stage came to when nothing is to be recorded for it (the run's budget stopped it
        before its model call), else None. May raise instead: the run stops here."""

    def keep(self, prepared: Prepared, computed: Computed) -> Computed:
        """Keep a fresh result by its stage key before it is recorded (a crash in between does not pay
        twice); what is recorded (a failed stage when it could not be kept)."""

    def record(self, con: duckdb.DuckDBPyConnection, computed: Computed, run_id: str | None,
               started_at: datetime) -> Done:
        """Append its records, its stage row and its model calls (``record_calls``) in one transaction."""


def run_stage(ws: Workspace, steps: StageSteps[Prepared, Computed, Done], *, run_id: str | None = None,
              guards: RunGuards | None = None) -> Done:
    """One stage, any kind: the run's breaker and budget (``guards``: raises ``RunStopped`` or
    ``BudgetReached`` before anything is read), prepare with the database open to read, compute with it
    released, record with it open to write. The only place a stage is run."""
    if guards is not None:
        guards.check()
    started = datetime.now(timezone.utc)
    with ws.read() as con:
        prepared, done = steps.prepare(con)
    if prepared is None:
        return done
    computed = steps.kept(prepared)
    if computed is None:
        computed = steps.compute(prepared)
        settled = steps.unrecorded(computed)
        if settled is not None:
            return settled
        computed = steps.keep(prepared, computed)
    with ws.write() as con:
        return steps.record(con, computed, run_id, started)
