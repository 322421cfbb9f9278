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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, model_validator

from om_core.store.catalog import resolve_tip
from om_core.errors import EntryNotFound, OmError
from om_core.ingest import ingest
from om_core.memory.compaction import DeclineReason, compact
from om_core.recall.evidence import recall
from om_core.recall.tool import tool_result
from om_core.redaction.redact import redact
from om_core.pi.tokens import count_tokens

if TYPE_CHECKING:
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


def warm() -> None:
    """Load what the first answer would otherwise load on its way (the ingest's tokenizer, the secret
    rules of the summary's redaction: about a second): a long-running endpoint pays it at its start."""
    count_tokens(["warm up"])
    redact("warm up")


@contextmanager
def _with_file(ws: Workspace, session_file: str, command: str) -> Iterator[tuple[Workspace, str, int]]:
    """The workspace on one write connection, after ingesting ``session_file``: (it, session id,
    entries added)."""
    path = Path(session_file).expanduser().resolve()
    if not path.is_file():
        raise OmError(f"no session file at {path}")
    with ws.held() as here:
        report = ingest(here, [path], command=command)
        if not report.files:
            raise OmError(f"{path} was not ingested")
        done = report.files[0]
        if done.error or done.session_id is None:
            raise OmError(f"cannot ingest {path}: {done.error or done.status}")
        yield here, done.session_id, done.entries_added


def compact_live(ws: Workspace, req: CompactRequest) -> LiveCompaction:
    """Ingest the file's new lines, then fold its memory at Pi's cut point on the branch ending at
    ``req.leaf`` (``om compact FILE --first-kept F --leaf LEAF`` on the same file)."""
    with _with_file(ws, req.session_file, "live compact") as (here, session_id, added):
        with here.read() as con:
            resolve_tip(con, session_id, req.leaf)  # the leaf must be in the file: a clear error if not
        result = compact(here, session_id, req.first_kept_entry_id, req.leaf, instructions=req.custom_instructions)
    answer = LiveCompaction(session_id=session_id, leaf=req.leaf, entries_added=added,
                            observations=len(result.observationIds), reflections=len(result.reflectionIds),
                            left_out=result.leftOutObservations + result.leftOutReflections)
    if result.summary is None:
        answer.declined_reason = result.declined
        answer.declined = (f"no memory before entry {req.first_kept_entry_id} of this session yet"
                           if result.declined is DeclineReason.EMPTY_PROJECTION else
                           f"no memory record fits compactionSummaryMaxTokens {result.summaryMaxTokens}")
        return answer
    answer.compaction = {"summary": result.summary, "firstKeptEntryId": req.first_kept_entry_id,
                         "tokensBefore": req.tokens_before, "details": result.details()}
    return answer


def recall_live(ws: Workspace, req: RecallRequest) -> dict[str, Any]:
    """The ``recall`` tool's result (``{content, details}``, the extension's shape) for the id on the
    branch ending at ``req.leaf`` (the file's current leaf when not given or not in the file yet)."""
    with _with_file(ws, req.session_file, "live recall") as (here, session_id, _):
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
