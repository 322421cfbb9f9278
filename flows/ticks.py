"""One line per scheduled maintenance tick (`om serve --live`): what the tick saw and did, and when the
next one starts. The flow run prints it on its own stdout, which Prefect's runner relays to `om serve`'s
terminal, and logs it to the flow run's logs (the Prefect UI)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flows.run_result import RunResult


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def tick_line(result: RunResult, started: datetime, every_seconds: int | None, link: str | None = None) -> str:
    """``tick 04:01:10: 3 sessions seen, 120 lines ingested, 2 stages recorded memory, 0 errors; next tick
    04:11:10; http://127.0.0.1:4200/runs/flow-run/…`` (``link``: the tick's flow run in Prefect's UI)."""
    at = started.astimezone().strftime("%H:%M:%S")
    upcoming = ""
    if every_seconds:
        upcoming = f"; next tick {(started + timedelta(seconds=every_seconds)).astimezone():%H:%M:%S}"
    if link:
        upcoming += f"; {link}"
    if result.busy:
        return f"tick {at}: skipped ({result.busy}){upcoming}"
    files = result.ingest.get("files", [])
    lines = sum(f.get("entries_added", 0) + f.get("lines_quarantined", 0) for f in files)
    seen = len({f["session_id"] for f in files if f.get("session_id")})
    return (f"tick {at}: {_count(seen, 'session')} seen, {_count(lines, 'line')} ingested, "
            f"{_count(result.stages_recorded(), 'stage')} recorded memory, "
            f"{_count(result.error_count(), 'error')}{upcoming}")


def flow_run_link() -> str | None:
    """The current flow run's page in Prefect's UI (None outside a flow run, or with no UI to link to)."""
    from prefect.runtime import flow_run
    from prefect.utilities.urls import url_for

    run_id = flow_run.id
    return url_for("flow-run", obj_id=run_id) if run_id else None


def log_to_run(line: str, level: int = logging.INFO) -> None:
    """``line`` in the current flow (or task) run's logs on the Prefect API, the UI's Logs tab, at INFO
    although the console shows Prefect's loggers from WARNING only: a logger outside ``prefect`` with the
    API handler alone. Outside a run context it does nothing."""
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.logging.handlers import APILogHandler

    if FlowRunContext.get() is None and TaskRunContext.get() is None:
        return
    logger = logging.getLogger("om.runs")
    if not any(isinstance(h, APILogHandler) for h in logger.handlers):
        logger.addHandler(APILogHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False  # the terminal has its own lines
    try:
        logger.log(level, line)
    except Exception:  # the API is gone: the run's own lines still say it
        pass


def announce_tick(result: RunResult, every_seconds: int | None) -> str:
    """Print the tick's line (flushed: the runner relays it as it comes) and log it to the flow run."""
    from prefect.runtime import flow_run

    started = flow_run.scheduled_start_time or datetime.now(timezone.utc)
    line = tick_line(result, started, every_seconds, flow_run_link())
    print(line, flush=True)
    log_to_run(line)
    return line


_SILENT = logging.getLogger("om.outside-a-run")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


def run_logger() -> logging.Logger | logging.LoggerAdapter:
    """The current flow (or task) run's logger; outside a run context (a test calling a flow's or a
    task's function) one that says nothing, so no caller needs to ask where it runs."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return _SILENT
