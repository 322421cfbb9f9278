"""Compaction gaps (SPEC §10, seed 001): measuring them, and gap-safe compaction that closes them.

Classification is SQL (the ``compaction_gaps`` view and the ``compaction_gap`` macro). Gap-safe
compaction moves F back to the first raw message after C, the last observation watermark included
(and, when that message is a tool result, back to the assistant message that made the call), never
forward. Moving F back can exclude a record whose watermark lies past the new F, so the rule is
applied again until F stops moving. A budget guard keeps the plain boundary when the kept tail
would take more than a set share of the model's context window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
from pydantic import BaseModel

from om_core.store import db as dbmod
from om_core.store.catalog import resolve_session, resolve_tip
from om_core.errors import EntryNotFound
from om_core.pi.session import loads_line
from om_core.settings import Settings
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

DEFAULT_CONTEXT_WINDOW = 200_000  # when the model's window is unknown (Claude-class models)


@dataclass
class GapSafeBoundary:
    first_kept: str
    first_kept_pos: int
    plain_first_kept: str
    plain_first_kept_pos: int
    kept_tail_growth_tokens: int = 0
    guard: str | None = None  # why the plain boundary was kept despite a gap

    @property
    def moved(self) -> bool:
        return self.first_kept_pos != self.plain_first_kept_pos

    def as_json(self) -> dict[str, Any]:
        return {"first_kept_entry_id": self.first_kept, "plain_first_kept_entry_id": self.plain_first_kept,
                "moved": self.moved, "kept_tail_growth_tokens": self.kept_tail_growth_tokens, "guard": self.guard}


@dataclass
class _Row:
    position: int
    entry_id: str
    entry_type: str | None
    role: str | None
    is_source: bool
    tokens: int
    raw: str

    @property
    def raw_message(self) -> bool:
        return self.entry_type == "message" and self.is_source


def _call_position(rows: dict[int, _Row], result: _Row) -> int | None:
    """Where the assistant message that made a tool result's call sits (searching backwards).

    Fallback when no assistant message names the call (an orphan result): the nearest earlier
    assistant message, since a tool result is never a valid place for F (pi-sessions.md §2.3)."""
    call_id = json.loads(result.raw).get("message", {}).get("toolCallId")
    nearest = None
    for position in range(result.position - 1, -1, -1):
        row = rows.get(position)
        if row is None:
            break
        if row.entry_type == "message" and row.role == "assistant":
            nearest = position if nearest is None else nearest
            content = loads_line(row.raw).get("message", {}).get("content") or []
            if any(isinstance(b, dict) and b.get("type") == "toolCall" and b.get("id") == call_id for b in content):
                return position
    return nearest


def gap_safe_position(rows: dict[int, _Row], watermarks: list[int], f_pos: int) -> int:
    """The gap-safe F for a plain F at ``f_pos``, given the judged observation watermark positions."""
    while True:
        c_pos = max((w for w in watermarks if w <= f_pos), default=-1)
        first = next((p for p in range(c_pos + 1, f_pos) if p in rows and rows[p].raw_message), None)
        if first is None:
            return f_pos
        if rows[first].role == "toolResult":
            call = _call_position(rows, rows[first])
            if call is not None:
                first = call
        if first >= f_pos:
            return f_pos
        f_pos = first


def gap_safe_boundary(con: duckdb.DuckDBPyConnection, session_id: str, leaf: str, *, compaction_pos: int,
                      seq: int | None, simulated: bool, first_kept: str, tip_pos: int,
                      settings: Settings) -> GapSafeBoundary:
    """Gap-safe F for a compaction at ``compaction_pos`` whose plain F is ``first_kept``."""
    f_pos = dbmod.scalar(con, "position_on_branch", {"session_id": session_id, "tip": leaf, "entry_id": first_kept})
    record = f_pos is None  # one of om's records (an entry of the exported file) may be F
    if record:
        anchor = dbmod.scalar(con, "kept_entry", {"session_id": session_id, "tip": leaf, "entry_id": first_kept})
        if anchor is None:
            raise EntryNotFound(f"first kept entry {first_kept!r} is not on the branch ending at {leaf}")
        # it stands right after its anchor: what precedes it is the branch through the anchor
        f_pos = dbmod.scalar(con, "position_on_branch", {"session_id": session_id, "tip": leaf, "entry_id": anchor}) + 1
    watermarks = dbmod.named_column(con, "judged_observation_watermarks", {
        "session_id": session_id, "leaf": leaf, "compaction_pos": compaction_pos, "simulated": simulated,
        "seq": seq if seq is not None else 2**62})
    if record:
        watermarks = [w for w in watermarks if w < f_pos]  # a watermark on the entry after the record is past F
    rows = {row.position: row for row in dbmod.rows_as(_Row, con.execute(query("gap_window"), {
        "session_id": session_id, "leaf": leaf, "from_pos": 0, "to_pos": f_pos}))}
    safe_pos = gap_safe_position(rows, watermarks, f_pos)
    kept = first_kept if safe_pos == f_pos else rows[safe_pos].entry_id
    boundary = GapSafeBoundary(kept, safe_pos, first_kept, f_pos)
    if safe_pos == f_pos:
        return boundary
    boundary.kept_tail_growth_tokens = int(dbmod.scalar(con, "source_tokens_between", {
        "session_id": session_id, "leaf": leaf, "from_pos": safe_pos, "to_pos": f_pos - 1}))
    tail = int(dbmod.scalar(con, "source_tokens_between", {"session_id": session_id, "leaf": leaf,
                                                           "from_pos": safe_pos, "to_pos": tip_pos}))
    window = settings.contextWindow or DEFAULT_CONTEXT_WINDOW
    budget = int(window * settings.gapSafeMaxContextShare)
    if tail > budget:
        boundary.guard = (f"the kept tail would be {tail} tokens, over {settings.gapSafeMaxContextShare:.0%} of a "
                          f"{window}-token window ({budget}); the plain boundary was kept")
        boundary.first_kept, boundary.first_kept_pos = first_kept, f_pos
    return boundary


# ---------------------------------------------------------------- reports


class CompactionGap(BaseModel):
    session_id: str
    leaf_id: str
    compaction_id: str
    origin: str
    trigger: str | None
    first_kept_entry_id: str | None
    compaction_position: int
    first_kept_position: int
    c_position: int
    watermark_reach: int | None
    gap_messages: int
    gap_tokens: int
    class_: str
    gap_safe: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """Keys spelled like the compaction_gaps view's columns."""
        data = self.model_dump()
        data["class"] = data.pop("class_")
        for name, column in _GAP_COLUMNS.items():
            data[column] = data.pop(name)
        return data


# CompactionGap's positions by the names of the compaction_gaps view's columns, in --json
_GAP_COLUMNS = {"compaction_position": "compaction_pos", "first_kept_position": "first_kept_pos", "c_position": "c_pos"}


@dataclass
class GapReport:
    compactions: list[CompactionGap] = field(default_factory=list)

    def totals(self) -> dict[str, int]:
        """Counts per class over distinct compactions (a compaction on several branches counts once)."""
        seen: dict[tuple[str, str], str] = {}
        for c in self.compactions:
            seen.setdefault((c.session_id, c.compaction_id), c.class_)
        out = {"cross_boundary": 0, "observer_lag": 0, "no_gap": 0, "native_fallback": 0}
        for cls in seen.values():
            out[cls] = out.get(cls, 0) + 1
        return out

    def per_session(self) -> dict[str, dict[str, int]]:
        return {sid: GapReport([c for c in self.compactions if c.session_id == sid]).totals()
                for sid in dict.fromkeys(c.session_id for c in self.compactions)}

    def as_json(self) -> dict[str, Any]:
        return {"compactions": [c.as_json() for c in self.compactions], "totals": self.totals(),
                "sessions": self.per_session()}


def _gap(row: dict[str, Any]) -> CompactionGap:
    return CompactionGap(
        session_id=row["session_id"], leaf_id=row["leaf_id"], compaction_id=row["compaction_id"], origin=row["origin"],
        trigger=row["trigger"], first_kept_entry_id=row["first_kept_entry_id"],
        compaction_position=row["compaction_pos"], first_kept_position=row["first_kept_pos"], c_position=row["c_pos"],
        watermark_reach=row["watermark_reach"], gap_messages=row["gap_messages"], gap_tokens=int(row["gap_tokens"]),
        class_=row["class"])


def compaction_gaps(con: duckdb.DuckDBPyConnection, session_ids: list[str] | None,
                    gap_safe: Settings | None = None) -> GapReport:
    """The gaps of every compaction of ``session_ids`` (None: all); with ``gap_safe`` (the settings its
    boundaries are computed with) also where a gap-safe compaction would have moved each cut."""
    rows = dbmod.rows_as_dicts(con.execute(query("compaction_gaps_for"), {"session_ids": session_ids}))
    report = GapReport()
    for row in rows:
        gap = _gap(row)
        if gap_safe is not None and row["first_kept_entry_id"] and not row["empty_projection"]:
            simulated = row["origin"] == "simulated"
            tip_pos = gap.compaction_position if simulated else gap.compaction_position - 1
            boundary = gap_safe_boundary(con, gap.session_id, gap.leaf_id, compaction_pos=gap.compaction_position,
                                         seq=row["append_seq"], simulated=simulated,
                                         first_kept=row["first_kept_entry_id"], tip_pos=max(tip_pos, 0),
                                         settings=gap_safe)
            again = dbmod.rows_as_dicts(con.execute(query("classify_gap"), {
                "session_id": gap.session_id, "leaf": gap.leaf_id, "compaction_pos": gap.compaction_position,
                "seq": row["append_seq"] if row["append_seq"] is not None else 2**62, "simulated": simulated,
                "f_pos": boundary.first_kept_pos, "empty": False}))[0]
            gap = gap.model_copy(update={
                "first_kept_entry_id": boundary.first_kept, "first_kept_position": boundary.first_kept_pos,
                "c_position": again["c_pos"], "gap_messages": again["gap_messages"],
                "gap_tokens": int(again["gap_tokens"]), "class_": again["class"], "gap_safe": boundary.as_json()})
        report.compactions.append(gap)
    return report


def gaps(ws: Workspace, sessions: list[str] | None = None, gap_safe: bool = False) -> GapReport:
    """The gap report of ``sessions`` (references as `om` accepts them; None: all), with the
    workspace's settings for the gap-safe boundaries."""
    settings = ws.settings
    with ws.read() as con:
        ids = [resolve_session(con, s) for s in sessions] if sessions else None
        return compaction_gaps(con, ids, settings if gap_safe else None)


def gap_safe_at(ws: Workspace, session: str, first_kept: str, leaf: str | None) -> GapSafeBoundary:
    """The gap-safe F if Pi compacted now at ``leaf`` with plain F ``first_kept`` (for `om compact`)."""
    settings = ws.settings
    with ws.read() as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        below = dbmod.named_row(con, "leaf_of", {"session_id": sid, "entry_id": tip})
        return gap_safe_boundary(con, sid, below["leaf_id"], compaction_pos=below["position"], seq=None,
                                 simulated=True, first_kept=first_kept, tip_pos=below["position"], settings=settings)
