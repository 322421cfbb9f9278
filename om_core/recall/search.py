"""Search over all memory: observations, reflections, source entries and project
reflections, ranked by BM25.

The index is a terms table in the database (``om_internal.search_documents``, ``search_terms``), kept up
to date by the writers: every ingest indexes what it added to its sessions (and drops what a rewrite
took away), every run what it appended, ``om forget`` and the project stage theirs
(``refresh_search_index``, in ``om_core.store.search_index``). Terms and BM25 are SQL
(``sql/views/090_search.sql``): a search reads the index and never writes, so it works during a run
like ``om sql``.

DuckDB's own full-text extension (``fts``) is not used: DuckDB installs extensions from its own
server at run time, which om never reaches, and the only registry copies (PyPI's
``duckdb-extension-fts``, ``duckdb-ext-fts``) are built for older DuckDB versions than the one om
runs on, which refuses to load them. Its index is also rebuilt whole, where this one grows with each
write.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import duckdb
from pydantic import BaseModel, Field

from om_core.recall.kinds import SearchKind
from om_core.store.db import named_rows, scalar
from om_core.store.search_index import index_everything

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


def refresh_session_index(ws: Workspace, session_ids: Iterable[str]) -> None:
    """The index (and the vectors, when recall by meaning is on) brought up to date for these sessions
    in one write: what an ingest told not to index (``ingest(..., index=False)``) left for later."""
    from om_core.store.db import transaction
    from om_core.store.search_index import refresh_search_index

    with ws.write() as con, transaction(con):
        refresh_search_index(con, session_ids)
        if ws.settings.recallEmbeddings:
            from om_core.recall.vectors import embedder, refresh_vectors

            refresh_vectors(con, embedder())


class SearchHit(BaseModel):
    rank: int
    score: float
    kind: Literal["observation", "reflection", "entry", "project_reflection"]
    session_id: str | None
    project_id: str | None
    memory_id: str | None  # the observation's or reflection's id (None: an entry)
    entry_id: str | None  # the entry's id (an entry hit)
    source_entry_ids: list[str] = Field(default_factory=list)  # where the hit comes from
    memory_ids: list[str] = Field(default_factory=list)  # memory resting on the hit, or that it cites
    matched_terms: int
    text: str


class SearchResult(BaseModel):
    query: str
    project_id: str | None = None
    session_id: str | None = None
    hits: list[SearchHit] = Field(default_factory=list)
    unindexed: int = 0  # documents the index does not hold yet (until the next ingest or run)

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def catch_up(ws: Workspace) -> int:
    """Index what the index lacks (a database written before it existed, or by a writer that does not
    keep it), when no other process is writing: the writer lock is tried, not waited for. Returns the
    documents left unindexed (0 once caught up; more while another process writes)."""
    from om_core.store.db import transaction
    from om_core.errors import DatabaseBusy

    with ws.read() as con:
        behind = int(scalar(con, "search_unindexed", {}) or 0)
    if not behind:
        return 0
    try:
        with ws.one_writer("search (indexing)", busy_seconds=0.05):  # tried, not waited for
            with ws.write() as con, transaction(con):
                index_everything(con)
                return int(scalar(con, "search_unindexed", {}) or 0)
    except (DatabaseBusy, duckdb.Error):  # another writer, or a file this user may only read
        return behind


def search(ws: Workspace, text: str, *, project: str | None = None, session: str | None = None,
           limit: int = 20, raw: bool = False, kinds: list[SearchKind] | None = None) -> SearchResult:
    """The best ``limit`` hits for ``text``, in one project (its id, name or folder), one session, or
    everywhere, their texts' secrets redacted as in compaction summaries (``raw``: as stored). An index
    that lacks documents is brought up to date first when nobody else writes."""
    from om_core.store.catalog import resolve_session
    from om_core.errors import InvalidArgument

    if not text.strip():
        raise InvalidArgument("the query is empty")
    behind = catch_up(ws)
    with ws.read() as con:
        sid = resolve_session(con, session) if session is not None else None
        pid = None
        if project is not None:
            from om_core.store.repository import resolve_project

            pid = resolve_project(con, project, ws.settings.projects).project_id
        rows = named_rows(con, "search", {"query": text, "project": pid, "session": sid, "limit": limit,
                                          "kinds": [k.value for k in kinds] if kinds else None})
    from om_core.redaction.redact import redact

    hits = [SearchHit(**{**r, "source_entry_ids": list(r["source_entry_ids"] or []),
                         "memory_ids": list(r["memory_ids"] or []),
                         "text": (r["text"] or "") if raw else redact(r["text"] or "")}) for r in rows]
    return SearchResult(query=text, project_id=pid, session_id=sid, hits=hits, unindexed=behind)


def snippet(text: str, query: str, width: int = 160) -> str:
    """A one-line excerpt of ``text`` around the first place a query word occurs."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    lowered = flat.lower()
    spots = [lowered.find(w) for w in query.lower().split() if w and lowered.find(w) >= 0]
    at = min(spots) if spots else 0
    start = max(0, min(at - width // 3, len(flat) - width))
    piece = flat[start:start + width]
    return ("…" if start > 0 else "") + piece + ("…" if start + width < len(flat) else "")


class HitPlace(BaseModel):
    """Where a hit comes from, as a person reads it: its session's file (or short id) and the time of
    its latest source entry (None: a project reflection, or entries with no time)."""
    label: str
    time: str | None = None


def hit_places(ws: Workspace, hits: list[SearchHit]) -> list[HitPlace]:
    """Each hit's place, in the hits' order (the human listing's header line)."""
    from pathlib import PurePath

    from om_core.pi.session import file_label

    sessions = sorted({h.session_id for h in hits if h.session_id})
    keys = sorted({f"{h.session_id}/{e}" for h in hits if h.session_id
                   for e in ([h.entry_id] if h.entry_id else h.source_entry_ids)})
    with ws.read() as con:
        files = {r["session_id"]: r["file_path"] for r in named_rows(con, "search_hit_files", {"sessions": sessions})}
        times = {(r["session_id"], r["entry_id"]): r["ts"]
                 for r in named_rows(con, "search_hit_times", {"sessions": sessions, "keys": keys})}
    places = []
    for h in hits:
        if not h.session_id:
            places.append(HitPlace(label=f"project {h.project_id or ''}".strip()))
            continue
        file = files.get(h.session_id)
        name = file_label(PurePath(file).name, h.session_id) if file else ""
        label = h.session_id[:8] + (f" {name}" if name else "")
        stamps = [times[(h.session_id, e)] for e in ([h.entry_id] if h.entry_id else h.source_entry_ids)
                  if times.get((h.session_id, e)) is not None]
        places.append(HitPlace(label=label, time=max(stamps).strftime("%Y-%m-%d %H:%M") if stamps else None))
    return places
