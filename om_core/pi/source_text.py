"""The exact text of source entries, for recall and for the observer's input.

Text is the original message text, never a paraphrase: text blocks verbatim, thinking verbatim,
tool calls as ``name(arguments-as-JSON)``, tool results verbatim, images as a placeholder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from om_core.pi.js_length import js_number, js_stringify
from om_core.pi.session import JS_WHITESPACE, entry_as_message

ROLE_LABELS = {
    "user": "User",
    "assistant": "Assistant",
    "toolResult": "Tool result",
    "bashExecution": "User ran a command",
    "custom": "Extension message",
    "branchSummary": "Branch summary",
    "compactionSummary": "Compaction summary",
}


def _arguments_json(arguments: Any) -> str:
    try:
        return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:  # nested deeper than Python's limit (JSON.parse reads it)
        from om_core.pi.session import run_deep

        return run_deep(lambda: json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))


def _blocks_text(content: Any, *, images: bool = True) -> list[str]:
    if isinstance(content, str):
        return [content]
    parts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "image" and images:
            parts.append(f"[image: {block.get('mimeType', 'unknown type')}]")
    return parts


def message_text(message: dict[str, Any], *, tool_call_ids: bool = True,
                 tool_part: Callable[[str], str] | None = None) -> str:
    """The readable text of one AgentMessage. ``tool_call_ids=False`` leaves out the ids of tool
    calls (the observer's view: results follow their calls and name the tool, so the ids only cost
    tokens); recall keeps them. ``tool_part`` rewrites each tool call's arguments, tool result and
    command output (the observer's view shortens long ones); recall shows them as stored."""
    part = tool_part or (lambda text: text)
    role = message.get("role")
    if role == "assistant":
        parts: list[str] = []
        for block in message.get("content") if isinstance(message.get("content"), list) else ():
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "thinking" and isinstance(block.get("thinking"), str) and block["thinking"]:
                parts.append(f"(thinking) {block['thinking']}")
            elif kind == "text" and isinstance(block.get("text"), str):
                parts.append(block["text"])
            elif kind == "toolCall":
                args = _arguments_json(block.get("arguments"))
                call = f"(tool call {block.get('id', '')})" if tool_call_ids else "(tool call)"
                parts.append(f"{call} {block.get('name', '?')}({part(args)})")
        if not parts and message.get("errorMessage"):
            parts.append(f"(no reply: {message.get('stopReason', 'error')}: {message['errorMessage']})")
        return "\n".join(parts)
    if role == "toolResult":
        text = "\n".join(_blocks_text(message.get("content")))
        name = message.get("toolName", "tool")
        prefix = f"({name}{' error' if message.get('isError') else ''}) "
        return prefix + part(text)
    if role == "bashExecution":
        out = f"$ {message.get('command', '')}\n{part(str(message.get('output', '')))}"
        if message.get("cancelled"):
            out += "\n(command cancelled)"
        elif message.get("exitCode") not in (None, 0):
            out += f"\n(exit code {message['exitCode']})"
        return out
    if role in ("branchSummary", "compactionSummary"):
        summary = message.get("summary")
        return summary if isinstance(summary, str) else ""
    return "\n".join(_blocks_text(message.get("content")))


def entry_text(entry_type: str | None, obj: dict[str, Any], *, tool_call_ids: bool = True,
               tool_part: Callable[[str], str] | None = None) -> str:
    message = entry_as_message(entry_type or "", obj)
    return message_text(message, tool_call_ids=tool_call_ids, tool_part=tool_part) if message else ""


def minute(ts: Any) -> str:
    """``YYYY-MM-DD HH:MM`` (UTC) from an ISO string or datetime; '' when unknown."""
    if isinstance(ts, datetime):
        value = ts
    elif isinstance(ts, str) and ts:
        try:
            value = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            return ""
    else:
        return ""
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M")


def role_label(entry_type: str | None, obj: dict[str, Any], role: str | None = None) -> str:
    """A reader's label for a source entry. ``role`` is the stored (migrated) role: the raw line of a
    v1/v2 file still says ``hookMessage`` where Pi reads ``custom``."""
    message = entry_as_message(entry_type or "", obj) or {}
    role = role or message.get("role")
    custom_type = message.get("customType") or obj.get("customType")
    if role == "custom" and custom_type:
        return f"Extension message ({custom_type})"
    return ROLE_LABELS.get(role or "", role or entry_type or "entry")


# ---------------------------------------------------------------- the recall tool's source text
# The ``recall`` tool answers the model with the text the TypeScript extension renders for a source
# entry (its recall format), so an agent that used the extension reads the same evidence byte for
# byte: ``[Origin @ local time]: text``, thinking as ``[thinking: …]`` (redacted thinking left out),
# a tool call as ``[name(JSON.stringify(arguments))]``, anything else as a placeholder, and the empty
# lines of an assistant message left out. ``om recall`` keeps om's own format above.

NON_TEXT = "[non-text content omitted]"
_DATE_ONLY = re.compile(r"^[+-]?\d{4,6}(-\d{2}(-\d{2})?)?$")
_ISO_DATE_TIME = re.compile(r"^[+-]?\d{4,6}-\d{2}-\d{2}[T ]\d{2}:\d{2}")
_MAX_JS_MS = 8.64e15  # the largest magnitude a JavaScript Date holds


def _js_date(value: Any) -> datetime | None:
    """What ``new Date(value)`` holds, as an aware datetime, or None when JavaScript finds it invalid (an
    ISO date-time without an offset is local time in JavaScript, a date alone is UTC)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        if value != value or abs(value) > _MAX_JS_MS:
            return None
        try:
            return _EPOCH + timedelta(milliseconds=int(value))
        except OverflowError:  # a valid JavaScript date beyond Python's years 1-9999
            return None
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        if _DATE_ONLY.match(text):
            if text.startswith("-"):
                return None
            year, month, day = ([int(p) for p in text.lstrip("+").split("-")] + [1, 1])[:3]
            return datetime(year, month, day, tzinfo=timezone.utc)
        if _ISO_DATE_TIME.match(text):
            moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
            return moment if moment.tzinfo is not None else moment.astimezone()
    except (ValueError, OverflowError):
        return None
    return None


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def js_local_minute(*values: Any) -> str:
    """The extension's recall timestamp: the first value JavaScript reads as a date, as local
    ``YYYY-MM-DD HH:MM``; "Unknown time" when none is."""
    for value in values:
        moment = _js_date(value)
        if moment is not None:
            return moment.astimezone().strftime("%Y-%m-%d %H:%M")
    return "Unknown time"


def _js_template(value: Any, missing: bool) -> str:
    """``${value}`` in JavaScript for a JSON value (``missing``: the key is absent, so undefined)."""
    if missing:
        return "undefined"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return js_number(float(value)) if isinstance(value, float) or abs(value) >= 2**53 else str(value)
    if isinstance(value, list):
        return ",".join("" if v is None else _js_template(v, False) for v in value)
    if isinstance(value, dict):
        return "[object Object]"
    return str(value)


def _js_truthy(value: Any) -> bool:
    return bool(value) or isinstance(value, (dict, list))


def _placeholder_text(content: Any, *, thinking: bool = False) -> str:
    """The extension's text of a content value: text blocks as they are, thinking (``thinking``) as
    ``[thinking: …]`` with redacted thinking left out, tool calls as ``[name(arguments)]``, any other
    block as a placeholder, joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return NON_TEXT
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            parts.append(NON_TEXT)
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind == "thinking":
            if thinking and block.get("redacted") is True:
                continue
            parts.append(f"[thinking: {block['thinking']}]" if thinking and isinstance(block.get("thinking"), str)
                         else NON_TEXT)
        elif kind == "toolCall" and isinstance(block.get("name"), str):
            arguments = block.get("arguments")
            parts.append(f"[{block['name']}({js_stringify({} if arguments is None else arguments)})]")
        else:
            parts.append(NON_TEXT)
    return "\n".join(parts)


def recall_block(entry_type: str | None, obj: dict[str, Any]) -> str | None:
    """One source entry as the recall tool shows it (``[Origin @ time]: text``), or None where the
    extension shows nothing (an assistant message with no text, a branch summary without one)."""
    if entry_type == "message":
        message = obj.get("message")
        if not isinstance(message, dict):
            return None
        time = js_local_minute(message.get("timestamp"), obj.get("timestamp"))
        role = message.get("role")
        if role == "user":
            return f"[User @ {time}]: {_placeholder_text(message.get('content'))}"
        if role == "assistant":
            body = "\n".join(line for line in _placeholder_text(message.get("content"), thinking=True).split("\n") if line)
            return f"[Assistant @ {time}]: {body}" if body else None
        name = _js_template(message.get("toolName"), "toolName" not in message)
        return f"[Tool result: {name} @ {time}]: {_placeholder_text(message.get('content'))}"
    if entry_type == "custom_message":
        time = js_local_minute(obj.get("timestamp"))
        kind = obj.get("customType")
        origin = f"Custom message ({_js_template(kind, False)})" if _js_truthy(kind) else "Custom message"
        return f"[{origin} @ {time}]: {_placeholder_text(obj.get('content'))}"
    if entry_type == "branch_summary" and isinstance(obj.get("summary"), str):
        return f"[Branch summary @ {js_local_minute(obj.get('timestamp'))}]: {obj['summary']}"
    return None


_BLOCK_LABEL = re.compile(r"^\[[^\]]+\]:\s?")


def recall_block_content(block: str) -> str:
    """A recall block without its ``[Origin @ time]:`` label (the details' ``content``)."""
    return _BLOCK_LABEL.sub("", block, count=1)


def js_blank(text: str) -> bool:
    """``text.trim()`` is empty in JavaScript."""
    return not text.strip(JS_WHITESPACE)
