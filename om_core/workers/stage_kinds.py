"""The stage kinds of SPEC §8 and §13 (observer, reflector, dropper, reflection dropper), each defined
once as a ``Stage``.

A ``Stage`` holds everything that differs between the kinds: the ledger record it appends and that
record's payload model (what its tool calls gave, as checked), how its input is read from the
database, the check its tool calls go through, which worker of a brain runs it, the record's
watermark, and when it is not due. Running, exactly-once and recording are the same for every kind
(``stages``); the replay (``om_core.replay.branch``) schedules by these records. Nothing else branches on a
kind, and the rule "the droppers run only right after a reflector run that appended reflections"
is ``follow_ups``, here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import duckdb
from pydantic import BaseModel, Field

from om_core.model.cost import BudgetExceeded
from om_core.ledger.records import (
    OBSERVATIONS_DROPPED,
    OBSERVATIONS_RECORDED,
    REFLECTIONS_DROPPED,
    REFLECTIONS_RECORDED,
    RETIRES,
    SUPERSEDED,
    ObservationsDropped,
    ObservationsRecorded,
    ReflectionsDropped,
    ReflectionsRecorded,
    om_note,
)
from om_core.model.client import CallRecord, ModelError
from om_core.settings import Settings
from om_core.pi.tokens import count_text_tokens
from om_core.workers.checks import DropCheck, ObservationCheck, ReflectionCheck, pi_token_counter
from om_core.workers.inputs import dropper_input, observer_input, reflector_input
from om_core.workers.llm import LoopResult
from om_core.workers.reflection_dropper import ReflectionDropCheck, reflection_dropper_input

StageKind = Literal["observer", "reflector", "dropper", "reflection-dropper"]
Outcome = Literal["recorded", "empty", "failed", "skipped"]


class Brain(Protocol):
    """What runs the workers: a model (``llm.ModelBrain``) or the offline baseline."""

    name: str
    offline: bool
    calls: list[CallRecord]  # the model calls it made (none offline), in order

    def observe(self, inp: Any, check: ObservationCheck) -> LoopResult: ...

    def reflect(self, inp: Any, check: ReflectionCheck) -> LoopResult: ...

    def drop(self, inp: Any, check: DropCheck) -> LoopResult: ...

    def drop_reflections(self, inp: Any, check: ReflectionDropCheck) -> LoopResult: ...


@dataclass
class StageRequest:
    session_id: str
    tip: str
    stage: StageKind
    reflection_watermark: str | None = None  # the droppers: the same run's reflection watermark
    chunk_until: int | None = None  # observer: the chunk ends at or before this branch position (the drain)


class StageOutcome(BaseModel):
    """What one stage run came to: recorded, empty, failed or skipped (and why), with its model calls."""

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
    receipts: list[str] = Field(default_factory=list)
    calls: list[CallRecord] = Field(default_factory=list)
    stage_key: str | None = None
    chunk: tuple[str, str] | None = None
    budget_stop: bool = False  # the run's --max-cost stopped this stage before it could pass it

    def as_json(self) -> dict[str, Any]:
        data = self.model_dump(exclude={"calls"})
        data["model_calls"] = len(self.calls)
        return data


def token_counter(settings: Settings) -> Callable[[str], int]:
    return pi_token_counter if settings.tokenCounter == "pi" else count_text_tokens


@dataclass(frozen=True)
class Stage:
    """One stage kind. ``read_input`` gives None when there is nothing to do (``not_due`` says why);
    ``threshold`` is the clock setting that makes it due at a turn end (None: it runs only right
    after an ``after`` run, see ``follow_ups``); ``needs`` names the kind whose watermark must exist
    first; ``backs_off``: whether after a deliberate empty result it waits for another threshold of source."""

    kind: StageKind
    record_kind: str  # the ledger record it appends (om_core.ledger.records)
    payload: type[BaseModel]  # that record's payload: the accepted items and the watermark
    items_field: str  # the payload's list of items
    read_input: Callable[[duckdb.DuckDBPyConnection, StageRequest, Settings], Any]
    not_due: Callable[[StageRequest], str]
    check: Callable[[Any, Settings], Any]  # the check its tool calls go through (om_core.workers.checks)
    ask: Callable[[Brain, Any, Any], LoopResult]  # the brain's worker for this kind
    watermark: Callable[[Any], str]  # the record's coversUpToId
    chunk: Callable[[Any], tuple[str, str] | None] = lambda inp: None  # the source span it read
    threshold: Callable[[Settings], int] | None = None
    needs: StageKind | None = None
    backs_off: Callable[[Settings], bool] = lambda settings: False
    after: StageKind | None = None
    # a follow-up that is rarely due leaves no outcome when it was not (the reflection dropper: the
    # reflections are within their target on almost every pass)
    silent_when_not_due: bool = False
    # the records its payload implies, appended after it in the same transaction, each (kind, payload)
    companions: Callable[[Any], list[tuple[str, BaseModel]]] = lambda payload: []
    # its own clock (SPEC §13, the reflection dropper): besides running after ``after``, it is due at a
    # turn end once this many source tokens passed since its own latest record (its input then says
    # whether there is anything to do)
    own_clock: Callable[[Settings], int] | None = None

    def run(self, inp: Any, brain: Brain, settings: Settings, outcome: StageOutcome) -> tuple[StageOutcome, Any]:
        """Run the worker on its input through the check; the payload holds what the check accepted
        (None: nothing). A model failure or the run's cost budget is an outcome, never an exception."""
        primary = getattr(brain, "primary_for", None)  # a routed brain (SPEC §13): the stage's own model
        outcome.stage_key = inp.stage_key(primary(self.kind).name if primary is not None else brain.name)
        outcome.chunk = self.chunk(inp)
        outcome.covers_up_to_id = self.watermark(inp)
        answering = brain.for_stage(self.kind) if primary is not None else brain
        while True:
            check = self.check(inp, settings)  # a fresh check: nothing a failed attempt accepted is kept
            try:
                loop = self.ask(answering, inp, check)
                break
            except BudgetExceeded as exc:
                outcome.outcome, outcome.reason, outcome.budget_stop = "skipped", str(exc), True
                return outcome, None
            except ModelError as exc:
                fallback = brain.after_failure(self.kind) if primary is not None else None
                if fallback is None:
                    outcome.outcome, outcome.error, outcome.error_kind = "failed", str(exc), exc.kind
                    return outcome, None
                outcome.receipts.append(f"{answering.name} failed ({exc}); the fallback {fallback.name} answers")
                answering = fallback
        outcome.model = answering.name
        outcome.receipts += loop.receipts
        outcome.turns, outcome.turn_cap_reached = loop.turns, not loop.finished
        accepted = check.accepted
        outcome.items, outcome.duplicates, outcome.rejected = len(accepted), check.duplicates, check.rejected
        if not accepted:
            outcome.outcome = "empty"
            return outcome, None
        outcome.outcome = "recorded"
        notes = getattr(check, "notes", {})  # om's notes on the record (om_core.ledger.records.om_note)
        return outcome, self.payload(**{self.items_field: accepted, "coversUpToId": self.watermark(inp)}, **notes)

    def items(self, payload: BaseModel) -> int:
        return len(getattr(payload, self.items_field))


def _observer_not_due(req: StageRequest) -> str:
    bound = f" up to position {req.chunk_until}" if req.chunk_until is not None else ""
    return "no uncovered source entries on this branch" + bound


OBSERVER = Stage(
    kind="observer", record_kind=OBSERVATIONS_RECORDED, payload=ObservationsRecorded, items_field="observations",
    read_input=lambda con, req, settings: observer_input(con, req.session_id, req.tip, settings,
                                                         until_position=req.chunk_until),
    not_due=_observer_not_due,
    check=lambda inp, settings: ObservationCheck(chunk_times=inp.citable_times, known_ids=inp.known_observation_ids,
                                                 user_ids=inp.user_entry_ids, active=inp.memory.observations,
                                                 memory_ids=inp.known_observation_ids
                                                 | {r.id for r in inp.memory.reflections},
                                                 count_tokens=token_counter(settings)),
    ask=lambda brain, inp, check: brain.observe(inp, check),
    watermark=lambda inp: inp.last_id,
    chunk=lambda inp: (inp.first_id, inp.last_id),
    threshold=lambda settings: settings.observeAfterTokens,
    backs_off=lambda settings: True,
)

def retirements(payload: ReflectionsRecorded) -> list[tuple[str, BaseModel]]:
    """The reflector's companions: for each new reflection that supersedes current ones (om's
    ``RETIRES`` note, ``ReflectionCheck.retired``), an ``om.reflections.dropped`` record retiring them,
    ``replacedBy`` the new one, of kind "superseded"."""
    retires = om_note(payload, RETIRES) or {}
    return [(REFLECTIONS_DROPPED, ReflectionsDropped(reflectionIds=list(old), coversUpToId=payload.coversUpToId,
                                                     replacedBy=new, kind=SUPERSEDED))
            for new, old in retires.items() if old]


REFLECTOR = Stage(
    kind="reflector", record_kind=REFLECTIONS_RECORDED, payload=ReflectionsRecorded, items_field="reflections",
    read_input=lambda con, req, settings: reflector_input(con, req.session_id, req.tip, settings),
    not_due=lambda req: "no observation watermark yet: run the observer first",
    check=lambda inp, settings: ReflectionCheck(active_ids=inp.active_ids,  # a tombstoned id is a duplicate too
                                                existing_ids={r.id for r in inp.reflections} | inp.dropped_reflection_ids,
                                                existing=inp.reflections, dropped_ids=inp.dropped_reflection_ids,
                                                count_tokens=token_counter(settings)),
    ask=lambda brain, inp, check: brain.reflect(inp, check),
    watermark=lambda inp: inp.observation_watermark,
    threshold=lambda settings: settings.reflectAfterTokens,
    needs="observer",
    backs_off=lambda settings: settings.reflectorBackoff,  # the extension has none (SPEC §9): off by default
    companions=retirements,
)

DROPPER = Stage(
    kind="dropper", record_kind=OBSERVATIONS_DROPPED, payload=ObservationsDropped, items_field="observationIds",
    read_input=lambda con, req, settings: dropper_input(con, req.session_id, req.tip, settings,
                                                        req.reflection_watermark),
    not_due=lambda req: "the active observation pool is within its target",
    check=lambda inp, settings: DropCheck(active=inp.active, max_drops=inp.max_drops,
                                          order={c.observation.id: i for i, c in enumerate(inp.covered)},
                                          keep_uncited_critical=settings.keepUncitedCritical,
                                          guarded_ids=inp.guarded),
    ask=lambda brain, inp, check: brain.drop(inp, check),
    watermark=lambda inp: inp.watermark,
    after="reflector",
)

REFLECTION_DROPPER = Stage(
    kind="reflection-dropper", record_kind=REFLECTIONS_DROPPED, payload=ReflectionsDropped,
    items_field="reflectionIds",
    read_input=lambda con, req, settings: reflection_dropper_input(con, req.session_id, req.tip, settings,
                                                                   req.reflection_watermark, token_counter(settings)),
    not_due=lambda req: "the active reflections are within reflectionsPoolTargetTokens",
    check=lambda inp, settings: ReflectionDropCheck(active={c.reflection.id: c for c in inp.candidates},
                                                    max_drops=inp.max_drops),
    ask=lambda brain, inp, check: brain.drop_reflections(inp, check),
    watermark=lambda inp: inp.watermark,
    after="reflector",
    silent_when_not_due=True,
    own_clock=lambda settings: settings.reflectAfterTokens,
)

STAGES: dict[str, Stage] = {stage.kind: stage for stage in (OBSERVER, REFLECTOR, DROPPER, REFLECTION_DROPPER)}
CLOCKED_STAGES = tuple(stage for stage in STAGES.values() if stage.threshold is not None)  # turn-end order
OWN_CLOCK_STAGES = tuple(stage for stage in STAGES.values() if stage.own_clock is not None)  # after them


def follow_ups(done: StageOutcome) -> list[StageRequest]:
    """The stages that run right after ``done`` at the same tip, in order: the dropper (SPEC §8) and
    the reflection dropper (SPEC §13) only after a reflector run that appended reflections, each with
    that run's reflection watermark."""
    if done.outcome != "recorded" or not done.ledger_id:
        return []
    return [StageRequest(done.session_id, done.tip, stage.kind, reflection_watermark=done.covers_up_to_id)
            for stage in STAGES.values() if stage.after == done.stage]


def silent(done: StageOutcome, req: StageRequest) -> bool:
    """A rarely due stage that was not due: it leaves no outcome (``Stage.silent_when_not_due``)."""
    stage = STAGES[done.stage]
    return (done.outcome == "skipped" and not done.budget_stop and stage.silent_when_not_due
            and done.reason == stage.not_due(req))


def run_in_order(run: Callable[[StageRequest], StageOutcome], req: StageRequest) -> list[StageOutcome]:
    """Run ``req``, then its follow-ups (``follow_ups``), each with ``run``."""
    outcomes = [run(req)]
    for nxt in follow_ups(outcomes[0]):
        done = run(nxt)
        if not silent(done, nxt):
            outcomes.append(done)
        if done.outcome == "failed":  # a failure ends the pass (it may have stopped the run); the next retries
            break
    return outcomes
