"""Forget: a user retires a memory id, append-only, with a reason.

``om forget ID`` appends, in each session whose ledger records the id (an observation or a
reflection), a drop record of origin ``user`` naming it (``om.observations.dropped``, or
``om.reflections.dropped`` for a reflection), with the user's reason in its ``reason``;
with ``--project`` (or where the id is a project reflection) a retirement record of origin ``user``
in the project's ledger. Nothing is deleted: the source entries, the records that hold the id and
``om recall`` (which shows it as forgotten) stay. What changes is every fold: a forgotten id leaves
the fold of its session on every branch and at every boundary (``forgotten_ids`` in
``sql/views/020_ledger.sql``), so no projection, compaction, worker input, ``om view`` (the stored
compactions' lists included) or project memory shows it again, and a model that records the same
text again records the same id, which stays forgotten. A drop of origin user is no dropper's
watermark and not in the record order; ``om export`` writes only what the pipeline appended, so
the exported file carries no forget (the extension would read it as an ordinary drop).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from om_core.store import db as dbmod
from om_core.store.db import named_column, named_rows, scalar
from om_core.errors import InvalidArgument, SessionNotFound
from om_core.ledger.records import (OBSERVATIONS_DROPPED, REFLECTIONS_DROPPED, LedgerRows, ObservationsDropped,
                                    ReflectionsDropped, is_memory_id, mint_ledger_id)
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

MAX_REASON_CHARS = 1_000


class Forgotten(BaseModel):
    """Where one forget was recorded."""

    scope: str  # session | project
    scope_id: str  # the session or project id
    ledger_id: str | None  # the record appended (None: it was forgotten there before)
    kind: str  # observation | reflection | project_reflection


class ForgetResult(BaseModel):
    id: str
    reason: str
    recorded: list[Forgotten] = Field(default_factory=list)
    already: list[Forgotten] = Field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def expand_any_memory_id(con, ref: str, session_id: str | None = None) -> str:  # noqa: ANN001
    """A whole memory id, or the one id (session or project memory) a unique prefix stands for."""
    from om_core.errors import AmbiguousMemoryId

    if is_memory_id(ref):
        return ref
    if not ref or len(ref) > 12 or any(c not in "0123456789abcdef" for c in ref):
        raise InvalidArgument(f"{ref!r} is no memory id: 12 lowercase hexadecimal characters (or a unique prefix)")
    ids = named_column(con, "any_memory_ids_by_prefix", {"prefix": ref, "session_id": session_id})
    if len(ids) > 1:
        raise AmbiguousMemoryId(f"{ref!r} starts several memory ids: {', '.join(ids[:5])}; give more characters")
    if not ids:
        raise SessionNotFound(f"no memory id starts with {ref!r}")
    return ids[0]


def forget(ws: Workspace, memory_id: str, reason: str, *, session: str | None = None, project: bool = False,
           run_id: str | None = None) -> ForgetResult:
    """Forget ``memory_id`` (or a unique prefix of one) everywhere it is recorded: in every session
    holding it (``session``: only there) and every project whose memory holds it (``project``: only
    there). Raises when it is recorded nowhere."""
    from om_core.store.catalog import resolve_session
    from om_core.store.search_index import refresh_search_index

    reason = " ".join(reason.split())[:MAX_REASON_CHARS]
    if not reason:
        raise InvalidArgument("give a reason (--reason TEXT): it is kept with the forget")
    if session is not None and project:
        raise InvalidArgument("choose one of --session and --project")
    with ws.write() as con:
        sid = resolve_session(con, session) if session is not None else None
        memory_id = expand_any_memory_id(con, memory_id, sid)
        result = ForgetResult(id=memory_id, reason=reason)
        now = datetime.now(timezone.utc).isoformat()
        with dbmod.transaction(con):
            if not project:
                for row in named_rows(con, "sessions_recording_memory_id", {"id": memory_id, "session_id": sid}):
                    _forget_in_session(con, row, memory_id, reason, now, run_id, result)
            if sid is None:
                for project_id in named_column(con, "projects_holding_reflection", {"id": memory_id}):
                    _forget_in_project(con, project_id, memory_id, reason, run_id, result)
            if not result.recorded and not result.already:
                where = (f"session {sid}" if sid else "any project's memory" if project
                         else "any session or project")
                raise SessionNotFound(f"{memory_id} is recorded in no {where}" if not sid
                                      else f"{memory_id} is not recorded in {where}")
            refresh_search_index(con, [], [f.scope_id for f in result.recorded if f.scope == "project"])
        return result


def _forget_in_session(con, row: dict[str, Any], memory_id: str, reason: str, now: str,  # noqa: ANN001
                       run_id: str | None, result: ForgetResult) -> None:
    session_id, kind = row["session_id"], row["kind"]
    if row["forgotten"]:
        result.already.append(Forgotten(scope="session", scope_id=session_id, ledger_id=None, kind=kind))
        return
    leaf = row["leaf_id"]
    ledger_id = mint_ledger_id(con, session_id, f"forget\x00{memory_id}\x00{now}")
    rows = LedgerRows()
    if kind == "reflection":  # a reflection drop (SPEC §13), as a reflection is retired
        kind_name, record = REFLECTIONS_DROPPED, ReflectionsDropped(reflectionIds=[memory_id], coversUpToId=leaf,
                                                                     reason=reason)
    else:
        kind_name, record = OBSERVATIONS_DROPPED, ObservationsDropped(observationIds=[memory_id], coversUpToId=leaf,
                                                                       reason=reason)
    rows.add_record(session_id, ledger_id, kind_name, record, anchor=leaf, origin="user", created_at=now,
                    run_id=run_id, stage="forget")
    rows.write(con)
    result.recorded.append(Forgotten(scope="session", scope_id=session_id, ledger_id=ledger_id, kind=kind))


def _forget_in_project(con, project_id: str, memory_id: str, reason: str, run_id: str | None,  # noqa: ANN001
                       result: ForgetResult) -> None:
    from om_core.memory.project_memory import mint_project_ledger_id

    if scalar(con, "project_reflection_forgotten", {"project_id": project_id, "id": memory_id}):
        result.already.append(Forgotten(scope="project", scope_id=project_id, ledger_id=None,
                                        kind="project_reflection"))
        return
    ledger_id = mint_project_ledger_id(con, project_id, f"forget\x00{memory_id}\x00{datetime.now(timezone.utc)}")
    watermark = scalar(con, "project_watermark", {"project_id": project_id})
    con.execute(query("insert_project_record"), {
        "project_id": project_id, "ledger_id": ledger_id, "kind": "om.project.reflections.retired",
        "covers_up_to_seq": watermark, "origin": "user", "run_id": run_id, "stage": "forget", "stage_key": None})
    con.execute(query("insert_project_retirement"), {"project_id": project_id, "ledger_id": ledger_id,
                                                     "item_index": 0, "refl_id": memory_id, "reason": reason})
    result.recorded.append(Forgotten(scope="project", scope_id=project_id, ledger_id=ledger_id,
                                     kind="project_reflection"))
