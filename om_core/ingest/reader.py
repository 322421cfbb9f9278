"""Reading one session file: lines through Pi's parser (``om_core.pi.session``: version migration,
source entries, bad lines set aside) into batches of entries and quarantined lines.

Lines stream through in batches of about 1 MB, so memory does not grow with file size; each
batch's real-tokenizer counts start at once on the tokenizer threads (``count_tokens(wait=False)``,
the GIL released), and are waited for only when the batch is written.
"""

from __future__ import annotations

import copy
import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from om_core.ingest.plan import Plan
from om_core.pi.session import ParsedEntry, ParserState, RejectedLine, SessionHeader, SessionParser
from om_core.pi.tokens import TokenCounts, count_tokens

BATCH_ENTRIES = 2000
BATCH_BYTES = 1 << 20  # small batches: parsing and tokenizing overlap even in small files
READ_BUFFER = 1 << 20  # file reads (each lets go of the GIL)

ProgressFn = Callable[[int], None]
# Where the ingest of a file ends: offset, lines, prefix hash, parser state.
FileEnd = tuple[int, int, Any, ParserState]


class Feeder(Protocol):
    """Whoever parses a reader's file ahead of the ingest (``read_ahead.ReadAhead``)."""

    def next_event(self, reader: FileReader) -> Batch | Header | None: ...


@dataclass(slots=True)
class Batch:
    """Parsed rows of consecutive lines, their token counts on the way (``count_tokens(wait=False)``)."""

    session_id: str | None
    entries: list[ParsedEntry]
    rejected: list[RejectedLine]
    ends: list[int]  # per entry: end of its text pieces in the counted list
    counts: TokenCounts | None  # None: no text to count
    longest: int  # longest line, in bytes
    size: int  # characters of raw text


@dataclass(slots=True)
class Header:
    """The session header, with what the file's row must record if the file turns out to be a copy."""

    header: SessionHeader
    line_no: int
    data: bytes
    offset: int  # just after the header line
    hasher: Any  # prefix hash up to there
    state: ParserState  # parser state just after the header


class FileReader:
    """Parses one file into ``Batch`` and ``Header`` events. It touches no database, so the
    read-ahead thread runs it ahead of the ingest (``feeder`` set); a reader without a feeder is
    driven by whoever asks for its events."""

    def __init__(self, plan: Plan, progress: ProgressFn | None, encoding: str, threads: int,
                 feeder: Feeder | None = None) -> None:
        appended = plan.action == "appended"
        self.plan = plan
        self.progress = progress
        self.encoding = encoding
        self.threads = threads
        self.feeder = feeder
        self.offset = self.start_offset = plan.offset if appended else 0
        self.line_no = plan.line_no if appended else 0
        self.parser = SessionParser(plan.state if appended else None)
        self.hasher = plan.hasher if appended else hashlib.sha256()
        self.session_id = self.parser.state.session_id
        self.file = open(plan.path, "rb", buffering=READ_BUFFER)
        self.unhashed: list[bytes] = []  # lines read but not yet hashed (hashed a batch at a time)
        self.file.seek(self.offset)
        self.lines = iter(self.file)
        self.entries: list[ParsedEntry] = []
        self.rejected: list[RejectedLine] = []
        self.size = 0
        self.longest = 0
        self.events: deque[Batch | Header] = deque()  # parsed, not yet taken (no feeder)
        self.finished: FileEnd | None = None  # set by the producer when the file is read to its end
        self.done = False  # every event of the file has been produced (queued, with a feeder)
        self.stopped = False  # the consumer wants no more events
        self.final: FileEnd | None = None  # where the ingest of the file ends, once the consumer knows

    # ---- consumer side

    def next_event(self) -> Batch | Header | None:
        """The next event, or None at the end of the file (``final`` is then set)."""
        if self.feeder is not None:
            return self.feeder.next_event(self)
        while not self.events and not self.done:
            self.events.extend(self.parse_some())
            if self.finished is not None:
                self.done = True
                self.close()
        if self.events:
            return self.events.popleft()
        self.final = self.finished
        return None

    def stop_at(self, header: Header) -> None:
        """The file is a copy of another session: as far as the ingest goes, it ends at its header."""
        self.abandon((header.offset, header.line_no, header.hasher, header.state))

    def abandon(self, final: FileEnd | None = None) -> None:
        """No more events are wanted; ``final`` is where the ingest of the file ends (None: nowhere).
        With a feeder, the read-ahead thread stops reading the file and the events it queued are
        dropped when the ingest takes its next file."""
        self.stopped = True
        self.final = final
        self.events.clear()
        if self.feeder is None:
            self.done = True
            self.close()

    @property
    def consumed(self) -> bool:
        """The consumer is through with the file (read to its end, or stopped)."""
        return self.stopped or self.final is not None

    def close(self) -> None:
        self.file.close()

    # ---- producer side (the read-ahead thread, or the consumer itself)

    def parse_some(self) -> list[Batch | Header]:
        """Parse lines until a batch or the header is ready, or the file ends (``finished``)."""
        events: list[Batch | Header] = []
        feed, add, update, progress = self.parser.feed, self._add, self.unhashed.append, self.progress
        line_no, offset = self.line_no, self.offset
        try:
            for raw in self.lines:
                line_no += 1
                size = len(raw)
                if size > self.longest:
                    self.longest = size
                had_newline = raw.endswith(b"\n")
                data = raw[:-1] if had_newline else raw
                if progress:
                    progress(size)
                result = feed(line_no, data)
                if not had_newline and isinstance(result, RejectedLine) and result.reason == "invalid_json":
                    # Pi may still be writing this line: keep it aside and re-read it next time.
                    result.reason = "truncated_last_line"
                    add(result, events)
                    line_no -= 1
                    break
                update(raw)
                offset += size
                if isinstance(result, SessionHeader):
                    self.session_id = result.id
                    self._flush(events)  # batches never straddle the header
                    self._hash()
                    events.append(Header(result, line_no, data, offset, self.hasher.copy(),
                                         copy.copy(self.parser.state)))
                    return events
                if result is not None:
                    add(result, events)
                    if events:
                        return events
            self._flush(events)
            self._hash()
            self.finished = (offset, line_no, self.hasher, self.parser.state)
            return events
        finally:
            self.line_no, self.offset = line_no, offset

    def _hash(self) -> None:
        """Hash the lines read since the last time: one update per batch, not one per line (each
        update of a long line lets go of the GIL and must win it back)."""
        if self.unhashed:
            self.hasher.update(b"".join(self.unhashed))
            self.unhashed.clear()

    def _flush(self, events: list) -> None:
        self._hash()
        entries, rejected = self.entries, self.rejected
        if not entries and not rejected:
            return
        pieces: list[str] = []
        ends: list[int] = []
        for e in entries:
            if e.text_pieces:
                pieces.extend(e.text_pieces)
            ends.append(len(pieces))
        counts = count_tokens(pieces, self.encoding, self.threads, wait=False) if pieces else None
        events.append(Batch(self.session_id, entries, rejected, ends, counts, self.longest, self.size))
        self.entries, self.rejected, self.size, self.longest = [], [], 0, 0

    def _add(self, item: ParsedEntry | RejectedLine, events: list) -> None:
        if isinstance(item, ParsedEntry):
            item.obj = None  # the parsed JSON is not needed any more; keep queued batches small
            self.entries.append(item)
        else:
            self.rejected.append(item)
        self.size += len(item.raw)
        if len(self.entries) >= BATCH_ENTRIES or self.size >= BATCH_BYTES:
            self._flush(events)
