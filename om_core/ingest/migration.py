"""Memory follows Pi's own rewrites of a session file (pi-sessions.md §1.5).

Pi 1.6 migrates a v1 or v2 file in place when it opens it, and ``pi --fork`` copies a file's entries
under a new session. om minted its own ids for v1 entries (SPEC §1) and anchored its records and
compactions to them, so after Pi's rewrite none of them would lie on a branch any more. Here the
rewritten (or copied) entries are compared with the ones om knew, in order: when they are the same
entries (each one's content equal once the keys the migration adds or renames are set aside, its id
Pi's, its parent the previous entry's new id for a v1 file or unchanged for a v2 one), each id om knew
maps to Pi's, and the references of what om appended are rewritten through that map, in the ingest's
transaction: record anchors and watermarks, observations' source entry ids, simulated compactions'
anchors and first kept entries (and their items' sources), the stages' tips and chunks. A fork copy
gets the source's records and simulated compactions the same way. Folds, projections, clocks and recall
then read the same memory at every point, and every query joins as before (nothing resolves through the
map; ``entry_id_map`` keeps it, for the ids that model requests, stage keys and earlier exports name).

Anything else (an entry that differs, one missing, another order) is no migration: the rewrite is
reported as before and the records stay, orphaned (om_core/ingest/rewrites.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from om_core.store import db as dbmod
from om_core.store.db import named_row
from om_core.pi.session import loads_line
from om_core.store.sqlfiles import query

# What Pi's migration adds or changes on an entry, set aside when comparing contents: ids and parent ids
# (v1 → v2), a compaction's firstKeptEntryIndex turned into firstKeptEntryId (compared through the map).
_SET_ASIDE = frozenset({"id", "parentId"})
_COMPACTION_SET_ASIDE = frozenset({"firstKeptEntryIndex", "firstKeptEntryId"})
_PAIRS_FETCH = 256


@dataclass(slots=True)
class Followed:
    """A rewrite om followed: the same entries, in the same order, under Pi's ids."""

    how: str  # migrated (in place, v1 or v2 → v3) | forked (a pi --fork copy of another session)
    from_session_id: str
    from_version: int
    entries: int  # the entries om knew, all found again
    appended: int  # entries after them (what Pi appended since)
    mapping: dict[str, str] = field(default_factory=dict)  # old id -> new id, where they differ


@dataclass(slots=True)
class NotFollowed:
    """Why a rewrite is no migration om can follow (then it is a rewrite as before), or a new session no
    copy of the one it names as its fork source."""

    reason: str
    how: str = "migrated"  # what was looked for: migrated | forked


def normalized(obj: Any, entry_type: str | None) -> Any:
    """An entry's content as Pi's migration leaves it, less what the migration adds: no id or parent id,
    a compaction without its first kept entry (compared apart), ``hookMessage`` as ``custom``, and
    numbers as JavaScript holds them (1 and 1.0 are one number; Pi writes what it parsed)."""
    if not isinstance(obj, dict):
        return _numbers(obj)
    aside = _SET_ASIDE | (_COMPACTION_SET_ASIDE if entry_type == "compaction" else frozenset())
    out = {k: _numbers(v) for k, v in obj.items() if k not in aside}
    message = out.get("message")
    if entry_type == "message" and isinstance(message, dict) and message.get("role") == "hookMessage":
        out["message"] = {**message, "role": "custom"}
    return out


def _numbers(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        number = float(value)
        return 0.0 if number == 0 else number if math.isfinite(number) else value
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    return value


def compare(pairs: Any, same_ids: bool) -> tuple[dict[str, str], int, int] | NotFollowed:
    """Walk (old, new) entry pairs in order (rows of query migration_pairs or fork_pairs). ``same_ids``:
    the ids must be kept (a v2 file, a copy of a v2 or v3 one); otherwise a v1 file's ids are Pi's new
    ones and its parents the chain of them. Returns the map (where ids differ), the entries matched and
    the entries appended after them."""
    mapping: dict[str, str] = {}
    new_ids: set[str] = set()
    matched = appended = 0
    previous_new: str | None = None
    for row in pairs:
        old_id, new_id = row["old_id"], row["new_id"]
        if old_id is None:  # past the entries om knew: what Pi (or the agent) appended since
            appended += 1
            continue
        if new_id is None:
            return NotFollowed(f"the file now holds {matched} of the {matched + _rest(pairs)} entries om knew")
        at = f"entry {matched + 1} ({old_id})"
        if row["old_type"] != row["new_type"]:
            return NotFollowed(f"{at} is a {row['new_type']} now, was a {row['old_type']}")
        if same_ids:
            if new_id != old_id or row["new_parent"] != row["old_parent"]:
                return NotFollowed(f"{at} has another id or parent now ({new_id})")
        elif row["new_parent"] != previous_new:
            return NotFollowed(f"{at} is not chained to the entry before it, as Pi's migration chains them")
        new_ids.add(new_id)
        if new_id != old_id:
            mapping[old_id] = new_id
        old_kept, new_kept = row["old_first_kept"], row["new_first_kept"]
        if old_kept is not None and mapping.get(old_kept, old_kept) != new_kept:
            return NotFollowed(f"{at}: a compaction that keeps another entry now")
        if old_kept is None and new_kept is not None and new_kept in new_ids:
            return NotFollowed(f"{at}: a compaction that keeps an entry now, none before")
        try:
            same = normalized(loads_line(row["old_raw"]), row["old_type"]) == normalized(
                loads_line(row["new_raw"]), row["new_type"])
        except (ValueError, RecursionError):
            same = False
        if not same:
            return NotFollowed(f"{at} changed")
        matched += 1
        previous_new = new_id
    return mapping, matched, appended


def _rest(pairs: Any) -> int:
    """Old entries left in the walk (each one missing from the new file)."""
    return 1 + sum(1 for row in pairs if row["old_id"] is not None)


def _pairs(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]):
    """The rows of a pairs query as dicts, a batch at a time (a long session's raw lines stay in DuckDB)."""
    cursor = con.execute(query(name), params)
    names = [d[0] for d in cursor.description]
    while rows := cursor.fetchmany(_PAIRS_FETCH):
        for row in rows:
            yield dict(zip(names, row))


# ------------------------------------------------------------------ in place: Pi's migration

def keep_replaced_entries(con: duckdb.DuckDBPyConnection, session_id: str) -> None:
    """Before a v1 or v2 session's rows are replaced (its file was rewritten): its entries are kept, so
    the new file can be compared with them (``follow_migration``). A snapshot a crash left stays."""
    con.execute(query("keep_replaced_entries"), {"session_id": session_id})


def follow_migration(con: duckdb.DuckDBPyConnection, session_id: str, run_id: str) -> Followed | NotFollowed | None:
    """After the file was read again: if the kept entries of the session are the same entries as the
    new file's first ones, re-anchor the session's own records to Pi's ids (in the caller's transaction).
    None: nothing was kept (the session was no v1/v2 one, or it is new)."""
    version = dbmod.scalar(con, "replaced_entries_version", {"session_id": session_id})
    if version is None:
        return None
    now = dbmod.scalar(con, "session_version", {"session_id": session_id})
    result = compare(_pairs(con, "migration_pairs", {"session_id": session_id}), same_ids=version >= 2) \
        if now is not None and now >= 3 else NotFollowed(f"the file is still v{now}: Pi's migration writes v3")
    con.execute(query("drop_replaced_entries"), {"session_id": session_id})
    if isinstance(result, NotFollowed):
        return result
    mapping, matched, appended = result
    followed = Followed("migrated", session_id, version, matched, appended, mapping)
    if mapping:
        _store_map(con, session_id, session_id, mapping, "migrated", run_id)
        for name in ("remap_ledger", "remap_observations", "remap_compactions", "remap_compaction_items",
                     "remap_stages"):
            _execute(con, name, {"session_id": session_id, "from_session_id": session_id, "run_id": run_id})
    return followed


def _execute(con: duckdb.DuckDBPyConnection, name: str, params: dict[str, Any]) -> None:
    """A named statement with the parameters it names (DuckDB refuses others)."""
    sql = query(name)
    con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql})


def _store_map(con: duckdb.DuckDBPyConnection, session_id: str, from_session_id: str, mapping: dict[str, str],
               how: str, run_id: str) -> None:
    table = pa.table({"old_id": pa.array(list(mapping), pa.string()),
                      "new_id": pa.array(list(mapping.values()), pa.string())})
    dbmod.insert_arrow(con, "id_map_batch", table, "insert_entry_id_map",
                       {"session_id": session_id, "from_session_id": from_session_id, "how": how, "run_id": run_id})


# ------------------------------------------------------------------ a copy: pi --fork

def follow_fork(con: duckdb.DuckDBPyConnection, session_id: str, parent_file: str | None,
                run_id: str) -> Followed | NotFollowed | None:
    """A new session whose header names the file it was forked from (``parentSession``): if that file's
    session is ingested, holds memory om appended, and its entries are this one's first entries, its
    records and simulated compactions are copied here under this session's ids. Once per session
    (a note says it was looked at), and never into a session with memory of its own (it was replayed
    itself). None: nothing to look at."""
    if not parent_file:
        return None
    source = named_row(con, "fork_source", {"session_id": session_id, "file_path": parent_file,
                                            "resolved_path": str(Path(parent_file).resolve())})
    if source is None or source["already_looked"] or source["has_own"]:
        return None
    from_sid, version = source["session_id"], source["version"]
    if not source["has_memory"]:
        return None
    result = compare(_pairs(con, "fork_pairs", {"session_id": session_id, "from_session_id": from_sid}),
                     same_ids=version >= 2)
    if isinstance(result, NotFollowed):
        return NotFollowed(f"not a copy of session {from_sid}: {result.reason}", "forked")
    mapping, matched, appended = result
    _store_map(con, session_id, from_sid, mapping, "forked", run_id)
    params = {"session_id": session_id, "from_session_id": from_sid, "run_id": run_id}
    for name in ("copy_fork_ledger", "copy_fork_observations", "copy_fork_reflections", "copy_fork_drops",
                 "copy_fork_reflection_drops", "copy_fork_compactions", "copy_fork_compaction_items"):
        _execute(con, name, params)
    return Followed("forked", from_sid, version, matched, appended, mapping)


def followed_counts(con: duckdb.DuckDBPyConnection, session_id: str, run_id: str) -> dict[str, int]:
    """What now stands on the session's entries: this project's records and simulated compactions (and
    how many of them this run's map re-anchored), and how many records are orphaned."""
    row = named_row(con, "followed_counts", {"session_id": session_id, "run_id": run_id})
    return {k: int(v or 0) for k, v in row.items()}
