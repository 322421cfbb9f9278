"""One writer at a time: a second writing command on one database gets exit 3 and
one line naming the holder; the lock is re-entrant within a process and never outlives its holder
(kill -9 included). The two real `om run` at once are in test_run_command.py, a tick of `om serve`'s
flow beside another writer in test_flows.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder

from om_core.errors import DatabaseBusy
from om_core.store.writer_lock import lock_path, one_writer

REPO = Path(__file__).resolve().parent.parent
HOLD = """
import sys, time
from om_core.store.writer_lock import one_writer
with one_writer(sys.argv[1], "run", 0):
    print("held", flush=True)
    time.sleep(600)
"""


def env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OM_")}, "COLUMNS": "300",
            "PYTHONPATH": str(REPO)}


@pytest.fixture
def holder(tmp_path):
    """Another process holding the writer lock of tmp_path/om.duckdb, as `om run` would."""
    db = tmp_path / "om.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(db)], stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert proc.stdout.readline().strip() == "held"
        yield db, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def om(db: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), *args], cwd=cwd, env=env(),
                          capture_output=True, text=True, timeout=180)


def test_re_entrant_in_one_process_and_shared_by_its_threads(tmp_path):
    db = tmp_path / "om.duckdb"
    with one_writer(db, "run", 0):
        with one_writer(db, "ingest", 0):  # om run's command, then its flow and its ingest
            pass
        seen: list[str] = []

        def flow_thread() -> None:  # om run's flow runs in a thread of the command's process
            with one_writer(db, "run", 0):
                seen.append("in")

        worker = threading.Thread(target=flow_thread)
        worker.start()
        worker.join(10)
        assert seen == ["in"]
    assert lock_path(db) == tmp_path / "om.duckdb.lock"


def test_a_second_writer_is_refused_after_a_short_wait_naming_the_holder(holder, tmp_path):
    db, proc = holder
    started = time.monotonic()
    with pytest.raises(DatabaseBusy) as caught:
        with one_writer(db, "ingest", 0.5):
            pytest.fail("two writers at once")
    assert 0.5 <= time.monotonic() - started < 5
    assert f"another om process is writing {db} (om run, pid {proc.pid} on " in str(caught.value)
    assert caught.value.exit_code == 3


def test_writing_commands_beside_a_writer_exit_3_in_one_line_and_write_nothing(holder, tmp_path):
    db, proc = holder
    b = SessionBuilder("10c40000-1111-4222-8333-444444444444")
    b.user("hello")
    b.assistant("hi")
    path = b.write(tmp_path / "s.jsonl")
    for args in (["ingest", str(path)], ["run", str(path), "--model", "offline"],
                 ["observe", str(path), "--model", "offline"], ["reflect", str(path), "--model", "offline"]):
        done = om(db, *args, cwd=tmp_path)
        assert done.returncode == 3, (args, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip() and "offline baseline" not in line]
        assert len(lines) == 1 and lines[0].startswith(f"error: another om process is writing {db} (om run, "
                                                       f"pid {proc.pid} "), (args, done.stderr)
        assert "Traceback" not in done.stderr and not db.exists(), args


def test_kill_9_of_the_holder_frees_the_lock_at_once(holder, tmp_path):
    db, proc = holder
    b = SessionBuilder("10c40000-1111-4222-8333-555555555555")
    b.user("hello")
    path = b.write(tmp_path / "s.jsonl")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    done = om(db, "ingest", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
    finally:
        con.close()


def test_a_clean_release_leaves_no_lock_file_and_a_waiting_writer_locks_the_path_anew(holder, tmp_path):
    """No stray ``<db>.lock`` beside the database after a writer is done: the holder removes it as it
    lets go. A writer that was waiting then holds the file now at the path (one it opens anew), so a
    third writer is refused, not let in beside it."""
    db = tmp_path / "mine.duckdb"
    with one_writer(db, "ingest", 0):
        assert lock_path(db).is_file()
    assert not lock_path(db).exists()
    # the holder fixture's process holds om.duckdb; this process waits for it, on the file it opened
    db, proc = holder
    taken: list[str] = []

    def second_writer() -> None:
        with one_writer(db, "run", 30):
            taken.append("in")
            time.sleep(3)

    worker = threading.Thread(target=second_writer)
    worker.start()
    time.sleep(0.5)
    proc.kill()  # the holder ends (its lock file stays: a kill -9 removes nothing)
    deadline = time.monotonic() + 20
    while not taken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert taken == ["in"]
    third = subprocess.run([sys.executable, "-c", "import sys\nfrom om_core.store.writer_lock import one_writer\n"
                            "with one_writer(sys.argv[1], 'ingest', 0.2): print('in')", str(db)],
                           capture_output=True, text=True, env=env(), timeout=60)
    assert "another om process is writing" in third.stderr and "in" not in third.stdout.split()
    worker.join(10)
    assert not lock_path(db).exists()


def test_a_release_that_unlinked_the_file_sends_a_waiter_to_the_path_anew(tmp_path):
    """The race a removed lock file opens: a waiter locked the old file just as its holder unlinked it.
    It sees the path now names another file (or none) and locks that one instead."""
    from om_core.store import writer_lock

    db = tmp_path / "om.duckdb"
    path = lock_path(db)
    stale = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # opened before the holder let go
    os.unlink(path)
    assert not writer_lock._is_the_path(stale, path)
    os.close(stale)
    fresh = writer_lock._open(path)
    try:
        assert writer_lock._is_the_path(fresh, path)
    finally:
        os.close(fresh)


def test_a_lock_file_with_a_run_end_for_the_next_writer_stays(tmp_path):
    from om_core.store import writer_lock

    db = tmp_path / "om.duckdb"
    with one_writer(db, "run", 0):
        writer_lock.note_unwritten_outcome(db, "run-1", "failed", {"errors": ["disk full"]})
    assert "run-1" in lock_path(db).read_text()  # the next writer records it (unwritten_outcomes)
