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
The file holds the holder's pid, host, command and start, for the second writer's message, and the
helper processes the holder started (``record_helpers``): the next writer to take the lock ends those
of a holder that is gone (a kill -9), so no Prefect server outlives om (om_core.store.helpers). A
clean release removes the file, unless it keeps something for the next writer (a run's end the
database could not take, a helper still running); it is unlinked while still locked, and a writer
that locked a file since unlinked opens the path again, so two writers never hold two files.
"""

from __future__ import annotations

import contextlib
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

from om_core.store import helpers as helper_procs
from om_core.errors import DatabaseBusy, OmError, storage_error

_held: dict[str, list] = {}  # lock file -> [descriptor, holder, depth], of this process
_previous: dict[str, dict] = {}  # lock file -> what its previous holder left in it
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
            entry = _held[path] = [*_acquire(Path(path), command, wait_seconds), 0]
        entry[2] += 1
    try:
        yield
    finally:
        with _guard:
            entry[2] -= 1
            if entry[2] == 0:
                del _held[path]
                if not _keeps_something(entry[1]):  # unlinked while locked: no stray file beside the database
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                os.close(entry[0])  # releases the lock


def record_helpers(db_path: str | os.PathLike) -> list[dict]:
    """Note this process's helper processes in the lock it holds (no-op when it holds none); the helpers."""
    path = str(lock_path(db_path))
    with _guard:
        entry = _held.get(path)
        if entry is None:
            return []
        found = helper_procs.helper_processes()
        if found != entry[1].get("helpers"):
            entry[1]["helpers"] = found
            _write_holder(entry[0], entry[1])
        return found


def note_unwritten_outcome(db_path: str | os.PathLike, run_id: str, status: str, detail: dict) -> None:
    """A run's end that the database could not take (a full disk): kept in the lock file it holds, for
    the next writer to record (``unwritten_outcomes``)."""
    path = str(lock_path(db_path))
    with _guard:
        entry = _held.get(path)
        if entry is not None:
            entry[1].setdefault("unwritten", []).append({"run_id": run_id, "status": status, "detail": detail})
            _write_holder(entry[0], entry[1])


def unwritten_outcomes() -> list[dict]:
    """The run ends that the previous holders of the locks this process took could not write."""
    with _guard:
        return [outcome for previous in _previous.values() for outcome in previous.get("unwritten") or []]


def _write_holder(fd: int, holder: dict) -> None:
    try:
        data = json.dumps(holder).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        pass  # a full disk: the lock holds all the same, only its holder goes unnamed


def _keeps_something(holder: dict) -> bool:
    """Whether the lock file must stay after a clean release: a run's end the database could not take,
    or a helper process still running (the next writer ends it once this holder is gone)."""
    return bool(holder.get("unwritten")) or any(
        helper_procs.same_process(int(h["pid"]), h.get("started")) for h in holder.get("helpers") or [])


def _take_over(fd: int, path: Path) -> None:
    """Keep what the previous holder left (run ends it could not write); a kill -9 left its helpers
    running (its Prefect server): end them now."""
    try:
        previous = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except (OSError, ValueError):
        return
    if not isinstance(previous, dict):
        return
    _previous[str(path)] = previous
    if not previous.get("helpers") or previous.get("host") != socket.gethostname():
        return
    if helper_procs.holder_gone(previous):
        helper_procs.end_helpers(previous["helpers"])


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by child processes (PEP 446)
    except OSError as exc:
        raise storage_error(exc, path) or OmError(f"cannot open {path}: {exc.strerror or exc}") from None


def _is_the_path(fd: int, path: Path) -> bool:
    """The locked descriptor is still the file at ``path`` (not one a holder unlinked as it let go)."""
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _acquire(path: Path, command: str, wait_seconds: float) -> tuple[int, dict]:
    fd = _open(path)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _is_the_path(fd, path):
                break
            os.close(fd)  # the holder removed this file as it let go: lock the path's file anew
            fd = _open(path)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(fd)
                os.close(fd)
                db = path.with_name(path.name.removesuffix(".lock"))
                raise DatabaseBusy(f"another om process is writing {db} ({holder}); it admits one writer at a "
                                   "time: try again when that one finishes") from None
            time.sleep(_POLL_SECONDS)
    _take_over(fd, path)
    holder = {"pid": os.getpid(), "pid_started": helper_procs.started(), "host": socket.gethostname(),
              "command": command, "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "helpers": []}
    _write_holder(fd, holder)
    return fd, holder


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"om {info['command']}, pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its holder did not say who it is"
