"""Search over all memory (issue 35): observations, reflections, source entries and project
reflections, ranked by BM25.

The index is a terms table in the database (``om_internal.search_documents``, ``search_terms``), kept up
to date by the writers: every ingest indexes what it added to its sessions (and drops what a rewrite
took away), every run what it appended, ``om forget`` and the project stage theirs
(``refresh_search_index``). Terms and BM25 are SQL (``sql/views/090_search.sql``): a search reads the
index and never writes, so it works during a run like ``om sql``.

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
import pyarrow as pa
from pydantic import BaseModel, Field

from om_core.recall.kinds import SearchKind
from om_core.store.db import named_rows, scalar
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

def _entry_texts(con: duckdb.DuckDBPyConnection, sessions: list[str]) -> pa.Table:
    """The texts of the source entries the index lacks, as ``om recall`` renders them. In Python, not
    SQL: it reads every line the ingest kept (deep nesting, lone surrogates) where DuckDB's JSON
    functions refuse some."""
    from om_core.pi.session import loads_line
    from om_core.recall.source_text import entry_text

    rows = named_rows(con, "search_missing_entries", {"sessions": sessions})
    texts = []
    for row in rows:
        try:
            text = entry_text(row["entry_type"], loads_line(row["raw"]))
        except Exception:  # an entry that renders no text is indexed without terms, never fatal
            text = ""
        texts.append(text.encode("utf-8", "replace").decode("utf-8"))  # lone surrogates: not UTF-8
    return pa.table({"doc_kind": pa.array(["entry"] * len(rows), pa.string()),
                     "scope_id": pa.array([r["session_id"] for r in rows], pa.string()),
                     "doc_id": pa.array([r["entry_id"] for r in rows], pa.string()),
                     "text": pa.array(texts, pa.string())})


def refresh_search_index(con: duckdb.DuckDBPyConnection, session_ids: Iterable[str] = (),
                         project_ids: Iterable[str] = ()) -> None:
    """Bring the index up to date for these sessions and projects (what a write touched), and drop
    the documents of sessions and projects that are gone. Call inside the writer's transaction."""
    sessions, projects = sorted(set(session_ids)), sorted(set(project_ids))
    con.execute(query("search_drop_gone_scopes"))
    if sessions or projects:
        con.execute(query("search_wanted_keys"), {"sessions": sessions, "projects": projects})
        con.execute(query("search_drop_unwanted"), {"sessions": sessions, "projects": projects})
        con.register("search_entry_batch", _entry_texts(con, sessions))
        try:
            con.execute(query("search_new_texts"))
        finally:
            con.unregister("search_entry_batch")
        con.execute(query("search_insert_docs"))
        con.execute(query("search_insert_terms"))
        con.execute(query("search_done"))
    con.execute(query("search_drop_gone_terms"))


def refresh_session_index(ws: Workspace, session_ids: Iterable[str]) -> None:
    """The index (and the vectors, when recall by meaning is on) brought up to date for these sessions
    in one write: what an ingest told not to index (``ingest(..., index=False)``) left for later."""
    from om_core.store.db import transaction

    with ws.write() as con, transaction(con):
        refresh_search_index(con, session_ids)
        if ws.settings.recallEmbeddings:
            from om_core.recall.vectors import embedder, refresh_vectors

            refresh_vectors(con, embedder())


def index_everything(con: duckdb.DuckDBPyConnection) -> None:
    """Index every session and project (a database written before the index existed)."""
    sessions = [r["session_id"] for r in named_rows(con, "all_session_ids", {})]
    projects = [r["project_id"] for r in named_rows(con, "all_project_ids", {})]
    refresh_search_index(con, sessions, projects)


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
    from om_core.store import writer_lock
    from om_core.store.db import transaction
    from om_core.errors import DatabaseBusy

    with ws.read() as con:
        behind = int(scalar(con, "search_unindexed", {}) or 0)
    if not behind:
        return 0
    try:
        with ws.one_writer("search (indexing)") if ws.path is None else \
                writer_lock.one_writer(ws.path, "search (indexing)", 0.05):
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
            from om_core.project.repository import resolve_project

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
