"""The replay engine: one session's payload in, replayed on a task-local database, rows out.

This is what a flow's replay task runs (on a thread, or on a Dask worker that cannot see the
user's database), and what a test can run in its own process without Prefect: the payload
(``om_core.replay.payload``) is loaded into an in-memory DuckDB, every branch is replayed
(``om_core.replay.branch``) with the one stage runner (``om_core.replay.stage_runner``), and the
rows the replay appended come back for the one writer to commit (``commit_replayed_rows``).
Errors are returned, never raised: one failing session never stops the others.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from om_core import db as dbmod
from om_core.memory import clocks as read_clocks
from om_core.replay.branch import Progress, replay_session
from om_core.replay.payload import SessionPayload, payload_workspace, replayed_rows
from om_core.replay.stage_runner import BudgetReached, Compute, RunStopped, StageResults, StageRunner
from om_core.settings import Settings
from om_core.workers.stage_kinds import Brain
from om_core.workspace import Workspace


def _due_source_tokens(ws: Workspace, session_id: str) -> int:
    """Source tokens not yet covered by an observation on the session's current leaf."""
    with ws.read() as con:
        leaf = dbmod.scalar(con, "session_leaf", {"session_id": session_id})
        if leaf is None:
            return 0
        return read_clocks(con, session_id, leaf, ws.settings)["observer"].tokens


def replay_payload(payload: SessionPayload, settings: Settings, brain: Brain, results: StageResults, *,
                   drain: bool, run_id: str, compute: Compute | None = None, progress: Progress | None = None,
                   on_error: Callable[[str, str], None] | None = None) -> dict[str, Any]:
    """Every branch of one session, stage after stage, on an in-memory copy of its rows.

    Returns ``session_id``, ``error`` (None, or one line), ``stopped`` (the run's breaker ended it),
    ``budget_stop`` (--max-cost ended it, cleanly), ``branches`` (their reports) and ``rows`` (what
    the replay appended, also before an error). ``on_error(message, traceback)`` hears an unexpected
    failure."""
    session_id = payload.session_id
    ws = payload_workspace(payload, settings)
    error, stopped, budget_stop = None, False, None
    reports: list = []
    try:
        due = _due_source_tokens(ws, session_id)
        runner = StageRunner(ws, brain, results, run_id, compute)
        reports = replay_session(ws, session_id, runner, drain=drain, run_id=run_id, progress=progress)
        if drain and due > 0 and not any(r.stages for r in reports):
            error = (f"the replay ran no stage although {due} source tokens are not yet observed "
                     f"({len(reports)} branch(es) found)")
    except RunStopped as exc:  # the reason is the run's one error line
        error, stopped = f"stopped: {exc}", True
    except BudgetReached as exc:  # --max-cost: what was appended is kept; a rerun resumes here
        budget_stop = str(exc)
    except Exception as exc:  # one failing session never stops the others
        error = f"{type(exc).__name__}: {exc}"
        if on_error is not None:
            on_error(error, traceback.format_exc())
    try:
        with ws.read() as con:
            rows = replayed_rows(con, session_id, run_id)  # what it appended before any error is kept
    finally:
        ws.close()
    return {"session_id": session_id, "error": error, "stopped": stopped, "budget_stop": budget_stop,
            "branches": [asdict(r) for r in reports], "rows": rows}
