"""The replay engine: one session's payload in, replayed on a task-local database, rows out.

One path replays a session, wherever it runs: the payload (``om_core.replay.payload``) is read from
the user's database, loaded into an in-memory DuckDB and every branch is replayed there
(``replay_payload``: ``om_core.replay.branch`` with the one stage runner,
``om_core.replay.stage_runner``); the rows the replay appended are committed to the user's database
in one transaction (``commit_replay``). ``replay_session`` does the three steps now, in this process
(`om eval`, tests, benchmarks); a flow reads payloads and commits results in its own process and runs
``replay_payload`` in its replay tasks (on a thread, or on a Dask worker that cannot see the user's
database). Errors are returned, never raised: one failing session never stops the others.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import duckdb

from om_core.errors import StopReason
from om_core.store import db as dbmod
from om_core.memory.views import clocks as read_clocks
from om_core.replay.branch import BranchReport, Progress, replay_branches
from om_core.replay.payload import (ReplayedRows, SessionPayload, commit_replayed_rows, payload_workspace,
                                    read_session_payload, replayed_rows)
from om_core.replay.plan import record_replay
from om_core.replay.stage_runner import Compute, StageResults, StageRunner, TableStageResults
from om_core.settings import Settings
from om_core.store.sqlfiles import query
from om_core.workers.stage_kinds import Brain
from om_core.workers.run_config import BudgetReached, RoutedBrain, RunGuards, RunStopped, read_session_model
from om_core.store.workspace import Workspace


@dataclass
class ReplayResult:
    """What one session's replay gave: the rows it appended (also before an error), its branches'
    reports, and how it ended."""

    session_id: str
    run_id: str
    rows: ReplayedRows
    branches: list[BranchReport] = field(default_factory=list)
    error: str | None = None  # one line; None when the replay ran to its end
    stop: StopReason | None = None  # the run's guards ended it (the breaker: also an error; the budget: cleanly)
    stop_detail: str | None = None  # the guard's own words for it
    kept: list[str] = field(default_factory=list)  # stage keys of results kept in the stage results store
    cost: float = 0.0  # of the model calls it made, as priced (USD)

    @property
    def stopped(self) -> bool:
        """The run's breaker ended it (its error says why)."""
        return self.stop is StopReason.CIRCUIT

    @property
    def budget_stop(self) -> str | None:
        """--max-cost ended it, cleanly (a rerun resumes here): the budget's words, else None."""
        return self.stop_detail if self.stop is StopReason.BUDGET else None

    @property
    def complete(self) -> bool:
        """Ran every stage it had to: no error, no budget stop, no failed stage (else the session stays due)."""
        return not self.error and self.stop is None and not any(b.failures for b in self.branches)


def _due_source_tokens(ws: Workspace, session_id: str) -> int:
    """Source tokens not yet covered by an observation on the session's current leaf."""
    with ws.read() as con:
        leaf = dbmod.scalar(con, "session_leaf", {"session_id": session_id})
        if leaf is None:
            return 0
        return read_clocks(con, session_id, leaf, ws.settings)["observer"].tokens


def replay_payload(payload: SessionPayload, settings: Settings, brain: Brain, results: StageResults, *,
                   drain: bool, run_id: str, guards: RunGuards | None = None, compute: Compute | None = None,
                   progress: Progress | None = None,
                   on_error: Callable[[str, str], None] | None = None) -> ReplayResult:
    """Every branch of one session, stage after stage, on an in-memory copy of its rows, with the run's
    ``guards`` (the brain's model was built with the same ones). ``on_error(message, traceback)`` hears
    an unexpected failure."""
    session_id = payload.session_id
    ws = payload_workspace(payload, settings)
    if isinstance(brain, RoutedBrain):  # its stages' models follow the session's own model (SPEC §13)
        with ws.read() as con:
            brain.bind(read_session_model(con, session_id))
    runner = StageRunner(ws, brain, results, run_id, compute, guards)
    result = ReplayResult(session_id, run_id, ReplayedRows(session_id, run_id))
    try:
        due = _due_source_tokens(ws, session_id)
        result.branches = replay_branches(ws, session_id, runner, drain=drain, run_id=run_id, progress=progress)
        if drain and due > 0 and not any(r.stages for r in result.branches):
            result.error = (f"the replay ran no stage although {due} source tokens are not yet observed "
                            f"({len(result.branches)} branch(es) found)")
    except RunStopped as exc:  # the reason is the run's one error line
        result.error, result.stop, result.stop_detail = f"stopped: {exc}", exc.reason, str(exc)
    except BudgetReached as exc:  # --max-cost: what was appended is kept; a rerun resumes here
        result.stop, result.stop_detail = exc.reason, str(exc)
    except Exception as exc:  # one failing session never stops the others
        result.error = f"{type(exc).__name__}: {exc}"
        if on_error is not None:
            on_error(result.error, traceback.format_exc())
    try:
        with ws.read() as con:
            result.rows = replayed_rows(con, session_id, run_id)  # what it appended before any error is kept
    finally:
        ws.close()
    result.kept = list(runner.kept)
    result.cost = result.rows.cost
    return result


def _record_session_error(con: duckdb.DuckDBPyConnection, session_id: str, run_id: str, message: str) -> None:
    con.execute(query("insert_stage_run"), {
        "stage_run_id": uuid.uuid4().hex[:16], "run_id": run_id, "session_id": session_id, "stage": "session",
        "stage_key": "", "tip_entry_id": "", "chunk_first_id": None, "chunk_last_id": None, "model": "",
        "outcome": "failed", "records": 0, "items": 0, "rejected": 0, "error_kind": "permanent",
        "error": message[:2000], "receipts": None, "started_at": datetime.now(timezone.utc)})


def commit_replay(con: duckdb.DuckDBPyConnection, result: ReplayResult, fingerprint: str | None = None) -> dict[str, int]:
    """The one write of a session's replay, in one transaction on ``con`` (the user's database, open to
    write): its rows; its error, or (when it completed) the fingerprint it started from
    (om_core.replay.plan), so that a rerun skips it; and the stage results the ledger now holds the
    records of are forgotten (the ``stage_results`` table; a flow's result storage is the flow's).
    A result committed twice changes nothing."""
    with dbmod.transaction(con):
        written = commit_replayed_rows(con, result.rows)
        if result.error:
            _record_session_error(con, result.session_id, result.run_id, result.error)
        elif fingerprint is not None and result.complete:
            record_replay(con, result.session_id, fingerprint, result.run_id)
        con.execute(query("delete_committed_stage_results"), {"session_id": result.session_id})
    return written


def replay_session(ws: Workspace, session_id: str, brain: Brain, *, guards: RunGuards | None = None,
                   drain: bool = True, run_id: str | None = None, results: StageResults | None = None,
                   compute: Compute | None = None, progress: Progress | None = None) -> ReplayResult:
    """Replay one session now: its payload read from ``ws``, replayed in memory, committed to ``ws``.
    Exactly-once through ``ws``'s ``stage_results`` table unless ``results`` is given."""
    run_id = run_id or dbmod.new_run_id()
    with ws.read() as con:
        payload = read_session_payload(con, session_id)
    result = replay_payload(payload, ws.settings, brain, results if results is not None else TableStageResults(ws),
                            drain=drain, run_id=run_id, guards=guards, compute=compute, progress=progress)
    with ws.write() as con:
        commit_replay(con, result)
    return result
