"""Each ingested session's project, detected at ingest: the facts of its working folder read from the
filesystem once (``om_core.store.repository`` says how a folder becomes a project), then every
session's project assigned again from those facts and the ``projects`` setting."""

from __future__ import annotations

from collections.abc import Mapping

import duckdb

from om_core.store.db import named_rows
from om_core.store.repository import ProjectFacts, project_of, resolve_facts
from om_core.store.sqlfiles import query


def record_session_projects(con: duckdb.DuckDBPyConnection, overrides: Mapping[str, str] | None = None,
                            session_ids: list[str] | None = None) -> int:
    """At ingest: resolve the sessions (``session_ids``, the ingest's own; None: all) that have no project
    facts yet (the filesystem, once each), then assign every session's project from its facts and
    ``overrides``. Returns the sessions resolved."""
    new = named_rows(con, "sessions_without_project", {"sessions": session_ids})
    for row in new:
        facts = resolve_facts(row["cwd"])
        project_id, how = project_of(facts, overrides)
        con.execute(query("insert_session_project"), {**facts.model_dump(), "session_id": row["session_id"],
                                                       "project_id": project_id, "how": how})
    for row in named_rows(con, "session_project_facts", {}):
        project_id, how = project_of(ProjectFacts(cwd=row["cwd"], git_root=row["git_root"],
                                                  git_remote=row["git_remote"]), overrides)
        if (project_id, how) != (row["project_id"], row["how"]):
            con.execute(query("assign_session_project"), {"session_id": row["session_id"],
                                                          "project_id": project_id, "how": how})
    return len(new)
