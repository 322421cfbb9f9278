"""What a run will do, decided before any orchestrator starts (``om run``'s first second).

Three steps, in this order: the targets are checked offline (``check_targets``: paths exist, session
ids resolve); new lines of the given files are ingested (``ingest_targets``, the one step that
writes); then the plan is computed, a value, without side effects (``plan_run``):

* a session is **due** unless its last complete replay started from exactly what it would start
  from now: the same session rows (entries, leaf, the ledger records and compactions the file
  holds), the same settings, the same model and the same drain. Its fingerprint is kept in
  ``session_replays`` when a replay commits without an error; anything else (a failure, an
  interruption, a stop) leaves it due.

So a rerun of a finished archive starts no Prefect server and returns at once.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import duckdb
from pydantic import BaseModel, ConfigDict, Field

from om_core.model.cost import RunEstimate, estimate_run
from om_core.store.catalog import resolve_session
from om_core.store.db import named_column, named_row, named_rows, scalar
from om_core.errors import InvalidArgument, OmError
from om_core.settings import Settings
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.ingest.reports import IngestReport
    from om_core.store.workspace import Workspace


class TargetsMissing(InvalidArgument):
    """Paths that do not exist, or session ids that resolve to no ingested session."""

    exit_code = 1


def split_targets(targets: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Paths (files, directories) to ingest, session ids (or prefixes) already ingested, and paths
    that do not exist (a target with a path separator or a .jsonl name is meant as a path)."""
    paths, sessions, missing = [], [], []
    for target in targets:
        if Path(target).exists():
            paths.append(target)
        elif "/" in target or "\\" in target or target.endswith(".jsonl"):
            missing.append(target)
        else:
            sessions.append(target)
    return paths, sessions, missing


class Fingerprint(NamedTuple):
    now: str  # of the session's rows and the run's settings today
    replayed: str | None  # of its last complete replay (None: never replayed)


def fingerprints(con: duckdb.DuckDBPyConnection, session_ids: list[str], settings: Settings, model: str,
                 drain: bool) -> dict[str, Fingerprint]:
    """session id -> its fingerprint now and that of its last complete replay."""
    if not session_ids:
        return {}
    basis = json.dumps({"settings": settings.model_dump(mode="json"), "model": model, "drain": drain},
                       sort_keys=True)
    out = {}
    for parts in named_rows(con, "session_fingerprint_parts", {"session_ids": session_ids}):
        replayed = parts.pop("replayed_fingerprint")
        digest = hashlib.sha256((basis + json.dumps(parts, sort_keys=True, default=str)).encode()).hexdigest()[:24]
        out[parts["session_id"]] = Fingerprint(digest, replayed)
    return out


def due_sessions(con: duckdb.DuckDBPyConnection, session_ids: list[str], settings: Settings, model: str,
                 drain: bool) -> tuple[list[str], dict[str, str]]:
    """The sessions a run has to replay (in the given order), and every session's fingerprint."""
    prints = fingerprints(con, session_ids, settings, model, drain)
    due = [sid for sid in session_ids if sid in prints and prints[sid].now != prints[sid].replayed]
    return due, {sid: printed.now for sid, printed in prints.items()}


def replay_decision(con: duckdb.DuckDBPyConnection, session_id: str, settings: Settings, model: str) -> tuple[bool, str]:
    """Whether `om run` (draining, with ``model``) would replay the session now, by ``due_sessions``'s
    rule, and why, in words (`om status`)."""
    if settings.passive:
        return False, "passive is set: om run only ingests"
    due, _ = due_sessions(con, [session_id], settings, model, True)
    last = named_row(con, "last_replay", {"session_id": session_id})
    if last is None:
        return True, "never replayed: om run replays it"
    when = f"run {last['run_id']}, {last['replayed_at']:%Y-%m-%d %H:%M}"
    if not due:
        return False, f"unchanged since its last complete replay ({when}): om run replays nothing"
    if not due_sessions(con, [session_id], settings, model, False)[0]:
        return True, (f"replayed without draining ({when}) and unchanged since: om run drains it "
                      "(om run --no-drain replays nothing)")
    return True, (f"changed since its last complete replay ({when}): new entries, other settings or another model "
                  f"than {model}: om run replays it")


def record_replay(con: duckdb.DuckDBPyConnection, session_id: str, fingerprint: str, run_id: str) -> None:
    con.execute(query("put_session_replay"), {"session_id": session_id, "fingerprint": fingerprint, "run_id": run_id})


class RunPlan(BaseModel):
    """What a run will do: a value, computed once (``plan_run``) and handed on unchanged."""

    model_config = ConfigDict(frozen=True)

    session_ids: tuple[str, ...] = ()  # every session the run covers, largest first
    due: tuple[str, ...] = ()  # the ones to replay
    errors: tuple[str, ...] = ()  # missing targets, files that could not be ingested
    notes: tuple[str, ...] = ()  # no failure, one line each: files skipped as no session (yet), copies of a
    # session file already ingested
    warnings: tuple[str, ...] = ()  # rewritten files that lost entries or memory evidence
    ingest: dict[str, Any] = Field(default_factory=lambda: {"files": [], "missing": []})  # the ingest's report
    # session id -> its fingerprint now (taken once, here): the flow records it when the replay completes
    fingerprints: dict[str, str] = Field(default_factory=dict)

    @property
    def nothing_due(self) -> bool:
        return not self.due

    @property
    def skipped(self) -> list[str]:
        """The sessions unchanged since their last complete replay (nothing to do)."""
        due = set(self.due)
        return [sid for sid in self.session_ids if sid not in due]


class Targets(NamedTuple):
    paths: list[str]  # files and directories to ingest
    session_ids: list[str]  # ingested sessions named by id (or prefix)
    problems: list[str]  # a missing path or an unknown id, one line each


def check_targets(ws: Workspace, targets: list[str], *, strict: bool = True) -> Targets:
    """The run's targets, checked offline (it reads only). ``strict`` (a command): a missing path or unknown
    session id stops everything, in one line, before anything is done (``TargetsMissing``); otherwise (a
    scheduled flow) it is one of the plan's errors."""
    from om_core.store.catalog import resolve_session

    paths, refs, missing = split_targets(targets)
    problems = [f"{p}: no such file or directory" for p in missing]
    session_ids: list[str] = []
    if refs:
        if ws.has_file and not ws.path.exists():
            problems += [f"{r}: no such file, directory or ingested session (no database yet)" for r in refs]
        else:
            with ws.read() as con:
                for ref in refs:
                    try:
                        session_ids.append(resolve_session(con, ref))
                    except OmError as exc:
                        problems.append(f"{ref}: {exc}")
    if problems and strict:
        raise TargetsMissing("; ".join(problems))
    return Targets(paths, session_ids, problems)


def ingest_targets(ws: Workspace, targets: Targets, *, command: str = "ingest", progress: Callable[..., None] | None = None,
                   exclude: Sequence[str] = ()) -> IngestReport:
    """The step before the plan: the new lines of the targets' paths ingested (``exclude``: globs leaving
    out files a directory walk finds). Returns the ingest's report (om_core.ingest), None without paths."""
    if not targets.paths:
        return None
    from om_core.ingest import ingest

    return ingest(ws, targets.paths, command=command, progress=progress, exclude=exclude)


def plan_run(ws: Workspace, targets: Targets, ingested: IngestReport | None, *, model: str, drain: bool) -> RunPlan:
    """The run's plan from its checked targets and what their ingest reported (``ingested``: None when
    nothing was ingested): the sessions it covers, the ones due and their fingerprints. It reads only."""
    session_ids = list(targets.session_ids)
    errors, notes, warnings = list(targets.problems), [], []
    report: dict[str, Any] = {"files": [], "missing": []}
    if ingested is not None:
        report = {"files": [f.model_dump() for f in ingested.files], "missing": ingested.missing_paths}
        for f in ingested.files:
            warnings += [f"{f.path}: {loss.describe()}" for loss in f.replaced]
            notes += [f"{f.path}: {done.describe()}" for done in f.followed]  # Pi's migration or a fork, followed
            if f.status in ("new", "appended", "rewritten", "unchanged") and f.session_id:
                session_ids.append(f.session_id)
            elif f.status == "duplicate_session":  # a copy of a file already ingested: skipped, nothing failed
                notes.append(f"{f.path}: {'; '.join(f.notes) or f.status}")
            elif f.error:
                errors.append(f"{f.path}: {f.error}")
            else:  # not a session (yet): an empty file, or another program's file a directory walk found
                notes += [f"{f.path}: {note}" for note in f.notes]
        errors += [f"{p}: no such file or directory" for p in ingested.missing_paths]
    session_ids = list(dict.fromkeys(session_ids))
    ordered, due, prints = [], [], {}
    if session_ids:
        with ws.read() as con:
            ordered = named_column(con, "sessions_largest_first", {"session_ids": session_ids})
            due, prints = due_sessions(con, ordered, ws.settings, model, drain)
    return RunPlan(session_ids=tuple(ordered), due=tuple(due), errors=tuple(errors), notes=tuple(notes),
                   warnings=tuple(warnings), ingest=report, fingerprints=prints)


# ------------------------------------------------------------------ what a run has to process (its estimate)

# Pi's estimate of source tokens per byte of a session file not yet ingested: the larger of the two
# sample sessions' figures (0.158 and 0.128), so the estimate errs high.
SOURCE_TOKENS_PER_BYTE = 0.16


@dataclass
class Backlog:
    """Source tokens a run would observe: measured in the database for ingested sessions, estimated
    from file size for files not (fully) ingested yet."""

    source_tokens: int = 0
    from_database: int = 0
    from_file_size: int = 0
    sessions: int = 0
    files: int = 0


def unobserved_tokens(con: Any, session_id: str) -> int:
    """Source tokens on the session's current branch after its observation watermark."""
    leaf = scalar(con, "session_leaf", {"session_id": session_id})
    if leaf is None:
        return 0
    after = scalar(con, "observation_watermark_position", {"session_id": session_id, "tip": leaf})
    return int(scalar(con, "unobserved_source_tokens", {"session_id": session_id, "tip": leaf, "after": after}) or 0)


def run_backlog(con: Any | None, files: list[Path], session_ids: list[str]) -> Backlog:
    """The backlog of a run over ``files`` (session files, resolved paths) and ``session_ids``
    (ingested sessions); ``con`` is a read connection, or None when there is no database yet."""
    backlog = Backlog()
    known: list[str] = []
    for path in files:
        row = named_row(con, "session_of_file", {"path": str(path)}) if con is not None else None
        pending = path.stat().st_size
        if row is not None and row["session_id"]:
            known.append(row["session_id"])
            pending = max(0, pending - int(row["ingested_bytes"] or 0))  # what was appended since the last ingest
        backlog.from_file_size += math.ceil(pending * SOURCE_TOKENS_PER_BYTE)
        backlog.files += 1
    for sid in dict.fromkeys([*known, *session_ids]):
        backlog.from_database += unobserved_tokens(con, sid) if con is not None else 0
        backlog.sessions += 1
    backlog.source_tokens = backlog.from_database + backlog.from_file_size
    return backlog


def estimate_for_targets(ws: Workspace, targets: list[str], model: str) -> tuple[RunEstimate, Backlog]:
    """The estimate `om run` prints before it starts: targets are files, directories or ingested
    session ids (unknown ids are left to the run to report)."""
    from om_core.ingest import discover  # the ingest room loads only when a run is estimated

    paths = [t for t in targets if Path(t).exists()]
    refs = [t for t in targets if not Path(t).exists() and "/" not in t and not t.endswith(".jsonl")]
    files, _ = discover(paths)
    backlog = None
    if not ws.has_file or ws.path.is_file():  # no database file yet: nothing ingested to count
        try:
            with ws.read() as con:
                sids = []
                for ref in refs:
                    try:
                        sids.append(resolve_session(con, ref))
                    except OmError:
                        pass
                backlog = run_backlog(con, files, sids)
        except OmError:  # not an om database: the run itself reports that
            backlog = None
    if backlog is None:
        backlog = run_backlog(None, files, [])
    return estimate_run(model, backlog.source_tokens), backlog
