"""The dropper's guard (om's, beyond SPEC §8): which uncited critical observations it keeps."""

from __future__ import annotations

import duckdb

from om_core.memory.views import CoveredObservation
from om_core.store.sqlfiles import query
from om_core.workers.checks import USER_ROLES

# The dropper's guard keeps uncited critical observations of the user's own words, newest first, up
# to this share of the pool's target tokens (the newest one always); older ones beyond it go by the
# ordinary safety order (critical last), so the guard can never pin the pool.
CRITICAL_GUARD_SHARE = 0.5


def guarded_critical(con: duckdb.DuckDBPyConnection, session_id: str, tip: str,
                     covered: list[CoveredObservation], target_tokens: int) -> frozenset[str]:
    """The uncited critical observations the dropper's guard keeps: those citing an entry in the user's
    own words (a message, a command the user ran), newest first, within ``CRITICAL_GUARD_SHARE`` of
    ``target_tokens`` (the newest one always)."""
    candidates = [c.observation for c in covered if c.coverage == "none" and c.observation.relevance == "critical"]
    ids = sorted({i for o in candidates for i in o.sourceEntryIds})
    if not ids:
        return frozenset()
    found = con.execute(query("entry_roles"), {"session_id": session_id, "tip": tip, "ids": ids}).fetchall()
    users = {entry_id for entry_id, role in found if role in USER_ROLES}
    kept, tokens = [], 0.0
    for o in reversed(candidates):  # newest first
        if not users & set(o.sourceEntryIds):
            continue
        if kept and tokens + o.tokenCount > CRITICAL_GUARD_SHARE * target_tokens:
            break  # the newest is kept whatever its size: the user's latest word is never unguarded
        kept.append(o.id)
        tokens += o.tokenCount
    return frozenset(kept)
