"""What each worker reads (SPEC §8), gathered from the database at one branch tip.

Inputs are plain data: the database is closed again before any model is called.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from collections.abc import Callable
from typing import Any

import duckdb

from om_core.ledger.records import Observation, Reflection
from om_core.store import db as dbmod
from om_core.memory.views import (CoveredObservation, active_memory, ledger_rows, observation_from_row,
                                 reflection_from_row)
from om_core.workers.checks import USER_ROLES
from om_core.workers.guard import guarded_critical
from om_core.workers.memory_layout import MemoryBudget, MemoryLayout, laid_out_memory
from om_core.workers.prompts import DAY_LINE, EXCERPT_MARKER, PART_CUT_MARKER
from om_core.pi.session import loads_line
from om_core.settings import Settings
from om_core.pi.source_text import entry_text, minute, role_label
from om_core.store.sqlfiles import query


@dataclass
class SourceEntry:
    entry_id: str
    position: int
    entry_type: str
    role: str | None
    timestamp: str  # YYYY-MM-DD HH:MM
    tokens: int
    obj: dict = field(repr=False)

    @property
    def label(self) -> str:
        return role_label(self.entry_type, self.obj, self.role)

    @property
    def text(self) -> str:
        return entry_text(self.entry_type, self.obj)

    @property
    def observed_text(self) -> str:
        """The text the observer reads: exact, without tool-call ids."""
        return entry_text(self.entry_type, self.obj, tool_call_ids=False)

    def shaped_text(self, tool_part: Callable[[str], str]) -> str:
        """The observer's text with each tool call's arguments, tool result and command output
        rewritten by ``tool_part`` (``shorten_tool_parts``)."""
        return entry_text(self.entry_type, self.obj, tool_call_ids=False, tool_part=tool_part)

    def message(self) -> dict:
        message = self.obj.get("message")
        return message if isinstance(message, dict) else {}


# The observer's context: this many source entries before its chunk, each shown as at most
# CONTEXT_MAX_CHARS (a head…tail excerpt): enough to read a reply that opens the chunk with what it
# answers, and cite it, without resending a long proposal whole.
CONTEXT_ENTRIES = 3
CONTEXT_MAX_CHARS = 1_200

HEAD_SHARE = 0.6  # of a cut text: its head (the command, the file's start) and tail (the result, the summary)


def head_and_tail(text: str, max_chars: int, marker: str) -> str:
    """``text`` with its middle cut out when longer than ``max_chars``; ``marker`` says how much."""
    if len(text) <= max_chars:
        return text
    head = int(max_chars * HEAD_SHARE)
    tail = max(0, max_chars - head)
    return text[:head] + marker.format(omitted=len(text) - head - tail) + (text[-tail:] if tail else "")


def shorten_tool_parts(max_chars: int, clean: Callable[[str], str] | None = None) -> Callable[[str], str]:
    """The observer's view of a tool call's arguments, a tool result or a command's output: over
    ``max_chars``, its head and tail with the cut marked with its size (``observerToolMaxTokens``).
    ``clean`` runs on the whole part before the cut, so no secret is cut in half."""

    def shorten(text: str) -> str:
        if len(text) <= max_chars:
            return text
        return head_and_tail(text if clean is None else clean(text), max_chars, PART_CUT_MARKER)

    return shorten


def render_entry(entry: SourceEntry, max_chars: int | None = None, clean: Callable[[str], str] | None = None,
                 tool_max_chars: int | None = None) -> tuple[str, bool]:
    """``[<id> <Role> HH:MM] text`` (the date is on a line of its own, see ``ObserverInput.render``);
    tool parts over ``tool_max_chars`` shortened (``shorten_tool_parts``); an entry still over
    ``max_chars`` as a head…tail excerpt.

    ``clean`` (secret redaction) runs on the whole text before any excerpt is cut, so a secret that
    straddles the cut cannot leak half of itself (a shortened part was cleaned whole before its cut;
    cleaning it again changes nothing: redaction is idempotent)."""
    if tool_max_chars:
        text = entry.shaped_text(shorten_tool_parts(tool_max_chars, clean))
    else:
        text = entry.observed_text
    text = text if clean is None else clean(text)
    excerpted = False
    if max_chars is not None and len(text) > max_chars:
        text = head_and_tail(text, max_chars, EXCERPT_MARKER)
        excerpted = True
    clock = f" {entry.timestamp[11:]}" if entry.timestamp else ""
    return f"[{entry.entry_id} {entry.label}{clock}] {text}", excerpted


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


@dataclass
class MemoryLines:
    reflections: list[Reflection]
    observations: list[Observation]
    ordered: list[str] = field(default_factory=list)  # both kinds, as laid out (laid_out_memory)
    dropped: list[str] = field(default_factory=list)  # dropped since they were laid out

    @property
    def reflection_lines(self) -> list[str]:
        return [r.line() for r in self.reflections]

    @property
    def observation_lines(self) -> list[str]:
        return [o.line() for o in self.observations]


@dataclass
class ObserverInput:
    session_id: str
    tip: str
    now: str
    memory: MemoryLines
    chunk: list[SourceEntry]
    cap_tokens: int
    known_observation_ids: set[str]
    tool_max_tokens: int = 0  # observerToolMaxTokens (0: tool parts are shown whole)
    context: list[SourceEntry] = field(default_factory=list)  # CONTEXT_ENTRIES before the chunk, already observed

    @property
    def first_id(self) -> str:
        return self.chunk[0].entry_id

    @property
    def last_id(self) -> str:
        return self.chunk[-1].entry_id

    @property
    def chunk_ids(self) -> set[str]:
        return {e.entry_id for e in self.chunk}

    @property
    def chunk_times(self) -> dict[str, str]:
        """Each chunk entry's time (``YYYY-MM-DD HH:MM``, '' when unknown), in chunk order."""
        return {e.entry_id: e.timestamp for e in self.chunk}

    @property
    def citable_times(self) -> dict[str, str]:
        """The entries a note may cite, with their times, in branch order: the context, then the chunk."""
        return {e.entry_id: e.timestamp for e in [*self.context, *self.chunk]}

    @property
    def user_entry_ids(self) -> frozenset[str]:
        """The citable entries in the user's own words (a message, a command the user ran)."""
        return frozenset(e.entry_id for e in [*self.context, *self.chunk] if e.role in USER_ROLES)

    def render_context(self, clean: Callable[[str], str] | None = None) -> str:
        """The context entries as the observer reads them ('' when there are none), each cut to
        ``CONTEXT_MAX_CHARS``."""
        parts, day = [], None
        for entry in self.context:
            if entry.timestamp and entry.timestamp[:10] != day:
                day = entry.timestamp[:10]
                parts.append(DAY_LINE.format(day=day))
            parts.append(render_entry(entry, CONTEXT_MAX_CHARS, clean, CONTEXT_MAX_CHARS)[0])
        return "\n\n".join(parts)

    def render(self, clean: Callable[[str], str] | None = None) -> tuple[str, bool]:
        """The chunk as the observer reads it, and whether an entry had to be excerpted."""
        parts, excerpted, day = [], False, None
        for entry in self.chunk:
            if entry.timestamp and entry.timestamp[:10] != day:
                day = entry.timestamp[:10]
                parts.append(DAY_LINE.format(day=day))  # the date once per day, not on every entry
            # long tool parts are shortened; an entry alone over the cap is sent as a head…tail excerpt
            # (both at about 4 characters a token)
            text, cut = render_entry(entry, self.cap_tokens * 4 if entry.tokens > self.cap_tokens else None, clean,
                                     self.tool_max_tokens * 4)
            parts.append(text)
            excerpted |= cut
        return "\n\n".join(parts), excerpted

    @property
    def chunk_text(self) -> str:
        return self.render()[0]

    @property
    def source_tokens(self) -> int:
        return sum(e.tokens for e in self.chunk)

    def stage_key(self, model: str) -> str:
        return _digest(["observer", model, self.session_id, self.memory.reflection_lines,
                        self.memory.observation_lines, self.now, [e.entry_id for e in self.chunk]])


def _now_at(tip_ts: Any) -> str:
    return minute(tip_ts) or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")


def _parse_minute(value: str) -> datetime | None:
    try:
        return datetime.strptime(value, "%Y-%m-%d %H:%M")
    except ValueError:
        return None


def observer_input(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings,
                   after_position: int | None = None, until_position: int | None = None) -> ObserverInput | None:
    """The oldest chunk of uncovered source entries after the observation watermark (None: nothing);
    ``until_position``: the chunk takes no entry past that branch position."""
    use_tiktoken = settings.tokenCounter == "tiktoken"
    cap = settings.chunk_max_tokens
    start = after_position
    if start is None:
        start = dbmod.scalar(con, "observation_watermark_position", {"session_id": session_id, "tip": tip})
        start = -1 if start is None else start
    until = 2**62 if until_position is None else until_position
    cursor = con.execute(query("observer_backlog"), {"session_id": session_id, "tip": tip, "after": start,
                                                     "until": until})
    names = [d[0] for d in cursor.description]
    chunk: list[SourceEntry] = []
    total = 0
    while True:
        rows = cursor.fetchmany(64)
        if not rows:
            break
        done = False
        for row in (dict(zip(names, r)) for r in rows):
            tokens = int((row["tokens"] if use_tiktoken else row["tokens_pi"]) or 0)
            if chunk and total + tokens > cap:
                done = True
                break
            chunk.append(SourceEntry(entry_id=row["entry_id"], position=row["position"], entry_type=row["entry_type"],
                                     role=row["role"], timestamp=minute(row["ts"]), tokens=tokens,
                                     obj=loads_line(row["raw"])))
            total += tokens
            if total >= cap:
                done = True
                break
        if done:
            break
    cursor.fetchall()  # release the result before the next statement
    if not chunk:
        return None
    context = [SourceEntry(entry_id=row["entry_id"], position=row["position"], entry_type=row["entry_type"],
                           role=row["role"], timestamp=minute(row["ts"]), tokens=int(row["tokens_pi"] or 0),
                           obj=loads_line(row["raw"]))
               for row in dbmod.rows_as_dicts(con.execute(query("observer_context"), {
                   "session_id": session_id, "tip": tip, "at": start, "n": CONTEXT_ENTRIES}))]
    state = ledger_rows(con, session_id, tip)
    memory = active_memory(state)
    known = {r["id"] for r in state if r["item_kind"] == "observation"}  # dropped ones too
    tip_ts = dbmod.scalar(con, "entry_timestamp", {"session_id": session_id, "entry_id": tip})
    layout = laid_out_memory(state, settings.observationsPoolMaxTokens, MemoryBudget.of(settings, newest_first=True))
    return ObserverInput(
        session_id=session_id, tip=tip, now=_now_at(tip_ts),
        memory=MemoryLines(memory.reflections, memory.observations, layout.lines, layout.dropped), chunk=chunk,
        cap_tokens=cap,
        known_observation_ids=known,
        tool_max_tokens=settings.observerToolMaxTokens,
        context=context,
    )


def coverage_tiers(covered: list[CoveredObservation]) -> dict[str, list[str]]:
    """Active observation ids by coverage tier (strong, partial, none), in ledger order."""
    tiers: dict[str, list[str]] = {"strong": [], "partial": [], "none": []}
    for c in covered:
        tiers[c.coverage].append(c.observation.id)
    return tiers


@dataclass
class CoveredMemory:
    """Current reflections, active observations with their coverage tiers, the memory as the workers
    read it (``laid_out_memory``), the active observations recorded after the last reflections
    (None: no reflections recorded yet) and the tombstoned reflection ids (SPEC §13)."""

    reflections: list[Reflection]
    covered: list[CoveredObservation]
    layout: MemoryLayout
    new_since_reflections: list[str] | None
    tombstoned: set[str]


def memory_with_coverage(con: duckdb.DuckDBPyConnection, session_id: str, tip: str,
                         full_fold_tokens: int, budget: MemoryBudget | None = None) -> CoveredMemory:
    """What the reflector and the dropper read, from one query."""
    rows = dbmod.rows_as_dicts(con.execute(query("ledger_coverage"), {"session_id": session_id, "tip": tip}))
    reflections = [reflection_from_row(r) for r in rows if r["item_kind"] == "reflection" and not r["dropped"]]
    tombstoned = {r["id"] for r in rows if r["item_kind"] == "reflection" and r["dropped"]}
    active = [r for r in rows if r["item_kind"] == "observation" and not r["dropped"]]
    covered = [CoveredObservation(observation=observation_from_row(r), citingReflections=r["citing_reflections"],
                                  coverage=r["coverage"]) for r in active]
    last = max((r["rec_order"] for r in rows if r["item_kind"] == "reflection"), default=None)
    new = None if last is None else [r["id"] for r in active if r["rec_order"] > last]
    return CoveredMemory(reflections, covered, laid_out_memory(rows, full_fold_tokens, budget), new, tombstoned)


class _CoveredPool:
    """What the reflector and the dropper both read: active observations with their coverage tiers."""

    covered: list[CoveredObservation]

    def covered_lines(self) -> list[str]:
        return [f"{c.observation.line()} (coverage: {c.coverage})" for c in self.covered]

    @property
    def coverage(self) -> dict[str, list[str]]:
        return coverage_tiers(self.covered)


@dataclass
class ReflectorInput(_CoveredPool):
    session_id: str
    tip: str
    reflections: list[Reflection]
    covered: list[CoveredObservation]
    observation_watermark: str  # the record's coversUpToId
    memory: MemoryLayout = field(default_factory=MemoryLayout)  # as the workers read it
    new_ids: list[str] | None = None  # active observations recorded after the last reflections (None: none yet)
    dropped_reflection_ids: set[str] = field(default_factory=set)  # tombstoned: duplicates, never recorded again

    @property
    def active_ids(self) -> set[str]:
        return {c.observation.id for c in self.covered}

    def stage_key(self, model: str) -> str:
        return _digest(["reflector", model, self.session_id, [r.line() for r in self.reflections],
                        self.covered_lines(), self.observation_watermark])


def _observation_watermark(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> str | None:
    """The latest observation watermark on the branch (the entry id), or None."""
    return dbmod.scalar(con, "observation_watermark_entry", {"session_id": session_id, "tip": tip})


def reflector_input(con: duckdb.DuckDBPyConnection, session_id: str, tip: str,
                    settings: Settings) -> ReflectorInput | None:
    """None when no observation watermark exists yet (the reflector has nothing to stand on)."""
    watermark = _observation_watermark(con, session_id, tip)
    if watermark is None:
        return None
    got = memory_with_coverage(con, session_id, tip, settings.observationsPoolMaxTokens,
                               MemoryBudget.of(settings, newest_first=True))
    return ReflectorInput(session_id, tip, got.reflections, got.covered, watermark, got.layout,
                          got.new_since_reflections, got.tombstoned)


@dataclass
class DropperInput(_CoveredPool):
    session_id: str
    tip: str
    reflections: list[Reflection]
    covered: list[CoveredObservation]
    pool_tokens: float
    target_tokens: int
    max_drops: int
    watermark: str
    memory: MemoryLayout = field(default_factory=MemoryLayout)  # as the workers read it
    now: str = ""  # the tip's time: each observation's age is counted from it
    guarded: frozenset[str] = frozenset()  # the uncited critical observations the guard keeps (guarded_critical)
    guard: bool = True  # keepUncitedCritical: the dropper's guard (om_core.workers.checks.DropCheck)

    @property
    def active(self) -> dict[str, CoveredObservation]:
        return {c.observation.id: c for c in self.covered}

    def citing(self) -> dict[str, list[str]]:
        """Each active observation's citing reflections (ids, in ledger order)."""
        out: dict[str, list[str]] = {}
        for r in self.reflections:
            for obs_id in dict.fromkeys(r.supportingObservationIds):
                out.setdefault(obs_id, []).append(r.id)
        return out

    def rows(self) -> list[tuple[str, str, str, float, str, list[str]]]:
        """(id, age in minutes at ``now``, relevance, tokens, coverage, citing reflection ids) of each
        active observation, oldest first."""
        now = _parse_minute(self.now)
        citing = self.citing()
        out = []
        for c in self.covered:
            o = c.observation
            then = _parse_minute(o.timestamp)
            minutes = str(max(0, int((now - then).total_seconds() // 60))) if now and then else "?"
            out.append((o.id, minutes, o.relevance, o.tokenCount, c.coverage, citing.get(o.id, [])))
        return out

    def stage_key(self, model: str) -> str:
        return _digest(["dropper", model, self.session_id, [r.line() for r in self.reflections],
                        self.covered_lines(), self.max_drops, self.watermark])


def max_drops(pool_tokens: float, target_tokens: int, active_count: int) -> int:
    """ceil(tokens over target / average tokens per active observation), at least 1, at most the pool."""
    if active_count == 0:
        return 0
    average = pool_tokens / active_count
    over = pool_tokens - target_tokens
    wanted = math.ceil(over / average) if average > 0 else active_count
    return max(1, min(active_count, wanted))


def dropper_input(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings,
                  reflection_watermark: str | None) -> DropperInput | None:
    """None unless the active pool is over ``observationsPoolTargetTokens``."""
    got = memory_with_coverage(con, session_id, tip, settings.observationsPoolMaxTokens,
                               MemoryBudget.of(settings, newest_first=False))
    reflections, covered, memory = got.reflections, got.covered, got.layout
    pool = sum(c.observation.tokenCount for c in covered)
    target = settings.pool_target_tokens
    if pool <= target or not covered:
        return None
    observation_watermark = _observation_watermark(con, session_id, tip)
    marks = [m for m in (observation_watermark, reflection_watermark) if m]
    if not marks:
        return None
    # the earlier of the two watermarks, by branch position
    found = dbmod.rows_as_dicts(con.execute(query("positions_of"), {"session_id": session_id, "tip": tip, "ids": marks}))
    positions = {row["entry_id"]: row["position"] for row in found}
    watermark = min(marks, key=lambda m: positions.get(m, math.inf))
    tip_ts = dbmod.scalar(con, "entry_timestamp", {"session_id": session_id, "entry_id": tip})
    return DropperInput(session_id, tip, reflections, covered, pool, target,
                        max_drops(pool, target, len(covered)), watermark, memory, _now_at(tip_ts),
                        guarded_critical(con, session_id, tip, covered, target), settings.keepUncitedCritical)
