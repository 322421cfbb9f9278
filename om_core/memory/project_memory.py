"""Project memory: the project ledger, its fold, and what one project shows.

A project's ledger is append-only like a session's (``om_internal.project_ledger``): records of
reflections (``om.project.reflections.recorded``: id, one line of content, the session memory ids it
rests on) and of retirements (``om.project.reflections.retired``: a superseded reflection, one the
project stage retired, or one a user forgot). Its fold is SPEC §3's, on these records in append
order (``project_fold`` in ``sql/views/080_projects.sql``; ``tests/project_oracle.py`` is its
plain-Python reference): the first record of an id wins, a retired id is a tombstone. Each record's
watermark is the session ledger's record order its stage read through (``covers_up_to_seq``).
The stage that writes it is ``om_core.project.stage``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import duckdb
from pydantic import BaseModel, Field

from om_core.store.db import named_rows, scalar
from om_core.memory.render import render_summary
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

PROJECT_REFLECTIONS_RECORDED = "om.project.reflections.recorded"
PROJECT_REFLECTIONS_RETIRED = "om.project.reflections.retired"


class ProjectReflection(BaseModel):
    id: str
    content: str
    supportingIds: list[str]  # session memory ids (reflections, critical observations) of the project's sessions
    tokenCount: float

    def line(self) -> str:
        return f"[{self.id}] {self.content}"


class Retirement(BaseModel):
    id: str
    reason: str


def mint_project_ledger_id(con: duckdb.DuckDBPyConnection, project_id: str, seed: str) -> str:
    """An 8-hex record id unused in the project's ledger."""
    salt = 0
    while True:
        candidate = hashlib.sha256(f"{project_id}\x00{seed}\x00{salt}".encode()).hexdigest()[:8]
        if not scalar(con, "project_ledger_id_taken", {"project_id": project_id, "id": candidate}):
            return candidate
        salt += 1


def append_project_records(con: duckdb.DuckDBPyConnection, project_id: str, *, reflections: list[ProjectReflection],
                           retirements: list[Retirement], covers_up_to_seq: int, origin: str = "pipeline",
                           run_id: str | None = None, stage: str = "project",
                           stage_key: str | None = None) -> list[str]:
    """Append a stage's records (reflections, then retirements); the caller owns the transaction.
    Returns the ledger ids appended."""
    appended = []
    for kind, items in ((PROJECT_REFLECTIONS_RECORDED, reflections), (PROJECT_REFLECTIONS_RETIRED, retirements)):
        if not items:
            continue
        ledger_id = mint_project_ledger_id(con, project_id, f"{stage_key or ''}\x00{kind}\x00{items[0].id}")
        con.execute(query("insert_project_record"), {
            "project_id": project_id, "ledger_id": ledger_id, "kind": kind, "covers_up_to_seq": covers_up_to_seq,
            "origin": origin, "run_id": run_id, "stage": stage, "stage_key": stage_key})
        for i, item in enumerate(items):
            if isinstance(item, ProjectReflection):
                con.execute(query("insert_project_reflection"), {
                    "project_id": project_id, "ledger_id": ledger_id, "item_index": i, "refl_id": item.id,
                    "content": item.content, "supporting_ids": item.supportingIds, "token_count": float(item.tokenCount)})
            else:
                con.execute(query("insert_project_retirement"), {
                    "project_id": project_id, "ledger_id": ledger_id, "item_index": i, "refl_id": item.id,
                    "reason": item.reason})
        appended.append(ledger_id)
    return appended


def _reflection(row: dict[str, Any]) -> ProjectReflection:
    count = row["token_count"]
    return ProjectReflection(id=row["id"], content=row["content"], supportingIds=list(row["supporting_ids"]),
                             tokenCount=int(count) if float(count).is_integer() else count)


def current_reflections(con: duckdb.DuckDBPyConnection, project_id: str) -> list[ProjectReflection]:
    """The project's memory: its current reflections in fold order."""
    return [_reflection(r) for r in named_rows(con, "project_memory_rows", {"project_id": project_id})]


class FoldedReflection(BaseModel):
    reflection: ProjectReflection
    retired: bool
    retired_reason: str | None = None


def project_fold(con: duckdb.DuckDBPyConnection, project_id: str) -> list[FoldedReflection]:
    """Every reflection the project ledger recorded (first occurrence), retired ones marked."""
    return [FoldedReflection(reflection=_reflection(r), retired=bool(r["retired"]), retired_reason=r["retired_reason"])
            for r in named_rows(con, "project_fold_rows", {"project_id": project_id})]


PROJECT_SECTION = "## Project memory"
PROJECT_SECTION_NOTE = ("Durable lessons of earlier sessions in this repository, each resting on their memory ids "
                        "(recall any id for its evidence):")


def project_section(reflections: list[ProjectReflection], max_tokens: float) -> str | None:
    """The project's memory as a summary section, newest reflections kept first within ``max_tokens``
    and shown in fold order; None when there is none."""
    kept: list[ProjectReflection] = []
    used = 0.0
    for r in reversed(reflections):
        if used + r.tokenCount > max_tokens:
            continue
        kept.append(r)
        used += r.tokenCount
    if not kept:
        return None
    kept.reverse()
    return PROJECT_SECTION + "\n" + PROJECT_SECTION_NOTE + "\n" + "\n".join(r.line() for r in kept)


def compaction_project_section(con: duckdb.DuckDBPyConnection, session_id: str, tip: str,
                               settings: Any) -> str | None:
    """The project memory section a compaction of the session carries: when
    ``projectMemoryInCompaction`` is on and this is the session's first compaction (no compaction the
    session file holds lies on the branch); None otherwise. The compaction service renders it
    (``om_core.memory.compaction``); an empty projection stays empty, so Pi's own summary of the
    conversation is never replaced by project memory alone."""
    if not settings.projectMemoryInCompaction:
        return None
    if scalar(con, "file_compactions_on_branch", {"session_id": session_id, "tip": tip}):
        return None
    project_id = scalar(con, "project_of_session", {"session_id": session_id})
    if project_id is None:
        return None
    return project_section(current_reflections(con, project_id), settings.projectMemoryMaxTokens)


class ProjectView(BaseModel):
    """`om project`: one project, its sessions and its memory."""

    project_id: str
    name: str
    how: str
    git_roots: list[str] = Field(default_factory=list)
    git_remote: str | None = None
    sessions: list[dict[str, Any]] = Field(default_factory=list)
    reflections: list[ProjectReflection] = Field(default_factory=list)
    retired: list[FoldedReflection] = Field(default_factory=list)
    new_tokens: float = 0  # the project stage's clock: input recorded since it last read
    threshold: int = 0
    offline: bool = False  # the offline baseline (extractive rules, no model) wrote some of it

    def summary(self) -> str | None:
        return render_summary([r.line() for r in self.reflections], [])

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def show_project(ws: Workspace, ref: str | None = None) -> ProjectView:
    """The project ``ref`` names (an id, a name, a folder; default the current directory)."""
    from om_core.store.repository import resolve_project

    with ws.read() as con:
        project = resolve_project(con, ref, ws.settings.projects)
        folded = project_fold(con, project.project_id)
        sessions = named_rows(con, "project_session_tips", {"project_id": project.project_id})
        growth = named_rows(con, "project_growth_of", {"project_id": project.project_id})
        offline = bool(scalar(con, "project_offline", {"project_id": project.project_id}))
    return ProjectView(offline=offline, project_id=project.project_id, name=project.name, how=project.how,
                       git_roots=project.git_roots, git_remote=project.git_remote,
                       sessions=[{"session_id": s["session_id"], "file_path": s["file_path"],
                                  "started_at": s["started_at"].isoformat() if s["started_at"] else None}
                                 for s in sessions],
                       reflections=[f.reflection for f in folded if not f.retired],
                       retired=[f for f in folded if f.retired],
                       new_tokens=float(growth[0]["new_tokens"]) if growth else 0.0,
                       threshold=ws.settings.projectReflectAfterTokens)
