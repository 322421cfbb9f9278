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

from om_core.ledger import Observation, Reflection
from om_core import db as dbmod
from om_core.memory import CoveredObservation, ledger_rows, observation_from_row, reflection_from_row, split_rows
from om_core.prompts import DAY_LINE, EXCERPT_MARKER, reflection_memory_line
from om_core.render import observation_line
from om_core.session import loads_line
from om_core.settings import Settings
from om_core.source_text import entry_text, minute, role_label
from om_core.sqlfiles import query


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

    def message(self) -> dict:
        message = self.obj.get("message")
        return message if isinstance(message, dict) else {}


def render_entry(entry: SourceEntry, max_chars: int | None = None,
                 clean: Callable[[str], str] | None = None) -> tuple[str, bool]:
    """``[<id> <Role> HH:MM] text`` (the date is on a line of its own, see ``ObserverInput.render``);
    an over-long entry as a head…tail excerpt.

    ``clean`` (secret redaction) runs on the whole text before any excerpt is cut, so a secret that
    straddles the cut cannot leak half of itself."""
    text = entry.observed_text
    text = text if clean is None else clean(text)
    excerpted = False
    if max_chars is not None and len(text) > max_chars:
        head = int(max_chars * 0.6)
        tail = max(0, max_chars - head)
        omitted = len(text) - head - tail
        text = text[:head] + EXCERPT_MARKER.format(omitted=omitted) + (text[-tail:] if tail else "")
        excerpted = True
    clock = f" {entry.timestamp[11:]}" if entry.timestamp else ""
    return f"[{entry.entry_id} {entry.label}{clock}] {text}", excerpted


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:24]


def memory_line(row: dict[str, Any]) -> str:
    """One memory item as workers read it: an observation's rendered line, or ``[id] reflection: …``."""
    if row["item_kind"] == "observation":
        return observation_line(row["id"], row["ts"], row["relevance"], row["content"])
    return reflection_memory_line(row["id"], row["content"])


def ordered_memory(rows: list[dict[str, Any]]) -> list[str]:
    """Current reflections and active observations in ledger order (the order they were first
    recorded): between two stages the memory then only grows at its end (a drop aside), so the
    earlier prompt stays a prefix a provider cache can serve."""
    current = (r for r in rows if not (r["item_kind"] == "observation" and r["dropped"]))
    return [memory_line(r) for r in sorted(current, key=lambda r: r["fold_order"])]


@dataclass
class MemoryLines:
    reflections: list[Reflection]
    observations: list[Observation]
    ordered: list[str] = field(default_factory=list)  # both kinds, in ledger order

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

    def render(self, clean: Callable[[str], str] | None = None) -> tuple[str, bool]:
        """The chunk as the observer reads it, and whether an entry had to be excerpted."""
        parts, excerpted, day = [], False, None
        for entry in self.chunk:
            if entry.timestamp and entry.timestamp[:10] != day:
                day = entry.timestamp[:10]
                parts.append(DAY_LINE.format(day=day))  # the date once per day, not on every entry
            # an entry alone over the cap is sent as a head…tail excerpt (about 4 characters a token)
            text, cut = render_entry(entry, self.cap_tokens * 4 if entry.tokens > self.cap_tokens else None, clean)
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
    state = ledger_rows(con, session_id, tip)
    memory = split_rows(r for r in state if not r["dropped"])
    known = {r["id"] for r in state if r["item_kind"] == "observation"}  # dropped ones too
    tip_ts = dbmod.scalar(con, "entry_timestamp", {"session_id": session_id, "entry_id": tip})
    return ObserverInput(
        session_id=session_id, tip=tip, now=_now_at(tip_ts),
        memory=MemoryLines(memory.reflections, memory.observations, ordered_memory(state)), chunk=chunk,
        cap_tokens=cap,
        known_observation_ids=known,
    )


def coverage_tiers(covered: list[CoveredObservation]) -> dict[str, list[str]]:
    """Active observation ids by coverage tier (strong, partial, none), in ledger order."""
    tiers: dict[str, list[str]] = {"strong": [], "partial": [], "none": []}
    for c in covered:
        tiers[c.coverage].append(c.observation.id)
    return tiers


def memory_with_coverage(con: duckdb.DuckDBPyConnection, session_id: str,
                         tip: str) -> tuple[list[Reflection], list[CoveredObservation], list[str]]:
    """Current reflections, active observations with their coverage tiers, and both as memory lines
    in ledger order, from one query."""
    rows = dbmod.rows_as_dicts(con.execute(query("ledger_coverage"), {"session_id": session_id, "tip": tip}))
    reflections = [reflection_from_row(r) for r in rows if r["item_kind"] == "reflection"]
    covered = [CoveredObservation(observation=observation_from_row(r), citingReflections=r["citing_reflections"],
                                  coverage=r["coverage"])
               for r in rows if r["item_kind"] == "observation" and not r["dropped"]]
    return reflections, covered, ordered_memory(rows)


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
    memory: list[str] = field(default_factory=list)  # reflections and active observations, ledger order

    @property
    def active_ids(self) -> set[str]:
        return {c.observation.id for c in self.covered}

    def stage_key(self, model: str) -> str:
        return _digest(["reflector", model, self.session_id, [r.line() for r in self.reflections],
                        self.covered_lines(), self.observation_watermark])


def _observation_watermark(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> str | None:
    """The latest observation watermark on the branch (the entry id), or None."""
    return dbmod.scalar(con, "observation_watermark_entry", {"session_id": session_id, "tip": tip})


def reflector_input(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> ReflectorInput | None:
    """None when no observation watermark exists yet (the reflector has nothing to stand on)."""
    watermark = _observation_watermark(con, session_id, tip)
    if watermark is None:
        return None
    reflections, covered, memory = memory_with_coverage(con, session_id, tip)
    return ReflectorInput(session_id, tip, reflections, covered, watermark, memory)


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
    memory: list[str] = field(default_factory=list)  # reflections and active observations, ledger order

    @property
    def active(self) -> dict[str, CoveredObservation]:
        return {c.observation.id: c for c in self.covered}

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
    reflections, covered, memory = memory_with_coverage(con, session_id, tip)
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
    return DropperInput(session_id, tip, reflections, covered, pool, target,
                        max_drops(pool, target, len(covered)), watermark, memory)
