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
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from pydantic import ValidationError
from prefect.cache_policies import NONE as NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from flows import progress as progress_board
from flows.limits import MODEL_CALL_LIMIT, ensure_model_call_limit, run_guards
from flows.served import refused_run, steering
from flows.storage import PrefectStageResults, stage_result_storage
from flows.run_names import project_stage_name, project_summary, replay_name, run_summary, session_label, session_summary, session_tags, \
    stage_name
from flows.ticks import announce_tick, log_to_run
from om_core.store import db as dbmod
from om_core.store import writer_lock
from om_core.errors import DatabaseBusy, InvalidArgument, StorageError, storage_error
from om_core.model.client import ModelError
from om_core.replay.engine import ReplayResult, commit_replay, replay_payload
from om_core.replay.payload import read_session_payload
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
    try:
        get_run_logger().error("%s\n%s", message, trace)
    except Exception:  # outside a Prefect run context (tests call the task's function)
        pass


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
    """One project stage's model run (issue 35) on its read input; touches no database (this process
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
        stored = storage_error(exc, ws.path)
        if stored is not None:
            guards.breaker.trip(stored)
        log_to_run(f"project stages failed: {type(exc).__name__}: {exc}", logging.ERROR)
        return [{"outcome": "failed", "error": f"{type(exc).__name__}: {exc}"}]
    for outcome in outcomes:
        log_to_run(project_summary(outcome))
    return [o.as_json() for o in outcomes]


# Commits are serialised, and an interrupted run takes this lock for good before it exits, so the
# database never sees half a commit (flows.interrupt).
COMMIT_LOCK = threading.Lock()


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
                        ingested: dict[str, Any]) -> dict[str, Any]:
    _finish(ws, run_id, "failed", {"errors": [*errors, message]})
    return {"run_id": run_id, "sessions": [], "errors": [*errors, message], "ingest": ingested, "skipped": [],
            "stopped": message}


def _process(ws: Workspace, plan: RunPlan, model: ModelConfig, guards: RunGuards, drain: bool, run_id: str,
             window: int) -> dict[str, Any]:
    """The run of a plan (its row started): every due session replayed, each result committed as it
    arrives, the row finished."""
    settings = ws.settings
    errors = list(plan.errors)
    for line in plan.warnings:  # the flow run's logs say what the plan saw (the Prefect UI's Logs tab)
        log_to_run(line, logging.WARNING)
    for line in plan.notes:
        log_to_run(line)
    if settings.passive:  # the extension's "no background work": ingest only
        with ws.write() as con:
            finish_run(con, run_id, "ok", {"sessions": 0, "passive": True})
        return {"run_id": run_id, "sessions": [], "errors": errors, "ingest": plan.ingest, "passive": True,
                "skipped": list(plan.session_ids)}
    if not model.offline and model.limit == "prefect":
        ensure_model_call_limit(settings.modelConcurrency)
    storage = stage_result_storage(settings, str(ws.path))
    session_ids = list(plan.due)  # sessions unchanged since their last complete replay have nothing to do
    progress_board.start(session_ids)
    results: list[ReplayResult] = []
    shared = _in_process()  # else each replay gets a copy of the guards, and a part of the budget
    lent: dict[str, float] = {}
    pending, labels = [], {}
    queue = list(session_ids)

    def submit_next(con) -> None:  # noqa: ANN001 - a connection to the user's database
        sid = queue[0]
        payload = read_session_payload(con, sid)
        labels[sid] = session_label(payload.file_path, sid)
        replay_guards = guards
        if not shared:
            if guards.budget is not None:
                lent[sid] = guards.budget.lend(window)
            replay_guards = guards.for_replay(lent.get(sid))
        pending.append(replay_session_task.with_options(
            task_run_name=replay_name(labels[sid]), tags=session_tags(sid, "replay")).submit(
                payload, model, settings, drain, run_id, storage, replay_guards))
        queue.pop(0)

    def collect(future) -> None:  # noqa: ANN001 - a Prefect future
        """Commit a finished replay and read the next session's payload (bounded: payloads are read
        just before their task starts) in one open of the file: opening and closing a DuckDB file
        costs ~20 ms of CPU, the largest part of the one writer's work per session."""
        result: ReplayResult = future.result()
        if result.session_id in lent:  # a replay elsewhere: its spending joins the run's budget
            guards.budget.settle(lent.pop(result.session_id), result.cost)
        if result.stopped and not guards.breaker.tripped:  # it stopped elsewhere: no later replay starts
            guards.breaker.trip(ModelError(result.error.removeprefix("stopped: "), "permanent"))
        waiting = len(queue)
        committed: list[str] = []
        if not isinstance(guards.breaker.reason, StorageError):  # after a full disk nothing more is written
            try:
                with COMMIT_LOCK, ws.write() as con:
                    commit_replay(con, result, plan.fingerprints.get(result.session_id))
                    if result.kept:
                        committed = dbmod.named_column(con, "committed_stage_keys",
                                                       {"session_id": result.session_id, "stage_keys": result.kept})
                    if queue:
                        submit_next(con)
            except Exception as exc:
                stored = storage_error(exc, ws.path)
                if stored is None:
                    raise
                guards.breaker.trip(stored)  # a full disk: stop the other sessions before their model calls
        if committed:  # their records are in the ledger: the stage results kept for them can go
            PrefectStageResults(storage).forget(committed)
        if queue and len(queue) == waiting:  # not read with the commit (a full disk): read it alone
            with ws.read() as con:
                submit_next(con)
        results.append(result)
        # the board is drawn here too: a replay on a cluster worker cannot update this process's board
        progress_board.update({"session_id": result.session_id,
                               **({"error": result.error} if result.error else {"done": True})})

    if queue:
        with ws.read() as con:  # the first window's payloads in one read
            while queue and len(pending) < window:
                submit_next(con)
    while pending:
        done = next(as_completed(pending))
        pending.remove(done)
        collect(done)
    order = {sid: i for i, sid in enumerate(session_ids)}
    results.sort(key=lambda r: order[r.session_id])
    projects = [] if guards.breaker.tripped else _project_stages(ws, model, guards, run_id)
    stopped = guards.breaker.reason
    if stopped is not None:
        errors.insert(0, f"model calls stopped: {stopped}" if isinstance(stopped, ModelError) else str(stopped))
    failed = bool(errors) or any(r.error for r in results)
    _finish(ws, run_id, "failed" if failed else "ok",
            {"sessions": len(results), "errors": errors + [r.error for r in results if r.error],
             "projects": [{k: p.get(k) for k in ("project_id", "outcome", "error")} for p in projects]})
    sessions = [r.summary() for r in results]
    for r in sessions:  # the flow run's logs say what the run did (the Prefect UI's Logs tab)
        log_to_run(session_summary(labels.get(r["session_id"], r["session_id"][:8]), r))
    log_to_run(run_summary(run_id, sessions, len(plan.skipped), errors))
    return {"run_id": run_id, "sessions": sessions, "errors": errors, "ingest": plan.ingest, "skipped": plan.skipped,
            "stopped": None if stopped is None else str(stopped), "projects": projects, "flow_run_id": _flow_run_id()}


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
    try:
        logger = get_run_logger()
    except Exception:  # outside a Prefect run context (tests call the flow's function)
        return plan
    for line in plan.warnings:
        logger.warning(line)
    for line in plan.notes:
        logger.info(line)
    return plan


def _run(ws: Workspace, command: str, plan: RunPlan | None, targets: list[str], model: ModelConfig,
         guards: RunGuards | None, drain: bool, run_id: str | None, window: int, exclude: list[str]) -> dict[str, Any]:
    """The flow's work holding the database's writer lock (om_core.store.writer_lock). Held already by this
    process (``om run``'s command) it is taken again at once; held by another process (``om run`` beside
    `om serve`), a scheduled tick is skipped with a line saying so (the next tick does its work), a run
    fails in one line."""
    with ExitStack() as stack:
        try:
            stack.enter_context(ws.one_writer(command))
        except DatabaseBusy as exc:
            message = str(exc)
            try:
                get_run_logger().warning(("skipped: " if command == "maintain" else "") + message)
            except Exception:
                pass
            return {"run_id": None, "sessions": [], "errors": [] if command == "maintain" else [message],
                    "ingest": {"files": [], "missing": []}, "skipped": [], "busy": message}
        run_id = run_id or dbmod.new_run_id()
        try:
            _start(ws, run_id, command, targets, drain, model)
        except Exception as exc:  # a full disk ends the run with one line
            stored = storage_error(exc, ws.path)
            if stored is None:
                raise
            return _stopped_by_storage(ws, run_id, str(stored), list(plan.errors) if plan else [],
                                       plan.ingest if plan else {"files": [], "missing": []})
        if plan is None:
            try:
                plan = _plan_here(ws, targets, model, drain, f"{command} {run_id}", exclude)
            except Exception as exc:
                stored = storage_error(exc, ws.path)
                if stored is None:
                    raise
                return _stopped_by_storage(ws, run_id, str(stored), [], {"files": [], "missing": []})
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


@flow(name="om-process-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=False,
      validate_parameters=False)
def process_sessions(targets: list[str], db_path: str = "om.duckdb", model: ModelConfig | dict[str, Any] | None = None,
                     settings: dict[str, Any] | None = None, drain: bool = True, run_id: str | None = None,
                     window: int = 8, exclude: list[str] | None = None, plan: RunPlan | None = None,
                     spec: WorkspaceSpec | None = None, guards: RunGuards | None = None) -> dict[str, Any]:
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


@flow(name="om-maintain-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), validate_parameters=False)
def maintain_sessions(directory: str, db_path: str = "om.duckdb", model: ModelConfig | dict[str, Any] | None = None,
                      settings: dict[str, Any] | None = None, exclude: list[str] | None = None,
                      every_seconds: int | None = None) -> dict[str, Any]:
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


__all__ = ["process_sessions", "maintain_sessions", "stage_task", "replay_session_task", "MODEL_CALL_LIMIT"]
