"""The Prefect pipeline: ingest, then replay every session's branches with the memory workers.

* ``process_sessions``: archives. Ingest paths (or take ingested session ids), replay every branch
  (SPEC §9) with observer/reflector/dropper stages as Prefect tasks when their clocks are due,
  simulated compactions at agent-settled points and at the archive's own compactions, and drain
  finished branches.
* ``maintain_sessions``: live folders on a schedule. New lines are ingested and due stages run;
  nothing is drained, since a live session may still grow.

One writer, many workers. Only the flow's own process opens the user's database. For each session
it reads the session's rows as a payload (``om_core.replay.payload``) and submits a replay task;
the task runs the replay engine (``om_core.replay.engine``, the same code a test runs without
Prefect) on a task-local in-memory DuckDB built from the same ``sql/`` schema, views and macros,
and returns the rows it appended; the flow commits each result in one short transaction as it
arrives. So the tasks can run on any machine (a Dask cluster) and an analyst's ``om sql`` gets the
file between commits.

Stages within a branch run strictly in order, through the one stage runner
(``om_core.replay.stage_runner``); each stage's model run is a task of its own (``stage_task``),
called from its session's task. Its computed result is kept in Prefect's result storage under the
stage key (``flows.storage.PrefectStageResults``), so a rerun after a crash (of the flow, or of a
worker) repeats no model call for a stage already computed. Transient model errors are retried
inside the model call with backoff and jitter (each attempt an llm_calls row; the stage succeeds or
fails once); permanent ones fail the stage at once. One failing session never stops the others.
"""

from __future__ import annotations

import threading
import uuid
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from pydantic import ValidationError
from prefect.cache_policies import NONE as NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from flows import progress as progress_board
from flows.limits import MODEL_CALL_LIMIT, ensure_model_call_limit, model_call_gate
from flows.storage import PrefectStageResults, stage_result_storage
from flows.run_names import replay_name, run_summary, session_label, session_summary, session_tags, \
    stage_name
from flows.ticks import announce_tick, log_to_run
from om_core import db as dbmod
from om_core import writer_lock
from om_core.circuit import release_run_breaker, run_breaker
from om_core.cost import run_budget
from om_core.errors import DatabaseBusy, InvalidArgument, StorageError, storage_error
from om_core.model import ModelError
from om_core.replay.engine import replay_payload
from om_core.replay.payload import ReplayedRows, commit_replayed_rows, read_session_payload
from om_core.replay.plan import RunPlan, plan_run, record_replay
from om_core.runs import finish_run, start_run
from om_core.settings import Settings
from om_core.sqlfiles import query
from om_core.workers.stages import ComputedStage, ModelConfig, PreparedStage, compute_stage, make_brain
from om_core.workspace import Workspace, WorkspaceSpec

def _brain(config: ModelConfig, settings: Settings, run_id: str):
    """A brain for one session's replay task, with the run's breaker and budget (per process; the
    stage runner checks them before each stage, the model before each call)."""
    breaker = run_breaker(run_id, settings.breakerFailures)  # a provider down for good stops the run
    if config.offline:
        return make_brain(config, settings, breaker=breaker)
    gate = model_call_gate(config.limit, settings.modelConcurrency)
    budget = run_budget(run_id, config.max_cost, config.model)
    return make_brain(config, settings, gate=gate, breaker=breaker, budget=budget)


@task(name="memory-stage", persist_result=False, cache_policy=NO_CACHE)
def stage_task(prepared: PreparedStage, brain: Any, settings: Settings) -> ComputedStage:
    """One observer, reflector or dropper model run on a prepared input; touches no database. Called
    by the stage runner (om_core.replay.stage_runner) inside its session's replay task, so each stage
    is a task run of its own in Prefect; exactly-once is the runner's (``PrefectStageResults``)."""
    return compute_stage(prepared, brain, settings)


def _log_session_error(message: str, trace: str) -> None:
    try:
        get_run_logger().error("%s\n%s", message, trace)
    except Exception:  # outside a Prefect run context (tests call the task's function)
        pass


@task(name="replay-session", persist_result=False, cache_policy=NO_CACHE)
def replay_session_task(payload: Any, model: ModelConfig, settings: Settings, drain: bool, run_id: str,
                        result_storage: Any) -> dict[str, Any]:
    """Every branch of one session on an in-memory copy of its rows (om_core.replay.engine); returns
    the rows it appended. Errors are returned, never raised.

    It passes stage_task's parameters in ``quote``: they hold no Prefect futures, and Prefect
    otherwise walks every field of the prepared input, the brain and the settings twice per stage
    (to resolve futures and to record task inputs), half of a stage task's orchestration CPU in the
    profile. (Not this task's own: Dask's serialisation turns a quote into a plain tuple.)"""
    brain = _brain(model, settings, run_id)
    label = session_label(payload.file_path, payload.session_id)

    def compute(prepared: PreparedStage) -> ComputedStage:  # a task run named and tagged by what it does
        return stage_task.with_options(task_run_name=stage_name(prepared, label), tags=session_tags(
            payload.session_id, prepared.request.stage))(quote(prepared), quote(brain), quote(settings))

    result = replay_payload(payload, settings, brain, PrefectStageResults(result_storage), drain=drain, run_id=run_id,
                            compute=compute,
                            progress=progress_board.update,
                            on_error=lambda message, trace: _log_session_error(
                                f"session {payload.session_id} failed: {message}", trace))
    error = result["error"]
    progress_board.update({"session_id": payload.session_id, **({"error": error} if error else {"done": True})})
    return result


def _record_session_error(con, session_id: str, run_id: str, message: str) -> None:
    con.execute(query("insert_stage_run"), {
        "stage_run_id": uuid.uuid4().hex[:16], "run_id": run_id, "session_id": session_id, "stage": "session",
        "stage_key": "", "tip_entry_id": "", "chunk_first_id": None, "chunk_last_id": None, "model": "",
        "outcome": "failed", "records": 0, "items": 0, "rejected": 0, "error_kind": "permanent",
        "error": message[:2000], "receipts": None, "started_at": datetime.now(timezone.utc)})


# Commits are serialised, and an interrupted run takes this lock for good before it exits, so the
# database never sees half a commit (flows.interrupt).
COMMIT_LOCK = threading.Lock()


def commit_session_result(con, result: dict[str, Any], fingerprint: str | None = None) -> dict[str, int]:  # noqa: ANN001
    """The flow's one write per session: the replay's rows, and its error or (when it completed)
    the fingerprint it started from (om_core.replay.plan), in one transaction on ``con`` (a write
    connection, held with COMMIT_LOCK)."""
    rows: ReplayedRows = result["rows"]
    with dbmod.transaction(con):
        written = commit_replayed_rows(con, rows)
        if result["error"]:
            _record_session_error(con, result["session_id"], rows.run_id, result["error"])
        elif fingerprint is not None:
            record_replay(con, result["session_id"], fingerprint, rows.run_id)
    return written


def _finish(ws: Workspace, run_id: str, status: str, detail: dict[str, Any]) -> None:
    try:
        with ws.write() as con:
            finish_run(con, run_id, status, detail)
    except Exception as exc:
        if storage_error(exc) is None:
            raise
        # a full disk: the run's error line says so; the row is written by the next writer's start, from
        # the lock file (its block is allocated already)
        if ws.path is not None:
            writer_lock.note_unwritten_outcome(ws.path, run_id, status, detail)


def _stopped_by_storage(ws: Workspace, run_id: str, message: str, ingested: dict[str, Any]) -> dict[str, Any]:
    _finish(ws, run_id, "failed", {"errors": [message]})
    return {"run_id": run_id, "sessions": [], "errors": [message], "ingest": ingested, "stopped": message}


def _process(targets: list[str], spec: WorkspaceSpec, model: ModelConfig, drain: bool, run_id: str | None,
             command: str, window: int, exclude: list[str], plan: RunPlan | None = None) -> dict[str, Any]:
    """The run: planned here (a deployment, a scheduled tick) unless ``plan`` is the caller's (``om run``
    planned it, ingest included, and reported its errors, warnings and notes): one plan per run either way."""
    ws = Workspace.from_spec(spec)
    settings = ws.settings
    run_id = run_id or dbmod.new_run_id()
    try:
        # before any work: the helpers Prefect started for this flow (its local API server) are noted
        # where the next writer finds them after a kill -9 (the lock file), and in the run's row
        helpers = writer_lock.record_helpers(spec.db_path)
        with ws.write() as con:
            start_run(con, run_id, command, {"targets": targets, "drain": drain, "model": model.name},
                      [h["pid"] for h in helpers])
        planned_here = plan is None
        if planned_here:
            plan = plan_run(ws, targets, model=model.name, drain=drain,
                            command=f"{command} {run_id}", strict=False, exclude=exclude)
    except Exception as exc:  # a full disk ends the run with one line
        stored = storage_error(exc, spec.db_path)
        if stored is None:
            raise
        return _stopped_by_storage(ws, run_id, str(stored), {"files": [], "missing": []})
    if planned_here:
        _log_ingest(plan)
    # the run's row and the flow run's log count the plan's errors; the result lists them only when the flow
    # planned (om run reports its own plan's errors, so they are not listed twice)
    errors, ingested = list(plan.errors), plan.ingest
    listed = errors if planned_here else []
    session_ids = plan.due  # sessions unchanged since their last complete replay have nothing to do
    skipped = [sid for sid in plan.session_ids if sid not in set(plan.due)]
    if settings.passive:  # the extension's "no background work": ingest only
        with ws.write() as con:
            finish_run(con, run_id, "ok", {"sessions": 0, "passive": True})
        return {"run_id": run_id, "sessions": [], "errors": listed, "ingest": ingested, "passive": True,
                "skipped": plan.session_ids}
    if not model.offline and model.limit == "prefect":
        ensure_model_call_limit(settings.modelConcurrency)
    storage = stage_result_storage(settings, spec.db_path)
    progress_board.start(session_ids)
    results: list[dict[str, Any]] = []

    prints = plan.fingerprints  # taken by the plan: no session is fingerprinted twice in a run
    breaker = run_breaker(run_id)

    pending, labels = [], {}
    queue = list(session_ids)

    def submit_next(con) -> None:  # noqa: ANN001 - a connection to the user's database
        sid = queue[0]
        payload = read_session_payload(con, sid)
        labels[sid] = session_label(payload.file_path, sid)
        pending.append(replay_session_task.with_options(
            task_run_name=replay_name(labels[sid]), tags=session_tags(sid, "replay")).submit(
                payload, model, settings, drain, run_id, storage))
        queue.pop(0)

    def collect(future) -> None:  # noqa: ANN001 - a Prefect future
        """Commit a finished replay and read the next session's payload (bounded: payloads are read
        just before their task starts) in one open of the file: opening and closing a DuckDB file
        costs ~20 ms of CPU, the largest part of the one writer's work per session."""
        result = future.result()
        # a replay with a failed stage is not complete: the session stays due, so a rerun retries it
        complete = (not result["error"] and not result.get("budget_stop")
                    and not any(b["failures"] for b in result["branches"]))
        waiting = len(queue)
        if not isinstance(breaker.reason, StorageError):  # after a full disk nothing more is written
            try:
                with COMMIT_LOCK, ws.write() as con:
                    commit_session_result(con, result, prints.get(result["session_id"]) if complete else None)
                    if queue:
                        submit_next(con)
            except Exception as exc:
                stored = storage_error(exc, spec.db_path)
                if stored is None:
                    raise
                breaker.trip(stored)  # a full disk: stop the other sessions before their model calls
        if queue and len(queue) == waiting:  # not read with the commit (a full disk): read it alone
            with ws.read() as con:
                submit_next(con)
        results.append({k: v for k, v in result.items() if k != "rows"})
        # the board is drawn here too: a replay on a cluster worker cannot update this process's board
        progress_board.update({"session_id": result["session_id"],
                               **({"error": result["error"]} if result["error"] else {"done": True})})

    if queue:
        with ws.read() as con:  # the first window's payloads in one read
            while queue and len(pending) < window:
                submit_next(con)
    while pending:
        done = next(as_completed(pending))
        pending.remove(done)
        collect(done)
    order = {sid: i for i, sid in enumerate(session_ids)}
    results.sort(key=lambda r: order[r["session_id"]])
    stopped = release_run_breaker(run_id)
    if stopped is not None:
        errors.insert(0, f"model calls stopped: {stopped}" if isinstance(stopped, ModelError) else str(stopped))
        if not planned_here:
            listed.insert(0, errors[0])
    failed = bool(errors) or any(r["error"] for r in results)
    _finish(ws, run_id, "failed" if failed else "ok",
            {"sessions": len(results), "errors": errors + [r["error"] for r in results if r["error"]]})
    for r in results:  # the flow run's logs say what the run did (the Prefect UI's Logs tab)
        log_to_run(session_summary(labels.get(r["session_id"], r["session_id"][:8]), r))
    log_to_run(run_summary(run_id, results, len(skipped), errors))
    return {"run_id": run_id, "sessions": results, "errors": listed, "ingest": ingested, "skipped": skipped,
            "stopped": None if stopped is None else str(stopped), "flow_run_id": _flow_run_id()}


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id


def _log_ingest(plan) -> None:  # noqa: ANN001 - a RunPlan
    """What the run's ingest saw that is no failure: a rewritten file that lost entries or the evidence
    of memory records (a warning: `om serve` shows it), a copy of a session file skipped (a note)."""
    try:
        logger = get_run_logger()
    except Exception:  # outside a Prefect run context (tests call the flow's function)
        return
    for line in plan.warnings:
        logger.warning(line)
    for line in plan.notes:
        logger.info(line)


def _as_the_writer(spec: WorkspaceSpec, command: str, work) -> dict[str, Any]:  # noqa: ANN001
    """``work()`` holding the database's writer lock (om_core.writer_lock). Held already by this process
    (``om run``'s command) it is taken again at once; held by another process (``om run`` beside `om serve`),
    a scheduled tick is skipped with a line saying so (the next tick does its work), a run fails in one line."""
    with ExitStack() as stack:
        try:
            stack.enter_context(Workspace.from_spec(spec).one_writer(command))
        except DatabaseBusy as exc:
            message = str(exc)
            try:
                get_run_logger().warning(("skipped: " if command == "maintain" else "") + message)
            except Exception:
                pass
            return {"run_id": None, "sessions": [], "errors": [] if command == "maintain" else [message],
                    "ingest": {"files": [], "missing": []}, "skipped": [], "busy": message}
        return work()


def _model(model: ModelConfig | dict[str, Any] | None) -> ModelConfig:
    """The flow's one ModelConfig: the caller's (om run), or validated once from a deployment's JSON."""
    if isinstance(model, ModelConfig):
        return model
    try:
        return ModelConfig.model_validate(model or {})
    except ValidationError as exc:  # a deployment's stale or mistyped parameter: one line, nothing started
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in exc.errors())
        raise InvalidArgument(f"the flow's model parameter: {problems}") from None


def _spec(db_path: str, settings: dict[str, Any] | Settings | None) -> WorkspaceSpec:
    typed = settings if isinstance(settings, Settings) else Settings(**(settings or {}))
    return WorkspaceSpec(db_path=str(Path(db_path).resolve()), settings=typed)


@flow(name="om-process-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=False,
      validate_parameters=False)
def process_sessions(targets: list[str], db_path: str = "om.duckdb", model: ModelConfig | dict[str, Any] | None = None,
                     settings: dict[str, Any] | None = None, drain: bool = True, run_id: str | None = None,
                     window: int = 8, exclude: list[str] | None = None, plan: RunPlan | None = None,
                     spec: WorkspaceSpec | None = None) -> dict[str, Any]:
    """Ingest and replay sessions (files, directories, or ingested session ids); ``exclude``: globs
    leaving out files the directory walk finds.

    ``om run`` passes its typed values: ``spec`` (the database and settings: ``db_path`` and
    ``settings`` are then not read) and ``plan`` (its RunPlan: the targets are ``plan.due``, nothing is
    planned or fingerprinted again). A deployment passes JSON (``db_path``, ``settings``) and the flow plans."""
    spec = spec if spec is not None else _spec(db_path, settings)
    config = _model(model)
    return _as_the_writer(spec, "run", lambda: _process(targets, spec, config, drain, run_id,
                                                        "run", window, exclude or [], plan))


@flow(name="om-maintain-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), validate_parameters=False)
def maintain_sessions(directory: str, db_path: str = "om.duckdb", model: ModelConfig | dict[str, Any] | None = None,
                      settings: dict[str, Any] | None = None, exclude: list[str] | None = None,
                      every_seconds: int | None = None) -> dict[str, Any]:
    """Scheduled maintenance of a live sessions folder: ingest new lines, run due stages, no draining.
    Ends with one line saying what the tick did (and, given its schedule's ``every_seconds``, when the next
    one is due), on stdout and in the flow run's logs."""
    spec = _spec(db_path, settings)
    config = _model(model)
    result = _as_the_writer(spec, "maintain", lambda: _process([directory], spec, config, False, None,
                                                               "maintain", 8, exclude or []))
    announce_tick(result, every_seconds)
    return result


__all__ = ["process_sessions", "maintain_sessions", "stage_task", "replay_session_task", "MODEL_CALL_LIMIT",
           "commit_session_result"]
