"""Recall (SPEC §6): the exact evidence behind a memory id, from the branch's whole ledger history."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

import duckdb
from pydantic import BaseModel, Field

from om_core.store.catalog import resolve_session, resolve_tip
from om_core.store.db import named_column, named_rows, scalar
from om_core.errors import AmbiguousMemoryId
from om_core.ledger.records import is_memory_id, memory_references
from om_core.pi.session import loads_line
from om_core.pi.source_text import entry_text, minute, role_label

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

_HEX_PREFIX = re.compile(r"[0-9a-f]{1,11}")


class RecallSource(BaseModel):
    entry_id: str
    role: str
    ts: str
    text: str


class RecallObservation(BaseModel):
    id: str
    status: Literal["active", "dropped", "forgotten"]  # forgotten: by the user (om forget), in no fold
    content: str
    ts: str
    relevance: str
    ledger_id: str
    item_index: int = 0  # its place in that record's list
    matched: bool  # False: listed as a supporting observation of a matched reflection
    source_entry_ids: list[str]
    missing_source_entry_ids: list[str] = Field(default_factory=list)
    non_source_entry_ids: list[str] = Field(default_factory=list)
    sources: list[RecallSource] = Field(default_factory=list)
    session_id: str | None = None
    # supersession: the observations on the branch its content names as replaced (``(supersedes [id])``),
    # and those that name it
    supersedes: list[str] = Field(default_factory=list)
    superseded_by: list[str] = Field(default_factory=list)


class RecallReflection(BaseModel):
    id: str
    content: str
    supporting_observation_ids: list[str]
    ledger_id: str
    item_index: int = 0  # its place in that record's list
    session_id: str | None = None
    forgotten: bool = False  # the user forgot it (om forget): in no fold or compaction
    # dropped: a reflection drop on the branch tombstones it (SPEC §13): no longer active, still recallable
    status: Literal["active", "dropped", "forgotten"] = "active"


class RecallOrphan(BaseModel):
    """The id in a record of this project that lies on no branch: its source is gone (SPEC §2)."""

    id: str
    kind: Literal["observation", "reflection"]
    content: str
    session_id: str
    ledger_id: str
    reason: Literal["session_gone", "anchor_gone"]
    ts: str | None = None
    relevance: str | None = None
    source_entry_ids: list[str] = Field(default_factory=list)
    supporting_observation_ids: list[str] = Field(default_factory=list)

    @property
    def why(self) -> str:
        if self.reason == "session_gone":
            return f"session {self.session_id} is no longer in any session file"
        return f"the entries it was recorded after are no longer in the file of session {self.session_id}"


class RecallGroup(BaseModel):
    """The matches in one session's branch: collision and partial are judged here, within one branch."""

    session_id: str
    tip: str
    kind: Literal["observation", "reflection", "mixed"] | None = None
    collision: bool = False
    partial: bool = False
    observations: list[RecallObservation] = Field(default_factory=list)
    reflections: list[RecallReflection] = Field(default_factory=list)
    missing_supporting_observation_ids: list[str] = Field(default_factory=list)


class RecallProjectReflection(BaseModel):
    """A project reflection with this id, as its project's ledger recorded it."""

    id: str
    content: str
    supporting_ids: list[str]  # the session memory ids it rests on
    ledger_id: str
    item_index: int = 0
    status: Literal["current", "retired"] = "current"
    retired_reason: str | None = None


class RecallProject(BaseModel):
    """The id in one project's memory: its reflection, and each memory id it rests on recalled in the
    project's sessions holding it (each session's current branch, as SPEC §6 recalls across sessions)."""

    project_id: str
    reflections: list[RecallProjectReflection] = Field(default_factory=list)
    sessions: list[RecallGroup] = Field(default_factory=list)
    missing_supporting_ids: list[str] = Field(default_factory=list)  # recorded in none of its sessions now


class RecallResult(BaseModel):
    """Recall of one id. ``sessions`` groups the matches by session (SPEC §6); the flat lists hold the
    same items in session order, and kind/collision/partial sum up the groups: ``collision`` is true
    only when some one branch matched more than once, never for one content hashed alike in two
    sessions."""

    status: Literal["found", "orphaned", "not_found", "invalid_id"]  # orphaned: found only where its source is gone
    id: str
    kind: Literal["observation", "reflection", "mixed", "project_reflection"] | None = None
    collision: bool = False
    partial: bool = False
    observations: list[RecallObservation] = Field(default_factory=list)
    reflections: list[RecallReflection] = Field(default_factory=list)
    missing_supporting_observation_ids: list[str] = Field(default_factory=list)
    session_ids: list[str] = Field(default_factory=list)
    sessions: list[RecallGroup] = Field(default_factory=list)
    orphaned: list[RecallOrphan] = Field(default_factory=list)  # on no branch: kept, their source is gone
    projects: list[RecallProject] = Field(default_factory=list)  # the id as a project reflection
    message: str | None = None

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def redacted(result: RecallResult) -> RecallResult:
    """``result`` with every secret in its texts (observations, reflections, source entries, orphans)
    replaced by a marker, by the rules that redact compaction summaries (om_core.redaction.redact): what the
    ``recall`` tool hands a model, and what ``om recall`` prints unless ``--raw``. The stored session
    and ledger are unchanged."""
    from om_core.redaction.redact import redact, redact_line

    copy = result.model_copy(deep=True)
    observations = copy.observations + [o for g in copy.sessions for o in g.observations]
    for o in observations:
        o.content = redact_line(o.content)
        for source in o.sources:
            source.text = redact(source.text)
    for item in copy.reflections + [r for g in copy.sessions for r in g.reflections] + copy.orphaned:
        item.content = redact_line(item.content)
    for project in copy.projects:
        for r in project.reflections:
            r.content = redact_line(r.content)
        for group in project.sessions:
            for o in group.observations:
                o.content = redact_line(o.content)
                for source in o.sources:
                    source.text = redact(source.text)
            for r in group.reflections:
                r.content = redact_line(r.content)
    return copy


def _observation(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, row: dict[str, Any], matched: bool,
                 resolved: dict[str, dict[str, Any]]) -> RecallObservation:
    item = RecallObservation(
        id=row["id"], status=row["status"], content=row["content"], ts=row["ts"], relevance=row["relevance"],
        ledger_id=row["ledger_id"], item_index=row["item_index"], matched=matched, source_entry_ids=list(row["source_entry_ids"]), session_id=session_id,
    )
    for entry_id in dict.fromkeys(item.source_entry_ids):  # an id cited twice is one source (as the extension has it)
        info = resolved.get(entry_id)
        if info is None or info["position"] is None:
            item.missing_source_entry_ids.append(entry_id)
        elif not info["is_source"]:
            item.non_source_entry_ids.append(entry_id)
        else:
            obj = loads_line(info["raw"])
            role = role_label(info["entry_type"], obj, info.get("role"))
            item.sources.append(RecallSource(entry_id=entry_id, role=role,
                                             ts=minute(obj.get("timestamp")),
                                             text=entry_text(info["entry_type"], obj)))
    return item


def recall_in_session(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, memory_id: str) -> RecallResult:
    """Recall on the branch ending at ``tip`` of one session."""
    if not is_memory_id(memory_id):
        return RecallResult(status="invalid_id", id=memory_id,
                            message="a memory id is 12 lowercase hexadecimal characters")
    params = {"session_id": session_id, "tip": tip}
    obs_rows = named_rows(con, "recall_observations", {**params, "ids": [memory_id]})
    refl_rows = named_rows(con, "recall_reflections", {**params, "id": memory_id})
    supporting_ids: list[str] = []
    for r in refl_rows:
        for s in r["supporting_observation_ids"]:
            if s not in supporting_ids:
                supporting_ids.append(s)
    named = [i for r in obs_rows for i in memory_references(r["content"]) if i != memory_id]
    wanted = list(dict.fromkeys(supporting_ids + named))
    first_support = {r["id"]: r for r in named_rows(con, "recall_observations", {**params, "ids": wanted})
                     if r["occurrence"] == 1} if wanted else {}
    cited = {e for r in obs_rows for e in r["source_entry_ids"]} | {
        e for r in first_support.values() for e in r["source_entry_ids"]}
    resolved = {r["entry_id"]: r for r in named_rows(con, "resolve_entries", {**params, "ids": sorted(cited)})} if cited else {}

    result = RecallResult(status="found" if obs_rows or refl_rows else "not_found", id=memory_id,
                          session_ids=[session_id] if obs_rows or refl_rows else [])
    result.observations = [_observation(con, session_id, tip, r, True, resolved) for r in obs_rows]
    superseded_by = named_column(con, "recall_superseded_by", {**params, "id": memory_id}) if obs_rows else []
    for item in result.observations:
        item.supersedes = [i for i in memory_references(item.content) if i in first_support and i != memory_id]
        item.superseded_by = list(superseded_by)
    result.reflections = [RecallReflection(id=r["id"], content=r["content"], ledger_id=r["ledger_id"], item_index=r["item_index"],
                                           supporting_observation_ids=list(r["supporting_observation_ids"]),
                                           session_id=session_id, forgotten=bool(r["forgotten"]),
                                           status="forgotten" if r["forgotten"] else
                                           "dropped" if r["dropped"] else "active") for r in refl_rows]
    matched_ids = {(o.id, o.ledger_id) for o in result.observations}
    for sid in supporting_ids:
        row = first_support.get(sid)
        if row is None:
            result.missing_supporting_observation_ids.append(sid)
        elif (row["id"], row["ledger_id"]) not in matched_ids:
            result.observations.append(_observation(con, session_id, tip, row, False, resolved))
            matched_ids.add((row["id"], row["ledger_id"]))
    for sid in dict.fromkeys(named):  # what the recalled observation replaces, with its evidence
        row = first_support.get(sid)
        if row is not None and (row["id"], row["ledger_id"]) not in matched_ids:
            result.observations.append(_observation(con, session_id, tip, row, False, resolved))
            matched_ids.add((row["id"], row["ledger_id"]))
    _finish(result, session_id, tip)
    _add_orphaned(con, result, session_id)
    return result


def _add_orphaned(con: duckdb.DuckDBPyConnection, result: RecallResult, session_id: str | None) -> None:
    """The id's occurrences in records whose session file no longer holds their source: kept in the
    ledger, on no branch. Found only there, the id is ``orphaned`` and the message says why."""
    result.orphaned = [RecallOrphan(**row) for row in
                       named_rows(con, "recall_orphaned", {"session_id": session_id, "id": result.id})]
    if result.status == "not_found" and result.orphaned:
        result.status = "orphaned"
        result.message = (f"{result.id} is only in memory records whose source is gone (the session file was "
                          f"rewritten): {result.orphaned[0].why}")


def _kind(has_obs: bool, has_refl: bool) -> str | None:
    return "mixed" if has_obs and has_refl else "observation" if has_obs else "reflection" if has_refl else None


def _finish(result: RecallResult, session_id: str, tip: str) -> None:
    """Judge one branch's matches, and file them as that session's group."""
    has_obs = any(o.matched for o in result.observations)
    result.kind = _kind(has_obs, bool(result.reflections))
    result.collision = sum(o.matched for o in result.observations) + len(result.reflections) > 1
    result.partial = bool(result.missing_supporting_observation_ids) or any(
        o.missing_source_entry_ids or o.non_source_entry_ids for o in result.observations)
    if result.status == "not_found":
        result.message = f"no observation or reflection with id {result.id} on this branch"
    else:
        result.sessions = [RecallGroup(session_id=session_id, tip=tip, kind=result.kind, collision=result.collision,
                                       partial=result.partial, observations=result.observations,
                                       reflections=result.reflections,
                                       missing_supporting_observation_ids=result.missing_supporting_observation_ids)]


def expand_memory_id(con: duckdb.DuckDBPyConnection, ref: str, session_id: str | None = None) -> str | None:
    """The id a unique prefix of an observation or reflection id stands for (in one session, or in
    all), as a SESSION argument takes a unique prefix; None when no id starts with it. A whole id, or
    what is no hex prefix at all, is returned as given (recall judges it)."""
    if is_memory_id(ref) or not _HEX_PREFIX.fullmatch(ref):
        return ref
    ids = named_column(con, "memory_ids_by_prefix", {"prefix": ref, "session_id": session_id})
    if len(ids) > 1:
        shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
        raise AmbiguousMemoryId(f"{ref!r} starts several memory ids: {shown}; give more characters")
    return ids[0] if ids else None


def recall(ws: Workspace, memory_id: str, session: str | None = None, leaf: str | None = None) -> RecallResult:
    """Recall in one session (``--session``), or in every session, each on its own current branch.
    ``memory_id`` may be a unique prefix of the id (``expand_memory_id``)."""
    with ws.read() as con:
        sid = resolve_session(con, session) if session is not None else None
        expanded = expand_memory_id(con, memory_id, sid)
        if expanded is None:
            where = f"session {sid}" if sid else "any ingested session"
            return RecallResult(status="not_found", id=memory_id,
                                message=f"no observation or reflection id starts with {memory_id} in {where}")
        memory_id = expanded
        if sid is not None:
            one = recall_in_session(con, sid, resolve_tip(con, sid, leaf), memory_id)
            project = scalar(con, "project_of_session", {"session_id": sid})
            return _with_projects(con, one, [project] if project else [])
        if not is_memory_id(memory_id):
            return RecallResult(status="invalid_id", id=memory_id,
                                message="a memory id is 12 lowercase hexadecimal characters")
        combined = RecallResult(status="not_found", id=memory_id)
        for row in named_rows(con, "sessions_mentioning_memory_id", {"id": memory_id}):
            sid = row["session_id"]
            one = recall_in_session(con, sid, row["leaf_id"], memory_id)
            if one.status != "found":
                continue
            combined.status = "found"
            combined.session_ids.append(sid)
            combined.sessions += one.sessions
            combined.observations += one.observations
            combined.reflections += one.reflections
            combined.missing_supporting_observation_ids += one.missing_supporting_observation_ids
        groups = combined.sessions
        combined.kind = _kind(any(g.kind in ("observation", "mixed") for g in groups),
                              any(g.kind in ("reflection", "mixed") for g in groups))
        combined.collision = any(g.collision for g in groups)
        combined.partial = any(g.partial for g in groups)
        if combined.status == "not_found":
            combined.message = f"no observation or reflection with id {memory_id} in any ingested session"
        _add_orphaned(con, combined, None)
        return _with_projects(con, combined, None)


def recall_in_projects(con: duckdb.DuckDBPyConnection, memory_id: str,
                       project_ids: list[str] | None = None) -> list[RecallProject]:
    """The id as a project reflection, in every project's memory (``project_ids``: only those): the
    records, and the session memory it rests on recalled in the project's own sessions, so the source
    entries are reached across sessions."""
    out = []
    for project_id in named_column(con, "projects_holding_reflection", {"id": memory_id}):
        if project_ids is not None and project_id not in project_ids:
            continue
        folded = {r["id"]: r for r in named_rows(con, "project_fold_rows", {"project_id": project_id})}
        found = RecallProject(project_id=project_id)
        support: list[str] = []
        for row in named_rows(con, "project_reflection_occurrences", {"project_id": project_id, "id": memory_id}):
            state = folded.get(row["id"])
            retired = bool(state and state["retired"])
            found.reflections.append(RecallProjectReflection(
                id=row["id"], content=row["content"], supporting_ids=list(row["supporting_ids"]),
                ledger_id=row["ledger_id"], item_index=row["item_index"], status="retired" if retired else "current",
                retired_reason=state["retired_reason"] if retired else None))
            support += [i for i in row["supporting_ids"] if i not in support]
        for supporting_id in support:
            holders = named_rows(con, "project_sessions_holding", {"project_id": project_id, "id": supporting_id})
            groups = [g for h in holders
                      for g in recall_in_session(con, h["session_id"], h["leaf_id"], supporting_id).sessions]
            if groups:
                found.sessions += groups
            else:
                found.missing_supporting_ids.append(supporting_id)
        out.append(found)
    return out


def _with_projects(con: duckdb.DuckDBPyConnection, result: RecallResult, project_ids: list[str] | None) -> RecallResult:
    """``result`` with the id's project reflections (recall resolves project memory ids too)."""
    if result.status == "invalid_id":
        return result
    result.projects = recall_in_projects(con, result.id, project_ids)
    if not result.projects:
        return result
    if result.status in ("not_found", "orphaned") and not (result.observations or result.reflections):
        result.status, result.kind, result.message = "found", "project_reflection", None
    else:
        result.kind = "mixed"
    result.partial = result.partial or any(p.missing_supporting_ids for p in result.projects)
    return result
