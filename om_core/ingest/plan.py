"""What to read of a file, decided from its ``session_files`` row and the file on disk.

* new file: read it all;
* grown file (Pi appends): the stored hash of the ingested prefix still matches, so only the new
  lines are read, the parser going on from its stored state;
* rewritten file (Pi rewrites whole files when it migrates them): the prefix hash differs, so the
  session's rows are replaced;
* unchanged file: nothing happens (``touch`` when only its mtime moved).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb

from om_core.store import db as dbmod
from om_core.ingest.files import SessionFileRow, hash_prefix, session_file_row
from om_core.pi.session import ParserState, SessionHeader
from om_core.store.sqlfiles import query


@dataclass(slots=True)
class Plan:
    """What to do with a file, decided from its ``session_files`` row and the file on disk."""

    path: Path
    stat: os.stat_result
    row: SessionFileRow | None
    action: str  # new | afresh | unchanged | touch | appended | rewritten
    offset: int = 0  # appended: where the new lines start
    line_no: int = 0
    state: ParserState | None = None
    hasher: Any = None

    @property
    def key(self) -> str:
        return str(self.path)

    @property
    def reads(self) -> bool:
        return self.action not in ("unchanged", "touch")


def plan_file(con: duckdb.DuckDBPyConnection, path: Path) -> Plan:
    """Decide what to do with ``path``. Only reads: ``con`` may be a cursor beside the writing connection
    (a file's row is changed by nothing but the ingest of that file)."""
    stat = path.stat()
    row = session_file_row(con, str(path))
    if row is None:
        return Plan(path, stat, row, "new")
    if stat.st_size == row.size_bytes and stat.st_mtime_ns == row.mtime_ns and row.status != "duplicate_session":
        return Plan(path, stat, row, "unchanged")
    if row.status != "ingested":
        # Never became a session (no header, or a copy of another file): read it afresh. A copy
        # is looked at every time, since the file it copies may have gone (cheap: one line).
        return Plan(path, stat, row, "afresh")
    done_bytes = row.ingested_bytes
    hasher = hash_prefix(path, done_bytes) if stat.st_size >= done_bytes else None
    if hasher is None or hasher.hexdigest() != row.prefix_sha256:
        return Plan(path, stat, row, "rewritten")
    if stat.st_size == done_bytes:
        return Plan(path, stat, row, "touch")
    state = state_from_json(row.parser_state)
    if state.version < 2 and state.session_id:
        ids = dbmod.rows_as_dicts(con.execute(query("v1_ids_by_index_upto"),
                                              {"session_id": state.session_id, "line_no": row.ingested_lines}))
        for minted in ids:
            state.ids_by_index[minted["entry_index"]] = minted["entry_id"]
            state.minted_ids.add(minted["entry_id"])
    return Plan(path, stat, row, "appended", done_bytes, row.ingested_lines, state, hasher)


def state_to_json(state: ParserState) -> str:
    """The parser state a file's row keeps (the v1 id maps are rebuilt from the stored entries)."""
    data = {k: v for k, v in asdict(state).items() if k not in ("minted_ids", "ids_by_index", "header")}
    data["header"] = state.header.model_dump(mode="json") if state.header else None
    return json.dumps(data)


def state_from_json(text: str | None) -> ParserState:
    data = json.loads(text) if text else {}
    header = data.pop("header", None)
    state = ParserState(**{k: v for k, v in data.items() if k in ParserState.__dataclass_fields__})
    state.header = SessionHeader(**header) if header else None
    return state
