"""The search index's writer: the terms of every document (observations, reflections, source entries,
project reflections) kept in ``om_internal.search_documents`` and ``search_terms``, brought up to date
inside each writer's transaction. It sits with storage because every writer (ingest, the run, forget,
the project stage) keeps it; reading it is recall's (``om_core.recall.search``)."""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import pyarrow as pa

from om_core.store.db import named_rows
from om_core.store.sqlfiles import query


def _entry_texts(con: duckdb.DuckDBPyConnection, sessions: list[str]) -> pa.Table:
    """The texts of the source entries the index lacks, as ``om recall`` renders them. In Python, not
    SQL: it reads every line the ingest kept (deep nesting, lone surrogates) where DuckDB's JSON
    functions refuse some."""
    from om_core.pi.session import loads_line
    from om_core.pi.source_text import entry_text

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


def index_everything(con: duckdb.DuckDBPyConnection) -> None:
    """Index every session and project (a database written before the index existed)."""
    sessions = [r["session_id"] for r in named_rows(con, "all_session_ids", {})]
    projects = [r["project_id"] for r in named_rows(con, "all_project_ids", {})]
    refresh_search_index(con, sessions, projects)
