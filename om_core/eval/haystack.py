"""One instance's haystack as one Pi session (v3): the chat history the memory is built from.

Sessions are put in date order (ties keep the file's order); each turn becomes a ``message``
entry, child of the previous one, stamped with its session's date (plus a second per turn, so time
only moves forward). Entry ids are a plain counter (``00000001``, …) and the session id is derived
from the question id by a hash: neither says anything about the question, and no label
(``has_answer``, ``answer_session_ids``, the answer, the haystack session ids) is written at all.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from om_core.eval.data import Instance, parse_date

_NAMESPACE = uuid.UUID("6f6d2d65-7661-4c2d-8c6f-6e676d656d31")
_ZERO_USAGE = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0,
               "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}


def iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def session_id_for(question_id: str) -> str:
    return str(uuid.uuid5(_NAMESPACE, question_id))


def file_key(question_id: str) -> str:
    return hashlib.sha256(question_id.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class HistoryTurn:
    entry_id: str
    role: str  # user | assistant
    content: str
    at: datetime
    haystack_index: int  # which haystack session (index into the instance's lists); never rendered


@dataclass
class Haystack:
    question_id: str
    session_id: str
    turns: list[HistoryTurn]
    header_at: datetime
    position: dict[str, int] = field(default_factory=dict)  # entry id -> index in turns

    def __post_init__(self) -> None:
        self.position = {t.entry_id: i for i, t in enumerate(self.turns)}

    def lines(self) -> list[dict]:
        header = {"type": "session", "version": 3, "id": self.session_id, "timestamp": iso(self.header_at),
                  "cwd": "/longmemeval"}
        out = [header]
        parent = None
        for turn in self.turns:
            ms = int(turn.at.timestamp() * 1000)
            if turn.role == "user":
                message = {"role": "user", "content": [{"type": "text", "text": turn.content}], "timestamp": ms}
            else:
                message = {"role": "assistant", "content": [{"type": "text", "text": turn.content}],
                           "api": "openai-completions", "provider": "longmemeval", "model": "haystack",
                           "usage": _ZERO_USAGE, "stopReason": "stop", "timestamp": ms}
            out.append({"type": "message", "id": turn.entry_id, "parentId": parent, "timestamp": iso(turn.at),
                        "message": message})
            parent = turn.entry_id
        return out

    def text(self) -> str:
        return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in self.lines())

    def write(self, directory: Path) -> Path:
        """Write the session file unless an identical one is there (so a rerun's ingest is a no-op)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{file_key(self.question_id)}.jsonl"
        data = self.text().encode("utf-8")
        if not path.is_file() or path.read_bytes() != data:
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return path


def build_haystack(instance: Instance) -> Haystack:
    order = sorted(range(len(instance.haystack_sessions)), key=lambda i: parse_date(instance.haystack_dates[i]))
    turns: list[HistoryTurn] = []
    last: datetime | None = None
    for index in order:
        start = parse_date(instance.haystack_dates[index])
        for k, turn in enumerate(instance.haystack_sessions[index]):
            at = start + timedelta(seconds=k)
            if last is not None and at <= last:
                at = last + timedelta(milliseconds=1)
            last = at
            turns.append(HistoryTurn(f"{len(turns) + 1:08x}", turn.role, turn.content, at, index))
    first = turns[0].at if turns else instance.asked_at
    return Haystack(instance.question_id, session_id_for(instance.question_id), turns, first)


def evidence_turns(instance: Instance, haystack: Haystack) -> list[HistoryTurn]:
    """The oracle's history: the turns of the evidence sessions only, in date order."""
    evidence = {i for i, sid in enumerate(instance.haystack_session_ids) if sid in set(instance.answer_session_ids)}
    return [t for t in haystack.turns if t.haystack_index in evidence]
