"""Simulated compactions (SPEC §5, §9): what the extension would have folded at a boundary.

A compaction is a query: the compaction projection at F, rendered without any model, stored in
``om_internal.compactions`` with origin ``simulated`` and its ``om.folded`` details. When the projection is
empty nothing is persisted as memory; the row records that Pi's native summarizer would have run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from om_core.store import db as dbmod
from om_core.memory.gap_free_compaction import gap_free_compaction
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
    kept_first: str | None = None  # the F it was stored at (gap-free: moved back from first_kept); None: first_kept


def stored_simulation(con: Any, session_id: str, anchor: str, first_kept: str, trigger: str) -> dict[str, Any] | None:
    """The compaction an earlier run simulated at ``anchor`` with this plain cut and trigger, if any."""
    return dbmod.named_row(con, "simulated_compaction_by_seed", {
        "session_id": session_id, "anchor": anchor, "plain_first_kept": first_kept, "trigger": trigger})


def simulate_compaction(db: Any, session_id: str, *, tip: str, anchor: str, first_kept: str, trigger: str,
                        settings: Settings, run_id: str | None = None) -> SimulatedCompaction:
    """Fold the ledger as it stands at ``tip`` into a compaction at ``first_kept``, anchored at ``anchor``.
    With ``gapSafeCompaction`` (the default) it is the live hook's gap-free compaction (SPEC §13, without
    the catch-up: the replay's observer ran at its own turn ends): F moved back to the first source entry
    no observation covers, or declined to Pi's native summary."""
    seed = f"{trigger}\x00{anchor}\x00{first_kept}"
    with db.read() as con:
        existing = stored_simulation(con, session_id, anchor, first_kept, trigger)
    if existing is not None:
        return SimulatedCompaction(session_id, existing["compaction_id"], anchor, first_kept, trigger,
                                   existing["full_fold"], 0, 0, not existing["folded"], existed=True)
    notes, kept, gap_free = [], first_kept, None
    if settings.gapSafeCompaction:
        # the replay's world: its own earlier simulated compactions set M, as the extension's would have
        gap_free = gap_free_compaction(db, session_id, first_kept, tip, replayed=True)
        result, declined = gap_free.result, gap_free.declined
        if declined is not None and declined not in (DeclineReason.EMPTY_PROJECTION, DeclineReason.NOTHING_FITS):
            notes.append(f"gap-free: declined ({declined.value}): {gap_free.why(settings.retained_max_tokens)}")
        elif gap_free.decision.moved:
            kept = gap_free.first_kept
            notes.append(f"gap-free: first kept moved back from {first_kept} to {kept}; "
                         f"{gap_free.decision.retained_tokens} tokens retained")
    else:
        with db.read() as con:
            result = compact_at(con, session_id, tip, kept, settings, world=World.REPLAYED)
        declined = result.declined
    details = parse_folded(result.details()) if result is not None and result.summary is not None else None
    if declined is DeclineReason.EMPTY_PROJECTION:
        notes.append("projection empty: Pi's native summarizer would run (nothing persisted as memory)")
    elif declined is DeclineReason.NOTHING_FITS:
        notes.append(f"no record fits compactionSummaryMaxTokens {settings.summary_max_tokens}: Pi's native "
                     "summarizer would run (nothing persisted as memory)")
    elif details is None:
        notes.append("Pi's native summarizer would run (nothing persisted as memory)")
    elif result.leftOutObservations or result.leftOutReflections:
        notes.append(f"summary budget {result.summaryMaxTokens}: left out {result.leftOutObservations} "
                     f"observation(s), {result.leftOutReflections} reflection(s)")
    with db.write() as con, dbmod.transaction(con):
        compaction_id = store_simulated_compaction(
            con, session_id, anchor_entry_id=anchor, first_kept_entry_id=kept, details=details,
            summary=result.summary if details is not None else None, note="; ".join(notes) or None, trigger=trigger,
            run_id=run_id, seed=seed, gap_safe=gap_free is not None, plain_first_kept_entry_id=first_kept)
    return SimulatedCompaction(session_id, compaction_id, anchor, first_kept, trigger,
                               result.fullFold if details else None, len(result.observationIds) if details else 0,
                               len(result.reflectionIds) if details else 0, details is None, kept_first=kept)
