"""The run's sessions in flight (flows.pipeline): a window of at most ``size`` replays submitted at once,
each session's payload read just before its replay starts, each result committed as it arrives by this
process, the one writer of the user's database.

``ReplayWindow.run`` reads as the steps: fill the window, then collect each finished replay (settle
its share of the budget, commit it, forget the stage results its commit made safe, submit the next
session) until none is in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from flows import progress as progress_board
from flows.run_names import session_label
from flows.storage import PrefectStageResults
from om_core.errors import StopReason, StorageError, storage_error
from om_core.model.client import ModelError
from om_core.replay.engine import ReplayResult, commit_replay
from om_core.replay.payload import SessionPayload, read_session_payload
from om_core.store import db as dbmod

if TYPE_CHECKING:
    import duckdb

    from om_core.replay.plan import RunPlan
    from om_core.store.workspace import Workspace
    from om_core.workers.run_config import RunGuards

# Commits are serialised, and an interrupted run takes this lock for good before it exits, so the
# database never sees half a commit (flows.interrupt).
COMMIT_LOCK = threading.Lock()

# submit(payload, label, guards) -> a future of the session's ReplayResult (the flow's Prefect task)
Submit = Callable[[SessionPayload, str, "RunGuards"], Any]


def full_disk(exc: BaseException, ws: Workspace) -> StorageError:
    """The storage error ``exc`` stands for (a full disk, a read-only file), the one check of the
    full-disk path; any other error is raised again as it was."""
    stored = storage_error(exc, ws.path)
    if stored is None:
        raise exc
    return stored


@contextmanager
def trips_on_full_disk(ws: Workspace, guards: RunGuards) -> Iterator[None]:
    """A write that may fill the disk: if it does, the run's breaker trips (no later model call
    starts; what was committed stays) instead of the error ending the run."""
    try:
        yield
    except Exception as exc:
        guards.breaker.trip(full_disk(exc, ws))


class ReplayWindow:
    """The replays of one run's due sessions, ``size`` at a time, committed as they finish."""

    def __init__(self, ws: Workspace, plan: RunPlan, guards: RunGuards, *, size: int, storage: Any,
                 submit: Submit, shared: bool, wait: Callable[[list[Any]], Any]) -> None:
        self.ws, self.plan, self.guards, self.size = ws, plan, guards, size
        self.storage = storage  # the run's stage result storage (flows.storage)
        self.submit_replay, self.wait = submit, wait
        self.shared = shared  # replays share the run's guards (threads); else each gets a copy and a loan
        self.queue = list(plan.due)
        self.pending: list[Any] = []
        self.results: list[ReplayResult] = []
        self.labels: dict[str, str] = {}
        self.lent: dict[str, float] = {}

    def run(self) -> list[ReplayResult]:
        """Every due session replayed and committed; the results in the plan's order."""
        progress_board.start(list(self.plan.due))
        self.fill()
        while self.pending:
            done = self.wait(self.pending)
            self.pending.remove(done)
            self.collect(done.result())
        PrefectStageResults(self.storage).tidy()  # every replay is committed or failed: nothing more is kept
        order = {sid: i for i, sid in enumerate(self.plan.due)}
        return sorted(self.results, key=lambda r: order[r.session_id])

    def fill(self) -> None:
        """The first window's payloads, in one read."""
        if self.queue:
            with self.ws.read() as con:
                while self.queue and len(self.pending) < self.size:
                    self.submit_next(con)

    def collect(self, result: ReplayResult) -> None:
        """A finished replay: its spending settled, its rows committed (with the next session's payload
        read in the same open of the file: opening a DuckDB file costs ~20 ms of CPU, the largest part
        of the one writer's work per session), its kept stage results forgotten."""
        self.settle(result)
        waiting = len(self.queue)
        self.forget(self.commit(result))
        if self.queue and len(self.queue) == waiting:  # not read with the commit (a full disk): read it alone
            with self.ws.read() as con:
                self.submit_next(con)
        self.results.append(result)
        # the board is drawn here too: a replay on a cluster worker cannot update this process's board
        progress_board.update({"session_id": result.session_id,
                               **({"error": result.error} if result.error else {"done": True})})

    def submit_next(self, con: duckdb.DuckDBPyConnection) -> None:
        sid = self.queue[0]
        payload = read_session_payload(con, sid)
        self.labels[sid] = session_label(payload.file_path, sid)
        guards = self.guards
        if not self.shared:
            if guards.budget is not None:
                self.lent[sid] = guards.budget.lend(self.size)
            guards = guards.for_replay(self.lent.get(sid))
        self.pending.append(self.submit_replay(payload, self.labels[sid], guards))
        self.queue.pop(0)

    def settle(self, result: ReplayResult) -> None:
        """A replay elsewhere: its spending joins the run's budget, and its stop stops the run."""
        if result.session_id in self.lent and self.guards.budget is not None:
            self.guards.budget.settle(self.lent.pop(result.session_id), result.cost)
        if result.stop is StopReason.CIRCUIT and not self.guards.breaker.tripped:  # no later replay starts
            self.guards.breaker.trip(ModelError(result.stop_detail or "", "permanent"))

    def commit(self, result: ReplayResult) -> list[str]:
        """The replay's rows in one transaction, and the next payload read: the stage keys of the
        results its commit made safe to forget. After a full disk nothing more is written."""
        committed: list[str] = []
        if isinstance(self.guards.breaker.reason, StorageError):
            return committed
        with trips_on_full_disk(self.ws, self.guards), COMMIT_LOCK, self.ws.write() as con:
            commit_replay(con, result, self.plan.fingerprints.get(result.session_id))
            if result.kept:
                committed = dbmod.named_column(con, "committed_stage_keys",
                                               {"session_id": result.session_id, "stage_keys": result.kept})
            if self.queue:
                self.submit_next(con)
        return committed

    def forget(self, committed: list[str]) -> None:
        """Their records are in the ledger: the stage results kept for them can go."""
        if committed:
            PrefectStageResults(self.storage).forget(committed)
