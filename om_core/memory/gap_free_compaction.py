"""A gap-free compaction on the database (SPEC §13): the branch's facts read once, the decisions of
``om_core.memory.gap_free`` asked, and the memory folded at the F they chose. No model runs here (the
live hook's catch-up runs before, om_core.usecases.live); the live hook and `om compact --gap-safe` give the
same F and summary on the same ledger because both are this function.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import duckdb
from pydantic import BaseModel

from om_core.memory.compaction import World, compact, compact_at
from om_core.memory.views import CompactionResult, DeclineReason, KeptFolds
from om_core.memory.gap_free import (
    DECLINED_WHY,
    Branch,
    Decision,
    SpanEntry,
    decide,
    needs_catch_up,
    retained_first_kept,
)
from om_core.pi.js_length import js_len
from om_core.store import db as dbmod
from om_core.store.catalog import resolve_session, resolve_tip
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


class GapFreeCompaction(BaseModel):
    """The compaction a gap-free path answers: F (moved back, or Pi's), the projection there, or why it
    declines (then Pi's own summary runs)."""

    session_id: str
    leaf: str
    proposed_first_kept: str  # Pi's F
    first_kept: str  # the F of the answer (Pi's when declined)
    decision: Decision
    result: CompactionResult | None = None  # None when declined
    result_max_tokens: int | None = None  # compactionSummaryMaxTokens where the service applied it
    summary: str | None = None

    @property
    def declined(self) -> DeclineReason | None:
        return self.decision.declined

    def why(self, budget: int) -> str | None:
        if self.decision.declined is None:
            return None
        if self.decision.declined is DeclineReason.NOTHING_FITS:
            return f"no memory record fits compactionSummaryMaxTokens {self.result_max_tokens}"
        return DECLINED_WHY[self.decision.declined].format(retained=self.decision.retained_tokens, budget=budget)

    def as_json(self) -> dict[str, Any]:
        return {"first_kept_entry_id": self.first_kept, "proposed_first_kept_entry_id": self.proposed_first_kept,
                "moved": self.decision.moved, "declined": self.declined.value if self.declined else None,
                "retained_tokens": self.decision.retained_tokens, "freed_tokens": self.decision.freed_tokens}


class BranchRows:
    """The branch ending at ``tip`` as the decisions need it, built entry by entry in order, so that a
    reader who kept it reads only the entries after its tip when the branch grew (a live session's
    answers: Pi appends to the branch between them). The tool results are tied to the assistant
    message that made their call (the latest one before naming its toolCallId, else the nearest
    assistant message before), each entry's JSON parsed once. ``folds``: the compaction folds read on
    this branch (om_core.memory.views.compaction_projection), kept while the entries it grows by hold no
    record and no compaction (a message changes no fold); emptied with it, and by its holder when the
    ledger changed otherwise (memory recorded, another process's write)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.folds: KeptFolds = {}
        self.reset()

    def reset(self) -> None:
        """Empty: the next read starts at the root."""
        self.tip: str | None = None
        self.tip_position = -1
        self.entries: list[SpanEntry] = []
        self.positions: dict[str, int] = {}
        self._compaction: tuple[Any, int] | None = None  # the latest compaction: its F, its position
        self._named: dict[Any, int] = {}  # toolCall id -> the latest assistant message naming it so far
        self._nearest: int | None = None
        self.folds.clear()

    def add(self, rows: list[dict[str, Any]], tip: str) -> None:
        """The branch's next entries (positions right after the current tip, in order) up to ``tip``."""
        for r in rows:
            position = r["position"]
            self.positions[r["entry_id"]] = position
            tool_result = r["entry_type"] == "message" and r["role"] == "toolResult"
            call = None
            if tool_result:
                call_id = json.loads(r["raw"]).get("message", {}).get("toolCallId")
                call = self._named.get(call_id, self._nearest)
            elif r["entry_type"] == "message" and r["role"] == "assistant":
                self._nearest = position
                for block in json.loads(r["raw"]).get("message", {}).get("content") or []:
                    if isinstance(block, dict) and block.get("type") == "toolCall":
                        self._named[block.get("id")] = position
            self.entries.append(SpanEntry(position=position, entry_id=r["entry_id"], is_source=bool(r["is_source"]),
                                          tokens=int(r["tokens"] or 0) if r["is_source"] else 0,
                                          tool_result=tool_result, call_position=call))
            if r["entry_type"] == "compaction":  # the context starts at the latest compaction's F
                self._compaction = (json.loads(r["raw"]).get("firstKeptEntryId"), position)
                self.folds.clear()
            elif r["entry_type"] == "custom" and str(json.loads(r["raw"]).get("customType")).startswith("om."):
                self.folds.clear()  # a record of the file's ledger
        self.tip, self.tip_position = tip, self.tip_position if not rows else rows[-1]["position"]

    def branch(self) -> Branch:
        start = 0
        if self._compaction is not None:
            kept, position = self._compaction
            start = self.positions.get(kept, position + 1)
        return Branch(entries=list(self.entries), context_start=start)


def read_branch(con: duckdb.DuckDBPyConnection, session_id: str, tip: str,
                known: BranchRows | None = None) -> BranchRows:
    """The branch ending at ``tip``, into ``known`` when given: the caller's rows of this session, kept
    between reads on the same entries (its holder empties it, or lets it go, when the file is rewritten
    or another process writes the database). When its tip is on this branch at the same position, only
    the entries after it are read and added; otherwise it is read again from the root."""
    rows = known if known is not None and known.session_id == session_id else BranchRows(session_id)
    if rows.tip == tip:
        return rows
    tip_pos = dbmod.scalar(con, "position_on_branch", {"session_id": session_id, "tip": tip, "entry_id": tip})
    start = 0
    if rows.tip is not None:
        at = dbmod.scalar(con, "position_on_branch", {"session_id": session_id, "tip": tip, "entry_id": rows.tip})
        if at is not None and at == rows.tip_position and tip_pos is not None and tip_pos > at:
            start = at + 1
        else:
            rows.reset()  # another branch: read from the root
    found = dbmod.rows_as_dicts(con.execute(query("gap_window"), {"session_id": session_id, "leaf": tip,
                                                                  "from_pos": start, "to_pos": tip_pos}))
    rows.add(found, tip)
    return rows


class BranchFacts(BaseModel):
    """What a gap-free compaction reads once: the branch ending at ``tip``, each entry's position,
    where Pi's F stands on it, and the memory folded at Pi's F. The live hook reads them once for
    both of its questions (is the observer behind F? what is the compaction?)."""

    session_id: str
    tip: str
    first_kept: str  # Pi's F
    branch: Branch
    positions: dict[str, int]
    proposed: int | None  # Pi's F on the branch (None: one of om's records, which stands after its anchor)
    record_at: int | None
    projection: CompactionResult  # the fold at Pi's F


def branch_facts(ws: Workspace, session: str, first_kept: str, leaf: str | None = None, *, replayed: bool = False,
                 instructions: str | None = None, known: BranchRows | None = None) -> BranchFacts:
    """The branch and the fold at Pi's F, read on one connection. ``known``: the session's branch as
    read before (``read_branch``), extended in place when the branch grew."""
    with ws.read() as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        read = read_branch(con, sid, tip, known)
        branch, positions = read.branch(), dict(read.positions)
        proposed = positions.get(first_kept)
        record_at = None
        if proposed is None:  # one of om's records (an entry of the exported file): it stands after its anchor
            anchor = dbmod.scalar(con, "kept_entry", {"session_id": sid, "tip": tip, "entry_id": first_kept})
            record_at = positions[anchor] + 1 if anchor in positions else None
        projection = compact_at(con, sid, tip, first_kept, ws.settings,
                                world=World.REPLAYED if replayed else World.FILE, instructions=instructions,
                                kept=read.folds if known is not None else None)
    return BranchFacts(session_id=sid, tip=tip, first_kept=first_kept, branch=branch, positions=positions,
                       proposed=proposed, record_at=record_at, projection=projection)


def observer_behind(facts: BranchFacts, max_chunks: int) -> bool:
    """Whether a catch-up observer may close a gap before Pi's F (some coverage, something uncovered)."""
    if facts.proposed is None:
        return False
    return needs_catch_up(facts.branch, facts.projection.observationWatermarkPosition, facts.proposed, max_chunks)


def gap_free_compaction(ws: Workspace, session: str, first_kept: str, leaf: str | None = None, *,
                        overflow: bool = False, replayed: bool = False, instructions: str | None = None,
                        facts: BranchFacts | None = None, known: BranchRows | None = None) -> GapFreeCompaction:
    """The compaction Pi proposed at ``first_kept``, gap-free: F moved back to the first source entry no
    observation in the projection covers, the memory folded there (``om compact`` at that F), then kept
    or declined by ``decide`` (the summary's tokens count toward compactionMaxRetainedTokens).
    ``facts``: the branch and the fold at Pi's F when the caller read them already (the same ledger);
    ``known``: the branch they were read into (``branch_facts``), whose kept folds serve the moved F."""
    if facts is None:
        facts = branch_facts(ws, session, first_kept, leaf, replayed=replayed, instructions=instructions)
    sid, tip, branch, positions, proposed = facts.session_id, facts.tip, facts.branch, facts.positions, facts.proposed
    result = facts.projection
    kept = first_kept
    if proposed is not None:  # (F may be one of om's records in an exported file: no move there)
        at = proposed
        for _ in range(len(branch.entries)):  # moving F back may exclude a record: until it stops moving
            moved = retained_first_kept(branch, result.observationWatermarkPosition, at)
            if moved == at:
                break
            at, kept = moved, branch.entries[moved].entry_id
            result = compact(ws, sid, kept, tip, replayed=replayed, instructions=instructions,
                             kept=known.folds if known is not None and known.tip == tip else None)
    summary = result.summary
    tokens = math.ceil(js_len(summary) / 4) if summary is not None else None  # Pi's estimate
    settings = ws.settings
    at = proposed if proposed is not None else (facts.record_at if facts.record_at is not None else 0)
    decision = decide(branch, at, positions.get(kept, at), tokens, max_retained_tokens=settings.retained_max_tokens,
                      overflow=overflow)
    if result.declined is not None:  # the compaction service's own decline (no record, or none fits)
        decision.declined, decision.first_kept, decision.moved = result.declined, at, False
    answer = GapFreeCompaction(session_id=sid, leaf=tip, proposed_first_kept=first_kept, first_kept=first_kept,
                               decision=decision, result_max_tokens=result.summaryMaxTokens)
    if decision.goes_ahead:
        answer.first_kept, answer.result, answer.summary = kept, result, summary
    return answer
