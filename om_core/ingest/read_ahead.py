"""The producer side of an ingest: a thread that plans the files in order and parses them into
batches ahead of the writer, through a ``queue.Queue``.

The queue holds, per file, a ``Prepared`` item (its plan and reader), then the file's events
(``Batch``, ``Header``) and an ``Ended`` or ``Failed`` item. It is bounded by the characters of the
batches it holds (``READ_AHEAD_BYTES``), not by their number, so memory stays bounded whatever the
line lengths; a semaphore keeps the planning at most ``PLAN_FILES_AHEAD`` files ahead. The
tokenizer threads so always have work, also while the writer inserts, commits and finishes a file.

Plans are made from committed rows through a cursor; a file's row is changed by nothing but the
ingest of that file, and the ingest checks the row again before it uses a plan.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from om_core.ingest import plan as planning
from om_core.ingest.connection import WriteConnection
from om_core.ingest.plan import Plan
from om_core.ingest.reader import Batch, FileEnd, FileReader, Header, ProgressFn

READ_AHEAD_BYTES = 8 << 20  # parsed (and being counted) in the next files while one is finished
PLAN_FILES_AHEAD = 64
POLL_SECONDS = 0.5  # how often a waiting writer checks that the thread is still alive


@dataclass(slots=True)
class Prepared:
    index: int
    plan: Plan | None  # None: planning failed; the writer plans the file itself and reports the error
    reader: FileReader | None  # None: nothing to read


@dataclass(slots=True)
class Ended:
    final: FileEnd


@dataclass(slots=True)
class Failed:
    error: BaseException


class BatchQueue(queue.Queue):
    """A ``queue.Queue`` whose size is the characters of the batches it holds (other items weigh
    nothing but still count, so an empty queue has size 0 and a queue of markers does not)."""

    def _init(self, maxsize: int) -> None:
        self.queue: deque[Any] = deque()
        self.chars = 0

    def _qsize(self) -> int:
        return self.chars + len(self.queue)

    def _put(self, item: Any) -> None:
        self.queue.append(item)
        if isinstance(item, Batch):
            self.chars += item.size

    def _get(self) -> Any:
        item = self.queue.popleft()
        if isinstance(item, Batch):
            self.chars -= item.size
        return item

    def wait_for_room(self) -> None:
        """Block until the queue is below its bound (the producer parses the next batch only then)."""
        with self.not_full:
            while 0 < self.maxsize <= self._qsize():
                self.not_full.wait()


class ReadAhead:
    def __init__(self, holder: WriteConnection, files: list[Path], progress: ProgressFn | None, encoding: str,
                 threads: int) -> None:
        self.holder = holder
        self.files = files
        self.progress = progress
        self.encoding = encoding
        self.threads = threads
        self.items = BatchQueue(READ_AHEAD_BYTES)
        self.plans_ahead = threading.Semaphore(PLAN_FILES_AHEAD)
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="om-ingest-reader", daemon=True)
        self.thread.start()

    # ---- the writer's side

    def _get(self) -> Any:
        while True:
            try:
                return self.items.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self.thread.is_alive() and self.items.empty():
                    return None

    def take(self, index: int) -> tuple[Plan, FileReader | None] | None:
        """The plan and reader of file ``index`` (None: plan it yourself). Drops what is still queued
        of the files before it (a file the writer stopped reading)."""
        while (item := self._get()) is not None:
            if isinstance(item, Prepared) and item.index == index:
                self.plans_ahead.release()
                return None if item.plan is None else (item.plan, item.reader)
        return None

    def next_event(self, reader: FileReader) -> Batch | Header | None:
        item = self._get()
        if isinstance(item, Failed):
            reader.final = None
            raise item.error
        if isinstance(item, Ended):
            reader.final = item.final
            return None
        if item is None:
            raise RuntimeError("the ingest's read-ahead thread ended before the file was read")
        return item

    def close(self) -> None:
        self.closed = True
        self.plans_ahead.release()  # a thread waiting to plan sees ``closed``
        while self.thread.is_alive():
            self._drain()  # a thread waiting for room sees ``closed``
            self.thread.join(0.05)
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self.items.get_nowait()
        except queue.Empty:
            pass

    # ---- the thread

    def _run(self) -> None:
        for index, path in enumerate(self.files):
            self.plans_ahead.acquire()
            if self.closed:
                return
            plan = reader = None
            try:
                with self.holder.lock:
                    plan = planning.plan_file(self.holder.cursor, path)
                if plan.reads:
                    reader = FileReader(plan, self.progress, self.encoding, self.threads, self)
            except Exception:
                plan = reader = None  # the writer plans the file itself, and reports what goes wrong
            try:
                self.items.put(Prepared(index, plan, reader))
                if reader is not None:
                    self._read(reader)
            finally:
                if reader is not None:
                    reader.close()
            if self.closed:
                return

    def _read(self, reader: FileReader) -> None:
        """Parse the whole file into the queue, unless the writer stops it or the ingest closes."""
        while True:
            self.items.wait_for_room()
            if self.closed or reader.stopped:
                return
            try:
                events = reader.parse_some()
            except Exception as exc:
                reader.done = True
                self.items.put(Failed(exc))
                return
            for event in events:
                self.items.put(event)
            if reader.finished is not None:
                reader.done = True
                self.items.put(Ended(reader.finished))
                return
