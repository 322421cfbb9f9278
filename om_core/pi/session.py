"""Reading Pi session files with Pi's own semantics (pi-sessions.md §1).

The reader is incremental: ``SessionParser`` takes one line at a time and remembers just enough
state (entry index, last id, minted ids) to continue after the last ingested line when Pi appends
to a file. It yields ``ParsedEntry`` for lines that belong in the tree and ``RejectedLine`` for
lines that must be quarantined.

Migration happens in memory only; the raw line is always kept as written:
* v1 (no ``version``): every entry gets a deterministic 8-hex id and is linked to the previous
  entry; ``firstKeptEntryIndex`` (header counted as index 0) becomes ``firstKeptEntryId``.
* v1 and v2: a message with role ``hookMessage`` becomes role ``custom``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from om_core.pi.tokens import SOURCE_ROLES, estimate_message_tokens, message_text_pieces

SOURCE_ENTRY_TYPES = frozenset({"message", "custom_message", "branch_summary"})
CURRENT_VERSION = 3
# What JavaScript's String.prototype.trim() removes (Pi trims the whole file before splitting it).
JS_WHITESPACE = ("\t\n\v\f\r \u00a0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
                 + "\u2028\u2029\u202f\u205f\u3000\ufeff")


# ---------------------------------------------------------------- what JSON.parse reads and DuckDB cannot hold

# A lone surrogate (a \uD800-\uDFFF escape without its pair) is valid JSON to JSON.parse, so Pi reads
# the line; Python parses it too, but the string cannot be encoded as UTF-8, which DuckDB and Arrow
# need. Such strings are kept in a lossless escaped form: each lone surrogate becomes the six
# characters of its JSON escape (``\ud800``), as ES2019 JSON.stringify writes it; the line's raw
# text is stored as written.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # in the JSON text: where a lone one may come from
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_match(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def escape_lone_surrogates(value: Any) -> Any:
    """``value`` (parsed JSON) with every lone surrogate in its strings, keys included, written as
    its ``\\uXXXX`` escape. Other values are returned as they are (the same objects)."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub(_escape_match, value) if _LONE_SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {escape_lone_surrogates(k): escape_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [escape_lone_surrogates(v) for v in value]
    return value


def may_hold_lone_surrogates(text: str) -> bool:
    return "\\u" in text and _SURROGATE_ESCAPE.search(text) is not None


# JSON.parse (V8) parses iteratively and reads nesting far deeper than Python's recursion limit
# (Pi reads 10,000 levels). A line too deep for the normal path is parsed, and its entry built, on a
# thread with a large stack and a raised recursion limit.
DEEP_NESTING_LEVELS = 200_000
_DEEP_STACK_BYTES = 1 << 30  # address space, touched only as deep as the line goes
_deep_lock = threading.Lock()
T = TypeVar("T")


def run_deep(fn: Callable[[], T]) -> T:
    """``fn()`` on a thread whose stack and recursion limit allow DEEP_NESTING_LEVELS of nesting."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    with _deep_lock:  # one at a time: the recursion limit is the process's
        old_limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(old_limit, DEEP_NESTING_LEVELS * 2 + 1_000))
        try:
            old_size = threading.stack_size(_DEEP_STACK_BYTES)
            try:
                worker = threading.Thread(target=target, name="om-deep-json", daemon=True)
                worker.start()
            finally:
                threading.stack_size(old_size)
            worker.join()
        finally:
            sys.setrecursionlimit(old_limit)
    if "error" in box:
        raise box["error"]
    return box["value"]


def loads_line(text: str) -> Any:
    """A session line as JSON.parse reads it, made storable: deep nesting parsed, lone surrogates
    escaped (``escape_lone_surrogates``). Raises ValueError for what JSON.parse rejects."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        obj = run_deep(lambda: _storable(json.loads(text, parse_constant=_reject_constant), text))
        return obj
    return _storable(obj, text)


def _storable(obj: Any, text: str) -> Any:
    return escape_lone_surrogates(obj) if may_hold_lone_surrogates(text) else obj


class SessionHeader(BaseModel):
    """The first parsed object of a session file (``type: "session"``)."""

    model_config = ConfigDict(extra="allow")

    type: str
    id: str = Field(min_length=1)
    version: int | None = None
    timestamp: str | None = None
    cwd: str | None = None
    parentSession: str | None = None
    level: int | None = None  # 1, 2 or 3: the version Pi's migrations treat the file as

    @property
    def file_version(self) -> int:
        if self.level is not None:
            return self.level
        return self.version if isinstance(self.version, int) and self.version >= 1 else 1


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (JSON.parse rejects it)")


def _integral(value: Any) -> int | None:
    """A JSON number that JavaScript would treat as an integer (3 and 3.0 alike)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value)


_JS_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _js_number(value: Any) -> float:
    """JavaScript's Number(value) for what a JSON header can hold (NaN for what it cannot read)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip(JS_WHITESPACE)
        if not text:
            return 0.0
        if _JS_NUMBER.fullmatch(text):
            return float(text)
        if re.fullmatch(r"0[xX][0-9a-fA-F]+", text):
            return float(int(text, 16))
        if text.lstrip("+-") == "Infinity":
            return float("-inf") if text.startswith("-") else float("inf")
        return math.nan
    if isinstance(value, list) and len(value) <= 1:  # Number([x]) is Number(String(x)); [] and [null] are 0
        inner = value[0] if value else None
        if inner is None:
            return 0.0
        if isinstance(inner, str):
            return _js_number(inner)
        if isinstance(inner, (int, float)) and not isinstance(inner, bool):
            return float(inner)
    return math.nan


def migration_level(version: Any) -> int:
    """Which of Pi's migrations run (pi-sessions.md §1.5): `version ?? 1`, then `< 2` and `< 3`
    compared as JavaScript does, so 2.5 gets only v2→v3, "3" none, and true both."""
    number = 1.0 if version is None else _js_number(version)
    if math.isnan(number) or number >= 3:
        return 3
    return 1 if number < 2 else 2


def header_from(obj: Any) -> SessionHeader | None:
    """Pi's header check: an object with ``type == "session"`` and a string ``id``."""
    if not isinstance(obj, dict) or obj.get("type") != "session" or not isinstance(obj.get("id"), str):
        return None
    version = obj.get("version")
    fields = {
        "type": "session",
        "id": obj["id"],
        "version": _integral(version),
        "timestamp": obj.get("timestamp") if isinstance(obj.get("timestamp"), str) else None,
        "cwd": obj.get("cwd") if isinstance(obj.get("cwd"), str) else None,
        "parentSession": obj.get("parentSession") if isinstance(obj.get("parentSession"), str) else None,
        "level": migration_level(version),
    }
    if not fields["id"]:
        return None
    return SessionHeader(**fields)


@dataclass(slots=True)
class ParsedEntry:
    line_no: int  # 1-based physical line in the file (header = 1)
    entry_index: int  # index in Pi's parsed-entry list, header = 0
    entry_id: str
    parent_id: str | None
    entry_type: str
    role: str | None
    timestamp: str | None
    is_source: bool
    first_kept_entry_id: str | None
    custom_type: str | None
    raw: str
    obj: dict = field(repr=False)  # the migrated object (what Pi holds in memory)
    tokens_pi: int | None = None
    text_pieces: list[str] | None = field(default=None, repr=False)


@dataclass(slots=True)
class RejectedLine:
    line_no: int
    reason: str
    detail: str
    raw: bytes


@dataclass(slots=True)
class ParserState:
    """What the parser must remember to continue a file after its last ingested line."""

    session_id: str | None = None
    version: int = 1
    header: SessionHeader | None = None
    next_entry_index: int = 0  # Pi's parsed-object index of the next object
    last_entry_id: str | None = None  # v1 chain: parent of the next entry
    minted_ids: set[str] = field(default_factory=set)  # v1 only
    ids_by_index: dict[int, str] = field(default_factory=dict)  # v1 only: firstKeptEntryIndex targets
    header_missing: bool = False  # the first parsed object was not a header: Pi reads nothing
    header_raw: str | None = None  # the header line exactly as written
    started: bool = False  # a non-blank line has been read (only the file's first one is trimmed)


def mint_v1_id(session_id: str, entry_index: int, taken: set[str]) -> str:
    """Deterministic 8-hex id for a v1 entry: the same file always gets the same ids."""
    salt = 0
    while True:
        seed = f"{session_id}\x00{entry_index}\x00{salt}".encode()
        candidate = hashlib.sha256(seed).hexdigest()[:8]
        if candidate not in taken:
            return candidate
        salt += 1


def is_source_entry(entry_type: str, role: str | None) -> bool:
    """SPEC §1: message (conversation roles only), custom_message and branch_summary."""
    if entry_type == "message":
        return role in SOURCE_ROLES
    return entry_type in SOURCE_ENTRY_TYPES


def entry_as_message(entry_type: str, obj: dict) -> dict | None:
    """The AgentMessage Pi builds from a source entry (buildSessionContext's appendMessage)."""
    if entry_type == "message":
        message = obj.get("message")
        return message if isinstance(message, dict) else None
    if entry_type == "custom_message":
        return {"role": "custom", "content": obj.get("content"), "customType": obj.get("customType")}
    if entry_type == "branch_summary":
        return {"role": "branchSummary", "summary": obj.get("summary")}
    return None


def entry_context_messages(entry_type: str, obj: dict) -> tuple[dict, ...]:
    """The context messages an entry contributes as Pi 1.6 builds them (pi-sessions.md §1.7, §7.1):
    any message (the system prompt included), a custom message, a branch summary with text, a
    compaction's summary and its stored system message. Metadata entries contribute none."""
    if entry_type == "message":
        message = obj.get("message")
        return (message,) if isinstance(message, dict) else ()
    if entry_type == "custom_message":
        return ({"role": "custom", "content": obj.get("content"), "customType": obj.get("customType")},)
    if entry_type == "branch_summary":
        summary = obj.get("summary")
        return ({"role": "branchSummary", "summary": summary},) if summary else ()
    if entry_type == "compaction":
        summary = obj.get("summary")
        messages = [{"role": "compactionSummary", "summary": summary if isinstance(summary, str) else ""}]
        system = obj.get("systemMessage")
        if isinstance(system, dict):
            messages.insert(0, {**system, "role": "system"})
        elif isinstance(system, str) and system:
            messages.insert(0, {"role": "system", "content": system})
        return tuple(messages)
    return ()


class SessionParser:
    """Turns the lines of one session file into entries, with Pi's migration applied."""

    def __init__(self, state: ParserState | None = None) -> None:
        self.state = state or ParserState()
        self._as_parsed: Any = None  # the line's value before escaping, when escaping changed it

    @property
    def has_header(self) -> bool:
        return self.state.header is not None

    def feed(self, line_no: int, data: bytes) -> ParsedEntry | RejectedLine | SessionHeader | None:
        """Parse one physical line (without its newline). Blank lines give None."""
        text = data.decode("utf-8", errors="replace")  # Node reads files the same lossy way
        st = self.state
        parsed_text = text
        if not st.started and st.header is None and not st.header_missing:
            parsed_text = text.lstrip(JS_WHITESPACE)  # Pi trims the file: a leading BOM or spaces go
            if not parsed_text.strip():
                return None
            st.started = True
        elif not text.strip():
            return None
        try:
            obj = json.loads(parsed_text, parse_constant=_reject_constant)
        except ValueError as exc:
            return RejectedLine(line_no, "invalid_json", " ".join(str(exc).split())[:200], data)
        except RecursionError:
            # JSON.parse reads it: parse it, and build its entry, on a deep stack
            try:
                return run_deep(lambda: self._parsed(line_no, data, text,
                                                     json.loads(parsed_text, parse_constant=_reject_constant)))
            except ValueError as exc:
                return RejectedLine(line_no, "invalid_json", " ".join(str(exc).split())[:200], data)
            except RecursionError:
                return RejectedLine(line_no, "too_deep", f"nested more than {DEEP_NESTING_LEVELS:,} levels deep", data)
        try:
            return self._parsed(line_no, data, text, obj)
        except RecursionError:  # nested just below the parser's limit, too deep for what follows
            return RejectedLine(line_no, "too_deep", "nested too deeply to measure", data)

    def _parsed(self, line_no: int, data: bytes, text: str, parsed: Any) -> ParsedEntry | RejectedLine | SessionHeader:
        """The rest of ``feed`` for one parsed line. Pi's estimate is measured on the value as
        parsed; everything stored comes from its storable form."""
        st = self.state
        obj = _storable(parsed, text)
        self._as_parsed = parsed if obj is not parsed else None
        if not isinstance(obj, dict):
            if st.header is None:
                st.header_missing = True  # a parsed value that is not a header ends Pi's read too
            else:
                st.next_entry_index += 1
            return RejectedLine(line_no, "not_an_object", f"JSON {type(obj).__name__}, not an object", data)
        if st.header is None:
            header = header_from(obj) if not st.header_missing else None
            if header is None:
                # Pi requires the first parsed object to be the header; otherwise the file is empty.
                st.header_missing = True
                return RejectedLine(line_no, "no_session_header", "file has no valid session header", data)
            st.header = header
            st.header_raw = text
            st.session_id = header.id
            st.version = header.file_version
            st.next_entry_index = 1
            return header
        index = st.next_entry_index
        st.next_entry_index += 1
        raw_type = obj.get("type")
        entry_type = raw_type if isinstance(raw_type, str) else ""  # typeless: an unknown type to Pi
        if entry_type == "session":
            return RejectedLine(line_no, "extra_session_header", "a second session header; Pi ignores it", data)
        if st.version < 2:
            return self._entry_v1(line_no, index, entry_type, obj, text)
        entry_id = obj.get("id")
        if not isinstance(entry_id, str) or not entry_id:
            return RejectedLine(line_no, "missing_id", f"v{st.version} entry without a string 'id'", data)
        parent = obj.get("parentId")
        parent_id = parent if isinstance(parent, str) and parent else None
        first_kept = obj.get("firstKeptEntryId") if entry_type == "compaction" else None
        return self._finish(line_no, index, entry_id, parent_id, entry_type, obj, text, first_kept)

    def _entry_v1(self, line_no: int, index: int, entry_type: str, obj: dict, text: str) -> ParsedEntry:
        st = self.state
        entry_id = mint_v1_id(st.session_id or "", index, st.minted_ids)
        st.minted_ids.add(entry_id)
        parent_id = st.last_entry_id
        st.last_entry_id = entry_id
        first_kept = None
        if entry_type == "compaction":
            target = obj.get("firstKeptEntryIndex")
            # The index counts the header as 0 and resolves only to an entry that already has an id:
            # an earlier one (or the compaction itself). Otherwise Pi leaves firstKeptEntryId unset.
            target = _integral(target)
            if target is not None and 1 <= target <= index:
                first_kept = st.ids_by_index.get(target) if target < index else entry_id
        st.ids_by_index[index] = entry_id
        return self._finish(line_no, index, entry_id, parent_id, entry_type, obj, text, first_kept)

    def _finish(
        self,
        line_no: int,
        index: int,
        entry_id: str,
        parent_id: str | None,
        entry_type: str,
        obj: dict,
        text: str,
        first_kept: Any,
    ) -> ParsedEntry:
        role = None
        if entry_type == "message":
            message = obj.get("message")
            if isinstance(message, dict):
                role = message.get("role") if isinstance(message.get("role"), str) else None
                if role == "hookMessage" and self.state.version < 3:
                    role = "custom"
                    obj = {**obj, "message": {**message, "role": "custom"}}
        ts = obj.get("timestamp")
        custom_type = obj.get("customType") if entry_type in ("custom", "custom_message") else None
        source = is_source_entry(entry_type, role)
        entry = ParsedEntry(
            line_no=line_no,
            entry_index=index,
            entry_id=entry_id,
            parent_id=parent_id,
            entry_type=entry_type,
            role=role,
            timestamp=ts if isinstance(ts, str) else None,
            is_source=source,
            first_kept_entry_id=first_kept if isinstance(first_kept, str) and first_kept else None,
            custom_type=custom_type if isinstance(custom_type, str) else None,
            raw=text,
            obj=obj,
        )
        if source:
            measured = self._as_parsed if self._as_parsed is not None else obj
            inner = measured.get("message") if measured is not obj and entry_type == "message" else None
            if isinstance(inner, dict) and role == "custom" and inner.get("role") != "custom":
                measured = {**measured, "message": {**inner, "role": "custom"}}  # the same migration
            message = entry_as_message(entry_type, measured) or {}
            entry.tokens_pi = estimate_message_tokens(message)
            entry.text_pieces = message_text_pieces(message)
        return entry


def file_label(file_name: str, session_id: str) -> str:
    """A session file's name less what repeats its session id: Pi names a file ``<time>_<session id>.jsonl``
    (pi-sessions.md §1.1), so beside the id its time says the rest ("" when the name is the id alone)."""
    name = file_name.removesuffix(".jsonl")
    return name.replace(f"_{session_id}", "").replace(session_id, "").strip("_-") if session_id else name


def file_header(path: Any, max_bytes: int = 1 << 20) -> SessionHeader | None:
    """The session header of a file as Pi finds it (the first parsed object; blank and invalid lines
    before it skipped), read from at most ``max_bytes``; None when the file is no Pi session."""
    parser = SessionParser()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            max_bytes -= len(raw)
            result = parser.feed(number, raw.rstrip(b"\n").rstrip(b"\r"))
            if isinstance(result, SessionHeader):
                return result
            if parser.state.header_missing or max_bytes <= 0:
                return None
    return None


def parse_lines(lines: list[bytes]) -> tuple[SessionHeader | None, list[ParsedEntry], list[RejectedLine]]:
    """Parse a whole file held in memory (tests and small tools; ingest streams instead)."""
    parser = SessionParser()
    entries: list[ParsedEntry] = []
    rejected: list[RejectedLine] = []
    for number, data in enumerate(lines, start=1):
        result = parser.feed(number, data.rstrip(b"\r"))
        if isinstance(result, ParsedEntry):
            entries.append(result)
        elif isinstance(result, RejectedLine):
            rejected.append(result)
    return parser.state.header, entries, rejected
