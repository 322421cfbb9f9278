"""What a session's memory reads at each point of its current branch, to compare two ingests of one
session (before and after Pi rewrote its file): the plain fold (the ledger the workers read), the full
projection, the replayed projection, the compaction projection with the point as its first kept entry,
the compactions on the branch, and the four clocks; and recall of every observation and reflection id.
Entry ids are given back through ``translate`` so that a map of ids can be applied before comparing."""

from __future__ import annotations

from typing import Any

import duckdb

from om_core.memory.views import clocks
from om_core.recall.evidence import recall_in_session
from om_core.settings import Settings

_FOLD = ("SELECT item_kind, fold_order, id, content, ts, relevance, source_entry_ids, supporting_observation_ids, "
         "token_count, ledger_id, wm_pos{extra} FROM {macro} ORDER BY item_kind, fold_order")


def branch_ids(con: duckdb.DuckDBPyConnection, session_id: str) -> list[str]:
    return [r[0] for r in con.execute("SELECT entry_id FROM current_branches WHERE session_id = ? ORDER BY position",
                                      [session_id]).fetchall()]


def translate(value: Any, mapping: dict[str, str]) -> Any:
    """``value`` with every string that is a key of ``mapping`` replaced (ids are opaque strings)."""
    if isinstance(value, str):
        return mapping.get(value, value)
    if isinstance(value, dict):
        return {k: translate(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [translate(v, mapping) for v in value]
    if isinstance(value, tuple):
        return tuple(translate(v, mapping) for v in value)
    return value


def _rows(con, sql: str, params: list) -> list[list]:
    return [list(r) for r in con.execute(sql, params).fetchall()]


def memory_at(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings) -> dict[str, Any]:
    p = [session_id, tip]
    return {
        "ledger_at": _rows(con, _FOLD.format(extra=", dropped", macro="ledger_at(?, ?)"), p),
        "full": _rows(con, _FOLD.format(extra="", macro="full_projection(?, ?, ?)"), [*p, tip]),
        "replayed": _rows(con, "SELECT item_kind, fold_order, id, source_entry_ids, compaction_id FROM "
                               "replayed_projection(?, ?) ORDER BY item_kind, fold_order", p),
        "compaction": _rows(con, _FOLD.format(extra=", full_fold", macro="compaction_projection(?, ?, ?, ?, false)"),
                            [*p, tip, settings.observationsPoolMaxTokens]),
        "compactions": _rows(con, "SELECT compaction_id, origin, folded, full_fold, first_kept_entry_id, anchor_pos, "
                                  "first_kept_pos, compaction_order FROM branch_compactions(?, ?) "
                                  "ORDER BY compaction_order", p),
        "clocks": {name: [c.tokens, c.tokens_pi, c.basis, c.watermark_entry_id, c.from_position, c.fallback]
                   for name, c in clocks(con, session_id, tip, settings).items()},
    }


def memory_at_every_point(con: duckdb.DuckDBPyConnection, session_id: str, settings: Settings,
                          every: int = 1) -> list[dict[str, Any]]:
    """``memory_at`` each ``every``-th entry of the current branch, and at its tip."""
    ids = branch_ids(con, session_id)
    points = sorted(set(range(0, len(ids), every)) | {len(ids) - 1})
    return [memory_at(con, session_id, ids[i], settings) for i in points]


def recalls(con: duckdb.DuckDBPyConnection, session_id: str) -> dict[str, Any]:
    """Recall of every observation and reflection id of the session, on its current branch."""
    tip = branch_ids(con, session_id)[-1]
    ids = [r[0] for r in con.execute("SELECT obs_id FROM observations WHERE session_id = ? UNION "
                                     "SELECT refl_id FROM reflections WHERE session_id = ? ORDER BY 1",
                                     [session_id, session_id]).fetchall()]
    return {i: recall_in_session(con, session_id, tip, i).model_dump(mode="json") for i in ids}
