"""The exact text of source entries, for recall and for the observer's input.

Text is the original message text, never a paraphrase: text blocks verbatim, thinking verbatim,
tool calls as ``name(arguments-as-JSON)``, tool results verbatim, images as a placeholder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from om_core.session import entry_as_message

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
        from om_core.session import run_deep

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
