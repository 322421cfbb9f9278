"""One writer at a time: a lock file next to the database, held by the command or flow run that writes.

DuckDB admits one process at a time, and om's long writers (``om run``, ``om ingest``, ``om
observe``/``reflect``, each of ``om serve``'s flow runs) let go of the file between commits so that
readers get in; two writers would interleave their runs. So each holds ``<database>.lock`` for its
whole work, from before it plans. A second writer waits a few seconds (the workspace's
``busy_seconds``) and then stops with ``DatabaseBusy`` (exit 3), naming the holder: what a cron job
needs (the next tick comes anyway; waiting would pile runs up).

The lock is ``flock`` on a descriptor that no child process inherits: the kernel releases it when
the holder ends, a kill -9 included, so a lock never outlives its process. Within one process it is
re-entrant: ``om run`` holds it around its plan and the flow it starts, which takes it too.
The file itself stays (removing a lock file races with the next writer opening it); it holds the
holder's pid, host, command and start, for the second writer's message.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from om_core.errors import DatabaseBusy, OmError, storage_error

_held: dict[str, list[int]] = {}  # lock file -> [descriptor, depth], of this process
_guard = threading.Lock()
_POLL_SECONDS = 0.1


def lock_path(db_path: str | os.PathLike) -> Path:
    db = Path(db_path).resolve()
    return db.with_name(db.name + ".lock")


@contextmanager
def one_writer(db_path: str | os.PathLike, command: str, wait_seconds: float) -> Iterator[None]:
    """Hold the database's writer lock for the block (``DatabaseBusy`` when another process keeps it)."""
    path = str(lock_path(db_path))
    with _guard:  # held while acquiring: this process's threads share the one lock
        entry = _held.get(path)
        if entry is None:
            entry = _held[path] = [_acquire(Path(path), command, wait_seconds), 0]
        entry[1] += 1
    try:
        yield
    finally:
        with _guard:
            entry[1] -= 1
            if entry[1] == 0:
                del _held[path]
                os.close(entry[0])  # releases the lock


def _acquire(path: Path, command: str, wait_seconds: float) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes (PEP 446)
    except OSError as exc:
        raise storage_error(exc, path) or OmError(f"cannot open {path}: {exc.strerror or exc}") from None
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                db = path.with_name(path.name.removesuffix(".lock"))
                raise DatabaseBusy(f"another om process is writing {db} ({holder}); it admits one writer at a "
                                   "time: try again when that one finishes") from None
            time.sleep(_POLL_SECONDS)
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
    except OSError:
        pass  # a full disk: the lock holds all the same, only its holder goes unnamed
    return fd


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"om {info['command']}, pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder did not say who it is"
