"""The helper processes a writer starts (Prefect's local API server and its uvicorn, Dask workers),
noted so that none outlives om.

A run ends its helpers itself on exit and on SIGINT/SIGTERM (flows.interrupt). After a kill -9 it
cannot: so each writer notes its helpers in the writer lock file (om_core.store.writer_lock) before any
work begins and again whenever they change, and the next writer to take the lock ends the helpers
of a holder that is gone. A process is named by its pid AND its start time: a pid the system gave
to another process since is never touched.
"""

from __future__ import annotations

import os
import threading
from typing import Any


def _process(pid: int | None = None):  # noqa: ANN202 - a psutil.Process
    import psutil  # only writers get here; psutil is small

    return psutil.Process(pid)


def started(pid: int | None = None) -> float | None:
    """A process's start time (seconds since the epoch, as the kernel keeps it); None when it is gone."""
    import psutil

    try:
        return _process(pid).create_time()
    except psutil.Error:
        return None


def _listed_descendants() -> list[int] | None:
    """This process's descendants as the kernel lists each thread's children (Linux:
    /proc/PID/task/TID/children), read for them alone; None where the kernel keeps no such list.
    A run asks every second, and psutil's own walk reads every process's stat file on the machine."""
    if not os.path.exists(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/children"):
        return None
    found: list[int] = []
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended meanwhile
            continue
        for tid in threads:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(children)
            todo.extend(children)
    return found


def helper_processes() -> list[dict[str, Any]]:
    """This process's descendants: pid, start time, command line (for a reader of the lock file)."""
    import psutil

    found = []
    listed = _listed_descendants()
    try:
        children = _process().children(recursive=True) if listed is None else sorted(set(listed))
    except psutil.Error:
        return []
    for child in children:
        try:
            if isinstance(child, int):
                child = _process(child)
            found.append({"pid": child.pid, "started": child.create_time(), "cmd": " ".join(child.cmdline())[:200]})
        except psutil.Error:  # ended meanwhile
            pass
    return sorted(found, key=lambda h: h["pid"])


def same_process(pid: int, when: float | None) -> bool:
    """True when ``pid`` is still the process that started at ``when``."""
    now = started(pid)
    return now is not None and when is not None and abs(now - when) < 0.05


def holder_gone(holder: dict[str, Any]) -> bool:
    """The lock's previous holder (pid and start time) no longer runs (on this host)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # unnamed, or this very process: nothing to end
    if holder.get("pid_started") is None:  # written before start times were kept: alive means alive
        return started(pid) is None
    return not same_process(pid, holder["pid_started"])


def end_helpers(helpers: list[dict[str, Any]], timeout: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``timeout``, each helper that is still the process noted; the pids ended."""
    import psutil

    procs = []
    for helper in helpers:
        try:
            if same_process(int(helper["pid"]), helper.get("started")):
                procs.append(_process(int(helper["pid"])))
        except (psutil.Error, KeyError, TypeError, ValueError):
            pass
    terminate_then_kill(procs, timeout)
    return [p.pid for p in procs]


def terminate_then_kill(procs: list[Any], timeout: float) -> None:
    """SIGTERM each psutil process, then SIGKILL what is still alive after ``timeout`` seconds."""
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=timeout)
