"""Memory as the SQL computes it: fold, projections, compaction, drift, clocks, coverage, status.

Every function here runs one of the macros in ``sql/views`` and shapes the rows into pydantic
models; none of them folds or projects in Python.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import duckdb
from pydantic import BaseModel, Field

from om_core.catalog import resolve_session, resolve_tip
from om_core.db import reading
from om_core.errors import EntryNotFound
from om_core.ledger import Observation, Reflection
from om_core.render import render_summary
from om_core.settings import Settings
from om_core.sqlfiles import query


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def observation_from_row(row: dict[str, Any]) -> Observation:
    return Observation.model_construct(
        id=row["id"], content=row["content"], timestamp=row["ts"], relevance=row["relevance"],
        sourceEntryIds=list(row["source_entry_ids"]), tokenCount=_number(row["token_count"]),
    )


def reflection_from_row(row: dict[str, Any]) -> Reflection:
    return Reflection.model_construct(
        id=row["id"], content=row["content"], supportingObservationIds=list(row["supporting_observation_ids"]),
        tokenCount=_number(row["token_count"]),
    )


def _rows(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    cursor = con.execute(query(name), params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, r)) for r in cursor.fetchall()]


class MemoryView(BaseModel):
    observations: list[Observation] = Field(default_factory=list)
    reflections: list[Reflection] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.observations and not self.reflections

    def summary(self) -> str | None:
        return render_summary(self.reflections, self.observations)

    def observation_tokens(self) -> float:
        return sum(o.tokenCount for o in self.observations)

    def wire(self) -> dict[str, Any]:
        return {"observations": [o.model_dump(mode="json") for o in self.observations],
                "reflections": [r.model_dump(mode="json") for r in self.reflections]}


def _split(rows: Iterable[dict[str, Any]]) -> MemoryView:
    view = MemoryView()
    for row in sorted(rows, key=lambda r: (r["item_kind"], r["ordinal"])):
        if row["item_kind"] == "observation":
            view.observations.append(observation_from_row(row))
        else:
            view.reflections.append(reflection_from_row(row))
    return view


def require_on_branch(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, entry_id: str, what: str) -> int:
    row = con.execute(query("position_on_branch"), {"session_id": session_id, "tip": tip, "entry_id": entry_id}).fetchone()
    if row is None or row[0] is None:
        raise EntryNotFound(f"{what} {entry_id!r} is not on the branch ending at {tip}")
    return row[0]


# ------------------------------------------------------------------ projections


def full_memory(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, boundary: str | None = None) -> MemoryView:
    """Full projection at ``boundary`` (default: the tip): the records covered through it."""
    boundary = boundary or tip
    require_on_branch(con, session_id, tip, boundary, "boundary")
    return _split(_rows(con, "full_projection", {"session_id": session_id, "tip": tip, "boundary": boundary}))


def visible_memory(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> MemoryView:
    """What the agent sees: the lists of the latest folded compaction on the branch."""
    return _split(_rows(con, "visible_projection", {"session_id": session_id, "tip": tip}))


def ledger_memory(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> MemoryView:
    """The plain fold through the tip: current reflections and active observations (what workers read)."""
    obs = _rows(con, "ledger_observations_at", {"session_id": session_id, "tip": tip})
    refl = _rows(con, "ledger_reflections_at", {"session_id": session_id, "tip": tip})
    return MemoryView(
        observations=[observation_from_row({**r, "id": r["obs_id"]}) for r in obs if not r["dropped"]],
        reflections=[reflection_from_row({**r, "id": r["refl_id"]}) for r in refl],
    )


class CompactionResult(BaseModel):
    fullFold: bool
    memory: MemoryView
    summary: str | None
    firstKeptEntryId: str
    observationWatermarkPosition: int | None = None  # C of SPEC §10: largest watermark included

    def details(self) -> dict[str, Any]:
        """The om.folded object stored with the compaction (SPEC §5)."""
        return {"type": "om.folded", "version": 1, "fullFold": self.fullFold, **self.memory.wire()}

    def as_json(self) -> dict[str, Any]:
        return {
            "fullFold": self.fullFold,
            "observations": [o.id for o in self.memory.observations],
            "reflections": [r.id for r in self.memory.reflections],
            "summary": self.summary,
            "details": self.details(),
        }


def compaction_projection(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, first_kept: str,
                          pool_max_tokens: int) -> CompactionResult:
    """Compaction projection at F with its normal/full-fold decision (SPEC §4), rendered (SPEC §5)."""
    require_on_branch(con, session_id, tip, first_kept, "first kept entry")
    rows = _rows(con, "compaction_projection", {"session_id": session_id, "tip": tip, "first_kept": first_kept,
                                                "pool_max": pool_max_tokens})
    # No rows means the normal projection held nothing, so it was a full fold only if P <= 0.
    full_fold = bool(rows[0]["full_fold"]) if rows else pool_max_tokens <= 0
    memory = _split(rows)
    watermark = con.execute(query("observation_watermark_through"),
                            {"session_id": session_id, "tip": tip, "first_kept": first_kept}).fetchone()[0]
    return CompactionResult(fullFold=full_fold, memory=memory, summary=memory.summary(), firstKeptEntryId=first_kept,
                            observationWatermarkPosition=watermark)


class Drift(BaseModel):
    observationsOnlyInFull: list[str] = Field(default_factory=list)
    reflectionsOnlyInFull: list[str] = Field(default_factory=list)
    visibleNoLongerActive: list[str] = Field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.observationsOnlyInFull) + len(self.reflectionsOnlyInFull) + len(self.visibleNoLongerActive)


def drift(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> Drift:
    out = Drift()
    lists = {"observation_only_in_full": out.observationsOnlyInFull,
             "reflection_only_in_full": out.reflectionsOnlyInFull,
             "visible_not_active": out.visibleNoLongerActive}
    for kind, item in con.execute(query("memory_drift"), {"session_id": session_id, "tip": tip}).fetchall():
        lists[kind].append(item)
    return out


class Clock(BaseModel):
    name: str
    tokens: int  # in the counter the settings choose
    tokens_pi: int
    tokens_tiktoken: int
    threshold: int | None
    due: bool | None
    watermark_entry_id: str | None
    from_position: int


def clocks(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings | None = None) -> dict[str, Clock]:
    settings = settings or Settings()
    thresholds = {"observer": settings.observeAfterTokens, "reflector": settings.reflectAfterTokens,
                  "dropper": None, "compaction": settings.compact_threshold}
    out: dict[str, Clock] = {}
    for row in _rows(con, "progress_clocks", {"session_id": session_id, "tip": tip}):
        used = int(row["tokens"] if settings.tokenCounter == "tiktoken" else row["tokens_pi"])
        threshold = thresholds[row["clock"]]
        out[row["clock"]] = Clock(
            name=row["clock"], tokens=used, tokens_pi=int(row["tokens_pi"]), tokens_tiktoken=int(row["tokens"]),
            threshold=threshold, due=None if threshold is None else used >= threshold,
            watermark_entry_id=row["watermark_entry_id"], from_position=row["from_pos"],
        )
    return out


class CoveredObservation(BaseModel):
    observation: Observation
    citingReflections: int
    coverage: str  # none | partial | strong


def coverage(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> list[CoveredObservation]:
    rows = _rows(con, "coverage_tiers", {"session_id": session_id, "tip": tip})
    rows.sort(key=lambda r: r["ordinal"])
    return [CoveredObservation(observation=observation_from_row({**r, "id": r["obs_id"]}),
                               citingReflections=r["citing_reflections"], coverage=r["coverage"]) for r in rows]


# ------------------------------------------------------------------ status


class MemoryStatus(BaseModel):
    session_id: str
    tip: str
    observations: dict[str, int]  # recorded, active, dropped, visible
    reflections: dict[str, int]  # recorded (current), visible
    drift: Drift
    clocks: dict[str, Clock]
    pools: dict[str, Any]
    lastErrors: list[dict[str, Any]] = Field(default_factory=list)


def memory_status(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings | None = None) -> MemoryStatus:
    settings = settings or Settings()
    obs = _rows(con, "ledger_observations_at", {"session_id": session_id, "tip": tip})
    refl = _rows(con, "ledger_reflections_at", {"session_id": session_id, "tip": tip})
    visible = visible_memory(con, session_id, tip)
    active_tokens = sum(r["token_count"] for r in obs if not r["dropped"])
    visible_tokens = visible.observation_tokens()
    errors = _rows(con, "last_errors", {"session_id": session_id})
    return MemoryStatus(
        session_id=session_id,
        tip=tip,
        observations={"recorded": len(obs), "active": sum(not r["dropped"] for r in obs),
                      "dropped": sum(bool(r["dropped"]) for r in obs), "visible": len(visible.observations)},
        reflections={"recorded": len(refl), "visible": len(visible.reflections)},
        drift=drift(con, session_id, tip),
        clocks=clocks(con, session_id, tip, settings),
        pools={
            "activeTokens": _number(active_tokens), "visibleTokens": _number(visible_tokens),
            "maxTokens": settings.observationsPoolMaxTokens, "targetTokens": settings.pool_target_tokens,
            "activePressure": round(active_tokens / settings.observationsPoolMaxTokens, 4),
            "visiblePressure": round(visible_tokens / settings.observationsPoolMaxTokens, 4),
            "activeOverTarget": active_tokens > settings.pool_target_tokens,
        },
        lastErrors=errors,
    )


# ------------------------------------------------------------------ by path, for the CLI


def view(db_path: str | os.PathLike, session: str, leaf: str | None = None, full: bool = False) -> tuple[str, str, MemoryView]:
    with reading(db_path) as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        return sid, tip, (full_memory(con, sid, tip) if full else visible_memory(con, sid, tip))


def compact(db_path: str | os.PathLike, session: str, first_kept: str, leaf: str | None = None,
            pool_max_tokens: int | None = None) -> CompactionResult:
    with reading(db_path) as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        pool = pool_max_tokens if pool_max_tokens is not None else Settings().observationsPoolMaxTokens
        return compaction_projection(con, sid, tip, first_kept, pool)


def status(db_path: str | os.PathLike, session: str, leaf: str | None = None,
           settings: Settings | None = None) -> MemoryStatus:
    with reading(db_path) as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        return memory_status(con, sid, tip, settings)
