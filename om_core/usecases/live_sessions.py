"""What a live endpoint keeps per session file between answers, so that an answer after Pi appended a
line reads only what is new: the file as it was last ingested (its identity, size and modification
time), the session it holds, the session's branch as read so far (``BranchRows``: extended by the
entries after its tip), and the compactions answered since anything changed (asked again, the same
answer, without reading the database).

What is kept is only ever a copy of what the database says: it goes when the file is rewritten (not
just appended to), when another process wrote the database while the endpoint had let it go
(``SharedFileDatabase.changed_by_others``: an `om forget`, `om serve`'s runs, an `om ingest` of the
same file), and the kept answers go when anything is ingested or a catch-up records memory (a
session's summary may show its project's memory, so every session's answers are out of date then). The
kept folds go with the branch, when its new entries hold a record or a compaction, when the ingest
imported records of the file's ledger, and when a catch-up records memory.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from om_core.ingest.reports import FileReport
    from om_core.memory.gap_free_compaction import BranchRows
    from om_core.usecases.live import LiveCompaction

FileMark = tuple[int, int, int, int]  # device, inode, size, modification time (ns)
KEPT_SESSIONS = 64  # the sessions whose state is kept (the most recently asked); an older one is read afresh


def file_mark(path: Path) -> FileMark | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


@dataclass
class LiveSession:
    """One session file's state between answers (used under the endpoint's lock for that file)."""

    path: Path
    ingested: FileMark | None = None  # the file as the database holds it (taken before it was read)
    session_id: str | None = None
    branch: BranchRows | None = None
    # the compactions answered since the file was last changed, by request and settings, each with the
    # count of memory recordings when it began (a recording since: it may be out of date)
    answers: dict[str, tuple[int, LiveCompaction]] = field(default_factory=dict)
    owner: LiveSessions | None = None
    folded_at: int = 0  # the count of memory recordings when the branch's kept folds were read

    def recordings(self) -> int:
        return self.owner.recordings if self.owner is not None else 0

    def answer(self, key: str) -> LiveCompaction | None:
        """The compaction answered for ``key`` when nothing it read has changed since."""
        kept = self.answers.get(key)
        return kept[1] if kept is not None and kept[0] == self.recordings() else None

    def branch_of(self, session_id: str) -> BranchRows:
        """The session's branch as read so far (a new one for another session), its kept folds dropped
        when memory was recorded since they were read."""
        from om_core.memory.gap_free_compaction import BranchRows

        if self.branch is None or self.branch.session_id != session_id:
            self.branch = BranchRows(session_id)
        if self.folded_at != self.recordings():
            self.folds_dropped()
        return self.branch

    def folds_dropped(self) -> None:
        """The ledger changed (memory recorded): the branch's folds are read again."""
        if self.branch is not None:
            self.branch.folds.clear()
        self.folded_at = self.recordings()

    def unchanged(self) -> bool:
        """The file is as it was last ingested: its lines need not be read again."""
        return self.session_id is not None and self.ingested is not None and file_mark(self.path) == self.ingested

    def ingested_now(self, mark: FileMark | None, report: FileReport) -> None:
        """After an ingest of the file as it stood at ``mark``: a plain append (or nothing new) keeps the
        branch; anything else (a rewrite, a migration followed, duplicate ids settled, notes) drops it."""
        plain = (report.status in ("appended", "unchanged") and not report.notes and not report.replaced
                 and not report.followed and report.session_id == self.session_id)
        if not plain:
            self.branch = None
        elif self.branch is not None and any(report.ledger.values()):  # the file's ledger grew
            self.branch.folds.clear()
        if report.entries_added or not plain:
            self.answers.clear()
        self.ingested, self.session_id = mark, report.session_id

    def forget(self) -> None:
        self.ingested = self.session_id = self.branch = None
        self.answers.clear()


class LiveSessions:
    """The endpoint's live sessions, by file; all dropped when the database changed under it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: OrderedDict[Path, LiveSession] = OrderedDict()
        self._changes: int | None = None
        self.recordings = 0  # catch-ups that recorded memory (an answer begun before one is out of date)

    def session(self, path: Path, changed_by_others: int) -> LiveSession:
        """The state of ``path``'s session; ``changed_by_others``: the database's count of changes found
        when it was opened again (a new count: every session's state is dropped first)."""
        with self._lock:
            if changed_by_others != self._changes:
                for kept in self._sessions.values():
                    kept.forget()
                self._changes = changed_by_others
            kept = self._sessions.setdefault(path, LiveSession(path, owner=self))
            self._sessions.move_to_end(path)
            while len(self._sessions) > KEPT_SESSIONS:
                self._sessions.popitem(last=False)
            return kept

    def memory_recorded(self) -> None:
        """A catch-up recorded memory: every kept answer is out of date (a session's summary may show
        its project's memory, so others' too)."""
        with self._lock:
            self.recordings += 1
