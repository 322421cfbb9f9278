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

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prefect import task
from pydantic import ValidationError
from prefect.cache_policies import NONE as NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from flows import progress as progress_board
from flows.om_flow import om_flow
from flows.limits import MODEL_CALL_LIMIT, ensure_model_call_limit, run_guards
from flows.served import refused_run, steering
from flows.storage import PrefectStageResults, stage_result_storage
from flows.run_names import (project_stage_name, project_summary, replay_name, run_summary, session_label,
                             session_summary, session_tags, stage_name)
from flows.run_result import RunResult, SessionOutcome
from flows.replay_window import COMMIT_LOCK, ReplayWindow, full_disk
from flows.ticks import announce_tick, log_to_run, run_logger
from om_core.store import db as dbmod
from om_core.store import writer_lock
from om_core.errors import DatabaseBusy, InvalidArgument, StopReason, StorageError, storage_error
from om_core.model.client import ModelError
from om_core.replay.engine import ReplayResult, replay_payload
from om_core.replay.payload import SessionPayload
from om_core.replay.plan import RunPlan, check_targets, ingest_targets, plan_run
from om_core.project.stage import ProjectInput, ProjectOutcome, compute_project_stage, run_due_projects
from om_core.store.runs import finish_run, start_run
from om_core.settings import Settings
from om_core.workers.stages import ComputedStage, PreparedStage, compute_stage
from om_core.workers.run_config import ModelConfig, RunGuards, make_brain
from om_core.store.workspace import Workspace, WorkspaceSpec


def _brain(config: ModelConfig, settings: Settings, guards: RunGuards):
    """A brain for one session's replay task; its model consults the run's guards before each call."""
    return make_brain(config, settings, guards)


@task(name="memory-stage", persist_result=False, cache_policy=NO_CACHE)
def stage_task(prepared: PreparedStage, brain: Any, settings: Settings) -> ComputedStage:
    """One observer, reflector or dropper model run on a prepared input; touches no database. Called
    by the stage runner (om_core.replay.stage_runner) inside its session's replay task, so each stage
    is a task run of its own in Prefect, named by what it does; exactly-once is the runner's
    (``PrefectStageResults``). Untagged: Prefect asks its API for concurrency slots for every tagged
    task run (a round trip per stage); the replay task carries the session's tags."""
    return compute_stage(prepared, brain, settings)


def _log_session_error(message: str, trace: str) -> None:
    run_logger().error("%s\n%s", message, trace)


@task(name="replay-session", persist_result=False, cache_policy=NO_CACHE)
def replay_session_task(payload: Any, model: ModelConfig, settings: Settings, drain: bool, run_id: str,
                        result_storage: Any, guards: RunGuards) -> ReplayResult:
    """Every branch of one session on an in-memory copy of its rows (om_core.replay.engine.replay_payload,
    the one replay path); returns what it appended. Errors are returned, never raised.

    It passes stage_task's parameters in ``quote``: they hold no Prefect futures, and Prefect
    otherwise walks every field of the prepared input, the brain and the settings twice per stage
    (to resolve futures and to record task inputs), half of a stage task's orchestration CPU in the
    profile. (Not this task's own: Dask's serialisation turns a quote into a plain tuple.)"""
    brain = _brain(model, settings, guards)
    label = session_label(payload.file_path, payload.session_id)

    def compute(prepared: PreparedStage) -> ComputedStage:  # a task run named by what it does
        return stage_task.with_options(task_run_name=stage_name(prepared, label))(
            quote(prepared), quote(brain), quote(settings))

    result = replay_payload(payload, settings, brain, PrefectStageResults(result_storage), drain=drain, run_id=run_id,
                            guards=guards, compute=compute, progress=progress_board.update,
                            on_error=lambda message, trace: _log_session_error(
                                f"session {payload.session_id} failed: {message}", trace))
    progress_board.update({"session_id": payload.session_id,
                           **({"error": result.error} if result.error else {"done": True})})
    return result


@task(name="project-stage", persist_result=False, cache_policy=NO_CACHE)
def project_stage_task(inp: ProjectInput, brain: Any, settings: Settings) -> ProjectOutcome:
    """One project stage's model run on its read input; touches no database (this process
    reads the input and records the outcome: om_core.project.stage.project_stage)."""
    return compute_project_stage(inp, brain, settings)


def _project_stages(ws: Workspace, model: ModelConfig, guards: RunGuards, run_id: str) -> list[dict[str, Any]]:
    """After the run's sessions are committed: every project whose sessions' reflections and critical
    observations grew by ``projectReflectAfterTokens`` gets its stages, each model run a task named by
    what it reads, under the run's guards (a tripped breaker or a spent budget starts none). A failure
    is the project's outcome, never the run's end; a full disk trips the breaker."""
    brain = make_brain(model, ws.settings, guards)

    def compute(inp: ProjectInput, brain_: Any, settings: Settings) -> ProjectOutcome:
        return project_stage_task.with_options(task_run_name=project_stage_name(inp))(
            quote(inp), quote(brain_), quote(settings))

    try:
        outcomes = run_due_projects(ws, brain, run_id=run_id, compute=compute, guards=guards)
    except Exception as exc:
        if storage_error(exc, ws.path) is not None:
            guards.breaker.trip(full_disk(exc, ws))
        log_to_run(f"project stages failed: {type(exc).__name__}: {exc}", logging.ERROR)
        return [{"outcome": "failed", "error": f"{type(exc).__name__}: {exc}"}]
    for outcome in outcomes:
        log_to_run(project_summary(outcome))
    return [o.as_json() for o in outcomes]


def _finish(ws: Workspace, run_id: str, status: str, detail: dict[str, Any]) -> None:
    try:
        with ws.write() as con:
            finish_run(con, run_id, status, detail)
    except Exception as exc:
        full_disk(exc, ws)
        # a full disk: the run's error line says so; the row is written by the next writer's start, from
        # the lock file (its block is allocated already)
        if ws.has_file:
            writer_lock.note_unwritten_outcome(ws.path, run_id, status, detail)


def _in_process() -> bool:
    """Whether the flow's replay tasks run in this process (threads), sharing the run's guards."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context is None or isinstance(context.task_runner, ThreadPoolTaskRunner)


def _start(ws: Workspace, run_id: str, command: str, targets: list[str], drain: bool, model: ModelConfig) -> None:
    """The run's row, before any work. The helpers Prefect started for this flow (its local API server)
    are noted first, where the next writer finds them after a kill -9 (the lock file), and in the row."""
    helpers = writer_lock.record_helpers(ws.path)
    with ws.write() as con:
        start_run(con, run_id, command, {"targets": targets, "drain": drain, "model": model.name},
                  [h["pid"] for h in helpers])


def _stopped_by_storage(ws: Workspace, run_id: str, message: str, errors: list[str],
                        ingested: dict[str, Any]) -> RunResult:
    _finish(ws, run_id, "failed", {"errors": [*errors, message]})
    return RunResult(run_id=run_id, errors=[*errors, message], ingest=ingested, stop=StopReason.STORAGE,
                     stopped=message)


def _process(ws: Workspace, plan: RunPlan, model: ModelConfig, guards: RunGuards, drain: bool, run_id: str,
             window: int) -> RunResult:
    """The run of a plan (its row started): every due session replayed, each result committed as it
    arrives, the projects' stages, the row finished."""
    settings = ws.settings
    errors = list(plan.errors)
    for line in plan.warnings:  # the flow run's logs say what the plan saw (the Prefect UI's Logs tab)
        log_to_run(line, logging.WARNING)
    for line in plan.notes:
        log_to_run(line)
    if settings.passive:  # the extension's "no background work": ingest only
        result = RunResult(run_id=run_id, errors=errors, ingest=plan.ingest, passive=True,
                           skipped=list(plan.session_ids))
        with ws.write() as con:
            finish_run(con, run_id, "ok", result.runs_detail())
        return result
    if not model.offline and model.limit == "prefect":
        ensure_model_call_limit(settings.modelConcurrency)
    storage = stage_result_storage(settings, str(ws.path))

    def submit(payload: SessionPayload, label: str, replay_guards: RunGuards) -> Any:
        return replay_session_task.with_options(
            task_run_name=replay_name(label), tags=session_tags(payload.session_id, "replay")).submit(
                payload, model, settings, drain, run_id, storage, replay_guards)

    replays = ReplayWindow(ws, plan, guards, size=window, storage=storage, submit=submit, shared=_in_process(),
                           wait=lambda pending: next(as_completed(pending)))
    results = replays.run()
    projects = [] if guards.breaker.tripped else _project_stages(ws, model, guards, run_id)
    run = _run_result(run_id, plan, results, projects, errors, guards)
    _finish(ws, run_id, "failed" if run.failed else "ok", run.runs_detail())
    for s in run.sessions:  # the flow run's logs say what the run did (the Prefect UI's Logs tab)
        log_to_run(session_summary(replays.labels.get(s.session_id, s.session_id[:8]), s))
    log_to_run(run_summary(run_id, run.sessions, len(plan.skipped), errors))
    return run


def _run_result(run_id: str, plan: RunPlan, results: list[ReplayResult], projects: list[dict[str, Any]],
                errors: list[str], guards: RunGuards) -> RunResult:
    """The run's result; a tripped breaker (failing model calls, a full disk) is its first error."""
    stopped = guards.breaker.reason
    if stopped is not None:
        errors.insert(0, f"model calls stopped: {stopped}" if isinstance(stopped, ModelError) else str(stopped))
    return RunResult(run_id=run_id, sessions=[SessionOutcome.of(r) for r in results], errors=errors,
                     ingest=plan.ingest, skipped=plan.skipped, projects=projects, flow_run_id=_flow_run_id(),
                     stop=None if stopped is None else (StopReason.STORAGE if isinstance(stopped, StorageError)
                                                        else StopReason.CIRCUIT),
                     stopped=None if stopped is None else str(stopped))


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.id


def _plan_here(ws: Workspace, targets: list[str], model: ModelConfig, drain: bool, command: str,
               exclude: list[str]) -> RunPlan:
    """A deployment's or a scheduled tick's plan, made by the flow (``om run`` hands it its own): the
    targets checked, their new lines ingested, then the plan. What it saw that is no failure reaches
    this flow run's console (`om serve` shows it): a rewritten file that lost entries or the evidence
    of memory records (a warning), a copy of a session file skipped (a note)."""
    targets_ = check_targets(ws, targets, strict=False)
    plan = plan_run(ws, targets_, ingest_targets(ws, targets_, command=command, exclude=exclude),
                    model=model.name, drain=drain)
    logger = run_logger()
    for line in plan.warnings:
        logger.warning(line)
    for line in plan.notes:
        logger.info(line)
    return plan


def _run(ws: Workspace, command: str, plan: RunPlan | None, targets: list[str], model: ModelConfig,
         guards: RunGuards | None, drain: bool, run_id: str | None, window: int, exclude: list[str]) -> RunResult:
    """The flow's work holding the database's writer lock (om_core.store.writer_lock). Held already by this
    process (``om run``'s command) it is taken again at once; held by another process (``om run`` beside
    `om serve`), a scheduled tick is skipped with a line saying so (the next tick does its work), a run
    fails in one line."""
    with ExitStack() as stack:
        try:
            stack.enter_context(ws.one_writer(command))
        except DatabaseBusy as exc:
            message = str(exc)
            run_logger().warning(("skipped: " if command == "maintain" else "") + message)
            return RunResult(errors=[] if command == "maintain" else [message], stop=StopReason.BUSY,
                             stopped=message)
        run_id = run_id or dbmod.new_run_id()
        try:
            _start(ws, run_id, command, targets, drain, model)
        except Exception as exc:  # a full disk ends the run with one line
            return _stopped_by_storage(ws, run_id, str(full_disk(exc, ws)), list(plan.errors) if plan else [],
                                       plan.ingest if plan else {"files": [], "missing": []})
        if plan is None:
            try:
                plan = _plan_here(ws, targets, model, drain, f"{command} {run_id}", exclude)
            except Exception as exc:
                return _stopped_by_storage(ws, run_id, str(full_disk(exc, ws)), [], {"files": [], "missing": []})
        return _process(ws, plan, model, guards or run_guards(model, ws.settings), drain, run_id, window)


def _model(model: ModelConfig | dict[str, Any] | None) -> ModelConfig:
    """The flow's one ModelConfig: the caller's (om run), or validated once from a deployment's JSON."""
    if isinstance(model, ModelConfig):
        return model
    try:
        return ModelConfig.model_validate(model or {})
    except ValidationError as exc:  # a deployment's stale or mistyped parameter: one line, nothing started
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'model'}: {e['msg']}" for e in exc.errors())
        raise InvalidArgument(f"the flow's model parameter: {problems}") from None


def _workspace(spec: WorkspaceSpec | None, db_path: str, settings: dict[str, Any] | Settings | None) -> Workspace:
    """The flow run's one workspace: from ``om run``'s spec, or from a deployment's JSON parameters."""
    if spec is None:
        typed = settings if isinstance(settings, Settings) else Settings(**(settings or {}))
        spec = WorkspaceSpec(db_path=str(Path(db_path).resolve()), settings=typed)
    return Workspace.from_spec(spec)


@om_flow(name="om-process-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=False,
      validate_parameters=False)
def process_sessions(targets: list[str], db_path: str = "om.duckdb", model: ModelConfig | dict[str, Any] | None = None,
                     settings: dict[str, Any] | None = None, drain: bool = True, run_id: str | None = None,
                     window: int = 8, exclude: list[str] | None = None, plan: RunPlan | None = None,
                     spec: WorkspaceSpec | None = None, guards: RunGuards | None = None) -> RunResult:
    """Ingest and replay sessions (files, directories, or ingested session ids); ``exclude``: globs
    leaving out files the directory walk finds.

    ``om run`` passes its typed values: ``spec`` (the database and settings: ``db_path`` and
    ``settings`` are then not read), ``plan`` (its RunPlan: nothing is ingested or planned again) and
    ``guards`` (the run's breaker and budget, which its Ctrl-C trips and its cost line reads). A
    deployment passes JSON (``db_path``, ``settings``), and the flow ingests and plans."""
    if refused := steering("om-process-sessions", dict(locals())):  # a run of om serve's deployment: as it made it
        return refused_run(refused)
    config = _model(model)
    return _run(_workspace(spec, db_path, settings), "run", plan, targets, config, guards, drain, run_id, window,
                exclude or [])


@om_flow(name="om-maintain-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), validate_parameters=False)
def maintain_sessions(directory: str, db_path: str = "om.duckdb", model: ModelConfig | dict[str, Any] | None = None,
                      settings: dict[str, Any] | None = None, exclude: list[str] | None = None,
                      every_seconds: int | None = None) -> RunResult:
    """Scheduled maintenance of a live sessions folder: ingest new lines, run due stages, no draining.
    Ends with one line saying what the tick did (and, given its schedule's ``every_seconds``, when the next
    one is due), on stdout and in the flow run's logs."""
    if refused := steering("om-maintain-sessions", dict(locals())):  # a run of om serve's deployment: as it made it
        return refused_run(refused)
    config = _model(model)
    result = _run(_workspace(None, db_path, settings), "maintain", None, [directory], config, None, False, None, 8,
                  exclude or [])
    announce_tick(result, every_seconds)
    return result


__all__ = ["COMMIT_LOCK", "MODEL_CALL_LIMIT", "process_sessions", "maintain_sessions", "stage_task",
           "replay_session_task"]
