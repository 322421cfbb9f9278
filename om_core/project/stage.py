"""The project stage: distil a project's durable reflections from its sessions' memory.

Its input is what the project's sessions recorded since the stage last read them (each session's
current branch, folded as the workers read it: current reflections and active critical
observations, forgotten ids left out), oldest first, whole records up to ``projectInputMaxTokens``,
beside the project's memory as it stands. Its output: project reflections, each citing the session
memory ids it rests on (only ids of this project's sessions: the check refuses any other), and
retirements of project reflections (a superseded one, one no longer true). Code, not the model, makes
ids, token counts and checks, as for the session workers; a model failure records nothing and moves
no watermark; a deliberate empty result waits for another ``projectReflectAfterTokens`` of input.

Two brains run it: a model (the tool loop of ``om_core.workers.llm``, with the prompt of
``om_core.project.distil``), and the offline baseline (``distil_offline`` there: extractive, no model). The stage is run by ``run_due_projects``
(om run and om serve, after their sessions: a Prefect task of its own in ``flows.pipeline``) and by
``om project --reflect``.

The prompt has a system prompt and a tool of its own rather than the session workers' shared head:
a provider's prompt cache serves a request's prefix only when it starts with the same tools, so
sharing would put this stage's tool in every session worker's request (about 150 tokens each, on
hundreds of calls per project stage) to save the head's ~1,500 tokens on one call
(``bench/cost/project_stage.py`` measures both).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import duckdb
from pydantic import BaseModel, Field

from om_core.errors import StopReason
from om_core.store import db as dbmod
from om_core.store.db import named_rows, scalar
from om_core.project.distil import PROJECT_SYSTEM, RECORD_PROJECT_REFLECTIONS_TOOL, ProjectCheck, distil_offline
from om_core.memory.project_memory import ProjectReflection, Retirement, append_project_records, current_reflections
from om_core.model.client import CallRecord
from om_core.store.sqlfiles import query
from om_core.workers.near_duplicates import normalised_words
from om_core.workers.stages import record_calls, run_stage

if TYPE_CHECKING:
    from om_core.settings import Settings
    from om_core.workers.run_config import RunGuards
    from om_core.store.workspace import Workspace

STAGE = "project"
MAX_STAGES_PER_RUN = 20  # a project's stages in one run at most (each reads one chunk of new input)


def memory_lines(memory: list[ProjectReflection]) -> str:
    lines = [f"[{r.id}] {r.content} (supports: {', '.join(r.supportingIds)})" for r in memory]
    return "## Project memory\n" + ("\n".join(lines) if lines else "(empty)") + "\n\n"


def task_block(inp: ProjectInput) -> str:
    parts = [f"## Task: distil\n## New session memory ({len(inp.new)} lines from {len(inp.new_sessions())} sessions)"]
    by_session: dict[str, list[InputItem]] = defaultdict(list)
    for item in inp.new:
        by_session[item.session_id].append(item)
    for session_id, items in by_session.items():
        parts.append(f"=== session {session_id[:8]} ({inp.session_labels.get(session_id, '')}) ===")
        parts.extend(item.line() for item in items)
    return "\n".join(parts)


# ---------------------------------------------------------------- the input


@dataclass
class InputItem:
    """One line of a session's memory the project stage reads."""

    session_id: str
    kind: Literal["reflection", "observation"]
    id: str
    content: str
    token_count: float
    append_seq: int  # its record's place in the session ledger's order
    ts: str | None = None
    relevance: str | None = None

    def line(self) -> str:
        if self.kind == "reflection":
            return f"[{self.id}] reflection: {self.content}"
        return f"[{self.id}] {self.ts} [{self.relevance}] {self.content}"


@dataclass
class ProjectInput:
    project_id: str
    memory: list[ProjectReflection]  # the project's current reflections
    new: list[InputItem]  # what is new, oldest first: the stage's chunk
    held: dict[str, set[str]]  # every current session memory id of the project -> the sessions holding it
    watermark: int  # the records' covers_up_to_seq
    previous: int  # the watermark before
    session_labels: dict[str, str] = field(default_factory=dict)

    def new_sessions(self) -> list[str]:
        return list(dict.fromkeys(i.session_id for i in self.new))

    @property
    def input_tokens(self) -> float:
        return sum(i.token_count for i in self.new)

    def allowed_ids(self) -> set[str]:
        """What a project reflection may cite: the new lines, and what the current ones cite."""
        return {i.id for i in self.new} | {s for r in self.memory for s in r.supportingIds}

    def stage_key(self, model: str) -> str:
        body = json.dumps({"project": self.project_id, "model": model, "through": self.watermark,
                           "memory": [r.id for r in self.memory],
                           "new": [[i.session_id, i.id, i.content] for i in self.new]}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:32]


def _label(file_path: str | None, started_at: Any) -> str:
    name = (file_path or "").rsplit("/", 1)[-1]
    when = started_at.strftime("%Y-%m-%d") if started_at else "?"
    return f"{name}, started {when}" if name else f"started {when}"


def read_project_input(con: duckdb.DuckDBPyConnection, project_id: str, settings: Settings) -> ProjectInput | None:
    """The project stage's input, or None when its sessions recorded nothing since it last read."""
    from om_core.memory.views import ledger_rows

    (growth,) = named_rows(con, "project_growth_of", {"project_id": project_id}) or [None]
    if growth is None:
        return None
    previous = int(growth["watermark_seq"] or 0)
    latest = int(growth["latest_seq"] or 0)
    if latest <= previous:
        return None
    items: list[InputItem] = []
    held: dict[str, set[str]] = defaultdict(set)
    labels: dict[str, str] = {}
    for tip in named_rows(con, "project_session_tips", {"project_id": project_id}):
        sid = tip["session_id"]
        labels[sid] = _label(tip["file_path"], tip["started_at"])
        seqs = {r["ledger_id"]: int(r["append_seq"]) for r in named_rows(con, "record_seqs", {"session_id": sid})}
        for row in ledger_rows(con, sid, tip["leaf_id"]):
            if row["dropped"] or (row["item_kind"] == "observation" and row["relevance"] != "critical"):
                continue
            held[row["id"]].add(sid)
            items.append(InputItem(session_id=sid, kind=row["item_kind"], id=row["id"], content=row["content"],
                                   token_count=float(row["token_count"]), append_seq=seqs.get(row["ledger_id"], 0),
                                   ts=row["ts"], relevance=row["relevance"]))
    fresh = sorted((i for i in items if i.append_seq > previous), key=lambda i: (i.append_seq, i.kind != "reflection"))
    chunk: list[InputItem] = []
    used = 0.0
    for i, item in enumerate(fresh):
        starts_record = i == 0 or item.append_seq != fresh[i - 1].append_seq
        if starts_record and chunk and used + sum(x.token_count for x in fresh[i:] if x.append_seq == item.append_seq) \
                > settings.projectInputMaxTokens:
            break
        chunk.append(item)
        used += item.token_count
    # the whole of what is new read: the watermark is the latest record of the project's sessions (also
    # those that hold no input: another branch, a dropped or forgotten line); else the chunk's last record
    watermark = latest if len(chunk) == len(fresh) else chunk[-1].append_seq
    return ProjectInput(project_id=project_id, memory=current_reflections(con, project_id), new=chunk, held=dict(held),
                        watermark=watermark, previous=previous, session_labels=labels)



# ---------------------------------------------------------------- running it


class Settled(StrEnum):
    """Why a project stage asked and appended nothing new: its work was done before (exactly-once)."""

    APPENDED = "already appended by an earlier run"
    EMPTY_BEFORE = "this exact input gave a deliberate empty result before; not asked again"


class ProjectOutcome(BaseModel):
    """What one project stage came to: recorded, empty, failed or skipped (and why), with its model calls."""

    project_id: str
    model: str
    outcome: Literal["recorded", "empty", "failed", "skipped"] = "skipped"
    reason: str | None = None
    stage_key: str | None = None
    reflections: list[ProjectReflection] = Field(default_factory=list)
    retirements: list[Retirement] = Field(default_factory=list)
    rejected: int = 0
    duplicates: int = 0
    turns: int = 0
    receipts: list[str] = Field(default_factory=list)
    calls: list[CallRecord] = Field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None
    ledger_ids: list[str] = Field(default_factory=list)
    inputs: int = 0
    input_tokens: float = 0
    covers_up_to_seq: int = 0
    settled: Settled | None = None  # its work was done before (``reason`` says it in words)
    stop: StopReason | None = None  # the run's guards stopped it before its model call

    def as_json(self) -> dict[str, Any]:
        data = self.model_dump(exclude={"calls", "settled", "stop"})
        data["model_calls"] = len(self.calls)
        return data


def project_prompt(inp: ProjectInput, clean=lambda text: text) -> tuple[str, list[dict[str, Any]]]:  # noqa: ANN001
    """The model's request: the system prompt, then the project memory (a cache breakpoint after it),
    then the task with what is new."""
    from om_core.workers.llm import user_parts

    return PROJECT_SYSTEM, user_parts(clean(memory_lines(inp.memory)), clean(task_block(inp)))


def compute_project_stage(inp: ProjectInput, brain: Any, settings: Settings) -> ProjectOutcome:
    """Run the project stage on its input with ``brain`` (a model brain, or the offline baseline);
    touches no database. A model failure is an outcome, never an exception."""
    from om_core.model.client import ModelError
    from om_core.workers.stage_kinds import token_counter

    outcome = ProjectOutcome(project_id=inp.project_id, model=brain.name, stage_key=inp.stage_key(brain.name),
                             inputs=len(inp.new), input_tokens=inp.input_tokens, covers_up_to_seq=inp.watermark)
    check = ProjectCheck(allowed=inp.allowed_ids(), held=inp.held, memory=inp.memory,
                         count_tokens=token_counter(settings))
    calls = getattr(brain, "calls", None)
    before = len(calls) if calls is not None else 0
    if not inp.new:
        outcome.outcome, outcome.reason = "empty", "the new records hold no current reflection or critical observation"
        return outcome
    if brain.offline:
        outcome.receipts = [check.submit(distil_offline(inp))]
    else:
        from om_core.model.cost import BudgetExceeded
        from om_core.redaction.redact import redact
        from om_core.workers.llm import tool_loop

        clean = redact if brain.redact_secrets else (lambda text: text)
        system, user = project_prompt(inp, clean)
        try:
            loop = tool_loop(brain.model, system, user, {check.tool: (RECORD_PROJECT_REFLECTIONS_TOOL, check)},
                             brain.max_turns, brain.closing_turn)
        except BudgetExceeded as exc:
            outcome.reason = str(exc)
            outcome.calls = list(calls[before:]) if calls is not None else []
            return outcome
        except ModelError as exc:
            outcome.outcome, outcome.error, outcome.error_kind = "failed", str(exc), exc.kind
            outcome.calls = list(calls[before:]) if calls is not None else []
            return outcome
        outcome.receipts, outcome.turns = loop.receipts, loop.turns
    outcome.calls = list(calls[before:]) if calls is not None else []
    outcome.reflections, outcome.retirements = check.accepted, check.retired
    outcome.rejected, outcome.duplicates = check.rejected, check.duplicates
    outcome.outcome = "recorded" if check.accepted or check.retired else "empty"
    return outcome


def record_project_stage(con: duckdb.DuckDBPyConnection, outcome: ProjectOutcome, run_id: str | None,
                         started_at: datetime) -> ProjectOutcome:
    """Append the stage's records, its project_stages row and its model calls in one transaction; the
    search index learns the new reflections."""
    from om_core.store.search_index import refresh_search_index

    with dbmod.transaction(con):
        if outcome.outcome == "recorded":
            if scalar(con, "project_has_stage_key", {"project_id": outcome.project_id, "stage_key": outcome.stage_key}):
                outcome.settled = Settled.APPENDED
                outcome.reason = str(Settled.APPENDED)
            else:
                outcome.ledger_ids = append_project_records(
                    con, outcome.project_id, reflections=outcome.reflections, retirements=outcome.retirements,
                    covers_up_to_seq=outcome.covers_up_to_seq, run_id=run_id, stage_key=outcome.stage_key)
        stage_run_id = uuid.uuid4().hex[:16]
        con.execute(query("insert_project_stage"), {
            "stage_run_id": stage_run_id, "run_id": run_id, "project_id": outcome.project_id,
            "stage_key": outcome.stage_key or "", "model": outcome.model,
            "outcome": outcome.outcome, "covers_up_to_seq": outcome.covers_up_to_seq, "inputs": outcome.inputs,
            "input_tokens": outcome.input_tokens, "records": len(outcome.ledger_ids),
            "items": len(outcome.reflections) + len(outcome.retirements), "rejected": outcome.rejected,
            "error_kind": outcome.error_kind, "error": outcome.error,
            "receipts": "\n\n".join(outcome.receipts)[:20_000] or None, "started_at": started_at})
        record_calls(con, outcome.calls, stage_run_id=stage_run_id, run_id=run_id, stage=STAGE)
        if outcome.ledger_ids:
            refresh_search_index(con, [], [outcome.project_id])
    return outcome


class ProjectSteps:
    """The project stage's steps for the one runner (``om_core.workers.stages.run_stage``): its input
    read from the project's sessions, its work done before known by its stage key (a deliberate empty
    result at prepare, an append at record), its records appended to the project's ledger. It keeps no
    computed result between compute and record: its watermark moves only with the append."""

    def __init__(self, project_id: str, brain: Any, settings: Settings, compute: Any = None) -> None:
        self.project_id = project_id
        self.brain = brain
        self.settings = settings
        self.run = compute or compute_project_stage

    def prepare(self, con: duckdb.DuckDBPyConnection) -> tuple[ProjectInput | None, ProjectOutcome | None]:
        inp = read_project_input(con, self.project_id, self.settings)
        if inp is None:
            return None, None
        key = inp.stage_key(self.brain.name)
        if scalar(con, "project_stage_was_empty", {"project_id": self.project_id, "stage_key": key}):
            return None, ProjectOutcome(project_id=self.project_id, model=self.brain.name, outcome="empty",
                                        stage_key=key, settled=Settled.EMPTY_BEFORE, reason=str(Settled.EMPTY_BEFORE))
        return inp, None

    def kept(self, prepared: ProjectInput) -> ProjectOutcome | None:
        return None

    def compute(self, prepared: ProjectInput) -> ProjectOutcome:
        return self.run(prepared, self.brain, self.settings)

    def unrecorded(self, computed: ProjectOutcome) -> ProjectOutcome | None:
        # the run's cost budget stopped it before its model call: nothing is recorded
        return computed if computed.outcome == "skipped" else None

    def keep(self, prepared: ProjectInput, computed: ProjectOutcome) -> ProjectOutcome:
        return computed

    def record(self, con: duckdb.DuckDBPyConnection, computed: ProjectOutcome, run_id: str | None,
               started_at: datetime) -> ProjectOutcome:
        return record_project_stage(con, computed, run_id, started_at)


def project_stage(ws: Workspace, project_id: str, brain: Any, *, run_id: str | None = None,
                  compute: Any = None, guards: RunGuards | None = None) -> ProjectOutcome | None:
    """One project stage through the one runner: read its input, run it, record it. None when nothing
    is new. ``compute`` runs the model part (``compute_project_stage``'s arguments; the flow passes its
    Prefect task), which touches no database: only this process reads and writes it. ``guards``: the
    run's breaker and budget, checked first (``RunStopped``, ``BudgetReached``)."""
    return run_stage(ws, ProjectSteps(project_id, brain, ws.settings, compute), run_id=run_id, guards=guards)


def due_projects(con: duckdb.DuckDBPyConnection, settings: Settings) -> list[str]:
    """The projects whose sessions recorded at least ``projectReflectAfterTokens`` of input since their
    project stage last read."""
    return [r["project_id"] for r in named_rows(con, "due_projects", {"threshold": settings.projectReflectAfterTokens})]


def run_project_stages(ws: Workspace, project_id: str, brain: Any, *, run_id: str | None = None,
                       force: bool = False, compute: Any = None, guards: RunGuards | None = None) -> list[ProjectOutcome]:
    """The project's stages until its clock is below its threshold (``force``: until nothing is new),
    a stage fails, or ``MAX_STAGES_PER_RUN``. ``guards``: the run's breaker and budget, checked before
    each stage as the session stages' runner checks them (a stopped run ends with a "skipped" outcome
    saying why; nothing is recorded for it)."""
    from om_core.workers.run_config import BudgetReached, RunStopped

    outcomes: list[ProjectOutcome] = []
    threshold = 1 if force else ws.settings.projectReflectAfterTokens
    for _ in range(MAX_STAGES_PER_RUN):
        with ws.read() as con:
            growth = named_rows(con, "project_growth_of", {"project_id": project_id})
        if not growth or (float(growth[0]["new_tokens"]) < threshold
                          and not (force and int(growth[0]["latest_seq"] or 0) > int(growth[0]["watermark_seq"] or 0))):
            break
        try:
            outcome = project_stage(ws, project_id, brain, run_id=run_id, compute=compute, guards=guards)
        except (RunStopped, BudgetReached) as exc:
            outcomes.append(ProjectOutcome(project_id=project_id, model=brain.name, reason=f"stopped: {exc}",
                                           stop=exc.reason))
            break
        if outcome is None:
            break
        outcomes.append(outcome)
        if outcome.outcome in ("failed", "skipped") or outcome.settled is not None:
            break
    return outcomes


def run_due_projects(ws: Workspace, brain: Any, *, run_id: str | None = None, compute: Any = None,
                     guards: RunGuards | None = None) -> list[ProjectOutcome]:
    """Every due project's stages (om run, om serve, after their sessions; flows.pipeline); a run
    stopped by its guards starts no further project's."""
    with ws.read() as con:
        due = due_projects(con, ws.settings)
    outcomes: list[ProjectOutcome] = []
    for project_id in due:
        outcomes += run_project_stages(ws, project_id, brain, run_id=run_id, compute=compute, guards=guards)
        if outcomes and outcomes[-1].stop is not None:
            break
    return outcomes


__all__ = ["PROJECT_SYSTEM", "RECORD_PROJECT_REFLECTIONS_TOOL", "ProjectInput", "ProjectCheck", "ProjectOutcome",
           "read_project_input", "compute_project_stage", "record_project_stage", "project_stage", "ProjectSteps",
           "run_project_stages", "run_due_projects", "due_projects", "distil_offline", "normalised_words"]
