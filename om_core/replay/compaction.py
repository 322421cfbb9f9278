"""Simulated compactions (SPEC §5, §9): what the extension would have folded at a boundary.

A compaction is a query: the compaction projection at F, rendered without any model, stored in
``om_internal.compactions`` with origin ``simulated`` and its ``om.folded`` details. When the projection is
empty nothing is persisted as memory; the row records that Pi's native summarizer would have run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from om_core.store import db as dbmod
from om_core.memory.gaps import GapSafeBoundary, gap_safe_boundary
from om_core.ledger.records import parse_folded, store_simulated_compaction
from om_core.memory.compaction import DeclineReason, World, compact_at
from om_core.settings import Settings


@dataclass
class SimulatedCompaction:
    session_id: str
    compaction_id: str | None
    anchor: str
    first_kept: str
    trigger: str
    full_fold: bool | None
    observations: int
    reflections: int
    native_fallback: bool
    existed: bool = False  # stored by an earlier run: nothing was written
    gap_safe: GapSafeBoundary | None = None


def stored_simulation(con: Any, session_id: str, anchor: str, first_kept: str, trigger: str) -> dict[str, Any] | None:
    """The compaction an earlier run simulated at ``anchor`` with this plain cut and trigger, if any."""
    return dbmod.named_row(con, "simulated_compaction_by_seed", {
        "session_id": session_id, "anchor": anchor, "plain_first_kept": first_kept, "trigger": trigger})


def simulate_compaction(db: Any, session_id: str, *, tip: str, anchor: str, first_kept: str, trigger: str,
                        settings: Settings, run_id: str | None = None) -> SimulatedCompaction:
    """Fold the ledger as it stands at ``tip`` into a compaction at ``first_kept``, anchored at ``anchor``."""
    seed = f"{trigger}\x00{anchor}\x00{first_kept}"
    with db.read() as con:
        existing = stored_simulation(con, session_id, anchor, first_kept, trigger)
        if existing is not None:
            return SimulatedCompaction(session_id, existing["compaction_id"], anchor, first_kept, trigger,
                                       existing["full_fold"], 0, 0, not existing["folded"], existed=True)
        boundary = None
        if settings.gapSafeCompaction:
            below = dbmod.named_row(con, "leaf_of", {"session_id": session_id, "entry_id": anchor})
            tip_pos = dbmod.scalar(con, "position_on_branch", {"session_id": session_id, "tip": tip, "entry_id": tip})
            boundary = gap_safe_boundary(con, session_id, below["leaf_id"], compaction_pos=below["position"], seq=None,
                                         simulated=True, first_kept=first_kept, tip_pos=tip_pos, settings=settings)
        kept = boundary.first_kept if boundary else first_kept
        # the replay's world: its own earlier simulated compactions set M, as the extension's would have
        result = compact_at(con, session_id, tip, kept, settings, world=World.REPLAYED)
    details = parse_folded(result.details()) if result.summary is not None else None
    notes = []
    if result.declined is DeclineReason.EMPTY_PROJECTION:
        notes.append("projection empty: Pi's native summarizer would run (nothing persisted as memory)")
    elif result.declined is DeclineReason.NOTHING_FITS:
        notes.append(f"no record fits compactionSummaryMaxTokens {result.summaryMaxTokens}: Pi's native "
                     "summarizer would run (nothing persisted as memory)")
    elif result.leftOutObservations or result.leftOutReflections:
        notes.append(f"summary budget {result.summaryMaxTokens}: left out {result.leftOutObservations} "
                     f"observation(s), {result.leftOutReflections} reflection(s)")
    if boundary is not None and boundary.moved:
        notes.append(f"gap-safe: first kept moved back from {first_kept} to {kept}; the kept tail grew by "
                     f"{boundary.kept_tail_growth_tokens} tokens")
    if boundary is not None and boundary.guard:
        notes.append(f"gap-safe guard: {boundary.guard}")
    with db.write() as con, dbmod.transaction(con):
        compaction_id = store_simulated_compaction(
            con, session_id, anchor_entry_id=anchor, first_kept_entry_id=kept, details=details,
            summary=result.summary, note="; ".join(notes) or None, trigger=trigger, run_id=run_id, seed=seed,
            gap_safe=boundary is not None, plain_first_kept_entry_id=first_kept)
    return SimulatedCompaction(session_id, compaction_id, anchor, first_kept, trigger,
                               result.fullFold if details else None, len(result.observationIds),
                               len(result.reflectionIds), details is None, gap_safe=boundary)
