"""What the report shows, read from om's database through the named queries of
``sql/queries/report.sql`` into plain typed rows: sessions from the catalog, each session's current
branch (``branch_detail``), the memory at each position where a ledger record is anchored
(``ledger_at``), the visible and replayed memory at the tip, compactions with their gap class
(``om_core.memory.gaps``) and model calls (the ``llm_calls`` view). Counts are those of the current branch
of each session. No markup here: ``page`` draws what this module reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import duckdb
from pydantic import BaseModel

from om_core.store.catalog import SessionInfo, list_sessions, resolve_session
from om_core.store.db import named_row, named_rows, scalar
from om_core.memory.gaps import CompactionGap, compaction_gaps

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

GAP_CLASSES = ("cross_boundary", "observer_lag", "no_gap", "native_fallback")


class BranchPoint(BaseModel):
    """One entry of the current branch (``report_branch``)."""

    position: int
    ts: datetime | None
    is_source: bool | None
    tokens_pi: int  # Pi's estimate; 0 where it has none


class MemoryPoint(BaseModel):
    """The ledger as it stands at one branch position (``ledger_at`` through that entry)."""

    position: int
    entry_id: str
    recorded: int  # observations recorded on the branch so far (distinct ids)
    active: int  # not dropped
    dropped: int
    reflections: int
    pool_tokens: float  # active observations' tokenCount
    reflection_tokens: float


class FoldedMemory(BaseModel):
    """Observation and reflection counts at the tip, of the visible and of the replayed view."""

    visible_observations: int
    visible_reflections: int
    replayed_observations: int
    replayed_reflections: int


class CallStats(BaseModel):
    """Model calls of one stage (``report_calls_by_stage``), or a total of several."""

    stage: str
    calls: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost: float | None = None
    unpriced: int = 0  # calls whose cost litellm did not know
    models: str = ""

    def add(self, other: CallStats) -> None:
        self.calls += other.calls
        self.errors += other.errors
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.unpriced += other.unpriced
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost


@dataclass
class SessionReport:
    info: SessionInfo
    tip: str | None = None
    tip_position: int | None = None
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    times: list[datetime | None] = field(default_factory=list)  # by position, carried forward
    source_cumulative: list[tuple[int, int]] = field(default_factory=list)  # (position, source tokens so far)
    branch_source_tokens: int = 0
    timeline: list[MemoryPoint] = field(default_factory=list)
    compactions: list[CompactionGap] = field(default_factory=list)
    visible: tuple[int, int] = (0, 0)  # (observations, reflections) of the file's own latest om.folded compaction
    replayed: tuple[int, int] = (0, 0)  # the same with the replay's simulated compactions counted
    calls_by_stage: list[CallStats] = field(default_factory=list)
    offline: bool = False  # the offline baseline (extractive rules, no model) wrote some of its memory
    # (observations, reflections) recorded in the session on every branch, repeats included: what `om run`
    # counts as it appends them, where the cards count the current branch's
    everywhere: tuple[int, int] = (0, 0)

    @property
    def sid(self) -> str:
        return self.info.session_id

    @property
    def final(self) -> MemoryPoint | None:
        return self.timeline[-1] if self.timeline else None

    @property
    def calls(self) -> CallStats:
        total = CallStats(stage="all")
        for stats in self.calls_by_stage:
            total.add(stats)
        return total

    @property
    def file_compactions(self) -> int:
        """Compactions the session file holds (Pi's and the extension's)."""
        return sum(c.origin != "simulated" for c in self.compactions)

    @property
    def replayed_compactions(self) -> int:
        """Compactions the replay simulated: what the extension would have done, not what happened."""
        return sum(c.origin == "simulated" for c in self.compactions)

    def class_counts(self) -> dict[str, int]:
        out = dict.fromkeys(GAP_CLASSES, 0)
        for c in self.compactions:
            out[c.class_] = out.get(c.class_, 0) + 1
        return out


def _current_branch(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    leaf = report.info.leaf_id
    if leaf is None:
        return
    report.tip = leaf
    branch = [BranchPoint.model_validate(row)
              for row in named_rows(con, "report_branch", {"session_id": report.sid, "tip": leaf})]
    if not branch:
        return
    report.tip_position = branch[-1].position
    stamps = [p.ts for p in branch if p.ts is not None]
    report.first_ts, report.last_ts = (min(stamps), max(stamps)) if stamps else (None, None)
    last: datetime | None = None
    total = 0
    for point in branch:
        last = point.ts if point.ts is not None else last
        report.times.append(last)
        if point.is_source:
            total += point.tokens_pi
        report.source_cumulative.append((point.position, total))
    report.branch_source_tokens = total


def _memory_timeline(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    rows = named_rows(con, "report_memory_timeline", {"session_id": report.sid, "tip": report.tip})
    report.timeline = [MemoryPoint.model_validate(row) for row in rows]


def _folded_memory(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    [row] = named_rows(con, "report_folded_memory", {"session_id": report.sid, "tip": report.tip})
    folded = FoldedMemory.model_validate(row)
    report.visible = (folded.visible_observations, folded.visible_reflections)
    report.replayed = (folded.replayed_observations, folded.replayed_reflections)


def _model_calls(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    rows = named_rows(con, "report_calls_by_stage", {"session_id": report.sid})
    report.calls_by_stage = [CallStats.model_validate(row) for row in rows]


def _gap_leaf(con: duckdb.DuckDBPyConnection, report: SessionReport) -> str | None:
    """The leaf by which the gap report names the tip's branch."""
    row = named_row(con, "leaf_of", {"session_id": report.sid, "entry_id": report.tip})
    return row["leaf_id"] if row else None


def _selected(con: duckdb.DuckDBPyConnection, sessions: list[str] | None) -> list[SessionInfo]:
    infos = list_sessions(con)
    if not sessions:
        return infos
    wanted = list(dict.fromkeys(resolve_session(con, s) for s in sessions))
    by_id = {i.session_id: i for i in infos}
    return [by_id[sid] for sid in wanted]


def collect(ws: Workspace, sessions: list[str] | None) -> list[SessionReport]:
    """Everything the page shows about ``sessions`` (references as `om` accepts them; None: all)."""
    with ws.read() as con:
        infos = _selected(con, sessions)
        if not infos:
            return []
        gap_report = compaction_gaps(con, [i.session_id for i in infos])
        reports = [SessionReport(info) for info in infos]
        for report in reports:
            _current_branch(con, report)
            report.offline = bool(scalar(con, "offline_memory", {"session_id": report.sid}))
            everywhere = named_row(con, "report_recorded_everywhere", {"session_id": report.sid})
            report.everywhere = (everywhere["observations"], everywhere["reflections"])
            _model_calls(con, report)
            if report.tip is None:
                continue
            _memory_timeline(con, report)
            _folded_memory(con, report)
            leaf = _gap_leaf(con, report)
            found = [c for c in gap_report.compactions if c.session_id == report.sid and c.leaf_id == leaf
                     and report.tip_position is not None and c.compaction_position <= report.tip_position]
            report.compactions = sorted(found, key=lambda c: c.compaction_position)
    return reports
