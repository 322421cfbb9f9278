"""The ``runs`` table: one row per pipeline run, owned by the process that started it.

A run row never stays ``running`` after its process has ended: when a run starts, rows of runs
whose process on this host is gone are marked ``abandoned`` (what they committed stays).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import duckdb

from om_core.store import writer_lock
from om_core.store.db import named_rows
from om_core.store.sqlfiles import query


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


_HELPERS = ("prefect", "uvicorn", "distributed", "dask")


def _end_left_behind(pids: list[int] | None) -> None:
    """End the helper processes (Prefect's API server, Dask) a killed run left running."""
    if not pids:
        return
    import psutil

    for pid in pids:
        try:
            proc = psutil.Process(pid)
            command = " ".join(proc.cmdline())
            if any(name in command for name in _HELPERS):  # never someone else's process on a reused pid
                proc.terminate()
        except psutil.Error:
            pass


def mark_abandoned_runs(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Rows left ``running``: how the run ended when its own process could not write it (a full disk:
    the lock file kept it, om_core.store.writer_lock), else ``abandoned`` when its process is gone."""
    for outcome in writer_lock.unwritten_outcomes():  # a run id is unique: another database's is a no-op
        con.execute(query("finish_unwritten_run"), {"run_id": outcome["run_id"], "status": outcome["status"],
                                                    "detail": json.dumps(outcome["detail"], default=str)})
    host = socket.gethostname()
    gone = [run for run in named_rows(con, "running_runs")
            if run["host"] == host and (run["pid"] is None or not _alive(run["pid"]))]
    for run in gone:
        con.execute(query("mark_run_abandoned"), {"run_id": run["run_id"]})
        _end_left_behind(run["child_pids"])
    return [run["run_id"] for run in gone]


def start_run(con: duckdb.DuckDBPyConnection, run_id: str, command: str, detail: dict[str, Any],
              child_pids: list[int] | None = None) -> None:
    """The run's row, with the helper processes already running (Prefect's local API server starts
    before the flow's first line)."""
    mark_abandoned_runs(con)
    con.execute(query("start_run"), {"run_id": run_id, "command": command, "detail": json.dumps(detail, default=str),
                                     "pid": os.getpid(), "host": socket.gethostname(), "child_pids": child_pids})


def finish_run(con: duckdb.DuckDBPyConnection, run_id: str, status: str, detail: dict[str, Any]) -> None:
    con.execute(query("finish_run"), {"run_id": run_id, "status": status, "detail": json.dumps(detail, default=str)})


def mark_interrupted_runs(con: duckdb.DuckDBPyConnection, pids: list[int], signal_name: str) -> list[str]:
    """The runs still ``running`` whose process (on this host) is one of ``pids``, processes a signal
    ended (`om serve`'s flow runs on Ctrl-C): marked ``interrupted``, as `om run` marks its own."""
    host, ended = socket.gethostname(), set(pids)
    hit = [run["run_id"] for run in named_rows(con, "running_runs") if run["host"] == host and run["pid"] in ended]
    for run_id in hit:
        con.execute(query("interrupt_run"), {"run_id": run_id, "detail": json.dumps({"signal": signal_name})})
    return hit
