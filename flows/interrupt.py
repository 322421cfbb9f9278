"""Stopping a run cleanly on Ctrl-C (SIGINT) or SIGTERM, and leaving no process behind.

The flow runs in a thread; the main thread waits for it and handles the signal. On a signal:
no new model call starts (the run's circuit breaker is tripped with the reason "interrupted"), the
flow's commit lock is taken for good (a commit in progress finishes; none starts), the run row is
marked ``interrupted``, the processes the run started (Prefect's local API server, a local Dask
cluster) are ended, and the caller exits at once with 130 (SIGINT) or 143 (SIGTERM), without
Prefect's own shutdown. In-flight replays are abandoned: their rows were never committed, and the
stage results they computed are in the result storage, so rerunning the same command resumes.

The helper processes are noted (pid and start time) in the writer lock file from before the flow's
work begins and every second after, so that after a kill -9 of ``om`` the next writer's start ends
those still alive (om_core.store.writer_lock, om_core.store.helpers); the run's row names them too.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from om_core.errors import StopReason

if TYPE_CHECKING:
    from flows.run_result import RunResult
    from om_core.store.workspace import Workspace
    from om_core.workers.run_config import RunGuards

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclass
class Interruption:
    signum: int
    run_id: str
    sessions: int  # committed by this run
    observations: int
    compactions: int
    stderr: int = 2  # where the one line goes (the real stderr, kept aside while the rest is silenced)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 128 + self.signum)

    @property
    def line(self) -> str:
        name = signal.Signals(self.signum).name
        return (f"interrupted ({name}): run {self.run_id} committed {self.sessions} session(s), "
                f"{self.observations} observation(s), {self.compactions} compaction(s); "
                "rerun the same command to resume")


class RunInterrupted(Exception):
    reason = StopReason.INTERRUPT

    def __init__(self, interruption: Interruption) -> None:
        super().__init__(interruption.line)
        self.interruption = interruption


def silence_stderr() -> int:
    """From now on what the abandoned threads print (Prefect's websockets closing as its server ends)
    goes nowhere; returns a descriptor of the real stderr for the one line that is ours."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    return saved


def say_and_exit(fd: int, line: str, code: int) -> None:
    sys.stdout.flush()
    os.write(fd, (line + "\n").encode())
    os._exit(code)


def child_pids() -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process().children(recursive=True)]


def end_processes(pids: list[int], timeout: float = 3.0) -> None:
    import psutil

    from om_core.store.helpers import terminate_then_kill

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            pass
    terminate_then_kill(procs, timeout)


def _interrupt(ws: Workspace, run_id: str, guards: RunGuards, signum: int) -> Interruption:
    import json

    from flows.replay_window import COMMIT_LOCK
    from om_core.store.db import named_row
    from om_core.model.client import ModelError
    from om_core.store.sqlfiles import query

    logging.disable(logging.CRITICAL)  # the abandoned flow's errors and Prefect's shutdown are not news
    stderr = silence_stderr()
    guards.breaker.trip(ModelError("the run was interrupted", "permanent"))  # the run's RunGuards
    COMMIT_LOCK.acquire(timeout=30)  # held until exit: no commit starts, none is cut in half
    numbers = {"sessions": 0, "observations": 0, "compactions": 0}
    try:
        with ws.write() as con:
            con.execute(query("interrupt_run"), {"run_id": run_id, "detail": json.dumps(
                {"signal": signal.Signals(signum).name})})
            row = named_row(con, "run_outcome", {"run_id": run_id})
            numbers = {"sessions": row["sessions"], "observations": row["observations"],
                       "compactions": row["compactions"]}
    except Exception:  # the database is busy or gone: the next run's start marks the row
        pass
    end_processes(child_pids())
    return Interruption(signum, run_id, stderr=stderr, **numbers)


def _in_a_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the main thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="om-flow", daemon=True)
    thread.start()
    return thread, outcome


class _Signals:
    """SIGINT and SIGTERM noted for the main thread's loop; a second one exits at once."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def handler(self, signum, frame) -> None:  # noqa: ANN001 - the signal module's signature
        if self.signum is not None:
            os._exit(EXIT_CODES.get(signum, 128 + signum))
        self.signum = signum

    def __enter__(self) -> _Signals:
        self.previous = {s: signal.signal(s, self.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, h in self.previous.items():
            signal.signal(s, h)


def _record_helpers(ws: Workspace) -> None:
    """Note the run's helper processes in the writer lock file, for the next start after a kill -9
    (the run's row got those already running when the flow inserted it: om_core.store.runs.start_run)."""
    from om_core.store import writer_lock

    if ws.has_file:
        writer_lock.record_helpers(ws.path)


def run_interruptibly(ws: Workspace, run_id: str, guards: RunGuards, work: Callable[[], RunResult],
                      on_tick: Callable[[], None] | None = None) -> RunResult:
    """Run ``work`` (the flow) in a thread; raise ``RunInterrupted`` on SIGINT/SIGTERM."""
    with _Signals() as got:
        thread, outcome = _in_a_thread(work)
        ticks = 0
        while thread.is_alive():
            thread.join(0.25)
            if got.signum is not None:
                raise RunInterrupted(_interrupt(ws, run_id, guards, got.signum))
            if on_tick is not None:
                on_tick()
            if ticks % 4 == 0:  # every second: remember the helper processes, for after a kill -9
                _record_helpers(ws)
            ticks += 1
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class _ServeSignals(_Signals):
    """`om serve`'s: the first signal silences this process's stdout and stderr at once, in the handler.
    A terminal's Ctrl-C reaches the whole process group, so the flow run's own process (Prefect's runner
    relays its output through this one) prints its ``KeyboardInterrupt`` traceback a moment later: that
    must find nowhere to go. Further signals change nothing: the stop under way is bounded, and exiting
    before it ends would leave the local Prefect server running."""

    stderr: int | None = None

    def handler(self, signum, frame) -> None:  # noqa: ANN001 - the signal module's signature
        if self.signum is not None:
            return
        self.signum = signum
        self.stderr = silence_stderr()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


def serve_until_signal(work: Callable[[], Any], cleanup: Callable[[], None],
                       farewell: Callable[[int], str],
                       stopped: Callable[[list[int], int], None] | None = None) -> None:
    """`om serve`: serve in a thread until SIGINT/SIGTERM (or until serving ends); then end every
    process it started (flow runs in progress included: their database work is one transaction, so
    nothing is half-written), ``stopped(pids, signum)`` with every child pid seen while serving (to mark
    their runs interrupted), ``cleanup`` (the local Prefect server it started), print ``farewell(code)``
    and exit with 130 or 143. Nothing but that line is printed after the signal."""
    with _ServeSignals() as got:
        thread, outcome = _in_a_thread(work)
        seen: set[int] = set()
        ticks = 0
        while thread.is_alive() and got.signum is None:
            thread.join(0.25)
            ticks += 1
            if ticks % 4 == 0 and got.signum is None:  # a flow run's process may end on the signal itself
                seen.update(child_pids())
        if got.signum is None:
            cleanup()
            if "error" in outcome:
                raise outcome["error"]
            return
        logging.disable(logging.CRITICAL)  # Prefect's shutdown of the abandoned runner is not news
        children = child_pids()
        end_processes(children)
        if stopped is not None:
            try:
                stopped(sorted(seen | set(children)), got.signum)
            except Exception:  # the database is busy or gone: the next run's start marks the rows abandoned
                pass
        cleanup()
        code = EXIT_CODES.get(got.signum, 128 + got.signum)
        say_and_exit(got.stderr if got.stderr is not None else 2, farewell(code), code)
