"""The Prefect pipeline: ingest, then replay every session's branches with the memory workers.

* ``process_sessions``: archives. Ingest paths (or take ingested session ids), replay every branch
  (SPEC §9) with observer/reflector/dropper stages as Prefect tasks when their clocks are due,
  simulated compactions at agent-settled points and at the archive's own compactions, and drain
  finished branches.
* ``maintain_sessions``: live folders on a schedule. New lines are ingested and due stages run;
  nothing is drained, since a live session may still grow.

Sessions run in parallel up to ``concurrency``; stages within a branch run strictly in order (each
stage task is called from its session's task and awaited). Model calls share one Prefect global
concurrency limit. Transient model errors are retried by Prefect with exponential backoff and
jitter; permanent ones fail the stage at once. One failing session never stops the others.
"""

from __future__ import annotations

import traceback
import uuid
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.tasks import exponential_backoff

from flows import progress as progress_board
from flows.limits import MODEL_CALL_LIMIT, ensure_model_call_limit, model_call_gate
from om_core import db as dbmod
from om_core.circuit import release_run_breaker, run_breaker
from om_core.errors import OmError
from om_core.ingest import ingest
from om_core.model import RetryPolicy
from om_core.replay import replay_session
from om_core.settings import Settings
from om_core.sqlfiles import query
from om_core.workers.stages import ModelConfig, StageOutcome, StageRequest, execute_stage, make_brain


class RunStopped(Exception):
    """A session's replay ends here: the run's circuit breaker tripped (om_core.circuit)."""


class TransientStageError(RuntimeError):
    """A stage failed on a retryable model error; Prefect retries the task."""


def _retry_transient(task, task_run, state) -> bool:  # noqa: ANN001 - Prefect's hook signature
    try:
        state.result()
    except TransientStageError:
        return True
    except Exception:
        return False
    return False


_MODEL_KEYS = ("model", "api_base", "api_key", "thinking", "timeout", "stream")


def _config(model: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**{k: v for k, v in model.items() if k in _MODEL_KEYS})


def _brain(model: dict[str, Any], settings: Settings, breaker=None):
    """A brain for one stage (it records that stage's model calls; litellm is imported only once)."""
    config = _config(model)
    config.retry = RetryPolicy(attempts=1)  # Prefect retries the whole stage instead
    gate = None if config.offline else model_call_gate(model.get("limit", "process"), settings.modelConcurrency)
    return make_brain(config, settings, gate=gate, breaker=breaker)


@task(name="memory-stage", retries=4, retry_delay_seconds=exponential_backoff(backoff_factor=1.0),
      retry_jitter_factor=0.5, retry_condition_fn=_retry_transient, persist_result=False)
def stage_task(db_path: str, request: dict[str, Any], model: dict[str, Any], settings: dict[str, Any],
               run_id: str) -> dict[str, Any]:
    """One observer, reflector or dropper stage (exactly-once: see om_core.workers.stages)."""
    breaker = run_breaker(run_id)  # fail fast: a permanent provider error stops every stage of the run
    if breaker.tripped:
        return {"stopped": str(breaker.reason)}
    db = dbmod.shared_database(db_path)
    resolved = Settings(**settings)
    brain = _brain(model, resolved, breaker)
    outcome = execute_stage(db, StageRequest(**request), brain, resolved, run_id)
    if outcome.outcome == "failed" and outcome.error_kind == "transient":
        raise TransientStageError(outcome.error)
    return _outcome_dict(outcome)


def _outcome_dict(outcome: StageOutcome) -> dict[str, Any]:
    return {k: v for k, v in asdict(outcome).items() if k not in ("calls", "receipts")}


def _outcome(data: dict[str, Any]) -> StageOutcome:
    return StageOutcome(**data)


@task(name="replay-session", persist_result=False)
def replay_session_task(db_path: str, session_id: str, model: dict[str, Any], settings: dict[str, Any],
                        drain: bool, run_id: str, stage_options: dict[str, Any]) -> dict[str, Any]:
    """Every branch of one session, stage after stage. Errors are recorded, never raised."""
    db = dbmod.shared_database(db_path)
    resolved = Settings(**settings)
    staged = stage_task.with_options(**stage_options) if stage_options else stage_task

    def run_stage(request: StageRequest) -> StageOutcome:
        try:
            data = staged(db_path, asdict(request), model, settings, run_id)
            if "stopped" in data:  # the run's breaker tripped: this session goes no further
                raise RunStopped(data["stopped"])
            return _outcome(data)
        except TransientStageError as exc:  # retries exhausted; the failure is already recorded
            return StageOutcome(request.stage, "failed", request.session_id, request.tip, model.get("model") or "offline",
                                error=str(exc), error_kind="transient")

    try:
        reports = replay_session(db, session_id, resolved, run_stage, drain=drain, run_id=run_id,
                                 progress=progress_board.update)
    except RunStopped as exc:  # the reason is the run's one error line; nothing to record per session
        progress_board.update({"session_id": session_id, "error": str(exc)})
        return {"session_id": session_id, "error": f"stopped: {exc}", "stopped": True, "branches": []}
    except Exception as exc:  # one failing session never stops the others
        message = f"{type(exc).__name__}: {exc}"
        _record_session_error(db, session_id, run_id, message)
        get_run_logger().error("session %s failed: %s\n%s", session_id, message, traceback.format_exc())
        progress_board.update({"session_id": session_id, "error": message})
        return {"session_id": session_id, "error": message, "branches": []}
    progress_board.update({"session_id": session_id, "done": True})
    return {"session_id": session_id, "error": None,
            "branches": [{**asdict(r)} for r in reports]}


def _record_session_error(db, session_id: str, run_id: str, message: str) -> None:
    now = datetime.now(timezone.utc)
    try:
        with db.write() as con:
            con.execute(query("insert_stage_run"), {
                "stage_run_id": uuid.uuid4().hex[:16], "run_id": run_id, "session_id": session_id, "stage": "session",
                "stage_key": "", "tip_entry_id": "", "chunk_first_id": None, "chunk_last_id": None, "model": "",
                "outcome": "failed", "records": 0, "items": 0, "rejected": 0, "error_kind": "permanent",
                "error": message[:2000], "receipts": None, "started_at": now})
    except Exception:  # the error is also in the flow's logs and summary
        pass


@task(name="ingest-sessions", persist_result=False)
def ingest_task(db_path: str, paths: list[str], run_id: str) -> dict[str, Any]:
    db = dbmod.shared_database(db_path)
    with db.write() as con:
        report = ingest(con, paths, command=f"run {run_id}")
    return {"files": [f.model_dump() for f in report.files], "missing": report.missing_paths}


def _split_targets(targets: list[str]) -> tuple[list[str], list[str], list[str]]:
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


def _resolve_sessions(db_path: str, refs: list[str]) -> tuple[list[str], list[str]]:
    from om_core.catalog import resolve_session

    found, errors = [], []
    db = dbmod.shared_database(db_path)
    with db.read() as con:
        for ref in refs:
            try:
                found.append(resolve_session(con, ref))
            except OmError as exc:
                errors.append(str(exc))
    return found, errors


def _start_run(db_path: str, run_id: str, command: str, detail: dict[str, Any]) -> None:
    import json

    with dbmod.shared_database(db_path).write() as con:
        con.execute(query("start_run"), {"run_id": run_id, "command": command, "detail": json.dumps(detail)})


def _finish_run(db_path: str, run_id: str, status: str, detail: dict[str, Any]) -> None:
    import json

    with dbmod.shared_database(db_path).write() as con:
        con.execute(query("finish_run"), {"run_id": run_id, "status": status, "detail": json.dumps(detail, default=str)})


def _process(targets: list[str], db_path: str, model: dict[str, Any], settings: dict[str, Any], drain: bool,
             run_id: str | None, stage_options: dict[str, Any], command: str) -> dict[str, Any]:
    run_id = run_id or dbmod.new_run_id()
    db_path = str(Path(db_path).resolve())
    _start_run(db_path, run_id, command, {"targets": targets, "drain": drain, "model": model.get("model")})
    paths, refs, not_found = _split_targets(targets)
    ingested = ingest_task(db_path, paths, run_id) if paths else {"files": [], "missing": []}
    session_ids, errors = _resolve_sessions(db_path, refs)
    for f in ingested["files"]:
        if f["status"] in ("new", "appended", "rewritten", "unchanged") and f["session_id"]:
            session_ids.append(f["session_id"])
        elif f["error"] or f["status"] in ("no_header", "duplicate_session"):
            errors.append(f"{f['path']}: {f['error'] or f['status']}")
    errors += [f"{p}: no such file or directory" for p in ingested["missing"] + not_found]
    session_ids = list(dict.fromkeys(session_ids))
    if session_ids:
        with dbmod.shared_database(db_path).read() as con:
            session_ids = [r[0] for r in con.execute(query("sessions_largest_first"),
                                                     {"session_ids": session_ids}).fetchall()]
    if Settings(**settings).passive:  # the extension's "no background work": ingest only
        dbmod.shared_database(db_path).close()
        _finish_run(db_path, run_id, "ok", {"sessions": 0, "passive": True})
        dbmod.shared_database(db_path).close()
        return {"run_id": run_id, "sessions": [], "errors": errors, "ingest": ingested, "passive": True}
    if not _config(model).offline and model.get("limit") == "prefect":
        ensure_model_call_limit(Settings(**settings).modelConcurrency)
    progress_board.start(session_ids)
    futures = [replay_session_task.submit(db_path, sid, model, settings, drain, run_id, stage_options)
               for sid in session_ids]
    results = [f.result() for f in futures]
    dbmod.shared_database(db_path).close()
    stopped = release_run_breaker(run_id)
    if stopped is not None:
        errors.insert(0, f"model calls stopped: {stopped}")
    summary = {"run_id": run_id, "sessions": results, "errors": errors, "ingest": ingested,
               "stopped": None if stopped is None else str(stopped)}
    failed = errors or any(r["error"] for r in results)
    _finish_run(db_path, run_id, "failed" if failed else "ok",
                {"sessions": len(results), "errors": errors + [r["error"] for r in results if r["error"]]})
    dbmod.shared_database(db_path).close()
    return summary


@flow(name="om-process-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=False,
      validate_parameters=False)
def process_sessions(targets: list[str], db_path: str = "om.duckdb", model: dict[str, Any] | None = None,
                     settings: dict[str, Any] | None = None, drain: bool = True, run_id: str | None = None,
                     stage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ingest and replay sessions (files, directories, or ingested session ids)."""
    return _process(targets, db_path, model or {}, settings or Settings().model_dump(), drain, run_id,
                    stage_options or {}, "run")


@flow(name="om-maintain-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), validate_parameters=False)
def maintain_sessions(directory: str, db_path: str = "om.duckdb", model: dict[str, Any] | None = None,
                      settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Scheduled maintenance of a live sessions folder: ingest new lines, run due stages, no draining."""
    return _process([directory], db_path, model or {}, settings or Settings().model_dump(), False, None, {},
                    "maintain")


__all__ = ["process_sessions", "maintain_sessions", "stage_task", "replay_session_task", "MODEL_CALL_LIMIT"]
