"""The Prefect pipeline: ingest, then replay every session's branches with the memory workers.

* ``process_sessions``: archives. Ingest paths (or take ingested session ids), replay every branch
  (SPEC §9) with observer/reflector/dropper stages as Prefect tasks when their clocks are due,
  simulated compactions at agent-settled points and at the archive's own compactions, and drain
  finished branches.
* ``maintain_sessions``: live folders on a schedule. New lines are ingested and due stages run;
  nothing is drained, since a live session may still grow.

One writer, many workers. Only the flow's own process opens the user's database. For each session
it reads the session's rows as a payload (``om_core.replay.payload``) and submits a replay task;
the task replays the session on a task-local in-memory DuckDB built from the same ``sql/`` schema,
views and macros, and returns the rows it appended; the flow commits each result in one short
transaction as it arrives. So the tasks can run on any machine (a Dask cluster) and an analyst's
``om sql`` gets the file between commits.

Stages within a branch run strictly in order: each stage task (the model calls) is called from its
session's task. Its computed result is persisted in Prefect's result storage under the stage key,
so a rerun after a crash (of the flow, or of a worker) repeats no model call for a stage already
computed. Transient model errors are retried by Prefect with backoff and jitter; permanent ones
fail the stage at once. One failing session never stops the others.
"""

from __future__ import annotations

import logging
import threading
import traceback
import uuid
from contextlib import ExitStack
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE as NO_CACHE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.tasks import exponential_backoff
from prefect.transactions import CommitMode, transaction

from flows import progress as progress_board
from flows.limits import MODEL_CALL_LIMIT, ensure_model_call_limit, model_call_gate
from flows.storage import stage_result_storage
from flows.ticks import announce_tick
from om_core import db as dbmod
from om_core import writer_lock
from om_core.circuit import release_run_breaker, run_breaker
from om_core.cost import run_budget
from om_core.errors import DatabaseBusy, StorageError, storage_error
from om_core.memory import clocks as read_clocks
from om_core.model import ModelError, RetryPolicy
from om_core.replay.branch import replay_session
from om_core.replay.payload import ReplayedRows, commit_replayed_rows, payload_workspace, read_session_payload, \
    replayed_rows
from om_core.replay.plan import fingerprints, plan_run, record_replay
from om_core.runs import finish_run, start_run
from om_core.settings import Settings
from om_core.sqlfiles import query
from om_core.workers.stages import ComputedStage, ModelConfig, PreparedStage, StageOutcome, StageRequest, \
    compute_stage, make_brain, prepare_stage, record_stage
from om_core.workspace import Workspace, WorkspaceSpec


class RunStopped(Exception):
    """A session's replay ends here: the run's circuit breaker tripped (om_core.circuit)."""


class StageFailed(RuntimeError):
    """A stage's model run failed; it carries the failed outcome (with its model calls). Transient
    failures are retried by Prefect; a failed result is never persisted, so a rerun asks again."""

    def __init__(self, outcome: StageOutcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome

    @property
    def transient(self) -> bool:
        return self.outcome.error_kind == "transient"


class BudgetReached(Exception):
    """The run's --max-cost stopped a stage before its model call: the session's replay ends there,
    cleanly (no error), and a rerun resumes it (om_core.cost)."""


def _retry_transient(task, task_run, state) -> bool:  # noqa: ANN001 - Prefect's hook signature
    try:
        state.result()
    except StageFailed as exc:
        return exc.transient
    except Exception:
        return False
    return False


_MODEL_KEYS = ("model", "api_base", "api_key", "thinking", "timeout", "stream")


def _config(model: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**{k: v for k, v in model.items() if k in _MODEL_KEYS})


def _brain(model: dict[str, Any], settings: Settings, breaker=None, budget=None):
    """A brain for one stage (it records that stage's model calls; litellm is imported only once)."""
    config = _config(model)
    config.retry = RetryPolicy(attempts=1)  # Prefect retries the whole stage instead
    gate = None if config.offline else model_call_gate(model.get("limit", "process"), settings.modelConcurrency)
    return make_brain(config, settings, gate=gate, breaker=breaker, budget=budget)


def _stage_key(context, parameters: dict[str, Any]) -> str:  # noqa: ANN001 - Prefect's cache-key hook
    return parameters["prepared"].stage_key


@task(name="memory-stage", retries=4, retry_delay_seconds=exponential_backoff(backoff_factor=1.0),
      retry_jitter_factor=0.5, retry_condition_fn=_retry_transient, persist_result=True, cache_key_fn=_stage_key)
def stage_task(prepared: PreparedStage, model: dict[str, Any], settings: Settings, run_id: str,
               attempts: list[StageOutcome] | None = None) -> ComputedStage:
    """One observer, reflector or dropper model run on a prepared input; touches no database.

    Its result is kept in Prefect's result storage under the stage key (exactly-once). ``attempts``
    collects failed attempts, so each one's model calls are recorded. With ``model["max_cost"]`` the
    run's stages share one cost budget (per process): a stage it stops before its first call
    raises ``BudgetReached``, and nothing is persisted for it."""
    breaker = run_breaker(run_id)  # fail fast: a permanent provider error stops every stage of the run
    if breaker.tripped:
        raise RunStopped(str(breaker.reason))
    budget = None if _config(model).offline else run_budget(run_id, model.get("max_cost"), model.get("model"))
    if budget is not None and budget.exhausted:
        raise BudgetReached("the run's cost budget (--max-cost) is reached")
    computed = compute_stage(prepared, _brain(model, settings, breaker, budget), settings)
    for call in computed.outcome.calls:  # persisted with the result: a resuming run records them as this run's
        call.run_id = run_id
    if computed.outcome.budget_stop and not computed.outcome.calls:
        raise BudgetReached(computed.outcome.reason or "the run's cost budget (--max-cost) is reached")
    if computed.outcome.outcome == "failed":
        if attempts is not None:
            attempts.append(computed.outcome)
        raise StageFailed(computed.outcome)
    return computed


def _failed(req: StageRequest, model: str, exc: BaseException) -> StageOutcome:
    return StageOutcome(req.stage, "failed", req.session_id, req.tip, model, error=f"{type(exc).__name__}: {exc}",
                        error_kind="permanent")


class SessionReplayer:
    """The stage runner of one replay task: prepare on the in-memory workspace, compute through the
    stage task, record into the in-memory workspace."""

    def __init__(self, ws: Workspace, model: dict[str, Any], run_id: str, stage_options: dict[str, Any],
                 result_storage: Any) -> None:
        self.ws = ws
        self.model = model
        self.model_name = model.get("model") or "offline"
        self.run_id = run_id
        self.staged = stage_task.with_options(result_storage=result_storage, **stage_options)

    def __call__(self, req: StageRequest) -> StageOutcome:
        breaker = run_breaker(self.run_id)
        if breaker.tripped:  # stop here rather than in a stage task (Prefect would log its failure)
            raise RunStopped(str(breaker.reason))
        with self.ws.read() as con:
            prepared, outcome = prepare_stage(con, req, self.ws.settings, self.model_name)
        if prepared is None:
            return outcome
        started = datetime.now(timezone.utc)
        attempts: list[StageOutcome] = []
        try:
            # Committed at once, not when the session's task ends: a result survives a crash of the
            # flow or of the worker mid-session (Prefect defers a nested task's commit otherwise).
            with transaction(commit_mode=CommitMode.EAGER):
                computed = self.staged(prepared, self.model, self.ws.settings, self.run_id, attempts)
        except (RunStopped, BudgetReached):
            raise
        except StageFailed as exc:
            computed = ComputedStage(exc.outcome)
            attempts = attempts[:-1]  # the last attempt is the failure itself
        except Exception as exc:  # a task that could not run at all (e.g. result storage unreachable)
            computed = ComputedStage(_failed(req, self.model_name, exc))
        with self.ws.write() as con:
            for earlier in attempts:  # retried attempts: their failures and model calls are kept too
                record_stage(con, ComputedStage(earlier), self.run_id, started)
            return record_stage(con, computed, self.run_id, started)


def _due_source_tokens(ws: Workspace, session_id: str) -> int:
    """Source tokens not yet covered by an observation on the session's current leaf."""
    with ws.read() as con:
        leaf = dbmod.scalar(con, "session_leaf", {"session_id": session_id})
        if leaf is None:
            return 0
        return read_clocks(con, session_id, leaf, ws.settings)["observer"].tokens


@task(name="replay-session", persist_result=False, cache_policy=NO_CACHE)
def replay_session_task(payload: Any, model: dict[str, Any], settings: Settings, drain: bool, run_id: str,
                        stage_options: dict[str, Any], result_storage: Any) -> dict[str, Any]:
    """Every branch of one session, stage after stage, on an in-memory copy of its rows. Returns the
    rows it appended; errors are returned, never raised."""
    session_id = payload.session_id
    ws = payload_workspace(payload, settings)
    error, stopped, budget_stop = None, False, None
    reports: list = []
    try:
        due = _due_source_tokens(ws, session_id)
        reports = replay_session(ws, session_id, SessionReplayer(ws, model, run_id, stage_options, result_storage),
                                 drain=drain, run_id=run_id, progress=progress_board.update)
        if drain and due > 0 and not any(r.stages for r in reports):
            error = (f"the replay ran no stage although {due} source tokens are not yet observed "
                     f"({len(reports)} branch(es) found)")
    except RunStopped as exc:  # the reason is the run's one error line
        error, stopped = f"stopped: {exc}", True
    except BudgetReached as exc:  # --max-cost: what was appended is kept; a rerun resumes here
        budget_stop = str(exc)
    except Exception as exc:  # one failing session never stops the others
        error = f"{type(exc).__name__}: {exc}"
        try:
            get_run_logger().error("session %s failed: %s\n%s", session_id, error, traceback.format_exc())
        except Exception:  # outside a Prefect run context (tests call the task's function)
            pass
    try:
        with ws.read() as con:
            rows = replayed_rows(con, session_id, run_id)  # what it appended before any error is kept
    finally:
        ws.close()
    progress_board.update({"session_id": session_id, **({"error": error} if error else {"done": True})})
    return {"session_id": session_id, "error": error, "stopped": stopped, "budget_stop": budget_stop,
            "branches": [asdict(r) for r in reports], "rows": rows}


def _record_session_error(con, session_id: str, run_id: str, message: str) -> None:
    con.execute(query("insert_stage_run"), {
        "stage_run_id": uuid.uuid4().hex[:16], "run_id": run_id, "session_id": session_id, "stage": "session",
        "stage_key": "", "tip_entry_id": "", "chunk_first_id": None, "chunk_last_id": None, "model": "",
        "outcome": "failed", "records": 0, "items": 0, "rejected": 0, "error_kind": "permanent",
        "error": message[:2000], "receipts": None, "started_at": datetime.now(timezone.utc)})


# Commits are serialised, and an interrupted run takes this lock for good before it exits, so the
# database never sees half a commit (flows.interrupt).
COMMIT_LOCK = threading.Lock()


def commit_session_result(ws: Workspace, result: dict[str, Any], fingerprint: str | None = None) -> dict[str, int]:
    """The flow's one write per session: the replay's rows, and its error or (when it completed)
    the fingerprint it started from (om_core.replay.plan), in one transaction."""
    rows: ReplayedRows = result["rows"]
    with COMMIT_LOCK, ws.write() as con, dbmod.transaction(con):
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
            raise  # a full disk: the run's error line says so; the row cannot be written


def _stopped_by_storage(ws: Workspace, run_id: str, message: str, ingested: dict[str, Any]) -> dict[str, Any]:
    _finish(ws, run_id, "failed", {"errors": [message]})
    return {"run_id": run_id, "sessions": [], "errors": [message], "ingest": ingested, "stopped": message}


class _ExpectedStageFailures(logging.Filter):
    """Prefect logs every failed task run at ERROR. A failed stage (``StageFailed``) or a stopped run
    (``RunStopped``) is expected: it is recorded in ``om_internal.stages`` and summed up by the run's closing
    lines, so Prefect's own line is left out (unless Prefect's logs were asked for: ``--verbose``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Finished in state Failed") and ("StageFailed" in message
                                                                        or "RunStopped" in message))


def _quiet_expected_stage_failures() -> None:
    logger = logging.getLogger("prefect.task_runs")
    if logger.getEffectiveLevel() > logging.INFO and not any(isinstance(f, _ExpectedStageFailures)
                                                             for f in logger.filters):
        logger.addFilter(_ExpectedStageFailures())


def _process(targets: list[str], spec: WorkspaceSpec, model: dict[str, Any], drain: bool, run_id: str | None,
             stage_options: dict[str, Any], command: str, window: int, exclude: list[str]) -> dict[str, Any]:
    _quiet_expected_stage_failures()
    ws = Workspace.from_spec(spec)
    settings = ws.settings
    run_id = run_id or dbmod.new_run_id()
    try:
        # before any work: the helpers Prefect started for this flow (its local API server) are noted
        # where the next writer finds them after a kill -9 (the lock file), and in the run's row
        helpers = writer_lock.record_helpers(spec.db_path)
        with ws.write() as con:
            start_run(con, run_id, command, {"targets": targets, "drain": drain, "model": model.get("model")},
                      [h["pid"] for h in helpers])
        model_name = model.get("model") or "offline"
        plan = plan_run(ws, targets, model=model_name, drain=drain, command=f"{command} {run_id}", strict=False,
                        exclude=exclude)
    except Exception as exc:  # a full disk ends the run with one line
        stored = storage_error(exc, spec.db_path)
        if stored is None:
            raise
        return _stopped_by_storage(ws, run_id, str(stored), {"files": [], "missing": []})
    _log_ingest(plan)
    errors, ingested = plan.errors, plan.ingest
    session_ids = plan.due  # sessions unchanged since their last complete replay have nothing to do
    skipped = [sid for sid in plan.session_ids if sid not in set(plan.due)]
    if settings.passive:  # the extension's "no background work": ingest only
        with ws.write() as con:
            finish_run(con, run_id, "ok", {"sessions": 0, "passive": True})
        return {"run_id": run_id, "sessions": [], "errors": errors, "ingest": ingested, "passive": True,
                "skipped": plan.session_ids}
    if not _config(model).offline and model.get("limit") == "prefect":
        ensure_model_call_limit(settings.modelConcurrency)
    storage = stage_result_storage(settings, spec.db_path)
    progress_board.start(session_ids)
    results: list[dict[str, Any]] = []

    prints: dict[str, str] = {}
    breaker = run_breaker(run_id)

    def collect(future) -> None:  # noqa: ANN001 - a Prefect future
        result = future.result()
        # a replay with a failed stage is not complete: the session stays due, so a rerun retries it
        complete = (not result["error"] and not result.get("budget_stop")
                    and not any(b["failures"] for b in result["branches"]))
        if not isinstance(breaker.reason, StorageError):  # after a full disk nothing more is written
            try:
                commit_session_result(ws, result, prints.get(result["session_id"]) if complete else None)
            except Exception as exc:
                stored = storage_error(exc, spec.db_path)
                if stored is None:
                    raise
                breaker.trip(stored)  # a full disk: stop the other sessions before their model calls
        results.append({k: v for k, v in result.items() if k != "rows"})
        # the board is drawn here too: a replay on a cluster worker cannot update this process's board
        progress_board.update({"session_id": result["session_id"],
                               **({"error": result["error"]} if result["error"] else {"done": True})})

    pending = []
    for sid in session_ids:
        while len(pending) >= window:  # bounded: payloads are read just before their task starts
            done = next(as_completed(pending))
            pending.remove(done)
            collect(done)
        with ws.read() as con:
            payload = read_session_payload(con, sid)
            prints[sid] = fingerprints(con, [sid], settings, model_name, drain)[sid].now
        pending.append(replay_session_task.submit(payload, model, settings, drain, run_id, stage_options, storage))
    for future in as_completed(pending):
        collect(future)
    order = {sid: i for i, sid in enumerate(session_ids)}
    results.sort(key=lambda r: order[r["session_id"]])
    stopped = release_run_breaker(run_id)
    if stopped is not None:
        errors.insert(0, f"model calls stopped: {stopped}" if isinstance(stopped, ModelError) else str(stopped))
    failed = bool(errors) or any(r["error"] for r in results)
    _finish(ws, run_id, "failed" if failed else "ok",
            {"sessions": len(results), "errors": errors + [r["error"] for r in results if r["error"]]})
    return {"run_id": run_id, "sessions": results, "errors": errors, "ingest": ingested, "skipped": skipped,
            "stopped": None if stopped is None else str(stopped)}


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


def _spec(db_path: str, settings: dict[str, Any] | Settings | None) -> WorkspaceSpec:
    typed = settings if isinstance(settings, Settings) else Settings(**(settings or {}))
    return WorkspaceSpec(db_path=str(Path(db_path).resolve()), settings=typed)


@flow(name="om-process-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), log_prints=False,
      validate_parameters=False)
def process_sessions(targets: list[str], db_path: str = "om.duckdb", model: dict[str, Any] | None = None,
                     settings: dict[str, Any] | None = None, drain: bool = True, run_id: str | None = None,
                     stage_options: dict[str, Any] | None = None, window: int = 8,
                     exclude: list[str] | None = None) -> dict[str, Any]:
    """Ingest and replay sessions (files, directories, or ingested session ids); ``exclude``: globs
    leaving out files the directory walk finds."""
    spec = _spec(db_path, settings)
    return _as_the_writer(spec, "run", lambda: _process(targets, spec, model or {}, drain, run_id, stage_options or {},
                                                        "run", window, exclude or []))


@flow(name="om-maintain-sessions", task_runner=ThreadPoolTaskRunner(max_workers=4), validate_parameters=False)
def maintain_sessions(directory: str, db_path: str = "om.duckdb", model: dict[str, Any] | None = None,
                      settings: dict[str, Any] | None = None, exclude: list[str] | None = None,
                      every_seconds: int | None = None) -> dict[str, Any]:
    """Scheduled maintenance of a live sessions folder: ingest new lines, run due stages, no draining.
    Ends with one line saying what the tick did (and, given its schedule's ``every_seconds``, when the next
    one is due), on stdout and in the flow run's logs."""
    spec = _spec(db_path, settings)
    result = _as_the_writer(spec, "maintain", lambda: _process([directory], spec, model or {}, False, None, {},
                                                               "maintain", 8, exclude or []))
    announce_tick(result, every_seconds)
    return result


__all__ = ["process_sessions", "maintain_sessions", "stage_task", "replay_session_task", "MODEL_CALL_LIMIT",
           "commit_session_result"]
