"""Recall by query (SPEC §13, "The agent's tools and commands"): ``recall`` given words instead of an
id. Ids still answer exactly as in §6 (om_core.recall.evidence); anything else is a query.

Ranking: om's BM25 over the search index (om_core.recall.search); with ``recallEmbeddings`` on and
the embeddings extra installed, cosine similarity over the documents' embeddings
(om_core.recall.vectors) is fused in by reciprocal rank fusion. A document holding one of the query's
identifiers (a path, a file name, a snake_case name: a term joined by ``_ . + - / : @ #``) ranks
before the rest: such a term means exactly itself, and similarity has nothing to add to it.

Order: hits from the session's branch first (its memory and its transcript, what a compaction hid
included), then from its project (the project's other sessions and the project memory); without a
session, everything in one list. Each hit carries its memory id (or entry id) so the next call can
recall it exactly.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from om_core.store.db import named_rows

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

RRF_K = 60  # the usual constant: a rank's weight falls slowly, so both lists count
CANDIDATES = 200  # candidates each ranking gives the fusion
HEX_PREFIX = re.compile(r"[0-9a-f]{1,12}")

Kind = Literal["observation", "reflection", "entry", "project_reflection"]


class QueryHit(BaseModel):
    rank: int
    where: Literal["branch", "project", "everywhere"]  # the session's own branch, its project, or all
    kind: Kind
    session_id: str | None
    project_id: str | None
    memory_id: str | None  # an observation's or reflection's id: recall(memory_id) gives its evidence
    entry_id: str | None  # a source entry's id (an entry hit)
    memory_ids: list[str] = Field(default_factory=list)  # memory citing the entry, or a reflection's support
    source_entry_ids: list[str] = Field(default_factory=list)
    exact_identifier: bool = False  # holds one of the query's identifiers
    keyword_rank: int | None = None
    semantic_rank: int | None = None
    similarity: float | None = None
    score: float
    text: str  # redacted as in compaction summaries; an excerpt for a long entry


class QueryRecall(BaseModel):
    query: str
    session_id: str | None = None
    project_id: str | None = None
    mode: Literal["keyword", "fused"]
    embeddings_wanted: bool = False  # recallEmbeddings on (or asked for)
    embeddings: str | None = None  # why similarity was not fused in (off, extra absent), or None
    hits: list[QueryHit] = Field(default_factory=list)
    unindexed: int = 0  # documents the keyword index or the embeddings lack (another writer runs)

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def is_query(text: str) -> bool:
    """Whether ``om recall``'s argument is a query: anything but a memory id or a hex prefix of one
    (those answer exactly as in SPEC §6)."""
    return not HEX_PREFIX.fullmatch(text)


Key = tuple[str, str, str]  # doc_kind, scope_id, doc_id


def _fuse(keyword: list[dict], semantic: list[dict]) -> dict[Key, dict[str, Any]]:
    fused: dict[Key, dict[str, Any]] = {}
    for row in keyword:
        key = (row["doc_kind"], row["scope_id"], row["doc_id"])
        fused.setdefault(key, {"score": 0.0})
        fused[key]["keyword_rank"] = int(row["rank"])
        fused[key]["score"] += 1.0 / (RRF_K + int(row["rank"]))
    for row in semantic:
        key = (row["doc_kind"], row["scope_id"], row["doc_id"])
        fused.setdefault(key, {"score": 0.0})
        fused[key]["semantic_rank"] = int(row["rank"])
        fused[key]["similarity"] = float(row["similarity"])
        fused[key]["score"] += 1.0 / (RRF_K + int(row["rank"]))
    return fused


def _text(row: dict[str, Any], query: str) -> str:
    from om_core.recall.search import snippet

    if row["doc_kind"] != "entry":
        return row["content"] or ""
    from om_core.pi.session import loads_line
    from om_core.pi.source_text import entry_text

    try:
        text = entry_text(row["entry_type"], loads_line(row["raw"])) if row["raw"] is not None else ""
    except Exception:  # a line that renders no text shows nothing, never fails the recall
        text = ""
    return snippet(text.encode("utf-8", "replace").decode("utf-8"), query, 400)


def recall_query(ws: Workspace, text: str, session: str | None = None, leaf: str | None = None, *,
                 limit: int = 10, embeddings: bool | None = None) -> QueryRecall:
    """The best ``limit`` hits for ``text``: the session's branch (ending at ``leaf``, else its current
    leaf) first, then its project; everything when no session is given. ``embeddings`` overrides the
    ``recallEmbeddings`` setting."""
    from om_core.errors import InvalidArgument
    from om_core.recall.search import catch_up
    from om_core.redaction.redact import redact
    from om_core.store.catalog import resolve_session, resolve_tip

    if not text.strip():
        raise InvalidArgument("the query is empty")
    want = ws.settings.recallEmbeddings if embeddings is None else embeddings
    model, why = None, "recallEmbeddings is off"
    behind = catch_up(ws)
    if want:
        from om_core.recall import vectors

        model, why = vectors.embedder(), vectors.unavailable()
        if model is not None:
            behind += vectors.catch_up_vectors(ws, model)
    vec = model.embed([text])[0] if model is not None else None

    with ws.read() as con:
        sid = resolve_session(con, session) if session is not None else None
        tip = resolve_tip(con, sid, leaf) if sid is not None else None
        pid = None
        if sid is not None:
            found = named_rows(con, "query_session_project", {"session_id": sid})
            pid = found[0]["project_id"] if found else None
        # one ranking over the widest scope asked (the project, else the session, else all), split below
        scope = {"project": pid, "session": sid if pid is None else None}
        keyword = named_rows(con, "query_keyword_ranks", {"query": text, **scope, "limit": CANDIDATES})
        semantic = named_rows(con, "query_semantic_ranks", {"vec": vec, "model": model.name, **scope,
                                                            "limit": CANDIDATES}) if model is not None else []
        fused = _fuse(keyword, semantic)
        scopes = sorted({k[1] for k in fused})
        exact = {(r["doc_kind"], r["scope_id"], r["doc_id"])
                 for r in named_rows(con, "query_identifier_holders", {"query": text, "scopes": scopes})}
        on_branch = ({(r["doc_kind"], r["doc_id"]) for r in named_rows(con, "query_branch_documents",
                                                                       {"session_id": sid, "tip": tip})}
                     if sid is not None else set())

        def where(key: Key) -> str:
            if sid is None:
                return "everywhere"
            return "branch" if key[1] == sid and (key[0], key[2]) in on_branch else "project"

        # the session's documents off its branch belong to another conversation: left out
        keys = [k for k in fused if not (sid is not None and k[1] == sid and where(k) == "project")]
        keys.sort(key=lambda k: (where(k) != "branch", k not in exact, -fused[k]["score"], k))
        keys = keys[:limit]
        details = {(r["doc_kind"], r["scope_id"], r["doc_id"]): r for r in named_rows(con, "query_documents", {
            "kinds": [k[0] for k in keys], "scopes": [k[1] for k in keys], "ids": [k[2] for k in keys]})}

    hits = []
    for rank, key in enumerate(keys, 1):
        row, score = details[key], fused[key]
        kind = key[0]
        hits.append(QueryHit(
            rank=rank, where=where(key), kind=kind,
            session_id=None if kind == "project_reflection" else key[1], project_id=row["project_id"],
            memory_id=None if kind == "entry" else key[2], entry_id=key[2] if kind == "entry" else None,
            memory_ids=list(row["memory_ids"] or []),
            source_entry_ids=[key[2]] if kind == "entry" else list(row["source_entry_ids"] or []),
            exact_identifier=key in exact, keyword_rank=score.get("keyword_rank"),
            semantic_rank=score.get("semantic_rank"), similarity=score.get("similarity"),
            score=round(score["score"], 6), text=redact(_text(row, text))))
    return QueryRecall(query=text, session_id=sid, project_id=pid, mode="fused" if model is not None else "keyword",
                       embeddings_wanted=want,
                       embeddings=None if model is not None else why, hits=hits, unindexed=behind)


def tool_text(result: QueryRecall) -> str:
    """The hits as the model reads them: one line each with the id to recall next."""
    if not result.hits:
        return f"No memory or transcript matched {result.query!r}."
    lines = [f"Memory and transcript matching {result.query!r}, best first (recall an id for its exact evidence):"]
    labels = {"branch": "this session", "project": "project", "everywhere": "memory"}
    for hit in result.hits:
        where = labels[hit.where]
        if hit.kind == "project_reflection":
            where = f"project {hit.project_id}"
        elif hit.where == "project":
            where = f"session {hit.session_id}"
        if hit.kind == "entry":
            cited = f" cited by {', '.join(hit.memory_ids)}" if hit.memory_ids else ""
            label = f"entry {hit.entry_id} ({where}){cited}"
        else:
            label = f"[{hit.memory_id}] {hit.kind.replace('_', ' ')} ({where})"
        lines.append(f"{hit.rank}. {label}: {' '.join(hit.text.split())}")
    if result.embeddings_wanted and result.mode == "keyword":
        lines.append(f"(keyword ranking only: {result.embeddings})")
    return "\n".join(lines)


def tool_result(result: QueryRecall) -> dict[str, Any]:
    """The ``recall`` tool's ``{content, details}`` for a query."""
    return {"content": [{"type": "text", "text": tool_text(result)}],
            "details": {"status": "ok" if result.hits else "not_found", **result.as_json()}}
