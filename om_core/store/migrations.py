"""The data steps of schema migrations, frozen as they were when each migration was written.

A migration whose new table holds rows derived from stored data derives them here, in the
migration's own transaction (``om_core.store.db.apply_migrations``). Each step uses only code and
queries of its own (``m004_…`` in sql/queries/db.sql), never today's ingest or tree code: an old
database then migrates to the same rows whatever the current code has become, and db.py imports
nothing above it (the 007 step still uses today's Pi estimate: the migration exists to apply it).
"""

from __future__ import annotations

from typing import Any

import duckdb

from om_core.pi.session import loads_line
from om_core.store.sqlfiles import query
from om_core.pi.tokens import estimate_message_tokens


def _named_rows(cursor: Any) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


# ------------------------------------------------------------------ 004: entry_tree


def derive_entry_tree_004(con: duckdb.DuckDBPyConnection) -> None:
    """Migration 004: ``entry_tree`` rows for every session stored before it (they had
    branch_entries rows instead), derived from the stored entries' ids, parents and lines."""
    sessions = _named_rows(con.execute(query("m004_sessions_without_tree")))
    for session in sessions:
        entries = _named_rows(con.execute(query("m004_session_entries"), {"session_id": session["session_id"]}))
        tree = entry_tree_004(entries)
        if tree["entry_id"]:
            con.execute(query("m004_insert_entry_tree"), {"session_id": session["session_id"], **tree})


def entry_tree_004(entries: list[dict[str, Any]]) -> dict[str, list]:
    """The entry_tree columns of one session, as migration 004 defines them.

    ``entries`` (entry_id, parent_id, line_no) in file order. A parent that is not in the session
    makes its child a root; each parent cycle is cut once, at the child whose parent does not come
    before it in the file (the first such child). Entries are numbered in depth-first preorder,
    roots and children in file order; ``last`` is the largest number in an entry's subtree."""
    parent: dict[str, str | None] = {}
    line: dict[str, int] = {}
    for e in entries:  # a later entry with the same id replaces the earlier one
        parent[e["entry_id"]] = e["parent_id"]
        line[e["entry_id"]] = e["line_no"]
    in_file = sorted(parent, key=line.__getitem__)
    for child in in_file:
        if parent[child] not in line:
            parent[child] = None
    walked: set[str] = set()
    for start in in_file:
        walk: dict[str, int] = {}  # node -> its place on this walk
        node = start
        while node is not None and node not in walked and node not in walk:
            walk[node] = len(walk)
            node = parent[node]
        if node is not None and node in walk:
            ring = [n for n, place in walk.items() if place >= walk[node]]
            forward = [c for c in ring if line[parent[c]] >= line[c]]  # type: ignore[index]
            parent[min(forward or ring, key=line.__getitem__)] = None
        walked.update(walk)
    kids: dict[str, list[str]] = {}
    roots: list[str] = []
    for child in in_file:
        up = parent[child]
        (roots if up is None else kids.setdefault(up, [])).append(child)
    preorder: list[str] = []
    depth: dict[str, int] = {}
    todo = [(root, 0) for root in reversed(roots)]
    while todo:
        node, level = todo.pop()
        preorder.append(node)
        depth[node] = level
        todo.extend((k, level + 1) for k in reversed(kids.get(node, [])))
    size: dict[str, int] = {}
    for node in reversed(preorder):  # children before their parent
        size[node] = 1 + sum(size[k] for k in kids.get(node, []))
    return {
        "entry_id": preorder,
        "depth": [depth[n] for n in preorder],
        "pre": list(range(len(preorder))),
        "last": [i + size[n] - 1 for i, n in enumerate(preorder)],
        "is_leaf": [n not in kids for n in preorder],
    }


# ------------------------------------------------------------------ 007: Pi 1.6 estimates


def pi16_user_image_tokens_007(con: duckdb.DuckDBPyConnection) -> None:
    """Migration 007: user images count 1200 tokens each in Pi 1.6's estimate (tokens_pi)."""
    changed: set[str] = set()
    for row in _named_rows(con.execute(query("user_messages_with_images"))):
        try:
            message = loads_line(row["raw"]).get("message")
        except (ValueError, AttributeError):
            continue
        if not isinstance(message, dict):
            continue
        tokens = estimate_message_tokens(message)
        if tokens != row["tokens_pi"]:
            con.execute(query("set_entry_tokens_pi"), {"tokens_pi": tokens, "session_id": row["session_id"],
                                                       "entry_id": row["entry_id"]})
            changed.add(row["session_id"])
    for session_id in sorted(changed):
        con.execute(query("resum_session_tokens_pi"), {"session_id": session_id})


# Migrations whose new tables hold rows derived from stored data, by version.
DATA_STEPS = {4: derive_entry_tree_004, 7: pi16_user_image_tokens_007}
