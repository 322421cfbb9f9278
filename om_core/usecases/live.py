"""What a live Pi asks om (the extension in deployments/pi/): the compaction at Pi's own cut point, and
the evidence behind a memory id, each after ingesting the session file's new lines.

Both work on one write connection held for the request: the new lines go in, then the answer is
read from the same connection, and the file is let go again (an analyst's ``om sql`` waits at most
that long). The compaction is the one ``om compact`` gives on that file at that cut point: the
visible world of the file (its own compactions), folded at F on the branch ending at Pi's leaf.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
import json
from pathlib import Path
import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, model_validator

from om_core.memory.views import DeclineReason
from om_core.store.catalog import resolve_tip
from om_core.errors import EntryNotFound, OmError
from om_core.ingest import ingest
from om_core.store import db as dbmod
from om_core.redaction.redact import redact
from om_core.pi.tokens import count_tokens
from om_core.usecases.live_sessions import LiveSession, file_mark

if TYPE_CHECKING:
    from om_core.memory.gap_free_compaction import BranchFacts, GapFreeCompaction
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace


class CompactRequest(BaseModel):
    """Pi's ``session_before_compact``: the session file, the branch tip and Pi's own cut; the user's
    ``/compact`` instructions when given; the session's folder (``cwd``), whose project settings the
    endpoint then uses (``project_settings`` False: Pi does not trust that folder, so its own files
    do not count)."""

    session_file: str = Field(min_length=1)
    leaf: str = Field(min_length=1)
    first_kept_entry_id: str = Field(min_length=1)
    tokens_before: int = Field(ge=0)
    custom_instructions: str | None = Field(default=None, max_length=20_000)
    cwd: str | None = None
    project_settings: bool = True
    reason: str | None = None  # Pi's: manual, threshold or overflow (a recovery: retention must not hold it back)
    deadline_seconds: float | None = Field(default=None, gt=0)  # how long the hook waits: the catch-up stops before


class RecallRequest(BaseModel):
    """The ``recall`` tool's call: the memory id (SPEC §6), or a query (SPEC §13), on the branch ending
    at ``leaf`` of the file."""

    session_file: str = Field(min_length=1)
    leaf: str | None = None
    id: str | None = None
    query: str | None = Field(None, max_length=2000)
    limit: int = Field(10, ge=1, le=50)

    @model_validator(mode="after")
    def _one_of(self) -> RecallRequest:
        if (self.id is None) == (self.query is None or not self.query.strip()):
            raise ValueError("a recall names either an id or a non-empty query")
        return self


class LiveCompaction(BaseModel):
    """The hook's answer: ``compaction`` (what Pi writes) or, when memory renders nothing at F,
    ``declined`` with the reason (Pi's own summarizer runs)."""

    session_id: str
    leaf: str
    compaction: dict[str, Any] | None = None  # {summary, firstKeptEntryId, tokensBefore, details}
    declined: str | None = None
    declined_reason: DeclineReason | None = None
    left_out: int = 0  # records the summary budget left out (SPEC §13)
    observations: int = 0
    reflections: int = 0
    entries_added: int = 0  # what this request ingested
    moved_from: str | None = None  # Pi's F, when om keeps from further back (SPEC §13: no raw message lost)
    catch_up: CatchUp | None = None  # the observer chunks run before answering, when it was behind Pi's F


class CatchUp(BaseModel):
    """The catch-up a live compaction ran (SPEC §13): chunks recorded, and how it ended."""

    chunks: int = 0
    ended: Literal["caught_up", "chunk_limit", "empty", "failed", "time_limit"] = "caught_up"
    error: str | None = None
    model: str | None = None


LiveCompaction.model_rebuild()


def warm() -> None:
    """Load what the first answer would otherwise load on its way (the ingest's tokenizer, the secret
    rules of the summary's redaction: about a second): a long-running endpoint pays it at its start."""
    count_tokens(["warm up"])
    redact("warm up")
    # a compaction's catch-up runs the observer (SPEC §13): its modules are loaded now, not in Pi's wait
    import om_core.replay.stage_runner  # noqa: F401
    import om_core.workers.offline  # noqa: F401


@contextmanager
def _with_file(ws: Workspace, session_file: str, command: str, index: bool = True,
               kept: LiveSession | None = None) -> Iterator[tuple[Workspace, str, int]]:
    """The workspace on one write connection, after ingesting ``session_file``: (it, session id,
    entries added). ``index`` False: the search index is left to the caller. ``kept``: the endpoint's
    state of this file; when the file is as it was last ingested, it is not read again."""
    path = Path(session_file).expanduser().resolve()
    if not path.is_file():
        raise OmError(f"no session file at {path}")
    with ws.held() as here:
        if kept is not None and kept.unchanged():
            yield here, kept.session_id, 0
            return
        mark = file_mark(path)  # before the read: a line appended meanwhile is read next time
        report = ingest(here, [path], command=command, index=index)
        if not report.files:
            raise OmError(f"{path} was not ingested")
        done = report.files[0]
        if done.error or done.session_id is None:
            if kept is not None:
                kept.forget()
            raise OmError(f"cannot ingest {path}: {done.error or done.status}")
        if kept is not None:
            kept.ingested_now(mark, done)
        yield here, done.session_id, done.entries_added


def _catch_up(here: Workspace, facts: BranchFacts, deadline: float) -> CatchUp | None:
    """Observer chunks from the watermark up to Pi's F, at most compactionCatchUpMaxChunks, each appended
    like any stage, before ``deadline`` (time.monotonic()); None when the observer is not behind F (no
    model is asked then). A chunk that records nothing, fails or runs out of time ends it."""
    from om_core.memory.gap_free_compaction import branch_facts, observer_behind

    settings = here.settings
    session_id, leaf, first_kept = facts.session_id, facts.tip, facts.first_kept
    if not observer_behind(facts, settings.compactionCatchUpMaxChunks):
        return None
    # the workers' modules only when a catch-up runs: the model-free answer imports none of them
    from om_core.model.client import RetryPolicy
    from om_core.replay.stage_runner import StageRunner
    from om_core.workers.stage_kinds import StageRequest
    from om_core.workers.run_config import ModelConfig, RunGuards, make_brain, read_session_model

    with here.read() as con:
        session_model = read_session_model(con, session_id)
        position = dbmod.scalar(con, "position_on_branch", {"session_id": session_id, "tip": leaf,
                                                              "entry_id": first_kept})
    report = CatchUp()
    for _ in range(settings.compactionCatchUpMaxChunks):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            report.ended = "time_limit"
            return report
        # one attempt, bounded by what is left: a model that hangs ends the catch-up, never the hook
        config = ModelConfig.from_settings(settings, retry=RetryPolicy(attempts=1)).model_copy(
            update={"timeout": min(settings.requestTimeoutSeconds, remaining)})
        guards = RunGuards()
        runner = StageRunner(here, make_brain(config, settings, guards, session_model=session_model), guards=guards)
        outcome = runner(StageRequest(session_id, leaf, "observer", chunk_until=position - 1))
        report.model = outcome.model
        if outcome.outcome == "failed":
            report.ended = "time_limit" if time.monotonic() >= deadline else "failed"
            report.error = outcome.error
            return report
        if outcome.outcome != "recorded":
            report.ended = "empty" if outcome.outcome == "empty" else "caught_up"
            return report
        report.chunks += 1
        if not observer_behind(branch_facts(here, session_id, first_kept, leaf), 1):
            return report
    report.ended = "chunk_limit"
    return report


def compact_live(ws: Workspace, req: CompactRequest, *, index: bool = True,
                 kept: LiveSession | None = None) -> LiveCompaction:
    """Ingest the file's new lines, then the gap-free compaction at Pi's cut point on the branch ending at
    ``req.leaf`` (SPEC §13): a catch-up when the observer is behind Pi's F, then F moved back to the
    first unobserved entry, or declined (then Pi's own summary runs). What `om compact --gap-safe
    --first-kept F --leaf LEAF` gives on the same file and ledger. ``index`` False: the search index
    of the new lines is left to the caller (the endpoint updates it after its reply). ``kept``: the
    endpoint's state of this file between answers (om_core.usecases.live_sessions): only the new
    entries of the branch are read, and a question asked again with nothing changed gets the same answer."""
    from om_core.memory.gap_free_compaction import branch_facts, gap_free_compaction

    started = time.monotonic()
    with _with_file(ws, req.session_file, "live compact", index, kept) as (here, session_id, added):
        settings = here.settings
        key = json.dumps([req.leaf, req.first_kept_entry_id, req.tokens_before, req.custom_instructions,
                          req.reason, settings.model_dump_json()])
        recordings = kept.recordings() if kept is not None else 0
        if kept is not None and (again := kept.answer(key)) is not None:
            return again
        branch = kept.branch_of(session_id) if kept is not None else None
        # the branch and the fold at Pi's F, read once (the leaf must be in the file: a clear error if not)
        facts = branch_facts(here, session_id, req.first_kept_entry_id, req.leaf,
                             instructions=req.custom_instructions, known=branch)
        limit = settings.compactionCatchUpSeconds
        if req.deadline_seconds is not None:  # leave the hook time to answer after the catch-up
            limit = min(limit, req.deadline_seconds * 0.5)
        catch_up = _catch_up(here, facts, started + limit)
        if catch_up is not None and catch_up.chunks:  # the ledger grew: read it again
            if kept is not None:
                if kept.owner is not None:
                    kept.owner.memory_recorded()
                kept.folds_dropped()
            facts = branch_facts(here, session_id, req.first_kept_entry_id, req.leaf,
                                 instructions=req.custom_instructions, known=branch)
        done = gap_free_compaction(here, session_id, req.first_kept_entry_id, req.leaf,
                                   overflow=req.reason == "overflow", instructions=req.custom_instructions,
                                   facts=facts, known=branch)
    answer = _answer(req, session_id, added, catch_up, done, settings)
    if kept is not None and catch_up is None:  # an answer no model took part in: the same while nothing changes
        kept.answers[key] = (recordings, answer.model_copy(update={"entries_added": 0}))
    return answer


def _answer(req: CompactRequest, session_id: str, added: int, catch_up: CatchUp | None, done: GapFreeCompaction,
            settings: Settings) -> LiveCompaction:
    """The hook's answer from the gap-free compaction."""
    answer = LiveCompaction(session_id=session_id, leaf=req.leaf, entries_added=added, catch_up=catch_up)
    if done.result is not None:
        answer.observations, answer.reflections = len(done.result.observationIds), len(done.result.reflectionIds)
        answer.left_out = done.result.leftOutObservations + done.result.leftOutReflections
    if done.declined is not None:
        answer.declined_reason = done.declined
        answer.declined = (f"no memory before entry {req.first_kept_entry_id} of this session yet"
                           if done.declined is DeclineReason.EMPTY_PROJECTION else done.why(settings.retained_max_tokens))
        return answer
    if done.decision.moved:
        answer.moved_from = req.first_kept_entry_id
    answer.compaction = {"summary": done.summary, "firstKeptEntryId": done.first_kept,
                         "tokensBefore": req.tokens_before, "details": done.result.details()}
    return answer


def recall_live(ws: Workspace, req: RecallRequest, *, kept: LiveSession | None = None) -> dict[str, Any]:
    """The ``recall`` tool's result (``{content, details}``, the extension's shape) for the id on the
    branch ending at ``req.leaf`` (the file's current leaf when not given or not in the file yet).
    ``kept``: the endpoint's state of this file (its ingest is noted there, as a compaction's is)."""
    from om_core.recall.evidence import recall
    from om_core.recall.tool import tool_result

    with _with_file(ws, req.session_file, "live recall", kept=kept) as (here, session_id, _):
        leaf = req.leaf
        with here.read() as con:
            try:
                leaf = resolve_tip(con, session_id, leaf)
            except EntryNotFound:  # a tool call before its own entry reached the file: the file's leaf
                leaf = resolve_tip(con, session_id, None)
        if req.id is None:
            from om_core.recall.query import recall_query, tool_result as query_result

            return query_result(recall_query(here, req.query or "", session_id, leaf, limit=req.limit))
        result = recall(here, req.id, session_id, leaf)
        return tool_result(here, session_id, leaf, result)
