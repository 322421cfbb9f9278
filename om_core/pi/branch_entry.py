"""A branch entry as Pi's cut point and context estimate see it: the messages it contributes to the
context and what they weigh in Pi's estimate (pi-sessions.md §2.2, §7.1)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from om_core.pi.js_length import js_json_length, js_len
from om_core.pi.session import entry_context_messages, loads_line
from om_core.pi.tokens import estimate_message_tokens


@dataclass(frozen=True, slots=True)
class BranchEntry:
    """The facts about a branch entry that the cut point looks at.

    ``messages``: the context messages the entry contributes (Pi's entry-to-message rule), when it
    was read from the file; without them an entry is one message of ``role`` worth ``tokens_pi``
    (small branches written in code). ``tokens_pi``: Pi's estimate of a source entry.
    """

    entry_id: str
    entry_type: str
    role: str | None
    tokens_pi: int | None  # Pi's estimate; None for entries Pi estimates as 0
    messages: tuple[dict, ...] | None = field(default=None, repr=False, compare=False)
    first_kept_entry_id: str | None = None  # compaction entries
    edit_target_id: str | None = None  # context_edit entries
    edit_replacement: Any = field(default=None, repr=False, compare=False)  # None empties the target
    context_tokens: int | None = field(default=None, compare=False)  # Pi 1.6 estimate of ``messages``, once

    def context_messages(self) -> tuple[dict, ...]:
        if self.messages is not None:
            return self.messages
        role = self.role if self.entry_type == "message" else {
            "custom_message": "custom", "branch_summary": "branchSummary", "compaction": "compactionSummary",
        }.get(self.entry_type)
        return ({"role": role, "_tokens": self.tokens_pi or 0},) if role else ()

    def legacy_tokens(self) -> int:
        """The §2.2 estimate (user images count 0) of a message entry."""
        if self.messages:
            return estimate_message_tokens(self.messages[0], "legacy")
        return self.tokens_pi or 0


def branch_entry(entry_id: str, entry_type: str, role: str | None, tokens_pi: int | None, obj: dict | None,
                 first_kept_entry_id: str | None = None) -> BranchEntry:
    """A branch entry read from its (migrated) JSON object."""
    if obj is None:
        return BranchEntry(entry_id, entry_type, role, tokens_pi, first_kept_entry_id=first_kept_entry_id)
    target = obj.get("targetId") if entry_type == "context_edit" else None
    messages = entry_context_messages(entry_type, obj)
    return BranchEntry(entry_id, entry_type, role, tokens_pi, messages=messages,
                       first_kept_entry_id=first_kept_entry_id,
                       edit_target_id=target if isinstance(target, str) and target else None,
                       edit_replacement=obj.get("replacement") if entry_type == "context_edit" else None,
                       context_tokens=sum(message_tokens(m) for m in messages))


def branch_entries_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[BranchEntry]:
    """Rows with entry_id, entry_type, role, tokens_pi, first_kept_entry_id and raw, in branch order."""
    out = []
    for row in rows:
        role, raw = row["role"], row["raw"]
        obj = None
        if raw is not None:
            try:
                obj = loads_line(raw)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and role == "custom" and isinstance(obj.get("message"), dict):
                obj = {**obj, "message": {**obj["message"], "role": "custom"}}  # a migrated hookMessage
        out.append(branch_entry(row["entry_id"], row["entry_type"] or "", role, row["tokens_pi"],
                                obj if isinstance(obj, dict) else None, row["first_kept_entry_id"]))
    return out


def message_tokens(message: dict, rules: str = "pi-1.6") -> int:
    if "_tokens" in message:  # an entry written in code: its estimate is given
        return message["_tokens"] if rules != "legacy" or message.get("role") != "system" else 0
    return estimate_message_tokens(message, rules)  # type: ignore[arg-type]


class CurrentSystemMessage:
    """Pi 1.6's current system message (pi-ai's ``getCurrentSystemMessage``), built up one system
    message at a time, and what ``estimateTokens`` counts for it: the contents that are not empty,
    joined by a blank line; the sections patched by name (null removes one); the tools left after
    each message's ``toolsRemoved`` and ``toolsAdded`` (by name). There is none, worth 0, while no
    system message has a ``timestamp`` field and no tool is declared. A message written in code
    (``_tokens``) counts as content of that many tokens."""

    __slots__ = ("_contents", "_parts", "_sections", "_tools", "_stamped")

    def __init__(self) -> None:
        self._contents = 0  # characters of the non-empty contents
        self._parts = 0
        self._sections: dict[str, int] = {}
        self._tools: dict[Any, int] = {}  # name -> JSON length of the declaration
        self._stamped = False

    def add(self, message: dict) -> None:
        if "_tokens" in message:
            chars, self._stamped = 4 * message["_tokens"], True
        else:
            chars = _content_text_len(message.get("content"))
            self._stamped = self._stamped or "timestamp" in message  # JSON null counts: not undefined
        if chars:
            self._contents += chars
            self._parts += 1
        sections = message.get("sections")
        for name, text in (sections.items() if isinstance(sections, dict) else ()):
            if text is None:
                self._sections.pop(name, None)
            else:
                self._sections[name] = js_len(text) if isinstance(text, str) else 0
        for key, keep in (("toolsRemoved", False), ("toolsAdded", True)):
            tools = message.get(key)
            for tool in tools if isinstance(tools, list) else ():
                name = tool.get("name") if isinstance(tool, dict) else None
                if keep:
                    self._tools[name] = js_json_length(tool)
                else:
                    self._tools.pop(name, None)

    def tokens(self) -> int:
        if not self._stamped and not self._tools:
            return 0
        chars = self._contents + 2 * max(0, self._parts - 1) + sum(self._sections.values())
        if self._tools:  # JSON.stringify of the list: brackets and commas around the declarations
            chars += 2 + len(self._tools) - 1 + sum(self._tools.values())
        return math.ceil(chars / 4)


def _content_text_len(content: Any) -> int:
    """``contentText(content).length``: a string, or its text blocks joined by newlines."""
    if isinstance(content, str):
        return js_len(content)
    blocks = content if isinstance(content, list) else ()
    texts = [b.get("text") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    return sum(js_len(t) for t in texts if isinstance(t, str)) + max(0, len(texts) - 1)
