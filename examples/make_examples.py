#!/usr/bin/env python3
"""Write the three sample Pi sessions in examples/sessions/ (Pi session format v3).

The sessions are hand-written stories, made up for this project: a user works with the Pi coding
agent on three small codebases, states constraints and preferences, asks questions, corrects the
agent, and the agent reads and edits files through tool calls. They exist so that `make demo` and
the docs have realistic material that is ours to publish.

Everything is deterministic: fixed session ids, fixed start times, and a seeded random generator
for entry ids, tool-call ids, signatures and the small jitter in timestamps. Running the script
twice writes byte-identical files.

    python examples/make_examples.py            # writes examples/sessions/*.jsonl
    python examples/make_examples.py --out DIR  # somewhere else

The files are written the way Pi writes them: one JSON object per line, compact separators, raw
Unicode (``JSON.stringify``), keys in Pi's order, and a trailing newline.

How a session is built: ``Session`` keeps a virtual workspace (path -> text). ``read`` returns the
current text of a file, ``edit`` replaces text in it (and fails, like Pi's edit tool, when the old
text is not found exactly once), ``write`` creates or replaces a file; ``bash`` results are
scripted. Assistant ``usage`` figures follow the conversation: the prompt is the system prompt plus
every message on the current branch (chars/4), cached up to the previous call, the rest written to
the cache. Pi's /tree navigation (``go``), ``branch_summary``, ``compaction`` (with Pi's own cut-point
rule), labels, model and thinking-level changes and ``!cmd`` shell runs are all supported.
"""

from __future__ import annotations

import argparse
import base64
import difflib
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "sessions"

SYSTEM_PROMPT_TOKENS = 3870  # Pi's system prompt plus tool definitions plus a short AGENTS.md

# USD per million tokens: input, output, cacheRead, cacheWrite
PRICES = {
    "claude-sonnet-4-5": (3.0, 15.0, 0.3, 3.75),
    "claude-opus-4-5": (5.0, 25.0, 0.5, 6.25),
    "claude-haiku-4-5": (1.0, 5.0, 0.1, 1.25),
    "gpt-5.1-codex": (1.25, 10.0, 0.125, 0.0),
}
APIS = {"anthropic": "anthropic-messages", "openai": "openai-responses"}


def js_number(value: float) -> str:
    """A float the way JavaScript prints it (``0`` not ``0.0``, ``0.000015`` not ``1.5e-05``)."""
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    if "e" not in text:
        return text
    if 1e-6 <= abs(value) < 1e21:
        return format(Decimal(text), "f")
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{'-' if exponent.startswith('-') else '+'}{exponent.lstrip('+-').lstrip('0')}"


def dumps(obj: Any) -> str:
    """``JSON.stringify``: compact, raw Unicode, JavaScript number formatting."""
    if isinstance(obj, str):
        return json.dumps(obj, ensure_ascii=False)
    if obj is None or isinstance(obj, bool):
        return json.dumps(obj)
    if isinstance(obj, int):
        return str(obj)
    if isinstance(obj, float):
        return js_number(obj)
    if isinstance(obj, dict):
        return "{" + ",".join(json.dumps(str(k), ensure_ascii=False) + ":" + dumps(v) for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    raise TypeError(type(obj))


def iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def js_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def est_tokens(message: dict) -> int:
    """Pi's estimateTokens (chars/4, rounded up), enough of it for the roles used here."""
    role = message["role"]
    chars = 0
    if role == "user":
        for block in message["content"]:
            if block["type"] == "text":
                chars += js_len(block["text"])
    elif role == "assistant":
        for block in message["content"]:
            if block["type"] == "text":
                chars += js_len(block["text"])
            elif block["type"] == "thinking":
                chars += js_len(block["thinking"])
            elif block["type"] == "toolCall":
                chars += js_len(block["name"]) + js_len(dumps(block["arguments"]))
    elif role in ("toolResult", "custom"):
        content = message["content"]
        if isinstance(content, str):
            chars += js_len(content)
        else:
            for block in content:
                chars += js_len(block["text"]) if block["type"] == "text" else 4800
    elif role == "bashExecution":
        chars += js_len(message["command"]) + js_len(message["output"])
    elif role in ("branchSummary", "compactionSummary"):
        chars += js_len(message["summary"])
    return math.ceil(chars / 4)


# ---------------------------------------------------------------------------------------------------
# tool calls


@dataclass
class Call:
    """One tool call an assistant message makes; the result is produced when the turn runs."""

    name: str
    arguments: dict
    output: str | None = None  # scripted output (bash); read/edit/write compute theirs
    error: bool = False
    details: dict | None = None
    files: dict[str, str | None] | None = None  # what a bash command does to the workspace (None deletes)


def read(path: str, offset: int | None = None, limit: int | None = None) -> Call:
    args: dict[str, Any] = {"path": path}
    if offset is not None:
        args["offset"] = offset
    if limit is not None:
        args["limit"] = limit
    return Call("read", args)


def edit(path: str, old: str, new: str, *, fails: bool = False) -> Call:
    """Pi's edit tool; ``fails=True`` marks an edit the story expects to fail (stale old text)."""
    return Call("edit", {"path": path, "oldText": old, "newText": new}, error=fails)


def write(path: str, content: str) -> Call:
    return Call("write", {"path": path, "content": content})


def bash(command: str, output: str, code: int = 0, timeout: int | None = None,
         files: dict[str, str | None] | None = None, aborted: bool = False) -> Call:
    """Pi's bash tool: output, plus Pi's exit-code line when the command failed (or the abort notice)."""
    args: dict[str, Any] = {"command": command}
    if timeout is not None:
        args["timeout"] = timeout
    if aborted:
        return Call("bash", args, output=output + "\n\nCommand aborted", error=True, details={}, files=files)
    if code:
        output = output + f"\n\nCommand exited with code {code}" if output else f"Command exited with code {code}"
    return Call("bash", args, output=output, error=bool(code), details={}, files=files)


# ---------------------------------------------------------------------------------------------------
# the session


@dataclass
class _Ctx:
    """Per-entry context figures: tokens the model sees on this branch, and what is cached."""

    tokens: int
    cached: int


class Session:
    def __init__(self, session_id: str, cwd: str, start: str, seed: int, *, provider: str = "anthropic",
                 model: str = "claude-sonnet-4-5", files: dict[str, str] | None = None) -> None:
        self.session_id = session_id
        self.cwd = cwd
        self.rng = random.Random(seed)
        self.clock = datetime.fromisoformat(start).replace(tzinfo=timezone.utc)
        self.header = {"type": "session", "version": 3, "id": session_id, "timestamp": iso(self.clock), "cwd": cwd}
        self.entries: list[dict] = []
        self.by_id: dict[str, dict] = {}
        self.leaf: str | None = None
        self.ctx: dict[str | None, _Ctx] = {None: _Ctx(SYSTEM_PROMPT_TOKENS, 0)}
        self.provider = provider
        self.model = model
        self.fs: dict[str, str] = dict(files or {})
        self.thinking_on = True

    # ------------------------------------------------------------------ plumbing

    def _tick(self, lo: float, hi: float) -> datetime:
        self.clock += timedelta(milliseconds=int(self.rng.uniform(lo, hi) * 1000))
        return self.clock

    def _new_id(self) -> str:
        while True:
            candidate = f"{self.rng.getrandbits(32):08x}"
            if candidate not in self.by_id:
                return candidate

    def _call_id(self) -> str:
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
        if self.provider == "openai":
            return "call_" + "".join(self.rng.choice(alphabet) for _ in range(24)) + "|fc_" + \
                "".join(self.rng.choice("0123456789abcdef") for _ in range(48))
        return "toolu_01" + "".join(self.rng.choice(alphabet) for _ in range(22))

    def _signature(self, n: int) -> str:
        return base64.b64encode(self.rng.randbytes(n)).decode()

    def _append(self, entry_type: str, fields: dict, *, delay: tuple[float, float] = (0.5, 3.0),
                message_tokens: int = 0, parent: str | None | bool = False) -> str:
        ts = self._tick(*delay)
        entry_id = self._new_id()
        parent_id = self.leaf if parent is False else parent
        entry = {"type": entry_type, "id": entry_id, "parentId": parent_id, "timestamp": iso(ts), **fields}
        self.entries.append(entry)
        self.by_id[entry_id] = entry
        before = self.ctx[parent_id]
        self.ctx[entry_id] = _Ctx(before.tokens + message_tokens, before.cached)
        self.leaf = entry_id
        return entry_id

    def _message(self, message: dict, *, delay: tuple[float, float] = (0.5, 3.0)) -> str:
        return self._append("message", {"message": message}, delay=delay, message_tokens=est_tokens(message))

    # ------------------------------------------------------------------ user side

    def user(self, text: str, *, delay: tuple[float, float] = (20, 120)) -> str:
        when = self.clock + timedelta(seconds=1)
        message = {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": ms(when)}
        entry_id = self._message(message, delay=delay)
        message["timestamp"] = ms(self.clock) - self.rng.randint(1, 4)
        return entry_id

    def shell(self, command: str, output: str, code: int = 0, *, delay: tuple[float, float] = (15, 60)) -> str:
        """The user ran ``!command`` in Pi's editor."""
        message = {"role": "bashExecution", "command": command, "output": output, "exitCode": code,
                   "cancelled": False, "truncated": False, "timestamp": 0}
        entry_id = self._message(message, delay=delay)
        message["timestamp"] = ms(self.clock)
        return entry_id

    def note(self, text: str, custom_type: str = "note", *, display: bool = True) -> str:
        """An extension's message (``pi.sendMessage``), persisted as a custom_message entry."""
        message = {"role": "custom", "content": text}
        return self._append("custom_message", {"customType": custom_type, "content": text, "display": display},
                            delay=(5, 30), message_tokens=est_tokens(message))

    def label(self, target: str, text: str) -> str:
        return self._append("label", {"targetId": target, "label": text}, delay=(3, 20))

    def set_model(self, provider: str, model: str) -> str:
        self.provider, self.model = provider, model
        return self._append("model_change", {"provider": provider, "modelId": model}, delay=(3, 20))

    def set_thinking(self, level: str) -> str:
        self.thinking_on = level != "off"
        return self._append("thinking_level_change", {"thinkingLevel": level}, delay=(2, 10))

    def wait_until(self, when: str) -> None:
        """The user was away: the next entry comes after ``when`` (UTC, ISO without zone)."""
        target = datetime.fromisoformat(when).replace(tzinfo=timezone.utc)
        if target > self.clock:
            self.clock = target

    def go(self, entry_id: str | None) -> None:
        """/tree navigation without a summary: only the in-memory leaf moves."""
        self.leaf = entry_id

    def branch_summary(self, target: str, summary: str, read_files: list[str], modified_files: list[str]) -> str:
        """/tree navigation with a summary: Pi appends the summary as a child of the target."""
        self.leaf = target
        message = {"role": "branchSummary", "summary": summary}
        entry_id = self._append("branch_summary", {
            "fromId": target, "summary": summary,
            "details": {"readFiles": read_files, "modifiedFiles": modified_files}, "fromHook": False,
        }, delay=(20, 60), message_tokens=est_tokens(message))
        # The prompt after a /tree jump is the old prefix again: nothing new is cached.
        self.ctx[entry_id].cached = min(self.ctx[entry_id].cached, self.ctx[target].tokens)
        return entry_id

    # ------------------------------------------------------------------ assistant side

    def _usage(self, output_tokens: int, cache: bool = True) -> dict:
        ctx = self.ctx[self.leaf]
        prompt = ctx.tokens
        if self.provider == "openai":
            cache_read = (ctx.cached // 1024) * 1024 if cache else 0
            uncached = prompt - cache_read
            cache_write = 0
        else:
            cache_read = ctx.cached if cache else 0
            uncached = self.rng.randint(1, 9)
            cache_write = max(prompt - cache_read - uncached, 0)
        p_in, p_out, p_cr, p_cw = PRICES[self.model]
        cost = {
            "input": uncached * p_in / 1e6,
            "output": output_tokens * p_out / 1e6,
            "cacheRead": cache_read * p_cr / 1e6,
            "cacheWrite": cache_write * p_cw / 1e6,
        }
        cost["total"] = cost["input"] + cost["output"] + cost["cacheRead"] + cost["cacheWrite"]
        return {
            "input": uncached, "output": output_tokens, "cacheRead": cache_read, "cacheWrite": cache_write,
            "totalTokens": uncached + output_tokens + cache_read + cache_write, "cost": cost,
        }

    def _assistant(self, content: list[dict], stop: str, *, delay: tuple[float, float], error: str | None = None) -> str:
        started = self.clock + timedelta(milliseconds=self.rng.randint(5, 40))
        message = {"role": "assistant", "content": content, "api": APIS[self.provider], "provider": self.provider,
                   "model": self.model}
        visible = est_tokens({"role": "assistant", "content": content})
        out_tokens = int(visible * self.rng.uniform(1.02, 1.18)) + self.rng.randint(8, 40)
        message["usage"] = self._usage(out_tokens)
        message["stopReason"] = stop
        message["timestamp"] = ms(started)
        if error:
            message["errorMessage"] = error
        prompt = self.ctx[self.leaf].tokens
        entry_id = self._message(message, delay=delay)
        # Everything up to this call is now in the provider's prompt cache.
        self.ctx[entry_id].cached = prompt
        return entry_id

    def _blocks(self, text: str | None, thinking: str | None, calls: list[Call]) -> list[dict]:
        content: list[dict] = []
        if thinking:
            block = {"type": "thinking", "thinking": thinking}
            if self.provider == "openai":
                block["thinkingSignature"] = dumps({"type": "reasoning", "id": "rs_" + self.rng.randbytes(24).hex(),
                                                    "encrypted_content": self._signature(180), "summary": []})
            else:
                block["thinkingSignature"] = self._signature(self.rng.randint(180, 420))
            content.append(block)
        if text:
            content.append({"type": "text", "text": text})
        for call in calls:
            content.append({"type": "toolCall", "id": self._call_id(), "name": call.name, "arguments": call.arguments})
        return content

    def say(self, text: str, thinking: str | None = None) -> str:
        """A final assistant answer (``stopReason: stop``)."""
        seconds = 2 + len(text) / 180 + (len(thinking) / 250 if thinking else 0)
        return self._assistant(self._blocks(text, thinking, []), "stop", delay=(seconds, seconds * 1.4))

    def act(self, *calls: Call, text: str | None = None, thinking: str | None = None) -> str:
        """An assistant message with tool calls, then one toolResult per call (``stopReason: toolUse``)."""
        content = self._blocks(text, thinking, list(calls))
        size = sum(len(dumps(c.arguments)) for c in calls) + len(text or "") + len(thinking or "")
        seconds = 1.5 + size / 220
        assistant_id = self._assistant(content, "toolUse", delay=(seconds, seconds * 1.3))
        for block, call in zip([b for b in content if b["type"] == "toolCall"], calls):
            self._tool_result(block["id"], call)
        return assistant_id

    def aborted(self) -> str:
        """The user pressed Escape before the reply streamed anything: empty content, zero usage."""
        message = {"role": "assistant", "content": [], "api": APIS[self.provider], "provider": self.provider,
                   "model": self.model,
                   "usage": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0,
                             "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                   "stopReason": "aborted", "timestamp": ms(self.clock) + self.rng.randint(2, 9),
                   "errorMessage": "Request was aborted."}
        return self._message(message, delay=(0.8, 2.0))

    def _tool_result(self, call_id: str, call: Call) -> str:
        text, is_error, details = self._run(call)
        message: dict[str, Any] = {"role": "toolResult", "toolCallId": call_id, "toolName": call.name,
                                   "content": [{"type": "text", "text": text}]}
        if details is not None:
            message["details"] = details
        message["isError"] = is_error
        message["timestamp"] = 0
        slow = call.name == "bash" and ("pytest" in call.arguments.get("command", "") or "uv " in call.arguments.get("command", ""))
        entry_id = self._message(message, delay=(2.0, 9.0) if slow else (0.01, 0.08))
        message["timestamp"] = ms(self.clock) - self.rng.randint(0, 3)
        return entry_id

    def _run(self, call: Call) -> tuple[str, bool, dict | None]:
        args = call.arguments
        if call.name == "read":
            path = args["path"]
            if path not in self.fs:
                return f"ENOENT: no such file or directory, access '{self._abs(path)}'", True, None
            text = self.fs[path]
            if "offset" in args or "limit" in args:
                lines = text.split("\n")
                start = max(args.get("offset", 1) - 1, 0)
                stop = start + args["limit"] if "limit" in args else len(lines)
                shown = "\n".join(lines[start:stop])
                if stop < len(lines):
                    shown += f"\n\n[{len(lines) - stop} more lines in file. Use offset={stop + 1} to continue.]"
                return shown, False, None
            return text, False, None
        if call.name == "write":
            path, content = args["path"], args["content"]
            self.fs[path] = content
            return f"Successfully wrote {len(content.encode())} bytes to {path}", False, None
        if call.name == "edit":
            path, old, new = args["path"], args["oldText"], args["newText"]
            text = self.fs.get(path)
            if text is None:
                return f"File not found: {path}", True, {}
            count = text.count(old)
            if (count == 1) == call.error:
                raise AssertionError(f"edit of {path} {'succeeds' if count == 1 else 'fails'} unexpectedly: {old[:80]!r}")
            if count == 0:
                return (f"Could not find the exact text in {path}. The old text must match exactly including all "
                        "whitespace and newlines."), True, {}
            if count > 1:
                return (f"Found {count} occurrences of the text in {path}. The text must be unique. Please provide "
                        "more context to make it unique."), True, {}
            updated = text.replace(old, new, 1)
            self.fs[path] = updated
            diff, first = _pi_diff(text, updated)
            return f"Successfully replaced text in {path}.", False, {"diff": diff, "firstChangedLine": first}
        if call.name == "bash":
            for path, content in (call.files or {}).items():
                if content is None:
                    self.fs.pop(path, None)
                else:
                    self.fs[path] = content
            return call.output or "(no output)", call.error, call.details
        raise ValueError(call.name)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.cwd}/{path}"

    # ------------------------------------------------------------------ compaction (Pi's rules)

    def path(self, leaf: str | None = None) -> list[dict]:
        out = []
        node = self.by_id.get(leaf if leaf is not None else self.leaf)
        while node is not None:
            out.append(node)
            node = self.by_id.get(node["parentId"]) if node["parentId"] else None
        return out[::-1]

    @staticmethod
    def _as_message(entry: dict) -> dict | None:
        if entry["type"] == "message":
            return entry["message"]
        if entry["type"] == "custom_message":
            return {"role": "custom", "content": entry["content"]}
        if entry["type"] == "branch_summary":
            return {"role": "branchSummary", "summary": entry["summary"]}
        if entry["type"] == "compaction":
            return {"role": "compactionSummary", "summary": entry["summary"]}
        return None

    def cut_point(self, keep_recent: int = 20000) -> tuple[str, int]:
        """(firstKeptEntryId, tokensBefore) exactly as Pi's prepareCompaction computes them."""
        path = self.path()
        prev = max((i for i, e in enumerate(path) if e["type"] == "compaction"), default=-1)
        start = prev + 1
        cut_roles = {"user", "assistant", "bashExecution", "custom", "branchSummary", "compactionSummary"}
        cuts = [i for i in range(start, len(path))
                if (path[i]["type"] == "message" and path[i]["message"]["role"] in cut_roles)
                or path[i]["type"] in ("branch_summary", "custom_message")]
        cut = cuts[0]
        total = 0
        for i in range(len(path) - 1, start - 1, -1):
            if path[i]["type"] != "message":
                continue
            total += est_tokens(path[i]["message"])
            if total >= keep_recent:
                later = [c for c in cuts if c >= i]
                if later:
                    cut = later[0]
                break
        while cut > start and path[cut - 1]["type"] not in ("compaction", "message"):
            cut -= 1
        # tokensBefore: estimateContextTokens over the messages from the previous compaction on
        messages = [m for m in (self._as_message(e) for e in path[max(prev, 0):]) if m is not None]
        last = None
        for i in range(len(messages) - 1, -1, -1):
            m = messages[i]
            if m["role"] == "assistant" and m.get("stopReason") not in ("aborted", "error") and m.get("usage"):
                last = i
                break
        if last is None:
            tokens = sum(est_tokens(m) for m in messages)
        else:
            u = messages[last]["usage"]
            tokens = u["totalTokens"] + sum(est_tokens(m) for m in messages[last + 1:])
        return path[cut]["id"], tokens

    def compaction(self, summary: str, read_files: list[str], modified_files: list[str]) -> tuple[str, str]:
        """Append a Pi compaction (manual /compact) at the current leaf; returns (entry id, firstKeptEntryId)."""
        first_kept, tokens_before = self.cut_point()
        files = ""
        read_only = sorted(set(read_files) - set(modified_files))
        if read_only:
            files += "\n\n<read-files>\n" + "\n".join(read_only) + "\n</read-files>"
        if modified_files:
            files += "\n\n<modified-files>\n" + "\n".join(sorted(modified_files)) + "\n</modified-files>"
        full = summary + files
        entry_id = self._append("compaction", {
            "summary": full, "firstKeptEntryId": first_kept, "tokensBefore": tokens_before,
            "details": {"readFiles": read_only, "modifiedFiles": sorted(modified_files)}, "fromHook": False,
        }, delay=(25, 70))
        # After a compaction the model sees: summary + kept messages; the cache starts over.
        path = self.path()
        kept = 0
        keeping = False
        for e in path[:-1]:
            if e["id"] == first_kept:
                keeping = True
            if keeping:
                m = self._as_message(e)
                if m is not None and e["type"] != "compaction":
                    kept += est_tokens(m)
        self.ctx[entry_id] = _Ctx(SYSTEM_PROMPT_TOKENS + est_tokens({"role": "compactionSummary", "summary": full}) + kept,
                                  SYSTEM_PROMPT_TOKENS)
        return entry_id, first_kept

    # ------------------------------------------------------------------ output

    def lines(self) -> list[str]:
        return [dumps(self.header)] + [dumps(e) for e in self.entries]

    def source_tokens(self) -> int:
        return sum(est_tokens(m) for m in (self._as_message(e) for e in self.entries if e["type"] != "compaction")
                   if m is not None)


def _pi_diff(old: str, new: str, context: int = 4) -> tuple[str, int]:
    """The diff Pi's edit tool stores in ``details.diff``: numbered lines, +/- marks, ``...`` gaps."""
    a, b = old.split("\n"), new.split("\n")
    width = len(str(max(len(a), len(b))))
    out: list[str] = []
    first_changed = None
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    opcodes = matcher.get_opcodes()
    for idx, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag == "equal":
            lines = list(range(i1, i2))
            head = lines[:context] if idx > 0 else []
            tail = lines[-context:] if idx < len(opcodes) - 1 else []
            if idx > 0 and idx < len(opcodes) - 1 and len(lines) <= 2 * context:
                shown = lines
            else:
                shown = None
            if shown is not None:
                out.extend(f" {n + 1:>{width}} {a[n]}" for n in shown)
                continue
            if head:
                out.extend(f" {n + 1:>{width}} {a[n]}" for n in head)
            if (head or tail) and len(lines) > len(head) + len(tail):
                out.append(" " + " " * width + " ...")
            elif not head and not tail and lines:
                out.append(" " + " " * width + " ...")
            if tail:
                out.extend(f" {n + 1:>{width}} {a[n]}" for n in tail if n not in head)
            continue
        if first_changed is None:
            first_changed = j1 + 1
        out.extend(f"-{n + 1:>{width}} {a[n]}" for n in range(i1, i2))
        out.extend(f"+{n + 1:>{width}} {b[n]}" for n in range(j1, j2))
    return "\n".join(out), first_changed or 1


# ---------------------------------------------------------------------------------------------------
# realistic command output


def pytest_output(tests: list[str], failures: dict[str, str] | None = None, seconds: float = 0.4,
                  verbose: bool = False, errors: dict[str, str] | None = None, warnings: str | None = None,
                  deselected: int = 0) -> tuple[str, int]:
    """Output of ``pytest -q`` (or ``-v``) for the given test ids; returns (output, exit code)."""
    failures = failures or {}
    errors = errors or {}
    lines: list[str] = []
    if verbose:
        lines.append("============================= test session starts ==============================")
        lines.append("platform linux -- Python 3.12.7, pytest-8.3.4, pluggy-1.5.0 -- /usr/bin/python3")
        lines.append("cachedir: .pytest_cache")
        lines.append("rootdir: {rootdir}")
        lines.append("configfile: pyproject.toml")
        lines.append(f"collected {len(tests) + deselected} items"
                     + (f" / {deselected} deselected / {len(tests)} selected" if deselected else ""))
        lines.append("")
        for i, t in enumerate(tests, 1):
            status = "FAILED" if t in failures else "ERROR" if t in errors else "PASSED"
            pct = f"[{int(100 * i / len(tests)):>3}%]"
            lines.append(f"{t} {status}".ljust(72) + " " + pct)
    else:
        by_file: dict[str, list[str]] = {}
        for t in tests:
            by_file.setdefault(t.split("::")[0], []).append(t)
        done = 0
        row = ""
        for t in tests:
            row += "F" if t in failures else "E" if t in errors else "."
            done += 1
            if len(row) == 70 or done == len(tests):
                pct = f"[{int(100 * done / len(tests)):>3}%]"
                lines.append(row.ljust(70) + " " + pct)
                row = ""
    if errors:
        lines.append("")
        lines.append("==================================== ERRORS ====================================")
        for t, tb in errors.items():
            name = t.split("::")[-1]
            lines.append(f"_" * 10 + f" ERROR at setup of {name} " + "_" * 10)
            lines.extend(tb.rstrip("\n").split("\n"))
    if failures:
        lines.append("")
        lines.append("=================================== FAILURES ===================================")
        for t, tb in failures.items():
            name = t.split("::")[-1]
            bar = max(0, (78 - len(name) - 2) // 2)
            lines.append("_" * bar + f" {name} " + "_" * bar)
            lines.append("")
            lines.extend(tb.rstrip("\n").split("\n"))
    if warnings:
        lines.append("")
        lines.append("=============================== warnings summary ===============================")
        lines.extend(warnings.rstrip("\n").split("\n"))
        lines.append("")
        lines.append("-- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html")
    if failures or errors:
        lines.append("=========================== short test summary info ============================")
        for t, tb in errors.items():
            last = [l for l in tb.strip().split("\n") if l.startswith("E ")]
            lines.append(f"ERROR {t} - {last[-1][2:].strip() if last else 'error'}")
        for t, tb in failures.items():
            last = [l for l in tb.strip().split("\n") if l.startswith("E ")]
            lines.append(f"FAILED {t} - {last[0][2:].strip() if last else 'failed'}")
    passed = len(tests) - len(failures) - len(errors)
    parts = []
    if failures:
        parts.append(f"{len(failures)} failed")
    parts.append(f"{passed} passed")
    if warnings:
        parts.append(f"{warnings.count('Warning:')} warning" + ("s" if warnings.count("Warning:") != 1 else ""))
    if deselected:
        parts.append(f"{deselected} deselected")
    if errors:
        parts.append(f"{len(errors)} error" + ("s" if len(errors) > 1 else ""))
    summary = ", ".join(parts) + f" in {seconds:.2f}s"
    if verbose:
        lines.append(f"{'=' * ((78 - len(summary)) // 2)} {summary} {'=' * ((78 - len(summary)) // 2)}")
    else:
        lines.append(summary)
    return "\n".join(lines) + "\n", 1 if (failures or errors) else 0


def run_pytest(command: str, tests: list[str], *, rootdir: str = "", **kw) -> Call:
    output, code = pytest_output(tests, **kw)
    return bash(command, output.replace("{rootdir}", rootdir), code)


def _changed_lines(old: str, new: str) -> tuple[int, int]:
    plus = minus = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old.split("\n"), b=new.split("\n"), autojunk=False).get_opcodes():
        if op != "equal":
            minus += i2 - i1
            plus += j2 - j1
    return plus, minus


def git_status(base: dict[str, str], current: dict[str, str], staged: bool = False) -> str:
    """``git status --short`` for a workspace compared with the last commit (all staged, or none)."""
    lines, untracked = [], set()
    for path in sorted(set(base) | set(current)):
        if path not in current:
            lines.append(("D  " if staged else " D ") + path)
        elif path not in base:
            if staged:
                lines.append("A  " + path)
            else:
                top = path.split("/")[0]
                tracked_dir = any(p.startswith(top + "/") for p in base)
                untracked.add(path if tracked_dir or "/" not in path else top + "/")
        elif base[path] != current[path]:
            lines.append(("M  " if staged else " M ") + path)
    if staged:
        lines.sort(key=lambda l: l[3:])
    return "\n".join(lines + [f"?? {p}" for p in sorted(untracked)]) + "\n"


def git_diff_stat(base: dict[str, str], current: dict[str, str], paths: list[str] | None = None) -> str:
    """``git diff --stat`` (tracked files only unless ``paths`` names new ones)."""
    rows = []
    for path in sorted(paths if paths is not None else [p for p in base if p in current and base[p] != current[p]]):
        plus, minus = _changed_lines(base.get(path, ""), current.get(path, ""))
        rows.append((path, plus, minus))
    width = max(len(p) for p, _, _ in rows)
    most = max(p + m for _, p, m in rows)
    scale = min(1.0, 50 / most) if most else 1.0
    out = []
    for path, plus, minus in rows:
        bar = "+" * max(int(plus * scale), 1 if plus else 0) + "-" * max(int(minus * scale), 1 if minus else 0)
        out.append(f" {path:<{width}} | {plus + minus:>3} {bar}")
    plus_total, minus_total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    out.append(f" {len(rows)} files changed, {plus_total} insertions(+), {minus_total} deletions(-)")
    return "\n".join(out) + "\n"


# ===================================================================================================
# Session 1 (short): tidewatch, a tide-table CLI gets a --units option. Tests must run offline.
# ===================================================================================================

TIDEWATCH_FILES = {
    "tidewatch/cli.py": '''"""Command line entry point: `tidewatch STATION [--days N]`."""

from __future__ import annotations

import argparse
import sys

from tidewatch.api import ApiError, fetch_predictions
from tidewatch.format import format_table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidewatch", description="High and low tides for a station.")
    parser.add_argument("station", help="station id, e.g. 9414290 (San Francisco)")
    parser.add_argument("--days", type=int, default=2, help="how many days to show (1-7)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 1 <= args.days <= 7:
        print("tidewatch: --days must be between 1 and 7", file=sys.stderr)
        return 2
    try:
        predictions = fetch_predictions(args.station, days=args.days)
    except ApiError as exc:
        print(f"tidewatch: {exc}", file=sys.stderr)
        return 1
    print(format_table(predictions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
''',
    "tidewatch/api.py": '''"""Tide predictions from the public predictions endpoint (heights in metres, times in local time)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import date, datetime, timedelta

BASE_URL = "https://api.tidesandcurrents.noaa.gov/api/prod/datagetter"


class ApiError(RuntimeError):
    pass


@dataclass(frozen=True)
class Prediction:
    time: datetime
    kind: str  # "H" or "L"
    height_m: float


def _params(station: str, days: int) -> dict[str, str]:
    start = date.today()
    return {
        "product": "predictions", "application": "tidewatch", "station": station,
        "begin_date": start.strftime("%Y%m%d"), "end_date": (start + timedelta(days=days - 1)).strftime("%Y%m%d"),
        "datum": "MLLW", "time_zone": "lst_ldt", "interval": "hilo", "units": "metric", "format": "json",
    }


def fetch_predictions(station: str, days: int = 2, timeout: float = 10.0) -> list[Prediction]:
    url = BASE_URL + "?" + urllib.parse.urlencode(_params(station, days))
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            payload = json.load(response)
    except (urllib.error.URLError, TimeoutError) as exc:
        raise ApiError(f"could not reach the predictions service: {exc}") from exc
    if "error" in payload:
        raise ApiError(payload["error"].get("message", "unknown error"))
    return [
        Prediction(datetime.strptime(p["t"], "%Y-%m-%d %H:%M"), p["type"], float(p["v"]))
        for p in payload.get("predictions", [])
    ]
''',
    "tidewatch/format.py": '''"""Plain-text rendering of predictions."""

from __future__ import annotations

from tidewatch.api import Prediction

KIND = {"H": "HIGH", "L": "low "}


def format_row(p: Prediction) -> str:
    return f"{p.time:%a %d %b %H:%M}  {KIND.get(p.kind, p.kind)}  {p.height_m:5.2f} m"


def format_table(predictions: list[Prediction]) -> str:
    if not predictions:
        return "no predictions for this period"
    return "\\n".join(format_row(p) for p in predictions)
''',
    "tests/test_format.py": '''from datetime import datetime

from tidewatch.api import Prediction
from tidewatch.format import format_row, format_table


def test_format_row_high_tide():
    p = Prediction(datetime(2026, 1, 12, 4, 31), "H", 1.824)
    assert format_row(p) == "Mon 12 Jan 04:31  HIGH   1.82 m"


def test_format_row_low_tide():
    p = Prediction(datetime(2026, 1, 12, 11, 2), "L", -0.153)
    assert format_row(p) == "Mon 12 Jan 11:02  low   -0.15 m"


def test_empty_table():
    assert format_table([]) == "no predictions for this period"
''',
    "tests/test_cli.py": '''from datetime import datetime

import pytest

from tidewatch import cli
from tidewatch.api import Prediction

SAMPLE = [
    Prediction(datetime(2026, 1, 12, 4, 31), "H", 1.824),
    Prediction(datetime(2026, 1, 12, 11, 2), "L", -0.153),
]


@pytest.fixture
def fake_fetch(monkeypatch):
    calls = []

    def fetch(station, days=2, timeout=10.0):
        calls.append((station, days))
        return SAMPLE

    monkeypatch.setattr(cli, "fetch_predictions", fetch)
    return calls


def test_main_prints_table(fake_fetch, capsys):
    assert cli.main(["9414290"]) == 0
    assert "HIGH" in capsys.readouterr().out
    assert fake_fetch == [("9414290", 2)]


def test_days_out_of_range(capsys):
    assert cli.main(["9414290", "--days", "9"]) == 2
    assert "between 1 and 7" in capsys.readouterr().err
''',
    "pyproject.toml": '''[project]
name = "tidewatch"
version = "0.3.1"
description = "High and low tides in your terminal"
requires-python = ">=3.11"
dependencies = []

[project.scripts]
tidewatch = "tidewatch.cli:main"

[project.optional-dependencies]
test = ["pytest>=8", "pytest-socket>=0.7"]

[tool.pytest.ini_options]
addopts = "--disable-socket"
testpaths = ["tests"]
''',
    "CHANGELOG.md": '''# Changelog

## 0.3.1
- Show an error instead of a traceback when the predictions service is unreachable.

## 0.3.0
- `--days` option (1-7 days).

## 0.2.0
- Low tides are shown too, not just high tides.
''',
}

TIDEWATCH_TESTS = [
    "tests/test_cli.py::test_main_prints_table",
    "tests/test_cli.py::test_days_out_of_range",
    "tests/test_format.py::test_format_row_high_tide",
    "tests/test_format.py::test_format_row_low_tide",
    "tests/test_format.py::test_empty_table",
]


def session_tidewatch() -> Session:
    s = Session("5b0e7c1a-3f2d-4e8b-9a61-2c4d7e9f0b13", "/home/dana/src/tidewatch", "2026-01-12T08:41:17.204", seed=101,
                files=TIDEWATCH_FILES)
    s.user("Add a `--units` option to tidewatch so I can get heights in feet. Metric stays the default. "
           "Keep in mind the tests must run offline: CI has no network, and pytest-socket is enabled to enforce it.")
    s.act(read("tidewatch/cli.py"), read("tidewatch/format.py"), read("tidewatch/api.py"),
          text="I'll look at the CLI, the formatter and the API client first.",
          thinking="The user wants a --units flag, metric default, feet as the alternative. Tests have to stay "
                   "offline (pytest-socket). First I need to see where heights come from and where they get printed.")
    s.act(read("tests/test_format.py"), read("tests/test_cli.py"),
          thinking="The API always requests units=metric and stores height_m. Printing happens in format_row with a "
                   "hard-coded ' m'. Simplest: keep the data in metres and convert when formatting. Let me check how "
                   "the tests stub the network before I add any.")
    s.act(edit("tidewatch/cli.py",
               '    parser.add_argument("--days", type=int, default=2, help="how many days to show (1-7)")\n',
               '    parser.add_argument("--days", type=int, default=2, help="how many days to show (1-7)")\n'
               '    parser.add_argument("--units", choices=("metric", "feet"), default="metric",\n'
               '                        help="height units (default: metric)")\n'),
          text="Heights arrive in metres, so I'll convert at display time. First the option:")
    s.act(edit("tidewatch/format.py",
               'KIND = {"H": "HIGH", "L": "low "}\n\n\n'
               'def format_row(p: Prediction) -> str:\n'
               '    return f"{p.time:%a %d %b %H:%M}  {KIND.get(p.kind, p.kind)}  {p.height_m:5.2f} m"\n\n\n'
               'def format_table(predictions: list[Prediction]) -> str:\n'
               '    if not predictions:\n'
               '        return "no predictions for this period"\n'
               '    return "\\n".join(format_row(p) for p in predictions)\n',
               'KIND = {"H": "HIGH", "L": "low "}\n'
               'FEET_PER_METRE = 3.28084\n\n\n'
               'def format_row(p: Prediction, units: str = "metric") -> str:\n'
               '    if units == "feet":\n'
               '        height = f"{p.height_m * FEET_PER_METRE:5.2f} ft"\n'
               '    else:\n'
               '        height = f"{p.height_m:5.2f} m"\n'
               '    return f"{p.time:%a %d %b %H:%M}  {KIND.get(p.kind, p.kind)}  {height}"\n\n\n'
               'def format_table(predictions: list[Prediction], units: str = "metric") -> str:\n'
               '    if not predictions:\n'
               '        return "no predictions for this period"\n'
               '    return "\\n".join(format_row(p, units) for p in predictions)\n'))
    s.act(edit("tidewatch/cli.py", "    print(format_table(predictions))\n",
               "    print(format_table(predictions, units=args.units))\n"))
    s.act(edit("tests/test_format.py",
               'def test_empty_table():\n',
               'def test_format_row_in_feet():\n'
               '    p = Prediction(datetime(2026, 1, 12, 4, 31), "H", 1.824)\n'
               '    assert format_row(p, units="feet") == "Mon 12 Jan 04:31  HIGH   5.98 ft"\n\n\n'
               'def test_main_feet(capsys):\n'
               '    from tidewatch import cli\n\n'
               '    assert cli.main(["9414290", "--units", "feet"]) == 0\n'
               '    assert " ft" in capsys.readouterr().out\n\n\n'
               'def test_empty_table():\n'),
          text="Now tests for the feet formatting and the option itself.")
    tests = TIDEWATCH_TESTS[:4] + ["tests/test_format.py::test_format_row_in_feet",
                                   "tests/test_format.py::test_main_feet", TIDEWATCH_TESTS[4]]
    socket_tb = '''capsys = <_pytest.capture.CaptureFixture object at 0x7f3a1c2b9e50>

    def test_main_feet(capsys):
        from tidewatch import cli
    
>       assert cli.main(["9414290", "--units", "feet"]) == 0

tests/test_format.py:26: 
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ 
tidewatch/cli.py:26: in main
    predictions = fetch_predictions(args.station, days=args.days)
tidewatch/api.py:36: in fetch_predictions
    with urllib.request.urlopen(url, timeout=timeout) as response:
/usr/lib/python3.12/urllib/request.py:215: in urlopen
    return opener.open(url, data, timeout)
/usr/lib/python3.12/http/client.py:1003: in connect
    self.sock = self._create_connection(
/usr/lib/python3.12/socket.py:836: in create_connection
    sock = socket(af, socktype, proto)
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ 

    def guarded(*args, **kwargs):
>       raise SocketBlockedError()
E       pytest_socket.SocketBlockedError: A test tried to use socket.socket.

.venv/lib/python3.12/site-packages/pytest_socket.py:80: SocketBlockedError'''
    s.act(run_pytest("python -m pytest -q", tests, failures={"tests/test_format.py::test_main_feet": socket_tb},
                     seconds=0.31))
    s.act(edit("tests/test_format.py",
               'def test_main_feet(capsys):\n'
               '    from tidewatch import cli\n\n'
               '    assert cli.main(["9414290", "--units", "feet"]) == 0\n'
               '    assert " ft" in capsys.readouterr().out\n\n\n', ''),
          edit("tests/test_cli.py",
               'def test_days_out_of_range(capsys):\n',
               'def test_main_feet(fake_fetch, capsys):\n'
               '    assert cli.main(["9414290", "--units", "feet"]) == 0\n'
               '    assert "5.98 ft" in capsys.readouterr().out\n\n\n'
               'def test_days_out_of_range(capsys):\n'),
          text="My new CLI test went to the real service, which pytest-socket rightly blocked. The CLI tests already "
               "have a `fake_fetch` fixture, so the test belongs there instead of in test_format.py.",
          thinking="test_main_feet calls cli.main without stubbing fetch_predictions. test_cli.py has fake_fetch that "
                   "monkeypatches cli.fetch_predictions. Move the test into test_cli.py and use the fixture. Never "
                   "disable the socket guard.")
    tests = TIDEWATCH_TESTS[:1] + ["tests/test_cli.py::test_main_feet"] + TIDEWATCH_TESTS[1:4] + \
        ["tests/test_format.py::test_format_row_in_feet", TIDEWATCH_TESTS[4]]
    s.act(run_pytest("python -m pytest -q", tests, seconds=0.12))
    s.say("Done. `tidewatch 9414290 --units feet` now prints heights in feet; metric stays the default.\n\n"
          "- `cli.py`: new `--units {metric,feet}` option, passed to `format_table`.\n"
          "- `format.py`: converts metres to feet at display time (`FEET_PER_METRE = 3.28084`).\n"
          "- Tests: one formatting test, and one CLI test that uses the existing `fake_fetch` fixture, so "
          "nothing touches the network. All 7 pass with `--disable-socket`.")
    s.set_thinking("high")
    s.user("Why convert in format.py instead of in api.py? I'd have expected the client to return whatever unit "
           "I ask for, the service has a units=english parameter after all.")
    s.say("Both work; I chose the formatter for three reasons:\n\n"
          "1. **One unit inside the program.** `Prediction.height_m` always means metres. If the client returned "
          "either unit, every consumer would need to know which one it got (the field name would lie half the time).\n"
          "2. **Tests stay simple.** The fixtures in `test_cli.py` are in metres; with conversion in the client "
          "they would need a second set for feet, or the fake would have to imitate the service's conversion.\n"
          "3. **Rounding.** The service rounds `units=english` results to 3 decimals of feet, so metric and feet "
          "output could disagree in the last digit with our own rounding on top.\n\n"
          "The trade-off: if you later cache raw responses or export them, they stay metric. If you'd rather have "
          "the service convert, it's a two-line change in `_params` plus renaming the field to `height`.",
          thinking="The user challenges the design. Reasons for converting at display: a single internal unit "
                   "(height_m stays truthful), tests need one set of fixtures, and the upstream rounding of english "
                   "units would double-round. Counter-argument: the service can do it. Be honest that both are valid "
                   "and give the cost of switching.")
    s.user("OK, makes sense, keep it. But round feet to one decimal: you print two decimals for feet and it looks "
           "falsely precise. Metres stay at two.")
    s.act(edit("tidewatch/format.py", 'height = f"{p.height_m * FEET_PER_METRE:5.2f} ft"',
               'height = f"{p.height_m * FEET_PER_METRE:4.1f} ft"'),
          edit("tests/test_format.py", '"Mon 12 Jan 04:31  HIGH   5.98 ft"', '"Mon 12 Jan 04:31  HIGH   6.0 ft"'),
          edit("tests/test_cli.py", 'assert "5.98 ft" in capsys.readouterr().out', 'assert "6.0 ft" in capsys.readouterr().out'))
    done = s.act(run_pytest("python -m pytest -q", tests, seconds=0.11))
    done = s.say("Feet now print with one decimal (`6.0 ft`), metres keep two. Tests updated, 7 passed, still offline.")
    s.shell("git diff --stat", " tests/test_cli.py    |  5 +++++\n tests/test_format.py |  5 +++++\n"
            " tidewatch/cli.py     |  4 +++-\n tidewatch/format.py  | 12 ++++++++----\n"
            " 4 files changed, 22 insertions(+), 4 deletions(-)\n")
    s.note("Release checklist: bump the version in pyproject.toml and add a CHANGELOG entry before tagging.")
    s.user("Add a changelog line and bump the version to 0.4.0, then we're done. Don't tag, I do that myself.")
    s.act(read("CHANGELOG.md"), read("pyproject.toml"))
    s.act(edit("CHANGELOG.md", "# Changelog\n\n## 0.3.1\n",
               "# Changelog\n\n## 0.4.0\n- `--units feet` shows heights in feet (one decimal); metric stays the default.\n\n## 0.3.1\n"),
          edit("pyproject.toml", 'version = "0.3.1"', 'version = "0.4.0"'))
    s.say("Version is 0.4.0 and the changelog has the new entry. Nothing is tagged or committed; that's yours.")
    s.label(done, "units-flag-done")
    return s


# ===================================================================================================
# Session 2 (medium): budgetbox, bank CSV exports into DuckDB. A branch: the YAML rules detour is
# abandoned with /tree and a branch summary, and categories move into DuckDB itself.
# ===================================================================================================

BUDGETBOX_FILES = {
    "pyproject.toml": '''[project]
name = "budgetbox"
version = "0.1.0"
description = "Monthly budget from bank CSV exports"
readme = "README.md"
requires-python = ">=3.12"
dependencies = []

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[dependency-groups]
dev = ["pytest>=8.3"]
''',
    "README.md": "# budgetbox\n\nMonthly budget from bank CSV exports.\n",
    ".gitignore": ".venv/\n__pycache__/\nsamples/\n*.duckdb\n*.duckdb.wal\n",
    "src/budgetbox/__init__.py": "",
}

CSV_HEAD = """Buchungstag;Valuta;Auftraggeber/Empfänger;Buchungstext;Verwendungszweck;Betrag;Währung
01.10.2025;01.10.2025;Wohnbau Nord eG;Dauerauftrag;Miete Oktober Whg 3;-890,00;EUR
01.10.2025;01.10.2025;ACME Logistik GmbH;Gehalt/Rente;Gehalt 10/2025;3.412,77;EUR
02.10.2025;02.10.2025;REWE Markt GmbH;Kartenzahlung;REWE SAGT DANKE 4471;-43,18;EUR
02.10.2025;02.10.2025;Bäckerei Kruse;Kartenzahlung;Kruse Filiale Hafen;-3,90;EUR
02.10.2025;02.10.2025;Bäckerei Kruse;Kartenzahlung;Kruse Filiale Hafen;-3,90;EUR
06.10.2025;06.10.2025;Stadtwerke Lübeck;Lastschrift;Abschlag Strom/Gas 10/25;-118,00;EUR
07.10.2025;07.10.2025;DB Fernverkehr AG;Kartenzahlung;Ticket HH-HL;-1.234,56;EUR
07.10.2025;08.10.2025;Dana Berger;Umbuchung;Sparen Oktober;-300,00;EUR
"""

DB_PY = '''"""The DuckDB database: schema and connection."""

from __future__ import annotations

from pathlib import Path

import duckdb

DEFAULT_DB = Path("budget.duckdb")

SCHEMA = """
CREATE TABLE IF NOT EXISTS transactions (
    tx_key       VARCHAR PRIMARY KEY,   -- stable hash of the row, see importer.py
    account      VARCHAR NOT NULL,
    booking_date DATE NOT NULL,
    value_date   DATE,
    payee        VARCHAR,
    booking_text VARCHAR,
    purpose      VARCHAR,
    amount       DECIMAL(12, 2) NOT NULL,
    currency     VARCHAR NOT NULL DEFAULT 'EUR',
    source_file  VARCHAR NOT NULL,
    imported_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);
"""


def connect(path: Path | str = DEFAULT_DB) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(str(path))
    con.execute(SCHEMA)
    return con
'''

IMPORTER_V1 = '''"""Import bank CSV exports: semicolon separated, German dates (31.12.2025) and amounts (-1.234,56)."""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb

from budgetbox.db import connect

INSERT = """
INSERT OR IGNORE INTO transactions
    (tx_key, account, booking_date, value_date, payee, booking_text, purpose, amount, currency, source_file)
SELECT md5(concat_ws('|', Buchungstag, Valuta, "Auftraggeber/Empfänger", Verwendungszweck, Betrag)),
       $account, Buchungstag, Valuta, "Auftraggeber/Empfänger", Buchungstext, Verwendungszweck, Betrag,
       "Währung", $source
FROM read_csv($path, delim = ';', header = true, dateformat = '%d.%m.%Y', decimal_separator = ',')
"""


def import_file(con: duckdb.DuckDBPyConnection, path: Path, account: str = "giro") -> tuple[int, int]:
    """Import one export; returns (rows inserted, rows skipped because they were already there)."""
    before = con.execute("SELECT count(*) FROM transactions").fetchone()[0]
    rows = con.execute("SELECT count(*) FROM read_csv($path, delim = ';', header = true)", {"path": str(path)}).fetchone()[0]
    con.execute(INSERT, {"path": str(path), "account": account, "source": path.name})
    inserted = con.execute("SELECT count(*) FROM transactions").fetchone()[0] - before
    return inserted, rows - inserted


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    con = connect()
    total_in = total_skip = 0
    for path in paths:
        inserted, skipped = import_file(con, path)
        total_in += inserted
        total_skip += skipped
    print(f"imported {total_in} rows ({total_skip} duplicates skipped)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
'''

IMPORTER_TEST = '''from pathlib import Path

import pytest

from budgetbox.db import connect
from budgetbox.importer import import_file

HEADER = "Buchungstag;Valuta;Auftraggeber/Empfänger;Buchungstext;Verwendungszweck;Betrag;Währung\\n"


@pytest.fixture
def con(tmp_path):
    return connect(tmp_path / "test.duckdb")


def write_export(path: Path, *rows: str) -> Path:
    path.write_text(HEADER + "".join(r + "\\n" for r in rows), encoding="utf-8")
    return path


def test_amounts_and_dates(con, tmp_path):
    export = write_export(tmp_path / "hafenbank-oct.csv",
                          "07.10.2025;07.10.2025;DB Fernverkehr AG;Kartenzahlung;Ticket;-1.234,56;EUR",
                          "01.10.2025;01.10.2025;ACME Logistik GmbH;Gehalt/Rente;Gehalt;3.412,77;EUR")
    assert import_file(con, export) == (2, 0)
    rows = con.execute("SELECT booking_date::VARCHAR, amount::VARCHAR FROM transactions ORDER BY 1").fetchall()
    assert rows == [("2025-10-01", "3412.77"), ("2025-10-07", "-1234.56")]


def test_overlapping_exports_are_deduplicated(con, tmp_path):
    row = "02.10.2025;02.10.2025;REWE Markt GmbH;Kartenzahlung;REWE SAGT DANKE;-43,18;EUR"
    first = write_export(tmp_path / "a.csv", row)
    second = write_export(tmp_path / "b.csv", row, "03.10.2025;03.10.2025;Apotheke am Markt;Kartenzahlung;;-12,40;EUR")
    assert import_file(con, first) == (1, 0)
    assert import_file(con, second) == (1, 1)


def test_umlauts_survive(con, tmp_path):
    export = write_export(tmp_path / "c.csv", "02.10.2025;02.10.2025;Bäckerei Kruse;Kartenzahlung;Brötchen;-3,90;EUR")
    import_file(con, export)
    assert con.execute("SELECT payee FROM transactions").fetchone() == ("Bäckerei Kruse",)
'''

BUDGETBOX_TESTS_1 = [
    "tests/test_importer.py::test_amounts_and_dates",
    "tests/test_importer.py::test_overlapping_exports_are_deduplicated",
    "tests/test_importer.py::test_umlauts_survive",
]

CONVERSION_TB = '''con = <duckdb.duckdb.DuckDBPyConnection object at 0x7f0c2a4d1bf0>
tmp_path = PosixPath('/tmp/pytest-of-dana/pytest-41/test_amounts_and_dates0')

    def test_amounts_and_dates(con, tmp_path):
        export = write_export(tmp_path / "hafenbank-oct.csv",
                              "07.10.2025;07.10.2025;DB Fernverkehr AG;Kartenzahlung;Ticket;-1.234,56;EUR",
                              "01.10.2025;01.10.2025;ACME Logistik GmbH;Gehalt/Rente;Gehalt;3.412,77;EUR")
>       assert import_file(con, export) == (2, 0)

tests/test_importer.py:23: 
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ 
src/budgetbox/importer.py:28: in import_file
    con.execute(INSERT, {"path": str(path), "account": account, "source": path.name})
E   duckdb.duckdb.ConversionException: Conversion Error: Could not convert string "-1.234,56" to DECIMAL(12,2)
E   
E   LINE 5: FROM read_csv($path, delim = ';', header = true, dateformat = '%d.%m.%Y', decimal_separator = ',')
E                ^'''


RULES_CSV = """priority,pattern,category
10,^REWE|EDEKA|ALDI|LIDL|Bäckerei,groceries
10,^DB Fernverkehr|HVV|Deutschlandticket,transport
20,Wohnbau Nord,rent
20,Stadtwerke,utilities
30,Gehalt,income
40,^Dana Berger$,transfer
"""


def session_budgetbox() -> Session:
    s = Session("c2a9e4d7-81f6-4b3a-a5d0-6e1f9b27c845", "/home/dana/src/budgetbox", "2026-01-19T19:05:42.881", seed=202,
                files=BUDGETBOX_FILES)
    s.user("I want a small tool that imports my bank's CSV exports and tells me monthly totals per category. "
           "Python 3.12, uv for the environment. Start with the import part; the exports are in samples/.")
    s.act(bash("ls -la && ls samples/",
               "total 28\ndrwxr-xr-x  5 dana dana 4096 Jan 19 19:01 .\ndrwxr-xr-x 14 dana dana 4096 Jan 19 18:57 ..\n"
               "-rw-r--r--  1 dana dana   52 Jan 19 18:58 .gitignore\ndrwxr-xr-x  7 dana dana 4096 Jan 19 19:01 .git\n"
               "-rw-r--r--  1 dana dana   48 Jan 19 18:58 README.md\n-rw-r--r--  1 dana dana  331 Jan 19 18:58 pyproject.toml\n"
               "drwxr-xr-x  2 dana dana 4096 Jan 19 19:00 samples\ndrwxr-xr-x  3 dana dana 4096 Jan 19 18:58 src\n"
               "hafenbank-giro-2025-10.csv\nhafenbank-giro-2025-11.csv\n"),
          read("pyproject.toml"),
          text="Let me look at the project and the exports.")
    s.act(bash("head -n 9 samples/hafenbank-giro-2025-10.csv && wc -l samples/*.csv && file samples/*.csv",
               CSV_HEAD + "   71 samples/hafenbank-giro-2025-10.csv\n   104 samples/hafenbank-giro-2025-11.csv\n"
               "  175 total\nsamples/hafenbank-giro-2025-10.csv: CSV text, UTF-8 Unicode text\n"
               "samples/hafenbank-giro-2025-11.csv: CSV text, UTF-8 Unicode text\n"))
    s.say("The exports are semicolon-separated with German formats: dates like `07.10.2025` and amounts like "
          "`-1.234,56` (dot for thousands, comma for decimals). UTF-8, one header row.\n\n"
          "Plan for the import:\n"
          "1. Parse with the `csv` module and convert dates and amounts in Python.\n"
          "2. Store rows in SQLite (`budget.db`), table `transactions`, with a hash of the row as primary key.\n"
          "3. A `budgetbox import FILE...` command.\n\n"
          "One question: the October and November exports might overlap by a few days. Should re-importing an "
          "overlapping export skip rows that are already stored?",
          thinking="Semicolon CSV, German decimal comma and thousands dot, umlauts in the header. A local database "
                   "makes the monthly queries easy; sqlite3 is in the standard library, no dependency.")
    s.user("No SQLite: use DuckDB. I query everything else with DuckDB already and I want to open the database "
           "from the duckdb CLI. And yes, dedupe: the exports overlap by a few days.")
    s.act(bash("uv add duckdb",
               "Resolved 2 packages in 312ms\nPrepared 1 package in 1.84s\nInstalled 1 package in 41ms\n + duckdb==1.2.1\n",
               files={"pyproject.toml": BUDGETBOX_FILES["pyproject.toml"].replace(
                   "dependencies = []", 'dependencies = [\n    "duckdb>=1.2.1",\n]')}),
          text="Understood: DuckDB instead of SQLite, and the row hash makes re-imports idempotent. DuckDB can also "
               "read the CSV itself, so there's no need for the csv module.",
          thinking="User corrected me: DuckDB, not SQLite. Use read_csv directly in DuckDB. Primary key on a hash of "
                   "the row plus INSERT OR IGNORE handles overlapping exports.")
    s.act(write("src/budgetbox/db.py", DB_PY), write("src/budgetbox/importer.py", IMPORTER_V1),
          write("tests/test_importer.py", IMPORTER_TEST))
    s.act(run_pytest("uv run pytest -q", BUDGETBOX_TESTS_1,
                     failures={"tests/test_importer.py::test_amounts_and_dates": CONVERSION_TB},
                     seconds=0.58))
    s.act(edit("src/budgetbox/importer.py",
               '''       $account, Buchungstag, Valuta, "Auftraggeber/Empfänger", Buchungstext, Verwendungszweck, Betrag,
       "Währung", $source
FROM read_csv($path, delim = ';', header = true, dateformat = '%d.%m.%Y', decimal_separator = ',')
''', '''       $account,
       strptime(Buchungstag, '%d.%m.%Y')::DATE,
       strptime(nullif(Valuta, ''), '%d.%m.%Y')::DATE,
       "Auftraggeber/Empfänger", Buchungstext, Verwendungszweck,
       -- German amounts: '.' groups thousands, ',' is the decimal mark
       replace(replace(Betrag, '.', ''), ',', '.')::DECIMAL(12, 2),
       "Währung", $source
FROM read_csv($path, delim = ';', header = true, all_varchar = true)
'''),
          text="`decimal_separator` handles the comma but not the thousands dot, so `-1.234,56` can't be parsed. "
               "I'll read every column as text and convert explicitly, which also makes the date handling obvious.",
          thinking="DuckDB's CSV reader has decimal_separator but no thousands separator option. Read all_varchar, "
                   "strip '.', swap ',' to '.', cast to DECIMAL(12,2). Dates via strptime. Valuta can be empty.")
    s.act(run_pytest("uv run pytest -q", BUDGETBOX_TESTS_1, seconds=0.41))
    s.act(bash("uv run python -m budgetbox.importer samples/hafenbank-giro-2025-10.csv samples/hafenbank-giro-2025-11.csv",
               "imported 166 rows (8 duplicates skipped)\n"))
    s.say("Import works. `python -m budgetbox.importer FILE...` loads exports into `budget.duckdb`:\n\n"
          "- DuckDB reads the CSV directly (`read_csv`, all columns as text), then converts dates with `strptime` "
          "and amounts by removing the thousands dot and swapping the decimal comma.\n"
          "- Each row gets `tx_key = md5(date|value date|payee|purpose|amount)`; `INSERT OR IGNORE` skips rows that "
          "are already stored, so overlapping exports are fine. Your two files gave 166 rows and 8 duplicates.\n"
          "- 3 tests, all passing, each on a temporary database.\n\n"
          "You can open it with `duckdb budget.duckdb` and query `transactions`.")
    s.user("How does the dedupe key work exactly? Two coffees at the same bakery on the same day for the same "
           "amount would collide, no? There are two of those in the October file.")
    s.say("Yes, they collide. The key is `md5(booking date | value date | payee | purpose | amount)`, and the two "
          "Bäckerei Kruse rows on 02.10. are identical in all five fields, so the second one was dropped as a "
          "\"duplicate\". Some of the 8 skipped rows were real purchases.\n\n"
          "Fix: add an occurrence number. Within one file, number identical rows 1, 2, 3... in file order and put "
          "that number into the key. An overlapping export contains the same identical rows in the same order, so "
          "the first coffee is `#1` in both files and the second is `#2`; re-imports still match, but two coffees "
          "stay two. The only case it can't tell apart is a bank that reorders same-day rows between exports, "
          "which yours doesn't seem to do.",
          thinking="Two identical rows in one file hash to the same key: the second is lost. Common fix: "
                   "row_number() over the identical-row partition in file order, included in the hash. Overlapping "
                   "exports list the same rows in the same order, so occurrence numbers agree.")
    s.user("ok do that")
    s.act(edit("src/budgetbox/importer.py", '''SELECT md5(concat_ws('|', Buchungstag, Valuta, "Auftraggeber/Empfänger", Verwendungszweck, Betrag)),''',
               '''SELECT md5(concat_ws('|', Buchungstag, Valuta, "Auftraggeber/Empfänger", Verwendungszweck, Betrag, occurrence)),'''),
          edit("src/budgetbox/importer.py", '''FROM read_csv($path, delim = ';', header = true, all_varchar = true)
''', '''FROM (
    -- number identical rows in file order, so two equal purchases on one day stay two rows
    SELECT *, row_number() OVER (
               PARTITION BY Buchungstag, Valuta, "Auftraggeber/Empfänger", Verwendungszweck, Betrag
               ORDER BY line) AS occurrence
    FROM (SELECT *, row_number() OVER () AS line
          FROM read_csv($path, delim = ';', header = true, all_varchar = true))
)
'''),
          edit("tests/test_importer.py", "def test_umlauts_survive(con, tmp_path):\n",
               '''def test_identical_rows_in_one_export_are_kept(con, tmp_path):
    coffee = "02.10.2025;02.10.2025;Bäckerei Kruse;Kartenzahlung;Kruse Filiale Hafen;-3,90;EUR"
    assert import_file(con, write_export(tmp_path / "a.csv", coffee, coffee)) == (2, 0)
    # the same two rows again in an overlapping export: nothing new
    assert import_file(con, write_export(tmp_path / "b.csv", coffee, coffee)) == (0, 2)


def test_umlauts_survive(con, tmp_path):
'''))
    tests2 = BUDGETBOX_TESTS_1[:2] + ["tests/test_importer.py::test_identical_rows_in_one_export_are_kept"] + BUDGETBOX_TESTS_1[2:]
    s.act(run_pytest("uv run pytest -q", tests2, seconds=0.47),
          bash("rm budget.duckdb && uv run python -m budgetbox.importer samples/hafenbank-giro-2025-10.csv samples/hafenbank-giro-2025-11.csv",
               "imported 169 rows (5 duplicates skipped)\n"))
    done = s.say("Done: identical rows within one export now get occurrence numbers 1, 2, ... in the key. The new test "
                 "imports two identical coffees (2 rows) and then the same two again from an overlapping file (0 new). "
                 "After a fresh import there are 169 rows and 5 real duplicates from the overlap (before: 8, three "
                 "of which were genuine purchases).")
    fork = s.label(done, "import-works")

    # ---------- the YAML detour (abandoned later via /tree)
    s.user("Next: categories. I want rules like \"payee contains REWE → groceries\". Suggest something.")
    s.say("Proposal: a `rules.yaml` next to the database, an ordered list where the first match wins:\n\n"
          "```yaml\n- match: '^REWE|EDEKA|ALDI'\n  field: payee\n  category: groceries\n- match: 'Stadtwerke'\n"
          "  field: payee\n  category: utilities\n```\n\n"
          "`budgetbox categorize` would load the rules with PyYAML, apply them in Python and write the category "
          "into a new `category` column. Readable, easy to edit by hand, comments allowed.")
    s.user("sounds fine, go ahead")
    s.act(bash("uv add pyyaml", "Resolved 3 packages in 208ms\nInstalled 1 package in 12ms\n + pyyaml==6.0.2\n",
               files={"pyproject.toml": BUDGETBOX_FILES["pyproject.toml"].replace(
                   "dependencies = []", 'dependencies = [\n    "duckdb>=1.2.1",\n    "pyyaml>=6.0.2",\n]')}),
          write("rules.yaml", "# first match wins\n- match: \"^REWE|EDEKA|ALDI|LIDL\"\n  field: payee\n  category: groceries\n"
                "- match: \"Bäckerei\"\n  field: payee\n  category: groceries\n- match: \"^DB Fernverkehr|\\d{2}-Ticket\"\n"
                "  field: payee\n  category: transport\n- match: \"Stadtwerke\"\n  field: payee\n  category: utilities\n"),
          write("src/budgetbox/categorize.py", '''"""Assign categories from rules.yaml (first matching rule wins)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from budgetbox.db import connect


def load_rules(path: Path = Path("rules.yaml")) -> list[tuple[re.Pattern, str, str]]:
    rules = yaml.safe_load(path.read_text(encoding="utf-8")) or []
    return [(re.compile(r["match"], re.IGNORECASE), r.get("field", "payee"), r["category"]) for r in rules]


def categorize(con, rules) -> int:
    con.execute("ALTER TABLE transactions ADD COLUMN IF NOT EXISTS category VARCHAR")
    rows = con.execute("SELECT tx_key, payee, purpose FROM transactions").fetchall()
    updates = []
    for key, payee, purpose in rows:
        fields = {"payee": payee or "", "purpose": purpose or ""}
        category = next((c for pattern, f, c in rules if pattern.search(fields[f])), "uncategorized")
        updates.append((category, key))
    con.executemany("UPDATE transactions SET category = ? WHERE tx_key = ?", updates)
    return len(updates)


if __name__ == "__main__":
    print(f"categorized {categorize(connect(), load_rules())} rows")
'''))
    s.act(bash("uv run python -m budgetbox.categorize", '''Traceback (most recent call last):
  File "/home/dana/src/budgetbox/src/budgetbox/categorize.py", line 31, in <module>
    print(f"categorized {categorize(connect(), load_rules())} rows")
  File "/home/dana/src/budgetbox/src/budgetbox/categorize.py", line 14, in load_rules
    rules = yaml.safe_load(path.read_text(encoding="utf-8")) or []
  File "/home/dana/src/budgetbox/.venv/lib/python3.12/site-packages/yaml/__init__.py", line 125, in safe_load
    return load(stream, SafeLoader)
yaml.scanner.ScannerError: while scanning a double-quoted scalar
  in "<unicode string>", line 8, column 10:
    - match: "^DB Fernverkehr|\\d{2}-Ticket"
             ^
found unknown escape character 'd'
  in "<unicode string>", line 8, column 34:
    - match: "^DB Fernverkehr|\\d{2}-Ticket"
                                     ^
''', code=1))
    s.act(edit("rules.yaml", '- match: "^DB Fernverkehr|\\d{2}-Ticket"', "- match: '^DB Fernverkehr|\\d{2}-Ticket'"),
          text="Double-quoted YAML treats `\\d` as an escape. Single quotes keep regexes literal:")
    s.act(bash("uv run python -m budgetbox.categorize && duckdb budget.duckdb \"SELECT category, count(*) FROM transactions GROUP BY ALL ORDER BY 2 DESC\"",
               "categorized 169 rows\n┌───────────────┬──────────────┐\n│   category    │ count_star() │\n"
               "│    varchar    │    int64     │\n├───────────────┼──────────────┤\n│ uncategorized │           71 │\n"
               "│ groceries     │           58 │\n│ transport     │           22 │\n│ utilities     │           18 │\n"
               "└───────────────┴──────────────┘\n"))
    s.say("Categories work: `python -m budgetbox.categorize` applies `rules.yaml` and stores the result in a new "
          "`category` column. 98 of 169 rows are categorized with the four starter rules.")
    s.user("Hmm. Now the rules live in a YAML file and the categories are a snapshot column, so when I change a rule "
           "I have to remember to re-run categorize, and I can't see the rules from the duckdb CLI. And I didn't "
           "want a new dependency for this.")
    s.say("Fair points, and they share a cause: the rules live outside the database. Alternative without any new "
          "dependency: a `category_rules(priority, pattern, category)` table, seeded from a `rules.csv` you edit, and a "
          "`categorized` **view** that joins transactions to the first matching rule with `regexp_matches`. Nothing "
          "to re-run after editing a rule except reloading the CSV, and you can query and change rules from the "
          "duckdb CLI. I'd drop the YAML file, the `category` column and PyYAML.")

    # ---------- /tree back to before the categories request, with a summary of the detour
    s.branch_summary(fork, (
        "## Goal\nCategorize imported bank transactions so monthly totals per category are possible.\n\n"
        "## Constraints & Preferences\n- DuckDB only (user queries everything from the duckdb CLI); no SQLite.\n"
        "- No new dependencies for categorization.\n\n"
        "## Progress\n### Done\n- [x] Tried rules in `rules.yaml` (regex per payee, first match wins) applied in Python "
        "with PyYAML, writing a `category` column.\n\n"
        "### Blocked\n- The user rejected the approach: rules outside the database cannot be queried from the duckdb "
        "CLI, the category column goes stale when rules change, and PyYAML is a new dependency.\n\n"
        "## Key Decisions\n- **Abandon the YAML rules**: rules must live in DuckDB (a table seeded from a CSV) and "
        "categories must be computed by a view, not stored.\n\n"
        "## Next Steps\n1. Create `category_rules` and a `categorized` view.\n2. Seed rules from `rules.csv`.\n\n"
        "## Critical Context\n- Double-quoted YAML broke `\\d` in regexes; irrelevant once rules are in a CSV.\n"
        "- Matching must be case-insensitive (payees mix `REWE` and `Rewe`)."),
        read_files=["pyproject.toml"], modified_files=["rules.yaml", "src/budgetbox/categorize.py", "pyproject.toml"])
    s.user("Categories: keep the rules in DuckDB itself. A category_rules table seeded from rules.csv, and "
           "categorize with SQL in a view so I can use it from the duckdb CLI. No new dependencies.")
    s.act(bash("uv remove pyyaml && rm rules.yaml src/budgetbox/categorize.py && "
               "duckdb budget.duckdb 'ALTER TABLE transactions DROP COLUMN IF EXISTS category' && git status --short",
               "Resolved 2 packages in 97ms\nUninstalled 1 package in 6ms\n - pyyaml==6.0.2\n M pyproject.toml\n"
               "?? src/budgetbox/db.py\n?? src/budgetbox/importer.py\n?? tests/\n?? uv.lock\n",
               files={"pyproject.toml": BUDGETBOX_FILES["pyproject.toml"].replace(
                   "dependencies = []", 'dependencies = [\n    "duckdb>=1.2.1",\n]'),
                      "rules.yaml": None, "src/budgetbox/categorize.py": None}),
          read("src/budgetbox/db.py"),
          text="The files of the YAML attempt are still on disk, so first I'll remove them (PyYAML, rules.yaml, "
               "categorize.py, and the stored `category` column, which would clash with the view), then extend the "
               "schema.",
          thinking="Back at the import-works point, but /tree does not undo file changes: PyYAML is still in "
                   "pyproject, rules.yaml and categorize.py exist, and the transactions table has a category column. "
                   "Clean up first. Then: rules table plus view, case-insensitive matching, lowest priority wins, "
                   "uncategorized as fallback.")
    s.act(edit("src/budgetbox/db.py", '''    imported_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);
"""''', '''    imported_at  TIMESTAMP NOT NULL DEFAULT current_timestamp
);

CREATE TABLE IF NOT EXISTS category_rules (
    priority INTEGER NOT NULL,   -- lower wins when several rules match
    pattern  VARCHAR NOT NULL,   -- regular expression, matched against payee and purpose
    category VARCHAR NOT NULL
);

CREATE OR REPLACE VIEW categorized AS
SELECT t.*, coalesce(r.category, 'uncategorized') AS category
FROM transactions t
LEFT JOIN category_rules r
       ON regexp_matches(t.payee, r.pattern) OR regexp_matches(t.purpose, r.pattern)
QUALIFY row_number() OVER (PARTITION BY t.tx_key ORDER BY r.priority NULLS LAST, r.pattern) = 1;
"""'''),
          write("rules.csv", RULES_CSV),
          write("src/budgetbox/rules.py", '''"""Load category rules from a CSV file into the category_rules table (replacing what was there)."""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb

from budgetbox.db import connect


def load_rules(con: duckdb.DuckDBPyConnection, path: Path = Path("rules.csv")) -> int:
    with con.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("DELETE FROM category_rules")
        cur.execute("INSERT INTO category_rules SELECT priority, pattern, category FROM read_csv($path, header = true)",
                    {"path": str(path)})
        cur.execute("COMMIT")
    return con.execute("SELECT count(*) FROM category_rules").fetchone()[0]


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("rules.csv")
    print(f"loaded {load_rules(connect(), path)} rules from {path}")
'''),
          write("tests/test_rules.py", '''from budgetbox.db import connect
from budgetbox.rules import load_rules


def make_db(tmp_path, rules_csv, *payees):
    con = connect(tmp_path / "t.duckdb")
    for i, payee in enumerate(payees):
        con.execute("INSERT INTO transactions (tx_key, account, booking_date, payee, purpose, amount, source_file) "
                    "VALUES (?, 'giro', DATE '2025-10-01', ?, '', -1, 'x.csv')", [f"k{i}", payee])
    path = tmp_path / "rules.csv"
    path.write_text(rules_csv, encoding="utf-8")
    load_rules(con, path)
    return con


def test_first_rule_by_priority_wins(tmp_path):
    con = make_db(tmp_path, "priority,pattern,category\\n20,Markt,shopping\\n10,^REWE,groceries\\n", "REWE Markt GmbH")
    assert con.execute("SELECT category FROM categorized").fetchone() == ("groceries",)


def test_matching_ignores_case(tmp_path):
    con = make_db(tmp_path, "priority,pattern,category\\n10,^REWE,groceries\\n", "Rewe Markt GmbH")
    assert con.execute("SELECT category FROM categorized").fetchone() == ("groceries",)


def test_unmatched_is_uncategorized(tmp_path):
    con = make_db(tmp_path, "priority,pattern,category\\n10,^REWE,groceries\\n", "Apotheke am Markt")
    assert con.execute("SELECT category FROM categorized").fetchone() == ("uncategorized",)
'''))
    rule_tests = ["tests/test_rules.py::test_first_rule_by_priority_wins", "tests/test_rules.py::test_matching_ignores_case",
                  "tests/test_rules.py::test_unmatched_is_uncategorized"]
    case_tb = '''tmp_path = PosixPath('/tmp/pytest-of-dana/pytest-44/test_matching_ignores_case0')

    def test_matching_ignores_case(tmp_path):
        con = make_db(tmp_path, "priority,pattern,category\\n10,^REWE,groceries\\n", "Rewe Markt GmbH")
>       assert con.execute("SELECT category FROM categorized").fetchone() == ("groceries",)
E       AssertionError: assert ('uncategorized',) == ('groceries',)
E         
E         At index 0 diff: 'uncategorized' != 'groceries'
E         Use -v to get more diff

tests/test_rules.py:25: AssertionError'''
    s.act(run_pytest("uv run pytest -q", tests2 + rule_tests, failures={rule_tests[1]: case_tb}, seconds=0.66))
    s.act(edit("src/budgetbox/db.py",
               "       ON regexp_matches(t.payee, r.pattern) OR regexp_matches(t.purpose, r.pattern)\n",
               "       ON regexp_matches(t.payee, r.pattern, 'i') OR regexp_matches(t.purpose, r.pattern, 'i')\n"),
          text="`regexp_matches` is case-sensitive by default; the `'i'` option fixes it.")
    s.act(run_pytest("uv run pytest -q", tests2 + rule_tests, seconds=0.52),
          bash("uv run python -m budgetbox.rules && duckdb budget.duckdb \"SELECT category, count(*) AS n FROM categorized GROUP BY ALL ORDER BY n DESC\"",
               "loaded 6 rules from rules.csv\n┌───────────────┬───────┐\n│   category    │   n   │\n│    varchar    │ int64 │\n"
               "├───────────────┼───────┤\n│ groceries     │    61 │\n│ uncategorized │    37 │\n│ transport     │    22 │\n"
               "│ utilities     │    18 │\n│ transfer      │    14 │\n│ rent          │     2 │\n│ income        │     2 │\n"
               "└───────────────┴───────┘\n"))
    s.say("Categories now live in DuckDB:\n\n"
          "- `category_rules(priority, pattern, category)`, loaded from `rules.csv` with `python -m budgetbox.rules` "
          "(replaces all rules in one transaction).\n"
          "- View `categorized` = every transaction plus the category of the best matching rule (payee or purpose, "
          "case-insensitive), `uncategorized` if none matches.\n\n"
          "Nothing is stored per transaction, so a rule change takes effect on the next query. 132 of 169 rows are "
          "categorized with the 6 starter rules. No new dependencies.")
    s.user("The view picks the first matching rule? What if two rules match?")
    s.say("Exactly one row per transaction survives: `QUALIFY row_number() OVER (PARTITION BY tx_key ORDER BY "
          "priority, pattern) = 1`. When several rules match, the lowest `priority` number wins; on a tie the "
          "pattern that sorts first wins, which is arbitrary but stable. If you want ties to be an error instead, "
          "I can add a query that lists transactions with more than one best-priority match, so you can fix rules.csv.")

    # ---------- the monthly report, partly with another model
    s.set_model("openai", "gpt-5.1-codex")
    s.user("Now the monthly report: `budgetbox report --month 2025-10` prints totals per category, then income, "
           "expenses and net. An aligned plain-text table, no rich or tabulate dependency.")
    s.act(bash("ls src/budgetbox tests", "src/budgetbox:\n__init__.py\ndb.py\nimporter.py\nrules.py\n\ntests:\ntest_importer.py\ntest_rules.py\n"),
          thinking="Need report.py with a SQL query over categorized for a month, a plain formatter, and a CLI entry "
                   "with subcommands import/rules/report. Add [project.scripts].")
    report_v1 = '''"""The monthly report: totals per category, then income, expenses and net."""

from __future__ import annotations

from decimal import Decimal

import duckdb

TOTALS = """
SELECT category, sum(amount) AS total, count(*) AS n
FROM categorized
WHERE date_trunc('month', booking_date) = $month
GROUP BY category
ORDER BY total
"""


def month_totals(con: duckdb.DuckDBPyConnection, month: str) -> list[tuple[str, Decimal, int]]:
    return con.execute(TOTALS, {"month": month}).fetchall()


def render(month: str, rows: list[tuple[str, Decimal, int]]) -> str:
    if not rows:
        return f"no transactions in {month}"
    width = max(len(c) for c, _, _ in rows + [("category", 0, 0)])
    lines = [f"Budget {month}", "", f"{'category':<{width}}  {'total':>10}  {'n':>4}"]
    lines += [f"{c:<{width}}  {t:>10,.2f}  {n:>4}" for c, t, n in rows]
    income = sum((t for _, t, _ in rows if t > 0), Decimal(0))
    expenses = sum((t for _, t, _ in rows if t < 0), Decimal(0))
    lines += ["", f"{'income':<{width}}  {income:>10,.2f}", f"{'expenses':<{width}}  {expenses:>10,.2f}",
              f"{'net':<{width}}  {income + expenses:>10,.2f}"]
    return "\\n".join(lines)
'''
    cli_py = '''"""budgetbox command line: import, rules, report."""

from __future__ import annotations

import argparse
from pathlib import Path

from budgetbox.db import DEFAULT_DB, connect
from budgetbox.importer import import_file
from budgetbox.report import month_totals, render
from budgetbox.rules import load_rules


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="budgetbox")
    parser.add_argument("--db", type=Path, default=DEFAULT_DB)
    sub = parser.add_subparsers(dest="command", required=True)
    p_import = sub.add_parser("import", help="import bank CSV exports")
    p_import.add_argument("files", nargs="+", type=Path)
    p_rules = sub.add_parser("rules", help="load category rules from a CSV file")
    p_rules.add_argument("action", choices=["load"])
    p_rules.add_argument("--file", type=Path, default=Path("rules.csv"))
    p_report = sub.add_parser("report", help="monthly totals per category")
    p_report.add_argument("--month", required=True, help="YYYY-MM")
    args = parser.parse_args(argv)

    con = connect(args.db)
    if args.command == "import":
        inserted = skipped = 0
        for path in args.files:
            i, s = import_file(con, path)
            inserted, skipped = inserted + i, skipped + s
        print(f"imported {inserted} rows ({skipped} duplicates skipped)")
    elif args.command == "rules":
        print(f"loaded {load_rules(con, args.file)} rules from {args.file}")
    else:
        print(render(args.month, month_totals(con, args.month)))
    return 0
'''
    report_test = '''from decimal import Decimal

from budgetbox.db import connect
from budgetbox.report import month_totals, render


def seeded(tmp_path):
    con = connect(tmp_path / "r.duckdb")
    rows = [("a", "2025-10-01", "ACME Logistik GmbH", "3412.77"), ("b", "2025-10-02", "REWE Markt GmbH", "-43.18"),
            ("c", "2025-10-06", "Stadtwerke Lübeck", "-118.00"), ("d", "2025-11-02", "REWE Markt GmbH", "-20.00")]
    for key, day, payee, amount in rows:
        con.execute("INSERT INTO transactions (tx_key, account, booking_date, payee, purpose, amount, source_file) "
                    "VALUES (?, 'giro', ?::DATE, ?, '', ?::DECIMAL(12,2), 'x.csv')", [key, day, payee, amount])
    con.execute("INSERT INTO category_rules VALUES (10, '^REWE', 'groceries'), (20, 'Stadtwerke', 'utilities'), "
                "(30, 'ACME', 'income')")
    return con


def test_month_totals_only_that_month(tmp_path):
    rows = month_totals(seeded(tmp_path), "2025-10")
    assert rows == [("utilities", Decimal("-118.00"), 1), ("groceries", Decimal("-43.18"), 1),
                    ("income", Decimal("3412.77"), 1)]


def test_render_has_net(tmp_path):
    text = render("2025-10", month_totals(seeded(tmp_path), "2025-10"))
    assert text.splitlines()[-1].split() == ["net", "3,251.59"]


def test_empty_month(tmp_path):
    assert render("2024-01", month_totals(seeded(tmp_path), "2024-01")) == "no transactions in 2024-01"
'''
    s.act(write("src/budgetbox/report.py", report_v1), write("src/budgetbox/cli.py", cli_py),
          edit("pyproject.toml", 'dependencies = [\n    "duckdb>=1.2.1",\n]\n',
               'dependencies = [\n    "duckdb>=1.2.1",\n]\n\n[project.scripts]\nbudgetbox = "budgetbox.cli:main"\n'),
          write("tests/test_report.py", report_test))
    report_tests = ["tests/test_report.py::test_month_totals_only_that_month", "tests/test_report.py::test_render_has_net",
                    "tests/test_report.py::test_empty_month"]
    binder = '''src/budgetbox/report.py:21: in month_totals
    return con.execute(TOTALS, {"month": month}).fetchall()
E   duckdb.duckdb.ConversionException: Conversion Error: invalid timestamp field format: "2025-10", expected format is (YYYY-MM-DD HH:MM[:SS[.US]][±HH[:MM[:SS]]| ZONE])
E   
E   LINE 4: WHERE date_trunc('month', booking_date) = $month
E                                                     ^^^^^^'''
    s.act(run_pytest("uv run pytest -q", tests2 + report_tests + rule_tests,
                     failures={t: binder for t in report_tests}, seconds=0.71))
    s.act(edit("src/budgetbox/report.py", "WHERE date_trunc('month', booking_date) = $month",
               "WHERE date_trunc('month', booking_date) = ($month || '-01')::DATE"),
          text="`$month` is the string `2025-10`, which DuckDB can't compare with a date. I'll turn it into the first "
               "day of the month.")
    s.act(run_pytest("uv run pytest -q", tests2 + report_tests + rule_tests, seconds=0.63),
          bash("uv run budgetbox report --month 2025-10", '''Budget 2025-10

category          total     n
rent            -890.00     1
transport       -612.40    11
groceries       -583.77    29
transfer        -500.00     7
utilities       -171.49     9
uncategorized   -402.16    18
income         3,412.77     1

income         3,412.77
expenses      -3,159.82
net              252.95
'''))
    s.say("`budgetbox report --month 2025-10` works (October: income 3,412.77, expenses -3,159.82, net 252.95). "
          "The CLI has three subcommands: `import`, `rules load` and `report`, installed as the `budgetbox` script. "
          "10 tests pass.")
    s.user("Transfers between my own accounts show up as expenses. Exclude category 'transfer' from income and "
           "expenses, but still list it, separately, below the categories.")
    s.act(edit("src/budgetbox/report.py", '''    lines += [f"{c:<{width}}  {t:>10,.2f}  {n:>4}" for c, t, n in rows]
    income = sum((t for _, t, _ in rows if t > 0), Decimal(0))
    expenses = sum((t for _, t, _ in rows if t < 0), Decimal(0))
''', '''    spending = [(c, t, n) for c, t, n in rows if c != TRANSFER]
    transfers = [(c, t, n) for c, t, n in rows if c == TRANSFER]
    lines += [f"{c:<{width}}  {t:>10,.2f}  {n:>4}" for c, t, n in spending]
    if transfers:
        lines += ["", "own accounts (not counted):"]
        lines += [f"{c:<{width}}  {t:>10,.2f}  {n:>4}" for c, t, n in transfers]
    income = sum((t for _, t, _ in spending if t > 0), Decimal(0))
    expenses = sum((t for _, t, _ in spending if t < 0), Decimal(0))
'''), edit("src/budgetbox/report.py", 'TOTALS = """', 'TRANSFER = "transfer"  # money moved between own accounts\n\nTOTALS = """'),
          edit("tests/test_report.py", "def test_empty_month(tmp_path):\n", '''def test_transfers_listed_but_not_counted(tmp_path):
    con = seeded(tmp_path)
    con.execute("INSERT INTO transactions (tx_key, account, booking_date, payee, purpose, amount, source_file) "
                "VALUES ('e', 'giro', DATE '2025-10-07', 'Dana Berger', 'Sparen', -300, 'x.csv')")
    con.execute("INSERT INTO category_rules VALUES (40, '^Dana Berger$', 'transfer')")
    text = render("2025-10", month_totals(con, "2025-10"))
    assert "own accounts (not counted):" in text
    assert text.splitlines()[-1].split() == ["net", "3,251.59"]


def test_empty_month(tmp_path):
'''))
    report_tests2 = report_tests[:2] + ["tests/test_report.py::test_transfers_listed_but_not_counted", report_tests[2]]
    s.act(run_pytest("uv run pytest -q", tests2 + report_tests2 + rule_tests, seconds=0.68),
          bash("uv run budgetbox report --month 2025-10", '''Budget 2025-10

category          total     n
rent            -890.00     1
transport       -612.40    11
groceries       -583.77    29
utilities       -171.49     9
uncategorized   -402.16    18
income         3,412.77     1

own accounts (not counted):
transfer        -500.00     7

income         3,412.77
expenses      -2,659.82
net              752.95
'''))
    s.say("Transfers are now listed under \"own accounts (not counted)\" and left out of income, expenses and net. "
          "October's net goes from 252.95 to 752.95. New test included; 11 pass.")
    s.shell('duckdb budget.duckdb "SELECT category, count(*) AS n, sum(amount) AS total FROM categorized GROUP BY ALL ORDER BY n DESC"',
            "┌───────────────┬───────┬───────────────┐\n│   category    │   n   │     total     │\n"
            "│    varchar    │ int64 │ decimal(38,2) │\n├───────────────┼───────┼───────────────┤\n"
            "│ groceries     │    61 │      -1231.05 │\n│ uncategorized │    37 │       -847.30 │\n"
            "│ transport     │    22 │      -1190.85 │\n│ utilities     │    18 │       -342.98 │\n"
            "│ transfer      │    14 │      -1000.00 │\n│ rent          │     2 │      -1780.00 │\n"
            "│ income        │     2 │       6825.54 │\n└───────────────┴───────┴───────────────┘\n")
    s.user("37 uncategorized over the two months. Show me the top payees among them so I can write rules.")
    s.act(bash('duckdb budget.duckdb "SELECT payee, count(*) AS n, sum(amount) AS total FROM categorized '
               'WHERE category = \'uncategorized\' GROUP BY payee ORDER BY n DESC, total LIMIT 10"',
               "┌──────────────────────────┬───────┬───────────────┐\n│          payee           │   n   │     total     │\n"
               "│         varchar          │ int64 │ decimal(38,2) │\n├──────────────────────────┼───────┼───────────────┤\n"
               "│ dm-drogerie markt        │     7 │       -96.35  │\n│ Apotheke am Markt        │     5 │       -61.20  │\n"
               "│ Vodafone GmbH            │     2 │       -79.98  │\n│ Stadtwerke Lübeck Bäder  │     4 │       -22.00  │\n"
               "│ Spotify AB               │     2 │       -21.98  │\n│ HUK-COBURG               │     1 │      -312.44  │\n"
               "│ PayPal Europe S.a.r.l.   │     6 │      -201.83  │\n│ Bücherstube Lindow       │     3 │       -54.70  │\n"
               "│ Tierarztpraxis Hansen    │     1 │       -88.10  │\n│ Amazon EU S.a.r.l.       │     4 │       -88.62  │\n"
               "└──────────────────────────┴───────┴───────────────┘\n"))
    s.say("Top uncategorized payees, with a suggested category each:\n\n"
          "| payee | n | suggestion |\n|---|---|---|\n| dm-drogerie markt | 7 | household |\n"
          "| Apotheke am Markt | 5 | health |\n| Vodafone GmbH | 2 | utilities |\n"
          "| Stadtwerke Lübeck Bäder | 4 | housing |\n| Spotify AB | 2 | subscriptions |\n"
          "| HUK-COBURG | 1 | insurance |\n| PayPal Europe | 6 | needs the purpose field; PayPal hides the merchant |\n\n"
          "Odd one: Stadtwerke Lübeck Bäder should already match the `Stadtwerke` rule. Those rows were probably "
          "imported after the last `rules load`; reloading the rules should pick them up.",
          thinking="Suggest categories. Stadtwerke Lübeck Bäder should already match 'Stadtwerke'... unless the "
                   "rules were loaded before. Actually the view computes live, so it should match. Hmm, the swimming "
                   "pool rows... I'm not sure; be careful what I claim.")
    s.user("That guess is wrong: the view is computed on every query, so a reload changes nothing. Look at the "
           "actual payee bytes.")
    s.act(bash('duckdb budget.duckdb "SELECT DISTINCT payee, encode(payee) FROM transactions WHERE payee LIKE \'%Bäder%\'"',
               "┌─────────────────────────┬──────────────────────────────────────────────────────┐\n"
               "│          payee          │                    encode(payee)                     │\n"
               "│         varchar         │                         blob                         │\n"
               "├─────────────────────────┼──────────────────────────────────────────────────────┤\n"
               "│ Stadtwerke Lübeck Bäder │ St\\xC2\\xADadtwerke L\\xC3\\xBCbeck B\\xC3\\xA4der            │\n"
               "└─────────────────────────┴──────────────────────────────────────────────────────┘\n"),
          text="You're right, the view is computed on every query. Checking the raw bytes:")
    s.say("Found it: the payee contains an invisible soft hyphen (U+00AD, `\\xC2\\xAD`) after \"St\", so `Stadtwerke` "
          "doesn't match. The bank inserted it for line breaking. Two options: strip soft hyphens during import "
          "(`replace(payee, chr(173), '')`), or a rule pattern that tolerates them. Stripping at import is cleaner; "
          "it needs a re-import of both files (the keys will change for those 4 rows only).")
    s.user("Strip them at import. Then add rules for those payees with your suggestions, except Stadtwerke Bäder is "
           "'leisure', not housing, and PayPal stays uncategorized for now.")
    s.act(edit("src/budgetbox/importer.py", '''       "Auftraggeber/Empfänger", Buchungstext, Verwendungszweck,
       -- German amounts''', '''       replace("Auftraggeber/Empfänger", chr(173), ''),  -- the bank inserts soft hyphens
       Buchungstext, replace(Verwendungszweck, chr(173), ''),
       -- German amounts'''),
          read("rules.csv"))
    s.act(write("rules.csv", RULES_CSV + "15,Bäder,leisure\n30,^dm-drogerie,household\n30,^Apotheke,health\n"
                "30,^Vodafone,utilities\n30,^Spotify,subscriptions\n30,^HUK-COBURG,insurance\n"),
          text="The `Bäder` rule needs a lower priority number than `Stadtwerke` (20) to win.")
    s.act(bash("rm budget.duckdb && uv run budgetbox import samples/*.csv && uv run budgetbox rules load && "
               "uv run budgetbox report --month 2025-10",
               '''imported 169 rows (5 duplicates skipped)
loaded 12 rules from rules.csv

Budget 2025-10

category          total     n
rent            -890.00     1
transport       -612.40    11
groceries       -583.77    29
utilities       -211.48    10
insurance       -312.44     1
household        -51.15     4
uncategorized   -127.40     7
health           -30.60     3
leisure          -11.00     2
subscriptions    -10.99     1
income         3,412.77     1

own accounts (not counted):
transfer        -500.00     7

income         3,412.77
expenses      -2,241.23
net            1,171.54
'''))
    s.say("Soft hyphens are stripped at import, the six new rules are in `rules.csv` (Bäder → leisure with priority "
          "15, so it wins over the general Stadtwerke rule), PayPal is left alone. October has 7 uncategorized rows "
          "left, most of them PayPal.")
    s.user("I paste the totals into a spreadsheet every month. Can the report print CSV instead of the table?")
    s.act(read("src/budgetbox/report.py"), read("src/budgetbox/cli.py"),
          thinking="Add --format {table,csv} to the report subcommand. CSV via the csv module into a StringIO: "
                   "category,total,n rows plus income/expenses/net as extra rows with empty n. Decimal point, not "
                   "thousands separators, so spreadsheets parse it.")
    s.act(edit("src/budgetbox/report.py", "from decimal import Decimal\n", "import csv\nimport io\nfrom decimal import Decimal\n"),
          edit("src/budgetbox/report.py", '''    return "\\n".join(lines)
''', '''    return "\\n".join(lines)


def render_csv(rows: list[tuple[str, Decimal, int]]) -> str:
    """Machine-readable variant: plain decimals, transfers flagged, totals as the last three rows."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\\n")
    writer.writerow(["category", "total", "n", "counted"])
    counted = [(c, t, n) for c, t, n in rows if c != TRANSFER]
    for c, t, n in rows:
        writer.writerow([c, f"{t:.2f}", n, "no" if c == TRANSFER else "yes"])
    income = sum((t for _, t, _ in counted if t > 0), Decimal(0))
    expenses = sum((t for _, t, _ in counted if t < 0), Decimal(0))
    for label, value in (("income", income), ("expenses", expenses), ("net", income + expenses)):
        writer.writerow([f"= {label}", f"{value:.2f}", "", ""])
    return out.getvalue()
'''),
          edit("src/budgetbox/cli.py", '''    p_report.add_argument("--month", required=True, help="YYYY-MM")
''', '''    p_report.add_argument("--month", required=True, help="YYYY-MM")
    p_report.add_argument("--format", choices=["table", "csv"], default="table")
'''),
          edit("src/budgetbox/cli.py", '''        print(render(args.month, month_totals(con, args.month)))''',
               '''        rows = month_totals(con, args.month)
        if args.format == "csv":
            print(render_csv(rows), end="")
        else:
            print(render(args.month, rows))'''),
          edit("src/budgetbox/cli.py", "from budgetbox.report import month_totals, render\n",
               "from budgetbox.report import month_totals, render, render_csv\n"))
    s.act(bash("uv run budgetbox report --month 2025-10 --format csv", '''category,total,n,counted
rent,-890.00,1,yes
transport,-612.40,11,yes
groceries,-583.77,29,yes
transfer,-500.00,7,no
insurance,-312.44,1,yes
utilities,-211.48,10,yes
uncategorized,-127.40,7,yes
household,-51.15,4,yes
health,-30.60,3,yes
leisure,-11.00,2,yes
subscriptions,-10.99,1,yes
income,3412.77,1,yes
= income,3412.77,,
= expenses,-2241.23,,
= net,1171.54,,
'''))
    s.say("`budgetbox report --month 2025-10 --format csv` prints plain CSV: one row per category with a `counted` "
          "column (`no` for transfers), then `= income`, `= expenses` and `= net` rows. Amounts use a decimal point "
          "and no thousands separator, so spreadsheets read them as numbers.")
    s.user("The totals rows are awkward when I paste, my sheet sums the column. Leave them out of the CSV; "
           "the sheet computes them.")
    s.act(edit("src/budgetbox/report.py",
               '    """Machine-readable variant: plain decimals, transfers flagged, totals as the last three rows."""',
               '    """Machine-readable variant: plain decimals, transfers flagged, no total rows (spreadsheets sum)."""'),
          edit("src/budgetbox/report.py", '''    counted = [(c, t, n) for c, t, n in rows if c != TRANSFER]
    for c, t, n in rows:
        writer.writerow([c, f"{t:.2f}", n, "no" if c == TRANSFER else "yes"])
    income = sum((t for _, t, _ in counted if t > 0), Decimal(0))
    expenses = sum((t for _, t, _ in counted if t < 0), Decimal(0))
    for label, value in (("income", income), ("expenses", expenses), ("net", income + expenses)):
        writer.writerow([f"= {label}", f"{value:.2f}", "", ""])
''', '''    for c, t, n in rows:
        writer.writerow([c, f"{t:.2f}", n, "no" if c == TRANSFER else "yes"])
'''),
          edit("tests/test_report.py", "from budgetbox.report import month_totals, render\n",
               "from budgetbox.report import month_totals, render, render_csv\n"),
          edit("tests/test_report.py", "def test_empty_month(tmp_path):\n", '''def test_csv_has_no_total_rows(tmp_path):
    text = render_csv(month_totals(seeded(tmp_path), "2025-10"))
    assert text.splitlines() == ["category,total,n,counted", "utilities,-118.00,1,yes", "groceries,-43.18,1,yes",
                                 "income,3412.77,1,yes"]


def test_empty_month(tmp_path):
'''))
    report_tests2 = report_tests2[:3] + ["tests/test_report.py::test_csv_has_no_total_rows"] + report_tests2[3:]
    s.act(run_pytest("uv run pytest -q", tests2 + report_tests2 + rule_tests, seconds=0.71))
    s.say("The CSV now has only the category rows (with the `counted` column); income, expenses and net are left to "
          "the sheet. New test `test_csv_has_no_total_rows`; 12 tests pass.")
    s.note("Reminder: download the December export and run `budgetbox import` on it before the review on Feb 1.")
    s.set_model("anthropic", "claude-sonnet-4-5")
    s.user("Write a short README section on how to use it, and don't mention my bank's name anywhere in the repo.")
    s.act(read("README.md"), bash("grep -rni hafenbank --exclude-dir=.venv --exclude-dir=.git . ; ls samples",
                                  "./tests/test_importer.py:21:    export = write_export(tmp_path / \"hafenbank-oct.csv\",\n"
                                  "hafenbank-giro-2025-10.csv\nhafenbank-giro-2025-11.csv\n"))
    s.act(write("README.md", '''# budgetbox

Monthly budget from bank CSV exports, stored in DuckDB.

## Usage

```sh
uv sync
uv run budgetbox import exports/*.csv          # idempotent: overlapping exports are fine
uv run budgetbox rules load                     # (re)load rules.csv into the database
uv run budgetbox report --month 2025-10         # totals per category, income, expenses, net
```

The exports must be semicolon-separated with German dates and amounts (`07.10.2025`, `-1.234,56`).

## Categories

`rules.csv` has one rule per line: `priority,pattern,category`. The pattern is a case-insensitive regular
expression matched against payee and purpose; when several rules match, the lowest priority number wins.
Categories are computed by the `categorized` view, so changed rules apply on the next query after
`rules load`. Rows with category `transfer` (moves between your own accounts) are listed in the report but
not counted as income or expenses.

Everything is plain DuckDB: `duckdb budget.duckdb` and query `transactions`, `category_rules`, `categorized`.
'''), edit("tests/test_importer.py", 'write_export(tmp_path / "hafenbank-oct.csv",', 'write_export(tmp_path / "oct.csv",'))
    s.act(run_pytest("uv run pytest -q", tests2 + report_tests2 + rule_tests, seconds=0.66),
          bash("grep -rni hafenbank --exclude-dir=.venv --exclude-dir=.git --exclude-dir=samples . ; git check-ignore samples/ && echo ignored",
               "samples/\nignored\n"))
    s.say("README has a usage section. The bank's name is gone from the tracked files (the one test fixture is now "
          "`oct.csv`); it only remains in the file names under `samples/`, which git ignores. Tests pass.")
    s.user("Commit it all. Message: \"import, rules and monthly report\".")
    s.act(bash("git add -A && git status --short",
               "M  README.md\nM  pyproject.toml\nA  rules.csv\nA  src/budgetbox/cli.py\nA  src/budgetbox/db.py\n"
               "A  src/budgetbox/importer.py\nA  src/budgetbox/report.py\nA  src/budgetbox/rules.py\nA  tests/test_importer.py\n"
               "A  tests/test_report.py\nA  tests/test_rules.py\nA  uv.lock\n"))
    s.act(bash('git commit -m "import, rules and monthly report"',
               "[main 4c1e9a2] import, rules and monthly report\n 12 files changed, 512 insertions(+), 3 deletions(-)\n"
               " create mode 100644 rules.csv\n create mode 100644 src/budgetbox/cli.py\n create mode 100644 src/budgetbox/db.py\n"
               " create mode 100644 src/budgetbox/importer.py\n create mode 100644 src/budgetbox/report.py\n"
               " create mode 100644 src/budgetbox/rules.py\n create mode 100644 tests/test_importer.py\n"
               " create mode 100644 tests/test_report.py\n create mode 100644 tests/test_rules.py\n create mode 100644 uv.lock\n"))
    committed = s.say("Committed as `4c1e9a2` (\"import, rules and monthly report\"), 12 files. Nothing pushed.")
    s.label(committed, "v0.2-report")
    return s


# ===================================================================================================
# Session 3 (long): harbor-sync, a service that mirrors marina bookings from a partner API into
# Postgres. A pagination bug, secrets, retries, a manual /compact, backfill and a secret scan.
# ===================================================================================================

HS_PYPROJECT = '''[project]
name = "harbor-sync"
version = "0.7.2"
description = "Mirror berth bookings from the Quayline partner API into Postgres"
readme = "README.md"
requires-python = ">=3.11"
dependencies = [
    "httpx>=0.27",
    "psycopg[binary]>=3.2",
]

[project.scripts]
harbor-sync = "harbor_sync.cli:main"

[dependency-groups]
dev = ["pytest>=8.3", "ruff>=0.8"]

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[tool.pytest.ini_options]
testpaths = ["tests"]
markers = ["integration: needs the staging Postgres (VPN)"]

[tool.ruff]
line-length = 110
target-version = "py311"

[tool.ruff.lint]
select = ["E", "F", "I", "B", "UP", "SIM"]
'''

HS_README = '''# harbor-sync

Mirrors berth bookings of one marina from the Quayline partner API into our Postgres, so the harbour
office tools (invoicing, the berth board, the night-watch list) can query them without hitting the
partner API.

## How it runs

A systemd timer on `ops-2` starts `harbor-sync run` every 15 minutes. Each run asks the partner API for
bookings changed since the last successful run (the *watermark*), upserts them, and moves the watermark.
Berths change rarely; `harbor-sync berths` refreshes them and runs nightly.

## Configuration

See `src/harbor_sync/config.py`. The database URL and marina id can be overridden with environment
variables (`HARBOR_DATABASE_URL`, `HARBOR_MARINA_ID`).

## Development

```sh
uv sync
uv run pytest -m "not integration"   # unit tests
uv run pytest -m integration          # needs the staging database (VPN)
uv run ruff check
```
'''

HS_CONFIG = '''"""Settings for harbor-sync."""

from __future__ import annotations

import os
from dataclasses import dataclass

API_BASE_URL = "https://api.quayline.example/v2"
API_TOKEN = "qk_live_4f9a2c7e1b8d6035a9e2"
DEFAULT_MARINA = "mar_kiel_sporthafen"
DEFAULT_DATABASE_URL = "postgresql://harbor@localhost:5432/harbor"


@dataclass(frozen=True)
class Settings:
    api_base_url: str = API_BASE_URL
    api_token: str = API_TOKEN
    marina_id: str = DEFAULT_MARINA
    page_size: int = 100
    database_url: str = DEFAULT_DATABASE_URL
    timeout_seconds: float = 20.0


def load_settings() -> Settings:
    return Settings(
        marina_id=os.environ.get("HARBOR_MARINA_ID", DEFAULT_MARINA),
        page_size=int(os.environ.get("HARBOR_PAGE_SIZE", "100")),
        database_url=os.environ.get("HARBOR_DATABASE_URL", DEFAULT_DATABASE_URL),
    )
'''

HS_MODELS = '''"""Bookings and berths as the partner API describes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

STATUSES = ("requested", "confirmed", "checked_in", "checked_out", "cancelled", "no_show")


def _ts(value: str) -> datetime:
    """Partner timestamps are ISO 8601 in UTC with a trailing Z."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _money(value: str | int | float) -> Decimal:
    # The API sends prices as strings ("84.50"); older endpoints sent floats.
    return Decimal(str(value)).quantize(Decimal("0.01"))


@dataclass(frozen=True)
class Berth:
    id: str
    code: str  # as painted on the pier, e.g. "B-07"
    pier: str
    max_length_m: Decimal
    max_beam_m: Decimal
    has_power: bool

    @classmethod
    def from_api(cls, item: dict) -> Berth:
        return cls(
            id=item["id"],
            code=item["code"],
            pier=item["pier"],
            max_length_m=Decimal(str(item["dimensions"]["max_length_m"])),
            max_beam_m=Decimal(str(item["dimensions"]["max_beam_m"])),
            has_power=bool(item.get("amenities", {}).get("power", False)),
        )


@dataclass(frozen=True)
class Booking:
    id: str
    berth_id: str
    vessel_name: str
    vessel_length_m: Decimal
    arrival: date
    departure: date
    status: str
    guests: int
    price_eur: Decimal
    updated_at: datetime

    @classmethod
    def from_api(cls, item: dict) -> Booking:
        status = item["status"]
        if status not in STATUSES:
            raise ValueError(f"unknown booking status {status!r} in booking {item.get('id')}")
        vessel = item["vessel"]
        return cls(
            id=item["id"],
            berth_id=item["berth_id"],
            vessel_name=vessel["name"].strip(),
            vessel_length_m=Decimal(str(vessel["length_m"])),
            arrival=date.fromisoformat(item["arrival"]),
            departure=date.fromisoformat(item["departure"]),
            status=status,
            guests=int(item.get("guests", 1)),
            price_eur=_money(item["price"]["amount"]),
            updated_at=_ts(item["updated_at"]),
        )

    @property
    def nights(self) -> int:
        return (self.departure - self.arrival).days

    @property
    def active(self) -> bool:
        return self.status in ("requested", "confirmed", "checked_in")
'''

HS_CLIENT = '''"""Client for the Quayline partner API (bookings and berths of one marina)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime

import httpx

from harbor_sync.config import Settings
from harbor_sync.models import Berth, Booking

log = logging.getLogger(__name__)


class PartnerApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"partner API returned {status}: {message}")
        self.status = status


class QuaylineClient:
    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
        self.http = httpx.Client(
            base_url=settings.api_base_url,
            headers={"Authorization": f"Bearer {settings.api_token}", "Accept": "application/json"},
            timeout=settings.timeout_seconds,
            transport=transport,
        )

    def close(self) -> None:
        self.http.close()

    def _get(self, path: str, params: dict | None = None) -> dict:
        response = self.http.get(path, params=params)
        if response.status_code >= 400:
            raise PartnerApiError(response.status_code, response.text[:200])
        return response.json()

    def berths(self) -> list[Berth]:
        payload = self._get(f"/marinas/{self.settings.marina_id}/berths")
        return [Berth.from_api(item) for item in payload["data"]]

    def bookings_page(self, updated_since: datetime, cursor: str | None = None) -> tuple[list[Booking], str | None]:
        params = {"updated_since": updated_since.isoformat(), "limit": self.settings.page_size}
        if cursor:
            params["cursor"] = cursor
        payload = self._get(f"/marinas/{self.settings.marina_id}/bookings", params)
        bookings = [Booking.from_api(item) for item in payload["data"]]
        return bookings, payload.get("cursor")

    def bookings_since(self, updated_since: datetime) -> Iterator[list[Booking]]:
        """Yield pages of bookings changed since ``updated_since``, oldest change first."""
        cursor = None
        while True:
            page, cursor = self.bookings_page(updated_since, cursor)
            log.info("fetched page bookings=%d cursor=%s", len(page), cursor)
            yield page
            if not cursor:
                break
'''

HS_STORE = '''"""Postgres storage: upserts keyed by the partner's ids, plus the sync watermark."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import psycopg

from harbor_sync.models import Berth, Booking

SCHEMA = """
CREATE TABLE IF NOT EXISTS berths (
    id            text PRIMARY KEY,
    code          text NOT NULL,
    pier          text NOT NULL,
    max_length_m  numeric(5, 2) NOT NULL,
    max_beam_m    numeric(5, 2) NOT NULL,
    has_power     boolean NOT NULL
);
CREATE TABLE IF NOT EXISTS bookings (
    id               text PRIMARY KEY,
    berth_id         text NOT NULL,
    vessel_name      text NOT NULL,
    vessel_length_m  numeric(5, 2) NOT NULL,
    arrival          date NOT NULL,
    departure        date NOT NULL,
    status           text NOT NULL,
    guests           integer NOT NULL,
    price_eur        numeric(10, 2) NOT NULL,
    updated_at       timestamptz NOT NULL,
    synced_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS bookings_arrival ON bookings (arrival);
CREATE TABLE IF NOT EXISTS sync_state (
    name       text PRIMARY KEY,
    watermark  timestamptz NOT NULL
);
"""

UPSERT_BOOKING = """
INSERT INTO bookings (id, berth_id, vessel_name, vessel_length_m, arrival, departure, status, guests,
                      price_eur, updated_at)
VALUES (%(id)s, %(berth_id)s, %(vessel_name)s, %(vessel_length_m)s, %(arrival)s, %(departure)s, %(status)s,
        %(guests)s, %(price_eur)s, %(updated_at)s)
ON CONFLICT (id) DO UPDATE SET
    berth_id = excluded.berth_id, vessel_name = excluded.vessel_name,
    vessel_length_m = excluded.vessel_length_m, arrival = excluded.arrival, departure = excluded.departure,
    status = excluded.status, guests = excluded.guests, price_eur = excluded.price_eur,
    updated_at = excluded.updated_at, synced_at = now()
WHERE bookings.updated_at <= excluded.updated_at
"""

UPSERT_BERTH = """
INSERT INTO berths (id, code, pier, max_length_m, max_beam_m, has_power)
VALUES (%(id)s, %(code)s, %(pier)s, %(max_length_m)s, %(max_beam_m)s, %(has_power)s)
ON CONFLICT (id) DO UPDATE SET code = excluded.code, pier = excluded.pier,
    max_length_m = excluded.max_length_m, max_beam_m = excluded.max_beam_m, has_power = excluded.has_power
"""


class Store:
    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=False)

    def migrate(self) -> None:
        with self.conn.transaction():
            self.conn.execute(SCHEMA)

    def upsert_bookings(self, bookings: Iterable[Booking]) -> int:
        rows = [vars(b) for b in bookings]
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(UPSERT_BOOKING, rows)
        return len(rows)

    def upsert_berths(self, berths: Iterable[Berth]) -> int:
        rows = [vars(b) for b in berths]
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany(UPSERT_BERTH, rows)
        return len(rows)

    def get_watermark(self, name: str = "bookings") -> datetime | None:
        row = self.conn.execute("SELECT watermark FROM sync_state WHERE name = %s", (name,)).fetchone()
        return row[0] if row else None

    def set_watermark(self, value: datetime, name: str = "bookings") -> None:
        with self.conn.transaction():
            self.conn.execute(
                "INSERT INTO sync_state (name, watermark) VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET watermark = excluded.watermark",
                (name, value),
            )

    def close(self) -> None:
        self.conn.close()
'''

HS_SYNC = '''"""One sync run: everything changed since the watermark, upserted, then the watermark moves."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

log = logging.getLogger(__name__)

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)  # the partner has no data before 2020


@dataclass
class SyncResult:
    pages: int
    bookings: int
    watermark_before: datetime
    watermark_after: datetime


def run_sync(client, store) -> SyncResult:
    since = store.get_watermark() or EPOCH
    watermark = since
    pages = total = 0
    for page in client.bookings_since(since):
        pages += 1
        if not page:
            continue
        total += store.upsert_bookings(page)
        watermark = max(b.updated_at for b in page)
        store.set_watermark(watermark)
    log.info("sync done pages=%d bookings=%d watermark=%s", pages, total, watermark.isoformat())
    return SyncResult(pages, total, since, watermark)


def refresh_berths(client, store) -> int:
    berths = client.berths()
    count = store.upsert_berths(berths)
    log.info("berths refreshed count=%d", count)
    return count
'''

HS_CLI = '''"""harbor-sync command line."""

from __future__ import annotations

import argparse
import logging
import sys

from harbor_sync.client import PartnerApiError, QuaylineClient
from harbor_sync.config import load_settings
from harbor_sync.store import Store
from harbor_sync.sync import refresh_berths, run_sync


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="harbor-sync")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="sync bookings changed since the last run")
    sub.add_parser("berths", help="refresh the berth list")
    sub.add_parser("migrate", help="create or update the database schema")
    args = parser.parse_args(argv)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    settings = load_settings()
    store = Store(settings.database_url)
    client = QuaylineClient(settings)
    try:
        if args.command == "migrate":
            store.migrate()
        elif args.command == "berths":
            refresh_berths(client, store)
        else:
            run_sync(client, store)
    except PartnerApiError as exc:
        logging.getLogger("harbor_sync").error("%s", exc)
        return 1
    finally:
        client.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

HS_CONFTEST = '''"""Fakes shared by the unit tests: no network, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from harbor_sync.models import Booking


def make_booking(n: int, updated_at: datetime | None = None, status: str = "confirmed") -> Booking:
    base = datetime(2025, 12, 1, 8, 0, tzinfo=UTC)
    return Booking(
        id=f"bk_{n:05d}", berth_id=f"brt_{n % 40:03d}", vessel_name=f"Testboot {n}",
        vessel_length_m=Decimal("9.80"), arrival=base.date(), departure=(base + timedelta(days=2)).date(),
        status=status, guests=2, price_eur=Decimal("84.50"),
        updated_at=updated_at or base + timedelta(minutes=n),
    )


class FakeClient:
    def __init__(self, pages: list[list[Booking]]) -> None:
        self.pages = pages
        self.calls: list[datetime] = []

    def bookings_since(self, updated_since):
        self.calls.append(updated_since)
        yield from self.pages

    def berths(self):
        return []


class MemoryStore:
    def __init__(self, watermark: datetime | None = None) -> None:
        self.bookings: dict[str, Booking] = {}
        self.watermark = watermark
        self.watermark_writes: list[datetime] = []

    def upsert_bookings(self, bookings) -> int:
        bookings = list(bookings)
        for b in bookings:
            self.bookings[b.id] = b
        return len(bookings)

    def upsert_berths(self, berths) -> int:
        return len(list(berths))

    def get_watermark(self, name: str = "bookings"):
        return self.watermark

    def set_watermark(self, value, name: str = "bookings") -> None:
        self.watermark = value
        self.watermark_writes.append(value)


@pytest.fixture
def store():
    return MemoryStore()
'''

HS_TEST_SYNC = '''from datetime import UTC, datetime

from conftest import FakeClient, MemoryStore, make_booking
from harbor_sync.sync import EPOCH, run_sync


def test_first_run_starts_at_epoch(store):
    client = FakeClient([[make_booking(1)]])
    run_sync(client, store)
    assert client.calls == [EPOCH]


def test_watermark_is_latest_updated_at(store):
    run_sync(FakeClient([[make_booking(1), make_booking(7), make_booking(3)]]), store)
    assert store.watermark == make_booking(7).updated_at


def test_empty_page_does_not_move_watermark():
    start = datetime(2025, 11, 30, tzinfo=UTC)
    store = MemoryStore(watermark=start)
    result = run_sync(FakeClient([[]]), store)
    assert store.watermark == start
    assert result.bookings == 0


def test_bookings_are_upserted(store):
    run_sync(FakeClient([[make_booking(1), make_booking(2)], [make_booking(3)]]), store)
    assert sorted(store.bookings) == ["bk_00001", "bk_00002", "bk_00003"]
'''

HS_TEST_CLIENT = '''import json
from datetime import UTC, datetime

import httpx
import pytest

from harbor_sync.client import PartnerApiError, QuaylineClient
from harbor_sync.config import Settings

SETTINGS = Settings(api_base_url="https://partner.test/v2", api_token="test-token", marina_id="mar_test")
SINCE = datetime(2025, 12, 1, tzinfo=UTC)


def booking_json(n: int) -> dict:
    return {
        "id": f"bk_{n:05d}", "berth_id": "brt_001", "status": "confirmed", "guests": 2,
        "vessel": {"name": f"Boot {n}", "length_m": 9.8}, "arrival": "2025-12-03", "departure": "2025-12-05",
        "price": {"amount": "84.50", "currency": "EUR"}, "updated_at": "2025-12-01T10:00:00Z",
    }


def client_for(handler) -> QuaylineClient:
    return QuaylineClient(SETTINGS, transport=httpx.MockTransport(handler))


def test_sends_bearer_token():
    seen = {}

    def handler(request):
        seen["auth"] = request.headers["Authorization"]
        return httpx.Response(200, json={"data": []})

    client_for(handler).berths()
    assert seen["auth"] == "Bearer test-token"


def test_bookings_page_params():
    seen = {}

    def handler(request):
        seen.update(request.url.params)
        return httpx.Response(200, json={"data": [booking_json(1)]})

    page, cursor = client_for(handler).bookings_page(SINCE)
    assert [b.id for b in page] == ["bk_00001"]
    assert seen == {"updated_since": "2025-12-01T00:00:00+00:00", "limit": "100"}


def test_error_status_raises():
    client = client_for(lambda request: httpx.Response(401, text=json.dumps({"error": "invalid token"})))
    with pytest.raises(PartnerApiError) as info:
        client.berths()
    assert info.value.status == 401
'''

HS_TEST_MODELS_NAMES = (
    ["tests/test_models.py::test_booking_from_api", "tests/test_models.py::test_booking_nights",
     "tests/test_models.py::test_vessel_name_is_stripped", "tests/test_models.py::test_unknown_status_rejected"]
    + [f"tests/test_models.py::test_status_parsed[{st}]" for st in
       ("requested", "confirmed", "checked_in", "checked_out", "cancelled", "no_show")]
    + [f"tests/test_models.py::test_active[{st}-{a}]" for st, a in
       (("requested", True), ("confirmed", True), ("checked_in", True), ("checked_out", False),
        ("cancelled", False), ("no_show", False))]
    + [f"tests/test_models.py::test_money[{v}]" for v in ("84.50", "84.5", "84", "84.505", "float-84.5")]
    + ["tests/test_models.py::test_berth_from_api", "tests/test_models.py::test_berth_without_amenities",
       "tests/test_models.py::test_updated_at_is_timezone_aware"]
)
HS_TESTS_CLIENT_NAMES = ["tests/test_client.py::test_sends_bearer_token", "tests/test_client.py::test_bookings_page_params",
                         "tests/test_client.py::test_error_status_raises"]
HS_TESTS_SYNC_NAMES = ["tests/test_sync.py::test_first_run_starts_at_epoch",
                       "tests/test_sync.py::test_watermark_is_latest_updated_at",
                       "tests/test_sync.py::test_empty_page_does_not_move_watermark",
                       "tests/test_sync.py::test_bookings_are_upserted"]
HS_INTEGRATION = 7

HS_DOCS = '''# Quayline partner API: the parts we use

Base URL `https://api.quayline.example/v2`. Authentication is a bearer token per partner:

```
curl -H "Authorization: Bearer qk_live_2b81f0c4d7e95a36c1f8" \\
     "https://api.quayline.example/v2/marinas/mar_kiel_sporthafen/bookings?updated_since=2025-12-01T00:00:00Z&limit=100"
```

## Bookings

`GET /marinas/{marina}/bookings?updated_since=ISO&limit=N[&cursor=C]`

Returns bookings whose `updated_at` is at or after `updated_since`, ordered by booking `id` (not by
`updated_at`), at most `limit` (max 200) per page. If more results exist, the response has `next_cursor`; pass it as
`cursor` to get the next page. The cursor expires after 10 minutes.

```json
{"data": [ ... ], "next_cursor": "c_MTczMzA1NjAwMHxia18wMDQxMg", "has_more": true}
```

## Berths

`GET /marinas/{marina}/berths` returns all berths, no paging.

## Errors and limits

- 401: token invalid or expired. Tokens are rotated every quarter since 2026 (partner mail of 2025-11-20).
- 429: rate limit, 120 requests/minute per token; `Retry-After` header in seconds.
- 503: maintenance, usually 02:00-02:30 Europe/Berlin; `Retry-After` may be missing.
'''

HS_FILES = {
    "pyproject.toml": HS_PYPROJECT,
    "README.md": HS_README,
    ".gitignore": ".venv/\n__pycache__/\n.pytest_cache/\n.ruff_cache/\ndist/\n",
    "CHANGELOG.md": "# Changelog\n\n## 0.7.2 (2025-10-14)\n- Store `guests` (the office needs it for the harbour dues).\n\n"
                    "## 0.7.1 (2025-09-02)\n- Berths: read `amenities.power`.\n\n## 0.7.0 (2025-08-18)\n"
                    "- Move from the v1 to the v2 partner API (cursor paging instead of page numbers).\n",
    "docs/partner-api.md": HS_DOCS,
    "src/harbor_sync/__init__.py": '__version__ = "0.7.2"\n',
    "src/harbor_sync/config.py": HS_CONFIG,
    "src/harbor_sync/models.py": HS_MODELS,
    "src/harbor_sync/client.py": HS_CLIENT,
    "src/harbor_sync/store.py": HS_STORE,
    "src/harbor_sync/sync.py": HS_SYNC,
    "src/harbor_sync/cli.py": HS_CLI,
    "tests/conftest.py": HS_CONFTEST,
    "tests/test_sync.py": HS_TEST_SYNC,
    "tests/test_client.py": HS_TEST_CLIENT,
}

HS_TIMER = """[Unit]
Description=Sync marina bookings every 15 minutes

[Timer]
OnCalendar=*:0/15
RandomizedDelaySec=20
Persistent=true

[Install]
WantedBy=timers.target
"""

HS_SERVICE = """[Unit]
Description=Sync marina bookings
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
User=harbor
WorkingDirectory=/opt/harbor-sync
EnvironmentFile=/etc/harbor-sync/env
ExecStart=/opt/harbor-sync/.venv/bin/harbor-sync run
TimeoutStartSec=10min
"""

VESSELS = ["Seeschwalbe", "Möwe II", "Nordlicht", "Kleine Freiheit", "Albatros", "Windspiel", "Hanse Rose",
           "Luv & Lee", "Sturmvogel", "Blue Heron", "Saltholm", "Fjordkatze", "Kiekut", "Meerjungfrau",
           "Skagerrak", "Smilla", "Tümmler", "Lütte Deern", "Havfrue", "Aurora", "Perlenfischer", "Rasmus",
           "Pinguin", "Südwind", "Flinthörn", "Elbe 3", "Morgenröte", "Polarstern", "Swantje", "Tjalk Anna"]

HS_TEST_MODELS = '''from datetime import date
from decimal import Decimal

import pytest

from harbor_sync.models import STATUSES, Berth, Booking, _money

BOOKING = {
    "id": "bk_04127", "berth_id": "brt_B07", "status": "confirmed", "guests": 3,
    "vessel": {"name": " Seeschwalbe ", "length_m": 10.4},
    "arrival": "2026-05-14", "departure": "2026-05-17",
    "price": {"amount": "126.00", "currency": "EUR"},
    "updated_at": "2026-02-02T20:41:07Z",
}
ACTIVE = {"requested": True, "confirmed": True, "checked_in": True,
          "checked_out": False, "cancelled": False, "no_show": False}


def test_booking_from_api():
    b = Booking.from_api(BOOKING)
    assert (b.id, b.berth_id, b.status, b.guests) == ("bk_04127", "brt_B07", "confirmed", 3)
    assert b.arrival == date(2026, 5, 14)
    assert b.price_eur == Decimal("126.00")


def test_booking_nights():
    assert Booking.from_api(BOOKING).nights == 3


def test_vessel_name_is_stripped():
    assert Booking.from_api(BOOKING).vessel_name == "Seeschwalbe"


def test_unknown_status_rejected():
    with pytest.raises(ValueError, match="unknown booking status 'parked'"):
        Booking.from_api({**BOOKING, "status": "parked"})


@pytest.mark.parametrize("status", STATUSES)
def test_status_parsed(status):
    assert Booking.from_api({**BOOKING, "status": status}).status == status


@pytest.mark.parametrize("status,active", ACTIVE.items())
def test_active(status, active):
    assert Booking.from_api({**BOOKING, "status": status}).active is active


@pytest.mark.parametrize(
    "value,expected",
    [("84.50", "84.50"), ("84.5", "84.50"), ("84", "84.00"), ("84.505", "84.50"), (84.5, "84.50")],
    ids=["84.50", "84.5", "84", "84.505", "float-84.5"],
)
def test_money(value, expected):
    assert _money(value) == Decimal(expected)


def test_berth_from_api():
    berth = Berth.from_api({"id": "brt_B07", "code": "B-07", "pier": "B",
                            "dimensions": {"max_length_m": 12, "max_beam_m": 4.2}, "amenities": {"power": True}})
    assert berth.code == "B-07"
    assert berth.max_beam_m == Decimal("4.2")
    assert berth.has_power


def test_berth_without_amenities():
    berth = Berth.from_api({"id": "brt_F31", "code": "F-31", "pier": "F",
                            "dimensions": {"max_length_m": 8, "max_beam_m": 3}})
    assert berth.has_power is False


def test_updated_at_is_timezone_aware():
    assert Booking.from_api(BOOKING).updated_at.tzinfo is not None
'''

HS_TEST_STORE = '''"""Against the staging Postgres: needs the VPN and HARBOR_TEST_DATABASE_URL."""

import os
from datetime import UTC, datetime, timedelta

import pytest

from conftest import make_booking
from harbor_sync.models import Berth
from harbor_sync.store import Store

pytestmark = pytest.mark.integration


@pytest.fixture
def store():
    dsn = os.environ.get("HARBOR_TEST_DATABASE_URL", "postgresql://harbor_test@staging-db.internal:5432/harbor_test")
    s = Store(dsn)
    s.migrate()
    s.conn.execute("TRUNCATE bookings, berths, sync_state")
    s.conn.commit()
    yield s
    s.close()


def test_migrate_is_idempotent(store):
    store.migrate()
    store.migrate()


def test_upsert_booking_inserts(store):
    assert store.upsert_bookings([make_booking(1), make_booking(2)]) == 2
    assert store.conn.execute("SELECT count(*) FROM bookings").fetchone() == (2,)


def test_upsert_keeps_newer_version(store):
    newer = make_booking(1, updated_at=datetime(2026, 1, 2, tzinfo=UTC), status="cancelled")
    older = make_booking(1, updated_at=datetime(2026, 1, 1, tzinfo=UTC))
    store.upsert_bookings([newer])
    store.upsert_bookings([older])
    assert store.conn.execute("SELECT status FROM bookings").fetchone() == ("cancelled",)


def test_upsert_replaces_older_version(store):
    store.upsert_bookings([make_booking(1)])
    later = make_booking(1, updated_at=make_booking(1).updated_at + timedelta(hours=1), status="checked_in")
    store.upsert_bookings([later])
    assert store.conn.execute("SELECT status FROM bookings").fetchone() == ("checked_in",)


def test_watermark_roundtrip(store):
    value = datetime(2026, 2, 1, 12, 30, tzinfo=UTC)
    store.set_watermark(value)
    assert store.get_watermark() == value


def test_watermark_absent_is_none(store):
    assert store.get_watermark() is None


def test_upsert_berths(store):
    berth = Berth("brt_A01", "A-01", "A", max_length_m=12, max_beam_m=4, has_power=True)
    assert store.upsert_berths([berth, berth]) == 2
    assert store.conn.execute("SELECT count(*) FROM berths").fetchone() == (1,)
'''


def _hs_sample_page(rng: random.Random, count: int) -> str:
    """A recorded partner response: ordered by id, updated_at all over the place, with next_cursor."""
    items = []
    n = 4080
    for _ in range(count):
        n += rng.randint(1, 4)
        arrival = datetime(2025, 8, 20) + timedelta(days=rng.randint(0, 120))
        nights = rng.choice([1, 2, 2, 3, 3, 4, 7, 14])
        updated = datetime(2025, 8, 14, 17, 0) + timedelta(seconds=rng.randint(0, 4 * 3600))
        length = round(rng.uniform(6.5, 15.5), 1)
        items.append({
            "id": f"bk_{n:05d}",
            "berth_id": f"brt_{rng.choice('ABCDEF')}{rng.randint(1, 38):02d}",
            "status": rng.choice(["requested", "confirmed", "confirmed", "confirmed", "cancelled"]),
            "guests": rng.randint(1, 6),
            "vessel": {"name": rng.choice(VESSELS), "length_m": length,
                       "flag": rng.choice(["DE", "DE", "DE", "DK", "SE", "NL", "PL"])},
            "arrival": f"{arrival:%Y-%m-%d}",
            "departure": f"{arrival + timedelta(days=nights):%Y-%m-%d}",
            "price": {"amount": f"{nights * (18 + length * 2.1):.2f}", "currency": "EUR"},
            "created_at": f"{updated - timedelta(days=rng.randint(0, 40), minutes=rng.randint(0, 600)):%Y-%m-%dT%H:%M:%SZ}",
            "updated_at": f"{updated:%Y-%m-%dT%H:%M:%SZ}",
        })
    payload = {"data": items, "next_cursor": "c_MTc3MDA1ODQ2N3xia18wNDIyOQ", "has_more": True}
    return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"


def _hs_booking_lines(rng: random.Random, count: int, first: int) -> list[str]:
    """``would upsert`` lines of a backfill dry run, ordered by booking id like the partner API."""
    out = []
    statuses = ["confirmed"] * 6 + ["checked_out"] * 4 + ["cancelled", "requested", "checked_in", "no_show"]
    n = first
    for _ in range(count):
        n += rng.randint(1, 9)
        arrival = datetime(2025, 12, 1) + timedelta(days=rng.randint(0, 75))
        departure = arrival + timedelta(days=rng.choice([1, 1, 2, 2, 3, 4, 7, 14]))
        berth = f"brt_{rng.choice('ABCDEF')}{rng.randint(1, 38):02d}"
        out.append(f"would upsert bk_{n:05d} berth={berth} {arrival:%Y-%m-%d}..{departure:%Y-%m-%d} "
                   f"{rng.choice(statuses):<11} {rng.choice(VESSELS)!r}")
    return out


def _hs_journal_pagination(rng: random.Random) -> str:
    lines = []
    for hour, minute in ((21, 0), (21, 15), (21, 30), (21, 45)):
        t = datetime(2026, 2, 2, hour, minute, 1)
        pid = rng.randint(180000, 199999)
        lines.append(f"Feb 02 {t:%H:%M:%S} ops-2 systemd[1]: Starting harbor-sync.service - Sync marina bookings...")
        t += timedelta(milliseconds=rng.randint(600, 900))
        lines.append(f"Feb 02 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]: {t:%Y-%m-%d %H:%M:%S},{rng.randint(100, 999)} INFO "
                     f"httpx HTTP Request: GET https://api.quayline.example/v2/marinas/mar_kiel_sporthafen/bookings?"
                     f"updated_since=2026-02-02T{hour - 1:02d}%3A{rng.randint(10, 59):02d}%3A{rng.randint(10, 59):02d}%2B00%3A00"
                     f"&limit=100 \"HTTP/1.1 200 OK\"")
        t += timedelta(milliseconds=rng.randint(300, 700))
        lines.append(f"Feb 02 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]: {t:%Y-%m-%d %H:%M:%S},{rng.randint(100, 999)} INFO "
                     "harbor_sync.client fetched page bookings=100 cursor=None")
        t += timedelta(milliseconds=rng.randint(200, 500))
        lines.append(f"Feb 02 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]: {t:%Y-%m-%d %H:%M:%S},{rng.randint(100, 999)} INFO "
                     f"harbor_sync.sync sync done pages=1 bookings=100 watermark=2026-02-02T{hour:02d}:"
                     f"{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999999):06d}+00:00")
        lines.append(f"Feb 02 {t:%H:%M:%S} ops-2 systemd[1]: harbor-sync.service: Deactivated successfully.")
        lines.append(f"Feb 02 {t:%H:%M:%S} ops-2 systemd[1]: Finished harbor-sync.service - Sync marina bookings.")
    return "\n".join(lines)


def _hs_journal_maintenance(rng: random.Random) -> str:
    lines = []
    for minute in (0, 15):
        t = datetime(2026, 2, 3, 2, minute, 1)
        pid = rng.randint(200000, 219999)
        stamp = lambda: f"{t:%Y-%m-%d %H:%M:%S},{rng.randint(100, 999)}"  # noqa: E731
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 systemd[1]: Starting harbor-sync.service - Sync marina bookings...")
        t += timedelta(milliseconds=rng.randint(600, 900))
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]: {stamp()} INFO httpx HTTP Request: GET "
                     "https://api.quayline.example/v2/marinas/mar_kiel_sporthafen/bookings?updated_since=2026-02-03T01"
                     f"%3A4{minute // 15}%3A12.481220%2B00%3A00&limit=100 \"HTTP/1.1 503 Service Unavailable\"")
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]: Traceback (most recent call last):")
        for frame in (
            ('/opt/harbor-sync/.venv/bin/harbor-sync', 8, '<module>', 'sys.exit(main())'),
            ('/opt/harbor-sync/src/harbor_sync/cli.py', 37, 'main', 'run_sync(client, store)'),
            ('/opt/harbor-sync/src/harbor_sync/sync.py', 28, 'run_sync', 'for page in client.bookings_since(since):'),
            ('/opt/harbor-sync/src/harbor_sync/client.py', 61, 'bookings_since', 'page, cursor = self.bookings_page(updated_since, cursor)'),
            ('/opt/harbor-sync/src/harbor_sync/client.py', 52, 'bookings_page', 'payload = self._get(f"/marinas/{self.settings.marina_id}/bookings", params)'),
            ('/opt/harbor-sync/src/harbor_sync/client.py', 39, '_get', 'raise PartnerApiError(response.status_code, response.text[:200])'),
        ):
            lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]:   File \"{frame[0]}\", line {frame[1]}, in {frame[2]}")
            lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]:     {frame[3]}")
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[{pid}]: harbor_sync.client.PartnerApiError: partner API "
                     "returned 503: <html><head><title>503 Service Temporarily Unavailable</title></head><body><center>"
                     "<h1>503 Service Temporarily Unavailable</h1></center><hr><center>nginx</center></body></html>")
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 systemd[1]: harbor-sync.service: Main process exited, code=exited, status=1/FAILURE")
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 systemd[1]: harbor-sync.service: Failed with result 'exit-code'.")
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 systemd[1]: Failed to start harbor-sync.service - Sync marina bookings.")
    t = datetime(2026, 2, 3, 2, 30, 1)
    lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 systemd[1]: Starting harbor-sync.service - Sync marina bookings...")
    for retry in range(3):
        t += timedelta(milliseconds=rng.randint(600, 1900))
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[221873]: {t:%Y-%m-%d %H:%M:%S},{rng.randint(100, 999)} INFO "
                     "httpx HTTP Request: GET https://api.quayline.example/v2/marinas/mar_kiel_sporthafen/bookings?"
                     f"updated_since=2026-02-03T01%3A45%3A12.481220%2B00%3A00&limit=100{'' if retry == 0 else '&cursor=c_' + rng.randbytes(12).hex()} \"HTTP/1.1 200 OK\"")
        lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[221873]: {t:%Y-%m-%d %H:%M:%S},{rng.randint(100, 999)} INFO "
                     f"harbor_sync.client fetched page bookings={100 if retry < 2 else 17} "
                     f"cursor={'c_' + rng.randbytes(12).hex() if retry < 2 else None}")
    lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 harbor-sync[221873]: {t:%Y-%m-%d %H:%M:%S},{rng.randint(100, 999)} INFO "
                 "harbor_sync.sync sync done pages=3 bookings=217 watermark=2026-02-03T02:29:51.003114+00:00")
    lines.append(f"Feb 03 {t:%H:%M:%S} ops-2 systemd[1]: Finished harbor-sync.service - Sync marina bookings.")
    return "\n".join(lines)


def _hs_uv_sync() -> str:
    return ("Using CPython 3.12.7 interpreter at: /usr/bin/python3.12\nCreating virtual environment at: .venv\n"
            "Resolved 19 packages in 2ms\nPrepared 14 packages in 1.21s\nInstalled 14 packages in 27ms\n"
            " + anyio==4.8.0\n + certifi==2025.1.31\n + h11==0.14.0\n + harbor-sync==0.7.2 (from file:///home/dana/src/harbor-sync)\n"
            " + httpcore==1.0.7\n + httpx==0.28.1\n + idna==3.10\n + iniconfig==2.0.0\n + packaging==24.2\n"
            " + pluggy==1.5.0\n + psycopg==3.2.4\n + psycopg-binary==3.2.4\n + pytest==8.3.4\n + ruff==0.8.6\n")


HS_GIT_LOG = """a81c3f0 (HEAD -> main, origin/main) Store guests per booking
5d2e9b7 Release 0.7.2
e04a6c1 berths: read amenities.power
3b97d22 Release 0.7.1
c8f1a05 Pin psycopg 3.2 (binary wheels on ops-2)
71e4d9a Move to partner API v2: cursor paging
9a0b6e3 config: marina id from environment
f2c5a18 Add integration tests against staging Postgres
6de0b41 Night-watch list needs departure dates: store them
0c93e72 Upsert: never overwrite a newer booking version
b4a1f67 systemd unit and timer
2f8e0d3 First version: bookings and berths into Postgres
"""


def session_harbor_sync() -> Session:
    s = Session("8e3f1d26-9c4b-4a7e-b0d5-71a2c6e8f394", "/home/dana/src/harbor-sync", "2026-02-03T09:12:05.530", seed=303,
                files=HS_FILES)
    s.fs["tests/test_models.py"] = HS_TEST_MODELS
    s.fs["tests/test_store.py"] = HS_TEST_STORE
    s.fs["docs/samples/bookings-page-v2.json"] = _hs_sample_page(random.Random(3032), 36)
    s.fs["deploy/harbor-sync.timer"] = HS_TIMER
    s.fs["deploy/harbor-sync.service"] = HS_SERVICE
    tracked = dict(s.fs)  # the files of the last commit (a81c3f0)
    gen = random.Random(3031)
    rootdir = "/home/dana/src/harbor-sync"
    unit = HS_TEST_MODELS_NAMES + HS_TESTS_CLIENT_NAMES + HS_TESTS_SYNC_NAMES

    # ------------------------------------------------------------------ 1. orientation
    s.user("I'm picking harbor-sync back up after two months away. Read through it and tell me how a sync run "
           "works and what looks fragile. Don't change anything yet.")
    s.act(bash("git log --oneline -12 && git status --short", HS_GIT_LOG),
          bash("find . -name '*.py' -not -path './.venv/*' | sort && wc -l src/harbor_sync/*.py tests/*.py | tail -1",
               "./src/harbor_sync/__init__.py\n./src/harbor_sync/cli.py\n./src/harbor_sync/client.py\n"
               "./src/harbor_sync/config.py\n./src/harbor_sync/models.py\n./src/harbor_sync/store.py\n"
               "./src/harbor_sync/sync.py\n./tests/conftest.py\n./tests/test_client.py\n./tests/test_models.py\n"
               "./tests/test_store.py\n./tests/test_sync.py\n  1012 total\n"),
          text="I'll start with the history and the layout, then read the code.",
          thinking="Read-only review. Start with git log and layout, then README, config, models, client, store, "
                   "sync, cli, tests. Run the unit tests without integration ones? I don't know yet how they are marked.")
    s.act(read("README.md"), read("pyproject.toml"))
    s.act(read("src/harbor_sync/config.py"),
          thinking="config.py first: where settings come from.")
    s.act(read("src/harbor_sync/models.py"))
    s.act(read("src/harbor_sync/client.py"),
          thinking="Models: Booking.from_api rejects unknown statuses with ValueError; that would abort a whole run. "
                   "Note it. Now the client.")
    s.act(read("src/harbor_sync/store.py"))
    s.act(read("src/harbor_sync/sync.py"), read("src/harbor_sync/cli.py"),
          thinking="Client yields pages following a cursor; sync sets the watermark per page to max(updated_at) of "
                   "that page. That is only safe if results are sorted by updated_at. Config has a live-looking token "
                   "constant. Store's upsert has a guard against older versions, good.")
    s.act(read("tests/conftest.py"), read("tests/test_sync.py"))
    s.act(read("tests/test_client.py"), read("tests/test_models.py"))
    s.act(read("tests/test_store.py"),
          thinking="test_store.py is marked integration at module level and connects to staging-db.internal. "
                   "Run only unit tests: -m 'not integration'.")
    s.act(bash("uv sync", _hs_uv_sync()),
          text="The integration tests need the staging database, so I'll run only the unit tests.")
    s.act(run_pytest('uv run pytest -v -m "not integration"', unit, verbose=True, seconds=0.84,
                     deselected=HS_INTEGRATION, rootdir=rootdir))
    s.say("""## How a run works

1. `cli.py run` loads `Settings`, opens the Postgres `Store` and a `QuaylineClient` (httpx).
2. `sync.run_sync` reads the watermark from `sync_state` (or `EPOCH` = 2020-01-01 on the first run) and asks the client for bookings with `updated_since = watermark`.
3. `client.bookings_since` requests `/marinas/{id}/bookings` page by page (`limit=100`), following a cursor until there is none.
4. Each page is upserted in one transaction. The upsert never replaces a newer version (`WHERE bookings.updated_at <= excluded.updated_at`), so re-fetching is harmless.
5. After each page the watermark is set to that page's highest `updated_at`.

Berths are a separate command (`berths`), no paging. Unit tests: 31 pass; 7 integration tests (marked `integration`) need the staging database.

## What looks fragile

- **The partner token is hard-coded** in `config.py` (`API_TOKEN = "qk_live_…"`) and therefore in git history. It can't be rotated without a code change.
- **Watermark per page** assumes the API returns bookings sorted by `updated_at`. If it isn't, a later page can contain older changes than the watermark already set, and a crash between pages would skip them.
- **No retries.** Any 429/5xx or network error fails the whole run; the next timer run retries 15 minutes later.
- `EPOCH` on an empty `sync_state` means a full history pull with no upper bound; fine once, slow if someone truncates `sync_state`.
- `load_settings` ignores `HARBOR_API_BASE_URL`, so there's no way to point it at the partner sandbox without editing code.
- Minor: `run_sync` logs the watermark but `SyncResult` isn't used by the CLI (exit code is always 0 unless the API errors).

Nothing changed.""",
          thinking="Summarize the flow and the risks. Key risk: per-page watermark plus unknown ordering. I haven't "
                   "verified the ordering in the docs; say it as an assumption.")
    s.user("What does the watermark mean exactly? And what happens if two bookings have the same updated_at and "
           "fall on either side of a page boundary?")
    s.act(bash("grep -n -i 'updated_since\\|at or after\\|limit' docs/partner-api.md",
               "7:     \"https://api.quayline.example/v2/marinas/mar_kiel_sporthafen/bookings?updated_since=2025-12-01T00:00:00Z&limit=100\"\n"
               "12:`GET /marinas/{marina}/bookings?updated_since=ISO&limit=N[&cursor=C]`\n"
               "14:Returns bookings whose `updated_at` is at or after `updated_since`, ordered by booking `id` (not by\n"
               "28:- 429: rate limit, 120 requests/minute per token; `Retry-After` header in seconds.\n"))
    s.say("The watermark is \"every change up to this `updated_at` is stored\": the next run asks for bookings with "
          "`updated_at >= watermark` (the docs say *at or after*, so the filter is inclusive).\n\n"
          "Same `updated_at` across a page boundary: the inclusive filter means the next run fetches the booking at "
          "the boundary again, and the upsert guard makes that a no-op. So ties are safe.\n\n"
          "But the same grep shows something worse: results are **ordered by booking id, not by `updated_at`**. "
          "Setting the watermark to the max `updated_at` of page 1 is then wrong whenever page 2 holds a booking "
          "with an older `updated_at`: if the run stops after page 1, the next run starts above that booking and "
          "never sees it. Within one complete run nothing is lost, because every page is fetched before the run "
          "ends. I'd move the watermark only once, after the last page, but you asked me not to change anything yet.",
          thinking="Docs line 14: ordered by id, not updated_at. The per-page watermark is therefore unsafe when a run "
                   "dies midway. Within a complete run it's fine.")

    # ------------------------------------------------------------------ 2. the pagination bug
    log_text = _hs_journal_pagination(gen)
    s.user("Funny you say that. Last night's runs each synced exactly 100 bookings, but the partner dashboard shows "
           "340 bookings changed yesterday evening, and the office says bk_04127 (a change of berth for the "
           "\"Seeschwalbe\") never showed up. Here's the journal for four runs:\n\n```\n" + log_text + "\n```")
    s.act(read("docs/partner-api.md"),
          text="Every run fetched exactly one full page and logged `cursor=None`. A full page with no cursor is "
               "suspicious, so let me check what the API calls its cursor.",
          thinking="bookings=100 cursor=None on every run: the client never sees a cursor. Check the docs for the "
                   "field name.")
    s.act(bash("grep -rn 'cursor' src tests",
               "src/harbor_sync/client.py:47:    def bookings_page(self, updated_since: datetime, cursor: str | None = None) -> tuple[list[Booking], str | None]:\n"
               "src/harbor_sync/client.py:49:        if cursor:\n"
               "src/harbor_sync/client.py:50:            params[\"cursor\"] = cursor\n"
               "src/harbor_sync/client.py:53:        return bookings, payload.get(\"cursor\")\n"
               "src/harbor_sync/client.py:57:        cursor = None\n"
               "src/harbor_sync/client.py:59:            page, cursor = self.bookings_page(updated_since, cursor)\n"
               "src/harbor_sync/client.py:60:            log.info(\"fetched page bookings=%d cursor=%s\", len(page), cursor)\n"
               "src/harbor_sync/client.py:62:            if not cursor:\n"))
    s.act(bash("ls docs/samples && git log --oneline -1 -- docs/samples",
               "bookings-page-v2.json\n71e4d9a Move to partner API v2: cursor paging\n"),
          read("docs/samples/bookings-page-v2.json"),
          text="There's a recorded v2 response from the migration in `docs/samples`; let me check the field name and "
               "the ordering on real data.")
    s.say("Found it; two bugs that together lose bookings:\n\n"
          "1. **Wrong field name.** The v2 API returns the next-page token as `next_cursor` (docs, \"Bookings\"); the "
          "client reads `payload.get(\"cursor\")`, which is always `None`. So every run stops after the first page. "
          "This has been so since the move to v2 (`71e4d9a`); it only showed now because yesterday was the first "
          "evening with more than 100 changes in 15 minutes (the spring booking window opened).\n"
          "2. **Watermark per page + id ordering.** Page 1 is ordered by id, so its highest `updated_at` can be "
          "newer than changes on pages 2-4. The run then set the watermark above those, and the next run started "
          "after them: they are skipped for good. bk_04127 is such a booking; the 240 others are a mix of skipped "
          "and merely delayed.\n\n"
          "Proposed fix: read `next_cursor`; compute the watermark over all pages and write it once at the end. Then a "
          "one-off re-sync since yesterday evening to recover what was skipped (the upsert guard makes that safe).",
          thinking="Client reads 'cursor' but API sends 'next_cursor'. Combined with the per-page watermark and id "
                   "ordering, changes on later pages with smaller updated_at than page 1's max get skipped "
                   "permanently. Fix both, then recover with a backfill.")
    s.user("Agreed on both. Watermark: only move it at the very end of a successful run, never per page. If a run "
           "dies midway, the next run must redo everything since the old watermark; upserts are idempotent, so "
           "that's fine. Write tests for both.")
    s.act(edit("src/harbor_sync/client.py", '        return bookings, payload.get("cursor")\n',
               '        return bookings, payload.get("next_cursor")\n'),
          edit("src/harbor_sync/client.py", '        """Yield pages of bookings changed since ``updated_since``, oldest change first."""\n',
               '        """Yield pages of bookings changed since ``updated_since`` (the API orders them by id)."""\n'),
          text="First the client: the cursor field, and the docstring that claimed the wrong order.")
    sync_loop_v1 = '''    since = store.get_watermark() or EPOCH
    watermark = since
    pages = total = 0
    for page in client.bookings_since(since):
        pages += 1
        if not page:
            continue
        total += store.upsert_bookings(page)
        watermark = max(b.updated_at for b in page)
        store.set_watermark(watermark)
    log.info("sync done pages=%d bookings=%d watermark=%s", pages, total, watermark.isoformat())
    return SyncResult(pages, total, since, watermark)
'''
    sync_loop_try = '''    since = store.get_watermark() or EPOCH
    latest = since
    pages = total = 0
    try:
        for page in client.bookings_since(since):
            pages += 1
            if not page:
                continue
            total += store.upsert_bookings(page)
            latest = max(latest, max(b.updated_at for b in page))
    finally:
        # one watermark write per run, after the last page
        if latest > since:
            store.set_watermark(latest)
    log.info("sync done pages=%d bookings=%d watermark=%s", pages, total, latest.isoformat())
    return SyncResult(pages, total, since, latest)
'''
    s.act(edit("src/harbor_sync/sync.py", sync_loop_v1, sync_loop_try))
    s.act(edit("tests/test_sync.py", "from datetime import UTC, datetime\n\n",
               "from datetime import UTC, datetime\n\nimport pytest\n\n"),
          edit("tests/test_sync.py", "from harbor_sync.sync import EPOCH, run_sync\n",
               "from harbor_sync.client import PartnerApiError\nfrom harbor_sync.sync import EPOCH, run_sync\n\n\n"
               "class FailingClient(FakeClient):\n    \"\"\"Delivers the first page, then the API fails.\"\"\"\n\n"
               "    def bookings_since(self, updated_since):\n        self.calls.append(updated_since)\n"
               "        yield self.pages[0]\n        raise PartnerApiError(502, \"bad gateway\")\n"),
          edit("tests/test_sync.py", "def test_bookings_are_upserted(store):\n",
               "def test_watermark_written_once_after_all_pages(store):\n"
               "    # id order: page 1 holds the newest change, page 2 an older one\n"
               "    pages = [[make_booking(1), make_booking(9)], [make_booking(5)]]\n"
               "    run_sync(FakeClient(pages), store)\n"
               "    assert store.watermark_writes == [make_booking(9).updated_at]\n\n\n"
               "def test_failed_run_keeps_old_watermark():\n"
               "    start = datetime(2025, 11, 30, tzinfo=UTC)\n"
               "    store = MemoryStore(watermark=start)\n"
               "    with pytest.raises(PartnerApiError):\n"
               "        run_sync(FailingClient([[make_booking(1)]]), store)\n"
               "    assert store.watermark == start\n"
               "    assert store.watermark_writes == []\n\n\n"
               "def test_bookings_are_upserted(store):\n"),
          edit("tests/test_client.py", "def test_error_status_raises():\n",
               "def test_follows_next_cursor():\n"
               "    pages = {None: ([booking_json(1), booking_json(2)], \"c_2\"), \"c_2\": ([booking_json(3)], None)}\n"
               "    seen = []\n\n"
               "    def handler(request):\n"
               "        cursor = request.url.params.get(\"cursor\")\n"
               "        seen.append(cursor)\n"
               "        data, next_cursor = pages[cursor]\n"
               "        return httpx.Response(200, json={\"data\": data, \"next_cursor\": next_cursor,\n"
               "                                         \"has_more\": next_cursor is not None})\n\n"
               "    ids = [b.id for page in client_for(handler).bookings_since(SINCE) for b in page]\n"
               "    assert ids == [\"bk_00001\", \"bk_00002\", \"bk_00003\"]\n"
               "    assert seen == [None, \"c_2\"]\n\n\n"
               "def test_error_status_raises():\n"),
          text="Now tests: the client follows `next_cursor`; the watermark is written once, after all pages; a run "
               "that fails midway leaves the old watermark.")
    unit_client = HS_TESTS_CLIENT_NAMES[:2] + ["tests/test_client.py::test_follows_next_cursor"] + HS_TESTS_CLIENT_NAMES[2:]
    unit_sync = HS_TESTS_SYNC_NAMES[:3] + ["tests/test_sync.py::test_watermark_written_once_after_all_pages",
                                           "tests/test_sync.py::test_failed_run_keeps_old_watermark"] + HS_TESTS_SYNC_NAMES[3:]
    unit = HS_TEST_MODELS_NAMES + unit_client + unit_sync
    fail_tb = '''    def test_failed_run_keeps_old_watermark():
        start = datetime(2025, 11, 30, tzinfo=UTC)
        store = MemoryStore(watermark=start)
        with pytest.raises(PartnerApiError):
            run_sync(FailingClient([[make_booking(1)]]), store)
>       assert store.watermark == start
E       AssertionError: assert datetime.datetime(2025, 12, 1, 8, 1, tzinfo=datetime.timezone.utc) == datetime.datetime(2025, 11, 30, 0, 0, tzinfo=datetime.timezone.utc)
E        +  where datetime.datetime(2025, 12, 1, 8, 1, tzinfo=datetime.timezone.utc) = <conftest.MemoryStore object at 0x7f5d8c3e2a10>.watermark

tests/test_sync.py:47: AssertionError'''
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit,
                     failures={"tests/test_sync.py::test_failed_run_keeps_old_watermark": fail_tb},
                     seconds=0.88, deselected=HS_INTEGRATION, rootdir=rootdir))
    s.act(edit("src/harbor_sync/sync.py", sync_loop_try, '''    since = store.get_watermark() or EPOCH
    latest = since
    pages = total = 0
    for page in client.bookings_since(since):
        pages += 1
        if not page:
            continue
        total += store.upsert_bookings(page)
        latest = max(latest, max(b.updated_at for b in page))
    # Only a complete run moves the watermark: if any page fails, the next run redoes everything since
    # the old watermark (the API orders by id, so a partial run's max updated_at can skip bookings).
    if latest > since:
        store.set_watermark(latest)
    log.info("sync done pages=%d bookings=%d watermark=%s", pages, total, latest.isoformat())
    return SyncResult(pages, total, since, latest)
'''),
          text="The new test caught my mistake: the `finally` wrote the watermark even when the API failed midway, "
               "which is exactly what you said must not happen. The write belongs after the loop, on success only.",
          thinking="finally runs on exceptions too. Must be a plain statement after the loop. Also document why.")
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=0.86, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("uv run ruff check", "All checks passed!\n"))
    # the state of the fix alone, committed separately at the end
    fix_state = {p: s.fs[p] for p in ("src/harbor_sync/client.py", "src/harbor_sync/sync.py", "tests/test_client.py",
                                      "tests/test_sync.py")}
    s.say("Both fixed, tests green (34 unit tests; ruff clean):\n\n"
          "- `client.py`: reads `next_cursor`, so runs follow all pages.\n"
          "- `sync.py`: the watermark is computed over all pages and written once, only after the last page. "
          "A failure midway leaves it where it was, so the next run redoes everything.\n"
          "- Tests: `test_follows_next_cursor`, `test_watermark_written_once_after_all_pages`, "
          "`test_failed_run_keeps_old_watermark` (it caught my first version, which wrote the watermark in a "
          "`finally`).\n\n"
          "Still open: recovering the bookings that were skipped since the v2 move; that needs a re-sync from a "
          "date, which the CLI can't do yet.")

    # ------------------------------------------------------------------ 3. the token
    s.user("Next: the partner rotates tokens quarterly now (see the docs). Make the token configurable via "
           "HARBOR_API_TOKEN, and fail clearly at startup if it's missing. HARBOR_API_BASE_URL too, so I can point "
           "it at their sandbox.")
    config_v2 = '''"""Settings for harbor-sync, read from HARBOR_* environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

API_BASE_URL = "https://api.quayline.example/v2"
DEFAULT_MARINA = "mar_kiel_sporthafen"
DEFAULT_DATABASE_URL = "postgresql://harbor@localhost:5432/harbor"


class ConfigError(RuntimeError):
    """A setting is missing or malformed; the message says which one."""


@dataclass(frozen=True)
class Settings:
    api_token: str
    api_base_url: str = API_BASE_URL
    marina_id: str = DEFAULT_MARINA
    page_size: int = 100
    database_url: str = DEFAULT_DATABASE_URL
    timeout_seconds: float = 20.0


def load_settings(env: Mapping[str, str] = os.environ) -> Settings:
    token = env.get("HARBOR_API_TOKEN", "").strip()
    if not token:
        raise ConfigError("HARBOR_API_TOKEN is not set (the Quayline partner token; see .env.example)")
    try:
        page_size = int(env.get("HARBOR_PAGE_SIZE", "100"))
    except ValueError:
        raise ConfigError(f"HARBOR_PAGE_SIZE must be a number, got {env['HARBOR_PAGE_SIZE']!r}") from None
    return Settings(
        api_token=token,
        api_base_url=env.get("HARBOR_API_BASE_URL", API_BASE_URL).rstrip("/"),
        marina_id=env.get("HARBOR_MARINA_ID", DEFAULT_MARINA),
        page_size=page_size,
        database_url=env.get("HARBOR_DATABASE_URL", DEFAULT_DATABASE_URL),
    )
'''
    s.act(read("src/harbor_sync/config.py"), bash("grep -rn 'API_TOKEN\\|load_settings\\|Settings(' src tests",
                                                 "src/harbor_sync/config.py:9:API_TOKEN = \"qk_live_4f9a2c7e1b8d6035a9e2\"\n"
                                                 "src/harbor_sync/config.py:17:    api_token: str = API_TOKEN\n"
                                                 "src/harbor_sync/config.py:25:def load_settings() -> Settings:\n"
                                                 "src/harbor_sync/cli.py:11:from harbor_sync.config import load_settings\n"
                                                 "src/harbor_sync/cli.py:29:    settings = load_settings()\n"
                                                 "tests/test_client.py:10:SETTINGS = Settings(api_base_url=\"https://partner.test/v2\", api_token=\"test-token\", marina_id=\"mar_test\")\n"))
    s.act(write("src/harbor_sync/config.py", config_v2),
          edit("src/harbor_sync/cli.py", "from harbor_sync.config import load_settings\n",
               "from harbor_sync.config import ConfigError, load_settings\n"),
          edit("src/harbor_sync/cli.py", "    settings = load_settings()\n",
               "    try:\n        settings = load_settings()\n    except ConfigError as exc:\n"
               "        print(f\"harbor-sync: {exc}\", file=sys.stderr)\n        return 2\n"),
          write("tests/test_config.py", '''import pytest

from harbor_sync.config import API_BASE_URL, ConfigError, load_settings


def test_token_is_required():
    with pytest.raises(ConfigError, match="HARBOR_API_TOKEN"):
        load_settings({})


def test_blank_token_is_missing():
    with pytest.raises(ConfigError):
        load_settings({"HARBOR_API_TOKEN": "   "})


def test_defaults():
    settings = load_settings({"HARBOR_API_TOKEN": "not-a-real-token"})
    assert settings.api_base_url == API_BASE_URL
    assert settings.page_size == 100


def test_sandbox_base_url_without_trailing_slash():
    env = {"HARBOR_API_TOKEN": "not-a-real-token", "HARBOR_API_BASE_URL": "https://sandbox.quayline.example/v2/"}
    assert load_settings(env).api_base_url == "https://sandbox.quayline.example/v2"


def test_bad_page_size():
    with pytest.raises(ConfigError, match="HARBOR_PAGE_SIZE"):
        load_settings({"HARBOR_API_TOKEN": "x", "HARBOR_PAGE_SIZE": "many"})
'''),
          write(".env", "# local runs: `set -a; . ./.env; set +a`\nHARBOR_API_TOKEN=qk_live_4f9a2c7e1b8d6035a9e2\n"
                        "HARBOR_DATABASE_URL=postgresql://harbor@localhost:5432/harbor\n"),
          text="Settings now come from the environment; a missing token stops the CLI with exit code 2 and a clear "
               "message. I'm moving the current token into a `.env` file so your local runs keep working.",
          thinking="Remove the constant; token required; parse page size with a clear error; base URL override. "
                   "Keep local dev working with a .env file.")
    unit_config = ["tests/test_config.py::test_token_is_required", "tests/test_config.py::test_blank_token_is_missing",
                   "tests/test_config.py::test_defaults", "tests/test_config.py::test_sandbox_base_url_without_trailing_slash",
                   "tests/test_config.py::test_bad_page_size"]
    unit = HS_TEST_MODELS_NAMES + unit_client + unit_config + unit_sync
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=0.9, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("git add -A && git status --short",
               "A  .env\nM  src/harbor_sync/cli.py\nM  src/harbor_sync/client.py\nM  src/harbor_sync/config.py\n"
               "M  src/harbor_sync/sync.py\nM  tests/test_client.py\nA  tests/test_config.py\nM  tests/test_sync.py\n"))
    s.user("Stop. Never commit secrets, and that includes .env files. Unstage .env right now, add it to .gitignore, "
           "and don't put the live token into any file in this repo, not even an ignored one; I keep it in pass. "
           "Also: why did you stage everything? I didn't ask for a commit.")
    s.act(bash("git restore --staged .env && rm .env && git status --short",
               "M  src/harbor_sync/cli.py\nM  src/harbor_sync/client.py\nM  src/harbor_sync/config.py\n"
               "M  src/harbor_sync/sync.py\nM  tests/test_client.py\nA  tests/test_config.py\nM  tests/test_sync.py\n",
               files={".env": None}),
          edit(".gitignore", ".ruff_cache/\n", ".ruff_cache/\n.env\n.env.*\n!.env.example\n"),
          write(".env.example", "# Copy to .env (ignored by git) or export these in your shell.\n"
                                "# The partner token lives in pass: `pass show quayline/live`.\n"
                                "HARBOR_API_TOKEN=\nHARBOR_API_BASE_URL=https://api.quayline.example/v2\n"
                                "HARBOR_MARINA_ID=mar_kiel_sporthafen\n"
                                "HARBOR_DATABASE_URL=postgresql://harbor@localhost:5432/harbor\n"),
          text="You're right on both counts, sorry. `.env` is unstaged and deleted, so the token is in no file now. "
               "Staging was a mistake too: I only wanted to show the change list and should have used `git status` "
               "without adding.",
          thinking="Serious mistake: I wrote a live token into a file and staged it. Undo immediately: unstage and "
                   "delete .env, ignore .env*, keep a placeholder-only .env.example. Don't stage anything again "
                   "without being asked. The rest of the changes are staged now; leave them, mention it.")
    s.act(bash("git reset -q && git status --short && grep -rn 'qk_live_' --exclude-dir=.venv --exclude-dir=.git .",
               " M .gitignore\n M src/harbor_sync/cli.py\n M src/harbor_sync/client.py\n M src/harbor_sync/config.py\n"
               " M src/harbor_sync/sync.py\n M tests/test_client.py\n M tests/test_sync.py\n?? .env.example\n"
               "?? tests/test_config.py\n./docs/partner-api.md:6:curl -H \"Authorization: Bearer qk_live_2b81f0c4d7e95a36c1f8\" \\\n"))
    s.say("Done:\n\n- `.env` is gone (never committed), and `.gitignore` now ignores `.env` and `.env.*` except "
          "`.env.example`, which has an empty `HARBOR_API_TOKEN=` and a pointer to `pass show quayline/live`.\n"
          "- I also unstaged everything else (`git reset`); all changes are back to unstaged.\n"
          "- The live token is no longer in any file of the working tree. It is still in git history "
          "(`config.py` since the first commit), so rotating it is the real fix.\n\n"
          "One more hit: `docs/partner-api.md` line 6 has a token in the curl example "
          "(`qk_live_2b81…`). Is that a real one?")
    s.shell("git log -S qk_live_4f9a2c7e1b8d6035a9e2 --oneline --all",
            "9a0b6e3 config: marina id from environment\n2f8e0d3 First version: bookings and berths into Postgres\n")
    s.user("The one in the docs is the old v1 sandbox token, dead since October; leave it for now. The live one has "
           "been in history since the first commit, as you see. Should I rewrite history to get it out?")
    s.say("I wouldn't, as long as you rotate it today:\n\n"
          "- Once rotated, the old token is worthless; what's left in history is harmless.\n"
          "- Rewriting (`git filter-repo --replace-text`) changes every commit hash since `2f8e0d3`. That means a "
          "force-push, and every clone (yours, ops-2's deploy checkout, CI caches) has to be re-cloned or reset. "
          "It also breaks references to commit hashes in tickets and the changelog.\n"
          "- It doesn't help anyway if the repo was ever cloned elsewhere: rotation is the only real fix.\n\n"
          "Rewrite only if the repository is ever going to be made public. Then do it once, with all secrets at once, "
          "right before publishing.",
          thinking="Standard answer: rotate, don't rewrite unless going public. Explain costs of rewrite concretely "
                   "for this repo (deploy checkout on ops-2).")
    s.user("OK. Update the README configuration section for the env vars, then move on.")
    s.act(edit("README.md", '''## Configuration

See `src/harbor_sync/config.py`. The database URL and marina id can be overridden with environment
variables (`HARBOR_DATABASE_URL`, `HARBOR_MARINA_ID`).
''', '''## Configuration

All settings come from environment variables; `.env.example` lists them.

| variable | default | |
|---|---|---|
| `HARBOR_API_TOKEN` | (required) | partner token, rotated quarterly; kept in `pass show quayline/live` |
| `HARBOR_API_BASE_URL` | `https://api.quayline.example/v2` | point at the partner sandbox for tests |
| `HARBOR_MARINA_ID` | `mar_kiel_sporthafen` | |
| `HARBOR_PAGE_SIZE` | `100` | at most 200 |
| `HARBOR_DATABASE_URL` | `postgresql://harbor@localhost:5432/harbor` | |

Never put the token into a file in this repository, `.env` included.
'''))
    s.say("README updated with a table of the variables and the rule that the token never goes into a file here.")
    s.user("While we're at it: with -v, does anything log the token? Check httpx and our own logging.")
    s.act(bash("grep -rn 'Authorization\\|headers' .venv/lib/python3.12/site-packages/httpx/_client.py | head -20; "
               "grep -rn 'trace(' .venv/lib/python3.12/site-packages/httpcore/_sync/http11.py | head -8",
               ".venv/lib/python3.12/site-packages/httpx/_client.py:170:        headers: HeaderTypes | None = None,\n"
               ".venv/lib/python3.12/site-packages/httpx/_client.py:194:        self._headers = Headers(headers)\n"
               ".venv/lib/python3.12/site-packages/httpx/_client.py:262:    def headers(self) -> Headers:\n"
               ".venv/lib/python3.12/site-packages/httpx/_client.py:266:        return self._headers\n"
               ".venv/lib/python3.12/site-packages/httpx/_client.py:476:        if self._auth is not None and \"Authorization\" in headers:\n"
               ".venv/lib/python3.12/site-packages/httpx/_client.py:1019:        logger.info(\n"
               ".venv/lib/python3.12/site-packages/httpx/_client.py:1020:            'HTTP Request: %s %s \"%s %d %s\"',\n"
               ".venv/lib/python3.12/site-packages/httpcore/_sync/http11.py:92:            with Trace(\"send_request_headers\", logger, request, kwargs) as trace:\n"
               ".venv/lib/python3.12/site-packages/httpcore/_sync/http11.py:96:            with Trace(\"send_request_body\", logger, request, kwargs) as trace:\n"
               ".venv/lib/python3.12/site-packages/httpcore/_sync/http11.py:114:            with Trace(\"receive_response_headers\", logger, request, kwargs) as trace:\n"),
          read("src/harbor_sync/client.py", offset=14, limit=12),
          thinking="httpx INFO logs method, URL and status only. httpcore DEBUG traces log event names with the "
                   "request repr (method and URL), not header values. Our own code: PartnerApiError includes "
                   "response.text[:200]; an error body could echo the token. Check the docs for 401 bodies.")
    s.act(bash("grep -n -A3 '401' docs/partner-api.md docs/samples/*.json | head -12",
               "docs/partner-api.md:26:- 401: token invalid or expired. Tokens are rotated every quarter since 2026 (partner mail of 2025-11-20).\n"
               "docs/partner-api.md-27-- 429: rate limit, 120 requests/minute per token; `Retry-After` header in seconds.\n"
               "docs/partner-api.md-28-- 503: maintenance, usually 02:00-02:30 Europe/Berlin; `Retry-After` may be missing.\n"))
    s.say("Mostly safe, with one gap:\n\n"
          "- httpx logs only `HTTP Request: GET <url> \"HTTP/1.1 200 OK\"` at INFO. The token is in a header, not the "
          "URL, so it never appears there.\n"
          "- httpcore's DEBUG traces (`-v`) log event names like `send_request_headers.started` with the request "
          "repr (method and URL), not header values.\n"
          "- **Our own gap:** `PartnerApiError` puts the first 200 characters of the error body into the message, "
          "and the CLI logs it. The docs don't say what a 401 body contains; some APIs echo the rejected token. A "
          "logging filter that masks anything token-shaped would close that, whatever the source.\n\n"
          "Want the filter?")
    s.user("Yes, add the filter. Mask to qk_live_**** so one can still see which kind of token it was.")
    redact_py = '''"""A logging filter that masks partner tokens, whatever logged them."""

from __future__ import annotations

import logging
import re

TOKEN = re.compile(r"\\b(qk_(?:live|test)_)[0-9A-Za-z]{6,}")


def mask(text: str) -> str:
    return TOKEN.sub(r"\\1****", text)


class RedactTokens(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def install(logger: logging.Logger | None = None) -> None:
    """Attach the filter to every handler of ``logger`` (default: the root logger)."""
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(RedactTokens())
'''
    s.act(write("src/harbor_sync/redact.py", redact_py),
          edit("src/harbor_sync/cli.py", '''        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
''', '''        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    redact.install()
'''),
          edit("src/harbor_sync/cli.py", "from harbor_sync.client import PartnerApiError, QuaylineClient\n",
               "from harbor_sync import redact\nfrom harbor_sync.client import PartnerApiError, QuaylineClient\n"),
          write("tests/test_redact.py", '''import logging

from harbor_sync.redact import RedactTokens, mask

# built at runtime: no token-shaped literal in the repository
FAKE = "qk_" + "live_" + "4d0c" + "9e7a1b22f3c8"


def test_mask_keeps_the_kind():
    assert mask(f"invalid token {FAKE}") == "invalid token qk_live_****"


def test_mask_leaves_other_text():
    assert mask("bk_04127 moved to brt_B07") == "bk_04127 moved to brt_B07"


def test_filter_masks_formatted_args(caplog):
    logger = logging.getLogger("test-redact")
    handler = caplog.handler
    handler.addFilter(RedactTokens())
    logger.error("partner API returned 401: %s", f'{{"error": "rejected {FAKE}"}}')
    assert FAKE not in caplog.text
    assert "qk_live_****" in caplog.text
'''))
    unit_redact = ["tests/test_redact.py::test_mask_keeps_the_kind", "tests/test_redact.py::test_mask_leaves_other_text",
                   "tests/test_redact.py::test_filter_masks_formatted_args"]
    unit = HS_TEST_MODELS_NAMES + unit_client + unit_config + unit_redact + unit_sync
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=0.93, deselected=HS_INTEGRATION, rootdir=rootdir))
    s.say("Added `redact.py`: a logging filter installed on the root handler by the CLI that turns any "
          "`qk_live_…`/`qk_test_…` into `qk_live_****`, in the message and in its arguments. The test builds its "
          f"fake token at runtime, so no token-shaped string is in the repo. {len(unit)} unit tests pass.")

    # ------------------------------------------------------------------ 4. retries
    maint = _hs_journal_maintenance(gen)
    s.user("The partner API 503s at night during their maintenance window, and the 02:00 and 02:15 runs fail every "
           "night, which pages whoever is on call. Add retries with exponential backoff and jitter for 429 and 503 "
           "(respect Retry-After when it's there) and for connection errors. No tenacity or any other new "
           "dependency, a small helper is enough. Here's last night:\n\n```\n" + maint + "\n```\n\n"
           "Note the 02:30 run worked and caught up, so the data is fine; it's only the noise.")
    retry_py = '''"""Retries with exponential backoff and full jitter, for the partner API's 429s and night-time 503s."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class RetryPolicy:
    """``attempts`` tries in total; waits ``uniform(0, min(cap, base * 2**n))`` unless told how long."""

    def __init__(self, attempts: int = 6, base: float = 1.0, cap: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.attempts = attempts
        self.base = base
        self.cap = cap
        self.sleep = sleep
        self.rng = rng or random.Random()

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.cap)
        return self.rng.uniform(0.0, min(self.cap, self.base * 2**attempt))

    def call(self, fn: Callable[[], T], retryable: Callable[[Exception], bool],
             retry_after: Callable[[Exception], float | None] = lambda exc: None) -> T:
        for attempt in range(self.attempts):
            try:
                return fn()
            except Exception as exc:
                if attempt == self.attempts - 1 or not retryable(exc):
                    raise
                wait = self.delay(attempt, retry_after(exc))
                log.warning("retry %d/%d in %.1fs after: %s", attempt + 1, self.attempts - 1, wait, exc)
                self.sleep(wait)
        raise AssertionError("unreachable")
'''
    s.act(read("src/harbor_sync/client.py"),
          thinking="Design: RetryPolicy with injectable sleep and rng for tests. Retry on PartnerApiError with status "
                   "429/502/503/504 and httpx.TransportError. Parse Retry-After (seconds form; the HTTP-date form is "
                   "rare, ignore it). 6 attempts with base 1s cap 60s gives at most ~63s of waiting: it won't bridge "
                   "a 30-minute maintenance window, but it will absorb the short blips. The 02:00 runs will still fail; "
                   "say so honestly and propose quieter alerting or skipping the window.")
    s.act(bash("grep -n '^class .*Error\\|^class .*Exception\\|^class .*Timeout' "
               ".venv/lib/python3.12/site-packages/httpx/_exceptions.py",
               "75:class HTTPError(Exception):\n101:class RequestError(HTTPError):\n116:class TransportError(RequestError):\n"
               "125:class TimeoutException(TransportError):\n133:class ConnectTimeout(TimeoutException):\n"
               "139:class ReadTimeout(TimeoutException):\n145:class WriteTimeout(TimeoutException):\n"
               "151:class PoolTimeout(TimeoutException):\n160:class NetworkError(TransportError):\n"
               "168:class ReadError(NetworkError):\n174:class WriteError(NetworkError):\n180:class ConnectError(NetworkError):\n"
               "186:class CloseError(NetworkError):\n195:class ProxyError(TransportError):\n"
               "201:class UnsupportedProtocol(TransportError):\n207:class ProtocolError(TransportError):\n"
               "215:class LocalProtocolError(ProtocolError):\n227:class RemoteProtocolError(ProtocolError):\n"
               "238:class DecodingError(RequestError):\n244:class TooManyRedirects(RequestError):\n"
               "253:class HTTPStatusError(HTTPError):\n275:class InvalidURL(Exception):\n"
               "283:class CookieConflict(Exception):\n"),
          text="Checking httpx's exception hierarchy to pick what counts as a connection problem:")
    s.act(write("src/harbor_sync/retry.py", retry_py),
          edit("src/harbor_sync/client.py", '''class PartnerApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"partner API returned {status}: {message}")
        self.status = status
''', '''RETRY_STATUSES = frozenset({429, 502, 503, 504})


class PartnerApiError(RuntimeError):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"partner API returned {status}: {message}")
        self.status = status
        self.retry_after = retry_after


def _retryable(exc: Exception) -> bool:
    if isinstance(exc, PartnerApiError):
        return exc.status in RETRY_STATUSES
    return isinstance(exc, httpx.TransportError)  # connection refused, reset, timeouts


def _retry_after(exc: Exception) -> float | None:
    return exc.retry_after if isinstance(exc, PartnerApiError) else None


def _parse_retry_after(value: str | None) -> float | None:
    """Seconds form only; the HTTP-date form is treated as absent."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
'''),
          edit("src/harbor_sync/client.py", '''    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None) -> None:
        self.settings = settings
''', '''    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None,
                 retry: RetryPolicy | None = None) -> None:
        self.settings = settings
        self.retry = retry or RetryPolicy()
'''),
          edit("src/harbor_sync/client.py", '''    def _get(self, path: str, params: dict | None = None) -> dict:
        response = self.http.get(path, params=params)
        if response.status_code >= 400:
            raise PartnerApiError(response.status_code, response.text[:200])
        return response.json()
''', '''    def _get(self, path: str, params: dict | None = None) -> dict:
        def attempt() -> dict:
            response = self.http.get(path, params=params)
            if response.status_code >= 400:
                raise PartnerApiError(response.status_code, response.text[:200],
                                      _parse_retry_after(response.headers.get("Retry-After")))
            return response.json()

        return self.retry.call(attempt, _retryable, _retry_after)
'''),
          edit("src/harbor_sync/client.py", "from harbor_sync.models import Berth, Booking\n",
               "from harbor_sync.models import Berth, Booking\nfrom harbor_sync.retry import RetryPolicy\n"))
    retry_tests = '''import random

import httpx
import pytest

from harbor_sync.client import PartnerApiError, QuaylineClient
from harbor_sync.config import Settings
from harbor_sync.retry import RetryPolicy

SETTINGS = Settings(api_token="test-token", api_base_url="https://partner.test/v2", marina_id="mar_test")


def policy(sleeps, attempts=4):
    return RetryPolicy(attempts=attempts, base=1.0, cap=8.0, sleep=sleeps.append, rng=random.Random(7))


def client(responses, sleeps, attempts=4):
    replies = iter(responses)

    def handler(request):
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return QuaylineClient(SETTINGS, transport=httpx.MockTransport(handler), retry=policy(sleeps, attempts))


def test_503_then_success():
    sleeps = []
    c = client([httpx.Response(503), httpx.Response(503), httpx.Response(200, json={"data": []})], sleeps)
    assert c.berths() == []
    assert sleeps == [1.0, 2.0]


def test_retry_after_is_respected():
    sleeps = []
    c = client([httpx.Response(429, headers={"Retry-After": "3"}), httpx.Response(200, json={"data": []})], sleeps)
    c.berths()
    assert sleeps == [3.0]


def test_connection_errors_are_retried():
    sleeps = []
    c = client([httpx.ConnectError("refused"), httpx.Response(200, json={"data": []})], sleeps)
    assert c.berths() == []
    assert len(sleeps) == 1


def test_401_is_not_retried():
    sleeps = []
    with pytest.raises(PartnerApiError) as info:
        client([httpx.Response(401, text="invalid token")], sleeps).berths()
    assert info.value.status == 401
    assert sleeps == []


def test_gives_up_after_attempts():
    sleeps = []
    with pytest.raises(PartnerApiError):
        client([httpx.Response(503)] * 4, sleeps).berths()
    assert len(sleeps) == 3
'''
    s.act(write("tests/test_retry.py", retry_tests),
          text="Tests use a fake `sleep` that records the waits, and a seeded random generator.")
    unit_retry = ["tests/test_retry.py::test_503_then_success", "tests/test_retry.py::test_retry_after_is_respected",
                  "tests/test_retry.py::test_connection_errors_are_retried", "tests/test_retry.py::test_401_is_not_retried",
                  "tests/test_retry.py::test_gives_up_after_attempts"]
    unit = HS_TEST_MODELS_NAMES + unit_client + unit_config + unit_redact + unit_retry + unit_sync
    jitter_tb = '''    def test_503_then_success():
        sleeps = []
        c = client([httpx.Response(503), httpx.Response(503), httpx.Response(200, json={"data": []})], sleeps)
        assert c.berths() == []
>       assert sleeps == [1.0, 2.0]
E       assert [0.32383276483316237, 0.30189428211648846] == [1.0, 2.0]
E         
E         At index 0 diff: 0.32383276483316237 != 1.0
E         Use -v to get more diff

tests/test_retry.py:33: AssertionError'''
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, failures={unit_retry[0]: jitter_tb},
                     seconds=0.97, deselected=HS_INTEGRATION, rootdir=rootdir))
    s.act(edit("tests/test_retry.py", '''    assert c.berths() == []
    assert sleeps == [1.0, 2.0]
''', '''    assert c.berths() == []
    # full jitter: each wait is uniform in [0, base * 2**attempt]
    assert len(sleeps) == 2
    assert 0 <= sleeps[0] <= 1.0 and 0 <= sleeps[1] <= 2.0


def test_delays_are_capped():
    p = RetryPolicy(base=1.0, cap=8.0, rng=random.Random(1))
    assert all(0 <= p.delay(attempt) <= 8.0 for attempt in range(20))
'''),
          text="My test expected the un-jittered delays; with full jitter only the bounds are fixed. I'll check the "
               "bounds, plus a separate test that the cap holds.")
    unit_retry = unit_retry[:1] + ["tests/test_retry.py::test_delays_are_capped"] + unit_retry[1:]
    unit = HS_TEST_MODELS_NAMES + unit_client + unit_config + unit_redact + unit_retry + unit_sync
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=0.95, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("uv run ruff check", "All checks passed!\n"))
    s.say("Retries are in, no new dependency:\n\n"
          "- `retry.py`: `RetryPolicy` (6 attempts, exponential backoff with full jitter, 1 s base, 60 s cap; sleep "
          "and random generator injectable for tests).\n"
          "- `client.py`: every GET goes through the policy. Retried: 429, 502, 503, 504 and connection errors "
          "(`httpx.TransportError`). `Retry-After` in seconds is honoured (capped at 60 s). 401 and other 4xx fail "
          "at once.\n"
          f"- 6 new tests; {len(unit)} unit tests pass.\n\n"
          "An honest caveat: at most about a minute of waiting per request won't bridge a 30-minute maintenance "
          "window. The 02:00 and 02:15 runs will still fail on a long outage, just less often on short blips. If the "
          "goal is no pages at night, the cleaner fix is to have the timer skip 02:00-02:30 (`OnCalendar` with two "
          "ranges) or to make the alert fire only after two failed runs in a row.")
    s.user("What about Retry-After as an HTTP date? Their docs only promise seconds, but I think their nginx sends a "
           "date on 503s during maintenance.")
    s.say("Right now a date is treated as \"no Retry-After\" and we fall back to the jittered backoff, so nothing "
          "breaks; we just might retry sooner than they asked. Parsing the date form is cheap with the standard "
          "library (`email.utils.parsedate_to_datetime`), and the wait is then `date - now`, clamped to [0, 60 s]. "
          "Shall I add it?",
          thinking="RFC 9110 allows Retry-After as delay-seconds or HTTP-date. parsedate_to_datetime handles the "
                   "IMF-fixdate. Need 'now' injectable for the test; compute against datetime.now(UTC).")
    s.user("Yes, add it.")
    s.act(edit("src/harbor_sync/client.py", '''def _parse_retry_after(value: str | None) -> float | None:
    """Seconds form only; the HTTP-date form is treated as absent."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
''', '''def _parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds or as an HTTP date (RFC 9110); None if absent or unreadable."""
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)
'''),
          edit("src/harbor_sync/client.py", "from datetime import datetime\n",
               "from datetime import UTC, datetime\nfrom email.utils import parsedate_to_datetime\n"),
          edit("tests/test_retry.py", "from harbor_sync.client import PartnerApiError, QuaylineClient\n",
               "from datetime import UTC, datetime\n\nfrom harbor_sync.client import PartnerApiError, QuaylineClient, _parse_retry_after\n"),
          edit("tests/test_retry.py", "def test_connection_errors_are_retried():\n", '''@pytest.mark.parametrize("value,expected", [
    ("7", 7.0), ("0", 0.0), ("-3", 0.0), ("soon", None), (None, None),
    ("Wed, 04 Feb 2026 02:10:30 GMT", 30.0),   # 30 s after NOW
    ("Wed, 04 Feb 2026 02:09:00 GMT", 0.0),    # already past
])
def test_parse_retry_after(value, expected):
    now = datetime(2026, 2, 4, 2, 10, tzinfo=UTC)
    assert _parse_retry_after(value, now) == expected


def test_connection_errors_are_retried():
'''))
    retry_after_ids = ["7-7.0", "0-0.0", "-3-0.0", "soon-None", "None-None",
                       "Wed, 04 Feb 2026 02:10:30 GMT-30.0", "Wed, 04 Feb 2026 02:09:00 GMT-0.0"]
    unit_retry = unit_retry[:3] + [f"tests/test_retry.py::test_parse_retry_after[{i}]" for i in retry_after_ids] + unit_retry[3:]
    unit = HS_TEST_MODELS_NAMES + unit_client + unit_config + unit_redact + unit_retry + unit_sync
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=0.99, deselected=HS_INTEGRATION, rootdir=rootdir))
    s.say(f"`Retry-After` now also accepts an HTTP date (wait = date - now, never negative), still capped by the "
          f"policy's 60 s. Seven parametrized cases cover seconds, negatives, garbage and both date directions; "
          f"{len(unit)} unit tests pass.")
    s.user("I'll change the timer myself. Run the whole suite once, verbose, I want to see everything.")
    s.act(bash("uv run pytest -v", "============================= test session starts ==============================\n"
               "platform linux -- Python 3.12.7, pytest-8.3.4, pluggy-1.5.0 -- /home/dana/src/harbor-sync/.venv/bin/python\n"
               f"cachedir: .pytest_cache\nrootdir: {rootdir}\nconfigfile: pyproject.toml\n"
               f"collected {len(unit) + HS_INTEGRATION} items\n\n"
               + "".join(f"{t} PASSED".ljust(72) + f" [{int(100 * (i + 1) / (len(unit) + HS_INTEGRATION)):>3}%]\n"
                         for i, t in enumerate(HS_TEST_MODELS_NAMES + unit_client + unit_config + unit_redact + unit_retry))
               + "tests/test_store.py::test_migrate_is_idempotent ", aborted=True),
          thinking="The user asked for the whole suite, verbose. That includes the integration tests.")
    s.user("Don't run the integration tests")
    s.aborted()
    s.user("Don't run the integration tests: they need the VPN to the staging database and just hang without it. "
           "Unit tests only, -m \"not integration\", from now on.")
    s.act(run_pytest('uv run pytest -v -m "not integration"', unit, verbose=True, seconds=1.02,
                     deselected=HS_INTEGRATION, rootdir=rootdir),
          text="Sorry, noted: unit tests only from now on.")
    s.say(f"All {len(unit)} unit tests pass ({HS_INTEGRATION} integration tests deselected). I won't run the "
          "integration tests again; they need the VPN to the staging database.")

    # ------------------------------------------------------------------ /compact, then a bigger model
    s.compaction(
        "## Goal\nMaintain harbor-sync (mirrors Quayline partner API bookings into Postgres): fix the lost-bookings "
        "bug, make the token configurable, add retries; next a backfill command to recover skipped bookings.\n\n"
        "## Constraints & Preferences\n"
        "- Never commit secrets, and never write the live token into any file of the repo (not even an ignored "
        "`.env`); the token lives in `pass show quayline/live`.\n"
        "- Don't stage or commit unless asked.\n"
        "- No new dependencies (no tenacity); small helpers instead.\n"
        "- Tests: unit only, `uv run pytest -m \"not integration\"`. Integration tests need the VPN to the staging "
        "database and hang without it: never run them.\n"
        "- The watermark may only move at the end of a complete, successful run; a failed run must leave it, so the "
        "next run redoes everything since the old watermark (upserts are idempotent).\n\n"
        "## Progress\n### Done\n"
        "- [x] `client.py` reads `next_cursor` (was `cursor`, so every run stopped after page 1 since the v2 move, "
        "commit 71e4d9a)\n"
        "- [x] `sync.py` writes the watermark once after all pages (the API orders by booking id, so a per-page "
        "watermark skipped bookings such as bk_04127)\n"
        "- [x] `config.py`: settings from `HARBOR_*` env vars, `ConfigError` if `HARBOR_API_TOKEN` is missing; "
        "CLI exits 2; `.env.example`, `.gitignore` ignores `.env*`; README configuration table\n"
        "- [x] `retry.py` `RetryPolicy` (6 attempts, full jitter, 1 s base, 60 s cap) used by every client GET; "
        "retries 429/502/503/504 and `httpx.TransportError`, honours `Retry-After` (seconds or HTTP date)\n"
        f"- [x] `redact.py`: logging filter masks token-shaped strings (`qk_live_****`)\n"
        f"- [x] {len(unit)} unit tests pass, ruff clean\n\n"
        "### In Progress\n- [ ] (none)\n\n### Blocked\n- (none)\n\n"
        "## Key Decisions\n"
        "- **No history rewrite**: the live token is in git history since 2f8e0d3; the user rotates it today instead.\n"
        "- **docs/partner-api.md token** (qk_live_2b81…) is a dead v1 sandbox token; left as is for now.\n"
        "- **Night-time 503s**: retries absorb blips only; the user changes the systemd timer to skip 02:00-02:30.\n\n"
        "## Next Steps\n1. Backfill command to recover bookings skipped since the v2 move.\n\n"
        "## Critical Context\n"
        "- Nothing is committed yet; all changes are unstaged.\n"
        "- Partner API: `updated_since` is inclusive; results ordered by id; `next_cursor` expires after 10 minutes.",
        read_files=["README.md", "pyproject.toml", "docs/partner-api.md", "src/harbor_sync/models.py",
                    "src/harbor_sync/store.py", "tests/conftest.py", "src/harbor_sync/config.py",
                    "src/harbor_sync/client.py", "src/harbor_sync/sync.py", "src/harbor_sync/cli.py",
                    "tests/test_sync.py", "tests/test_client.py"],
        modified_files=["src/harbor_sync/client.py", "src/harbor_sync/sync.py", "src/harbor_sync/config.py",
                        "src/harbor_sync/cli.py", "src/harbor_sync/retry.py", "tests/test_sync.py",
                        "tests/test_client.py", "tests/test_config.py", "tests/test_retry.py", ".gitignore",
                        ".env.example", "README.md"])
    assert s.by_id[s.entries[-1]["firstKeptEntryId"]]["message"]["role"] == "user", "cut point moved off a user message"
    s.set_model("anthropic", "claude-opus-4-5")
    s.set_thinking("high")

    # ------------------------------------------------------------------ 5. backfill
    s.user("Now the recovery: `harbor-sync backfill --since 2025-08-18` re-fetches everything changed since a "
           "date and upserts it, without touching the watermark. It must be safe to run while the timer's runs "
           "happen, because the first one will take a while.")
    s.act(read("src/harbor_sync/sync.py"), read("src/harbor_sync/cli.py"), read("src/harbor_sync/store.py"),
          thinking="After the compaction I need the current code again. Backfill: same paging as run_sync, no "
                   "watermark read or write. Concurrency with the timer: both only upsert, and the upsert has "
                   "WHERE bookings.updated_at <= excluded.updated_at, so an older copy fetched by the backfill can "
                   "never overwrite a newer one written by a sync run. Need the CLI subcommand with a UTC date.")
    s.act(edit("src/harbor_sync/sync.py", '''    if not page:
            continue
        total += store.upsert_bookings(page)
        watermark = max(b.updated_at for b in page)
        store.set_watermark(watermark)
''', '''    if not page:
            continue
        total += store.upsert_bookings(page)
        latest = max(latest, max(b.updated_at for b in page))
''', fails=True),
          text="The backfill goes next to `run_sync` in `sync.py`.")
    s.act(read("src/harbor_sync/sync.py", offset=19, limit=40),
          text="My edit used text that no longer exists (I worked from the pre-fix version). Re-reading the function:")
    backfill_fn = '''

def run_backfill(client, store, since: datetime) -> SyncResult:
    """Re-fetch every booking changed since ``since`` and upsert it; the watermark is not touched.

    Safe next to the timer's runs: both only upsert, and an upsert never replaces a newer version of
    a booking (``WHERE bookings.updated_at <= excluded.updated_at`` in store.py).
    """
    latest = since
    pages = total = 0
    for page in client.bookings_since(since):
        pages += 1
        if not page:
            continue
        total += store.upsert_bookings(page)
        latest = max(latest, max(b.updated_at for b in page))
        log.info("backfill page=%d bookings=%d so_far=%d", pages, len(page), total)
    log.info("backfill done since=%s pages=%d bookings=%d", since.isoformat(), pages, total)
    return SyncResult(pages, total, since, latest)
'''
    s.act(edit("src/harbor_sync/sync.py", '''    return SyncResult(pages, total, since, latest)
''', '''    return SyncResult(pages, total, since, latest)
''' + backfill_fn),
          edit("src/harbor_sync/cli.py", "from harbor_sync.sync import refresh_berths, run_sync\n",
               "from harbor_sync.sync import refresh_berths, run_backfill, run_sync\n"),
          edit("src/harbor_sync/cli.py", '''    sub.add_parser("migrate", help="create or update the database schema")
''', '''    sub.add_parser("migrate", help="create or update the database schema")
    p_backfill = sub.add_parser("backfill", help="re-fetch all bookings changed since a date; the watermark is left alone")
    p_backfill.add_argument("--since", required=True, type=datetime.fromisoformat, help="YYYY-MM-DD")
'''),
          edit("src/harbor_sync/cli.py", '''        elif args.command == "berths":
            refresh_berths(client, store)
''', '''        elif args.command == "berths":
            refresh_berths(client, store)
        elif args.command == "backfill":
            run_backfill(client, store, args.since)
'''),
          edit("src/harbor_sync/cli.py", "import argparse\nimport logging\nimport sys\n",
               "import argparse\nimport logging\nimport sys\nfrom datetime import datetime\n"))
    cli_test = '''from datetime import UTC, datetime

import pytest

from conftest import FakeClient, MemoryStore, make_booking
from harbor_sync import cli
from harbor_sync.config import Settings
from harbor_sync.sync import run_backfill


@pytest.fixture
def wired(monkeypatch):
    """cli.main with fakes instead of the partner API and Postgres."""
    client = FakeClient([[make_booking(1), make_booking(2)], [make_booking(3)]])
    store = MemoryStore(watermark=datetime(2026, 2, 1, tzinfo=UTC))
    client.close = lambda: None
    store.close = lambda: None
    monkeypatch.setattr(cli, "load_settings", lambda: Settings(api_token="not-a-real-token"))
    monkeypatch.setattr(cli, "QuaylineClient", lambda settings: client)
    monkeypatch.setattr(cli, "Store", lambda dsn: store)
    return client, store


def test_backfill_uses_since_and_keeps_watermark(wired):
    client, store = wired
    assert cli.main(["backfill", "--since", "2025-08-18"]) == 0
    assert client.calls == [datetime(2025, 8, 18, tzinfo=UTC)]
    assert sorted(store.bookings) == ["bk_00001", "bk_00002", "bk_00003"]
    assert store.watermark_writes == []


def test_backfill_rejects_bad_date(wired, capsys):
    with pytest.raises(SystemExit):
        cli.main(["backfill", "--since", "18.08.2025"])
    assert "invalid" in capsys.readouterr().err


def test_missing_token_exits_2(monkeypatch, capsys):
    monkeypatch.delenv("HARBOR_API_TOKEN", raising=False)
    assert cli.main(["run"]) == 2
    assert "HARBOR_API_TOKEN is not set" in capsys.readouterr().err
'''
    s.act(write("tests/test_cli.py", cli_test),
          edit("tests/test_sync.py", "from harbor_sync.sync import EPOCH, run_sync\n",
               "from harbor_sync.sync import EPOCH, run_backfill, run_sync\n"),
          edit("tests/test_sync.py", "def test_bookings_are_upserted(store):\n", '''def test_backfill_ignores_watermark():
    start = datetime(2026, 2, 1, tzinfo=UTC)
    store = MemoryStore(watermark=start)
    client = FakeClient([[make_booking(1)], [make_booking(2)]])
    result = run_backfill(client, store, datetime(2025, 8, 18, tzinfo=UTC))
    assert client.calls == [datetime(2025, 8, 18, tzinfo=UTC)]
    assert (result.pages, result.bookings) == (2, 2)
    assert store.watermark == start and store.watermark_writes == []


def test_bookings_are_upserted(store):
'''),
          text="Tests: the backfill passes `--since` through as an aware UTC datetime and never writes the watermark; "
               "the CLI test wires fakes in place of the API and Postgres.")
    unit_cli = ["tests/test_cli.py::test_backfill_uses_since_and_keeps_watermark",
                "tests/test_cli.py::test_backfill_rejects_bad_date", "tests/test_cli.py::test_missing_token_exits_2"]
    unit_sync2 = unit_sync[:5] + ["tests/test_sync.py::test_backfill_ignores_watermark"] + unit_sync[5:]
    unit = HS_TEST_MODELS_NAMES + unit_cli + unit_client + unit_config + unit_redact + unit_retry + unit_sync2
    naive_tb = '''wired = (<conftest.FakeClient object at 0x7f21c04b5d90>, <conftest.MemoryStore object at 0x7f21c04b6e10>)

    def test_backfill_uses_since_and_keeps_watermark(wired):
        client, store = wired
        assert cli.main(["backfill", "--since", "2025-08-18"]) == 0
>       assert client.calls == [datetime(2025, 8, 18, tzinfo=UTC)]
E       AssertionError: assert [datetime.datetime(2025, 8, 18, 0, 0)] == [datetime.datetime(2025, 8, 18, 0, 0, tzinfo=datetime.timezone.utc)]
E         
E         At index 0 diff: datetime.datetime(2025, 8, 18, 0, 0) != datetime.datetime(2025, 8, 18, 0, 0, tzinfo=datetime.timezone.utc)
E         Use -v to get more diff

tests/test_cli.py:27: AssertionError'''
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, failures={unit_cli[0]: naive_tb},
                     seconds=1.08, deselected=HS_INTEGRATION, rootdir=rootdir))
    s.act(edit("src/harbor_sync/cli.py", '''    p_backfill.add_argument("--since", required=True, type=datetime.fromisoformat, help="YYYY-MM-DD")
''', '''    p_backfill.add_argument("--since", required=True, type=_utc_date, help="YYYY-MM-DD (midnight UTC)")
'''),
          edit("src/harbor_sync/cli.py", '''def main(argv: list[str] | None = None) -> int:
''', '''def _utc_date(text: str) -> datetime:
    """argparse type: a calendar date as midnight UTC (the partner compares aware timestamps)."""
    try:
        return datetime.combine(date.fromisoformat(text), time.min, tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid date {text!r}, expected YYYY-MM-DD") from None


def main(argv: list[str] | None = None) -> int:
'''),
          edit("src/harbor_sync/cli.py", "from datetime import datetime\n", "from datetime import UTC, date, datetime, time\n"),
          text="`datetime.fromisoformat(\"2025-08-18\")` is naive; sent to the API it would lack the offset, and "
               "compared with aware timestamps it raises. A small argparse type makes it midnight UTC and gives a "
               "proper error for other formats.",
          thinking="Naive datetime from fromisoformat. Use date.fromisoformat + combine with UTC. ArgumentTypeError "
                   "makes argparse print 'invalid _utc_date value'? No: with ArgumentTypeError argparse prints the "
                   "message itself: 'argument --since: invalid date ...'. The test checks 'invalid' in stderr, fine.")
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.04, deselected=HS_INTEGRATION, rootdir=rootdir))
    s.say("`harbor-sync backfill --since 2025-08-18` is in:\n\n"
          "- `sync.run_backfill` pages through everything changed since the date and upserts it; it neither reads "
          "nor writes the watermark.\n"
          "- Safe alongside the timer: both only upsert, and the upsert's `WHERE bookings.updated_at <= "
          "excluded.updated_at` means an older copy from the backfill never overwrites a newer one from a sync run.\n"
          "- `--since` is a date, taken as midnight UTC; anything else is rejected by argparse.\n"
          f"- 4 new tests (3 CLI, 1 sync); {len(unit)} unit tests pass.\n\n"
          "Since 2025-08-18 that's roughly 25,000 bookings, 250 pages at 100 per page; with 120 requests per minute "
          "allowed it takes a few minutes, mostly Postgres time.")
    s.user("Try it against the partner sandbox first, with a --dry-run that only prints what it would upsert.")
    s.act(edit("src/harbor_sync/sync.py", '''def run_backfill(client, store, since: datetime) -> SyncResult:''',
               '''def run_backfill(client, store, since: datetime, dry_run: bool = False, out=print) -> SyncResult:'''),
          edit("src/harbor_sync/sync.py", '''        if not page:
            continue
        total += store.upsert_bookings(page)
        latest = max(latest, max(b.updated_at for b in page))
        log.info("backfill page=%d bookings=%d so_far=%d", pages, len(page), total)''', '''        if not page:
            continue
        if dry_run:
            for b in page:
                out(f"would upsert {b.id} berth={b.berth_id} {b.arrival}..{b.departure} {b.status:<11} "
                    f"{b.vessel_name!r}")
            total += len(page)
        else:
            total += store.upsert_bookings(page)
        latest = max(latest, max(b.updated_at for b in page))
        log.info("backfill page=%d bookings=%d so_far=%d dry_run=%s", pages, len(page), total, dry_run)'''),
          edit("src/harbor_sync/cli.py", '''    p_backfill.add_argument("--since", required=True, type=_utc_date, help="YYYY-MM-DD (midnight UTC)")
''', '''    p_backfill.add_argument("--since", required=True, type=_utc_date, help="YYYY-MM-DD (midnight UTC)")
    p_backfill.add_argument("--dry-run", action="store_true", help="print what would be upserted, write nothing")
'''),
          edit("src/harbor_sync/cli.py", '''            run_backfill(client, store, args.since)
''', '''            run_backfill(client, store, args.since, dry_run=args.dry_run)
'''),
          edit("tests/test_sync.py", "def test_bookings_are_upserted(store):\n", '''def test_backfill_dry_run_writes_nothing(store):
    lines = []
    result = run_backfill(FakeClient([[make_booking(4)]]), store, datetime(2025, 8, 18, tzinfo=UTC),
                          dry_run=True, out=lines.append)
    assert result.bookings == 1 and store.bookings == {}
    assert lines == ["would upsert bk_00004 berth=brt_004 2025-12-01..2025-12-03 confirmed   'Testboot 4'"]


def test_bookings_are_upserted(store):
'''))
    unit_sync2 = unit_sync2[:6] + ["tests/test_sync.py::test_backfill_dry_run_writes_nothing"] + unit_sync2[6:]
    unit = HS_TEST_MODELS_NAMES + unit_cli + unit_client + unit_config + unit_redact + unit_retry + unit_sync2
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.01, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("HARBOR_API_BASE_URL=https://sandbox.quayline.example/v2 uv run harbor-sync backfill --since 2025-12-01 --dry-run",
               "harbor-sync: HARBOR_API_TOKEN is not set (the Quayline partner token; see .env.example)\n", code=2))
    s.say("`--dry-run` is in (and tested); it prints one line per booking and writes nothing, not even through the "
          "store.\n\nI can't run it against the sandbox myself: there's no token in my environment, which is how it "
          "should be. With the sandbox token from pass:\n\n"
          "```sh\nHARBOR_API_TOKEN=$(pass show quayline/sandbox) HARBOR_API_BASE_URL=https://sandbox.quayline.example/v2 \\\n"
          "  uv run harbor-sync backfill --since 2025-12-01 --dry-run\n```",
          thinking="No token in the environment, correct. Don't ask the user to paste the token; tell them to run "
                   "it with pass.")
    dry = _hs_booking_lines(gen, 412, 3980)
    s.wait_until("2026-02-03T10:01:48")
    s.shell("HARBOR_API_TOKEN=$(pass show quayline/sandbox) HARBOR_API_BASE_URL=https://sandbox.quayline.example/v2 "
            "uv run harbor-sync backfill --since 2025-12-01 --dry-run",
            "\n".join(dry[:200]) + "\n2026-02-03 11:02:17,604 INFO harbor_sync.sync backfill page=2 bookings=200 "
            "so_far=400 dry_run=True\n" + "\n".join(dry[200:]) +
            "\n2026-02-03 11:02:18,311 INFO harbor_sync.sync backfill page=3 bookings=12 so_far=412 dry_run=True\n"
            "2026-02-03 11:02:18,312 INFO harbor_sync.sync backfill done since=2025-12-01T00:00:00+00:00 pages=3 "
            "bookings=412\n")
    s.user("Looks right: 412 sandbox bookings in 3 pages. Interesting that it used pages of 200, I have "
           "HARBOR_PAGE_SIZE=200 in my shell. I'll run the real one against production myself later.")
    s.say("Yes, page size 200 comes from your shell (the API's maximum). For the real run: the production backfill "
          "since 2025-08-18 will be about 125 pages at that size. Check afterwards with\n\n"
          "```sql\nSELECT count(*) FROM bookings WHERE synced_at > now() - interval '1 hour';\n```\n\n"
          "and whether `bk_04127` is there with the new berth.")

    # ------------------------------------------------------------------ 6. a secret scan before commits
    s.user("Add a pre-commit check that blocks anything that looks like a partner token (qk_live_ or qk_test_ "
           "followed by 16 or more hex chars) or a private key block. A small script in scripts/, run by a local "
           "pre-commit hook. No gitleaks.")
    scan_py = '''#!/usr/bin/env python3
"""Refuse commits that contain partner tokens or private keys (pre-commit passes the staged files)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

PATTERNS = {
    "Quayline token": re.compile(r"\\bqk_(?:live|test)_[0-9a-f]{16,}"),
    "private key": re.compile(r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----"),
}


def scan_text(text: str) -> list[tuple[int, str]]:
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        hits.extend((number, name) for name, pattern in PATTERNS.items() if pattern.search(line))
    return hits


def scan_file(path: Path) -> list[tuple[int, str]]:
    try:
        return scan_text(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
        return []  # binary, deleted or not a file: nothing to check


def main(argv: list[str]) -> int:
    found = 0
    for arg in argv:
        for number, name in scan_file(Path(arg)):
            print(f"{arg}:{number}: looks like a {name}")
            found += 1
    if found:
        print(f"check_secrets: {found} possible secret(s), commit refused. Use a placeholder such as "
              "qk_live_<your-token>.", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''
    scan_test_v1 = '''import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_secrets.py"
spec = importlib.util.spec_from_file_location("check_secrets", SCRIPT)
check_secrets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_secrets)


def test_live_token_is_found():
    assert check_secrets.scan_text("token = 'qk_live_0123456789abcdef0123'") == [(1, "Quayline token")]


def test_test_token_is_found():
    assert check_secrets.scan_text("x\\nBearer qk_test_fedcba9876543210") == [(2, "Quayline token")]


def test_placeholder_passes():
    assert check_secrets.scan_text("Authorization: Bearer qk_live_<your-token>") == []


def test_private_key_is_found():
    assert check_secrets.scan_text("-----BEGIN OPENSSH PRIVATE KEY-----") == [(1, "private key")]


def test_main_exit_codes(tmp_path, capsys):
    clean = tmp_path / "clean.txt"
    clean.write_text("nothing here")
    assert check_secrets.main([str(clean)]) == 0
    dirty = tmp_path / "dirty.txt"
    dirty.write_text("qk_live_0123456789abcdef0123")
    assert check_secrets.main([str(clean), str(dirty)]) == 1
    assert "dirty.txt:1: looks like a Quayline token" in capsys.readouterr().out
'''
    hook = '''repos:
  - repo: local
    hooks:
      - id: check-secrets
        name: refuse partner tokens and private keys
        entry: python scripts/check_secrets.py
        language: system
        types: [text]
'''
    s.act(write("scripts/check_secrets.py", scan_py), write(".pre-commit-config.yaml", hook),
          write("tests/test_check_secrets.py", scan_test_v1),
          thinking="Plain regex scan over the files pre-commit passes. Token: qk_(live|test)_ + 16+ hex. Private "
                   "keys: BEGIN ... PRIVATE KEY (RSA, EC, OPENSSH, or none). Skip binary files. Test via importlib "
                   "since scripts/ is not a package. Pre-commit itself: the user asked for a pre-commit hook, so "
                   "pre-commit as a tool (uv tool), not a project dependency.")
    unit_scan = ["tests/test_check_secrets.py::test_live_token_is_found", "tests/test_check_secrets.py::test_test_token_is_found",
                 "tests/test_check_secrets.py::test_placeholder_passes", "tests/test_check_secrets.py::test_private_key_is_found",
                 "tests/test_check_secrets.py::test_main_exit_codes"]
    unit = HS_TEST_MODELS_NAMES + unit_scan + unit_cli + unit_client + unit_config + unit_redact + unit_retry + unit_sync2
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.07, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("git ls-files -co --exclude-standard | xargs uv run python scripts/check_secrets.py",
               "docs/partner-api.md:6: looks like a Quayline token\n"
               "tests/test_check_secrets.py:11: looks like a Quayline token\n"
               "tests/test_check_secrets.py:15: looks like a Quayline token\n"
               "tests/test_check_secrets.py:31: looks like a Quayline token\n"
               "check_secrets: 4 possible secret(s), commit refused. Use a placeholder such as qk_live_<your-token>.\n",
               code=1))
    s.say("The scan works, and a first run over the repository finds 4 hits:\n\n"
          "- `docs/partner-api.md:6`: the dead v1 sandbox token in the curl example.\n"
          "- `tests/test_check_secrets.py` (3 lines): my own test strings, which the hook would refuse to commit.\n\n"
          "For the tests I'll build the fake tokens at runtime (`\"qk_\" + \"live_\" + …`), so no token-shaped literal "
          "is in the file. For the docs: replace the example with a placeholder, or would you rather have an "
          "allow-list marker (e.g. a `# check-secrets: ignore` comment on the line)?",
          thinking="Tests contain token-shaped literals: build them at runtime. For the docs: ask whether to replace "
                   "or add an allowlist mechanism; user preferences matter here.")
    s.user("Replace it with a placeholder. No allow-list mechanism: an ignore marker is exactly what someone will "
           "paste next to a real token one day. And placeholders must not match the pattern.")
    s.act(edit("docs/partner-api.md", 'curl -H "Authorization: Bearer qk_live_2b81f0c4d7e95a36c1f8" \\',
               'curl -H "Authorization: Bearer qk_live_<your-token>" \\'),
          edit("tests/test_check_secrets.py", '''spec.loader.exec_module(check_secrets)
''', '''spec.loader.exec_module(check_secrets)

# Built at runtime, so this file contains no token-shaped literal for the hook to refuse.
FAKE_LIVE = "qk_" + "live_" + "0123456789abcdef" + "0123"
FAKE_TEST = "qk_" + "test_" + "fedcba9876543210"
'''),
          edit("tests/test_check_secrets.py", '''    assert check_secrets.scan_text("token = 'qk_live_0123456789abcdef0123'") == [(1, "Quayline token")]''',
               '''    assert check_secrets.scan_text(f"token = '{FAKE_LIVE}'") == [(1, "Quayline token")]'''),
          edit("tests/test_check_secrets.py", '''    assert check_secrets.scan_text("x\\nBearer qk_test_fedcba9876543210") == [(2, "Quayline token")]''',
               '''    assert check_secrets.scan_text(f"x\\nBearer {FAKE_TEST}") == [(2, "Quayline token")]'''),
          edit("tests/test_check_secrets.py", '''    dirty.write_text("qk_live_0123456789abcdef0123")''',
               '''    dirty.write_text(FAKE_LIVE)'''))
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.05, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("git ls-files -co --exclude-standard | xargs uv run python scripts/check_secrets.py && echo clean", "clean\n"),
          bash("uv tool run pre-commit install && uv tool run pre-commit run --all-files",
               "pre-commit installed at .git/hooks/pre-commit\n[INFO] Initializing environment for local.\n"
               "refuse partner tokens and private keys..................................Passed\n"))
    scan_done = s.say("Done. The docs example is now `qk_live_<your-token>` (doesn't match: `<` isn't hex), the test "
                      "builds its fake tokens at runtime, and there's no allow-list. `pre-commit run --all-files` "
                      "passes; the hook is installed in your clone (others need `pre-commit install` once; I'll put "
                      "that in the README).")
    s.note("Token rotation: the Quayline live token expires 2026-03-31. A calendar reminder was added for 2026-03-24.")
    s.label(scan_done, "secret-scan")

    # ------------------------------------------------------------------ 6b. types
    def ln(path: str, needle: str) -> int:
        return next(i for i, line in enumerate(s.fs[path].split("\n"), 1) if needle in line)

    def ln_after(path: str, anchor: str, needle: str) -> int:
        start = ln(path, anchor)
        return next(i for i, line in enumerate(s.fs[path].split("\n"), 1) if i > start and needle in line)

    s.user("sync.py takes `client` and `store` untyped, and the fakes in conftest only work by accident. Add "
           "Protocols for both and get `mypy --strict src` clean. mypy as a dev dependency is fine.")
    s.act(bash("uv add --dev mypy", "Resolved 22 packages in 388ms\nPrepared 3 packages in 1.02s\nInstalled 3 packages in 19ms\n"
               " + mypy==1.14.1\n + mypy-extensions==1.0.0\n + typing-extensions==4.12.2\n",
               files={"pyproject.toml": s.fs["pyproject.toml"].replace('dev = ["pytest>=8.3", "ruff>=0.8"]',
                                                                      'dev = ["mypy>=1.14.1", "pytest>=8.3", "ruff>=0.8"]')}))
    c, sy, st, m, cl = ("src/harbor_sync/client.py", "src/harbor_sync/sync.py", "src/harbor_sync/store.py",
                        "src/harbor_sync/models.py", "src/harbor_sync/cli.py")
    mypy1 = [
        f"{m}:{ln(m, 'def from_api(cls, item: dict) -> Berth:')}: error: Missing type parameters for generic type \"dict\"  [type-arg]",
        f"{m}:{ln(m, 'def from_api(cls, item: dict) -> Booking:')}: error: Missing type parameters for generic type \"dict\"  [type-arg]",
        f"{c}:{ln(c, 'def _get(self, path: str, params: dict | None = None) -> dict:')}: error: Missing type parameters for generic type \"dict\"  [type-arg]",
        f"{c}:{ln(c, 'def attempt() -> dict:')}: error: Missing type parameters for generic type \"dict\"  [type-arg]",
        f"{c}:{ln(c, 'return response.json()')}: error: Returning Any from function declared to return \"dict[Any, Any]\"  [no-any-return]",
        f"{st}:{ln(st, 'return row[0] if row else None')}: error: Returning Any from function declared to return \"datetime | None\"  [no-any-return]",
        f"{sy}:{ln(sy, 'def run_sync(client, store) -> SyncResult:')}: error: Function is missing a type annotation for one or more arguments  [no-untyped-def]",
        f"{sy}:{ln(sy, 'def run_backfill(client, store')}: error: Function is missing a type annotation for one or more arguments  [no-untyped-def]",
        f"{sy}:{ln(sy, 'def refresh_berths(client, store) -> int:')}: error: Function is missing a type annotation for one or more arguments  [no-untyped-def]",
        f"{cl}:{ln(cl, 'refresh_berths(client, store)')}: error: Call to untyped function \"refresh_berths\" in typed context  [no-untyped-call]",
        f"{cl}:{ln(cl, 'run_backfill(client, store, args.since')}: error: Call to untyped function \"run_backfill\" in typed context  [no-untyped-call]",
        f"{cl}:{ln(cl, '            run_sync(client, store)')}: error: Call to untyped function \"run_sync\" in typed context  [no-untyped-call]",
    ]
    s.act(bash("uv run mypy --strict src", "\n".join(sorted(mypy1)) + "\nFound 12 errors in 5 files (checked 9 source files)\n",
               code=1),
          thinking="12 errors: dict type params, Any returns from json() and fetchone(), untyped sync functions. "
                   "Protocols: BookingSource (bookings_since, berths) and BookingSink (upserts, watermark).")
    ports_py = '''"""What sync.py needs from the partner client and from the store.

QuaylineClient and Store satisfy these structurally, and so do the fakes in tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Protocol

from harbor_sync.models import Berth, Booking


class BookingSource(Protocol):
    def bookings_since(self, since: datetime) -> Iterator[list[Booking]]: ...

    def berths(self) -> list[Berth]: ...


class BookingSink(Protocol):
    def upsert_bookings(self, bookings: Iterable[Booking]) -> int: ...

    def upsert_berths(self, berths: Iterable[Berth]) -> int: ...

    def get_watermark(self, name: str = "bookings") -> datetime | None: ...

    def set_watermark(self, value: datetime, name: str = "bookings") -> None: ...
'''
    s.act(write("src/harbor_sync/ports.py", ports_py),
          edit(sy, "def run_sync(client, store) -> SyncResult:", "def run_sync(client: BookingSource, store: BookingSink) -> SyncResult:"),
          edit(sy, "def run_backfill(client, store, since: datetime, dry_run: bool = False, out=print) -> SyncResult:",
               "def run_backfill(client: BookingSource, store: BookingSink, since: datetime, dry_run: bool = False,\n"
               "                 out: Callable[[str], None] = print) -> SyncResult:"),
          edit(sy, "def refresh_berths(client, store) -> int:", "def refresh_berths(client: BookingSource, store: BookingSink) -> int:"),
          edit(sy, "from dataclasses import dataclass\nfrom datetime import UTC, datetime\n",
               "from collections.abc import Callable\nfrom dataclasses import dataclass\nfrom datetime import UTC, datetime\n\n"
               "from harbor_sync.ports import BookingSink, BookingSource\n"))
    s.act(edit(m, "from decimal import Decimal\n", "from decimal import Decimal\nfrom typing import Any\n"),
          edit(m, "    def from_api(cls, item: dict) -> Berth:", "    def from_api(cls, item: dict[str, Any]) -> Berth:"),
          edit(m, "    def from_api(cls, item: dict) -> Booking:", "    def from_api(cls, item: dict[str, Any]) -> Booking:"),
          edit(c, "    def _get(self, path: str, params: dict | None = None) -> dict:\n        def attempt() -> dict:\n",
               "    def _get(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:\n"
               "        def attempt() -> dict[str, Any]:\n"),
          edit(c, "            return response.json()\n",
               "            payload: dict[str, Any] = response.json()\n            return payload\n"),
          edit(c, "from email.utils import parsedate_to_datetime\n", "from email.utils import parsedate_to_datetime\nfrom typing import Any\n"),
          edit(st, '''        row = self.conn.execute("SELECT watermark FROM sync_state WHERE name = %s", (name,)).fetchone()
        return row[0] if row else None
''', '''        row = self.conn.execute("SELECT watermark FROM sync_state WHERE name = %s", (name,)).fetchone()
        if row is None:
            return None
        value = row[0]
        if not isinstance(value, datetime):  # a timestamptz column always gives an aware datetime
            raise TypeError(f"sync_state.watermark is {type(value).__name__}, expected datetime")
        return value
'''))
    call_line = ln(cl, "            run_sync(client, store)")
    proto_note = "\n".join(f"{cl}:{n}: {t}" for n, t in [
        (call_line, 'error: Argument 1 to "run_sync" has incompatible type "QuaylineClient"; expected "BookingSource"  [arg-type]'),
        (call_line, 'note: Following member(s) of "QuaylineClient" have conflicts:'),
        (call_line, 'note:     Expected:'),
        (call_line, 'note:         def bookings_since(self, since: datetime) -> Iterator[list[Booking]]'),
        (call_line, 'note:     Got:'),
        (call_line, 'note:         def bookings_since(self, updated_since: datetime) -> Iterator[list[Booking]]'),
    ])
    back_line = ln(cl, "run_backfill(client, store, args.since")
    s.act(bash("uv run mypy --strict src",
               f"{cl}:{back_line}: error: Argument 1 to \"run_backfill\" has incompatible type \"QuaylineClient\"; "
               "expected \"BookingSource\"  [arg-type]\n"
               f"{cl}:{back_line}: note: \"QuaylineClient.bookings_since\" has a different argument name\n"
               + proto_note + "\nFound 2 errors in 1 file (checked 10 source files)\n", code=1))
    s.act(edit("src/harbor_sync/ports.py", "    def bookings_since(self, since: datetime) -> Iterator[list[Booking]]: ...",
               "    def bookings_since(self, updated_since: datetime) -> Iterator[list[Booking]]: ..."),
          text="Argument names are part of a Protocol: `QuaylineClient.bookings_since` calls it `updated_since` (and "
               "could be called with it as a keyword), so the Protocol has to use the same name.")
    s.act(bash("uv run mypy --strict src", "Success: no issues found in 10 source files\n"),
          run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.09, deselected=HS_INTEGRATION, rootdir=rootdir))
    s.say("`mypy --strict src` is clean:\n\n"
          "- `ports.py` defines `BookingSource` (`bookings_since`, `berths`) and `BookingSink` (upserts and "
          "watermark); `sync.py` is typed against them.\n"
          "- `dict[str, Any]` for JSON, and the two places that returned `Any` (`response.json()`, `fetchone()`) "
          "now narrow it explicitly; `get_watermark` raises if the column ever isn't a datetime.\n"
          "- mypy caught one thing of mine: the Protocol named the parameter `since` while the client calls it "
          f"`updated_since`.\n\nmypy is a dev dependency now; {len(unit)} unit tests still pass.")
    s.user("Why Protocols and not an abstract base class that QuaylineClient and Store inherit from?")
    s.say("Mainly because of the fakes. With an ABC, `FakeClient` and `MemoryStore` in `conftest.py` would have to "
          "inherit from it too, and every fake would need every abstract method, even those a test never uses. A "
          "Protocol is checked structurally: anything with matching methods fits, so the fakes stay small, and "
          "`QuaylineClient` doesn't need to import anything from `sync`'s side.\n\n"
          "The trade-off: nothing forces a class to declare that it implements the Protocol, so a mismatch only "
          "shows where the object is passed (as just happened in `cli.py`). If you want the check at the class, "
          "add a line like `_: BookingSource = QuaylineClient(...)` in a test, or run mypy over `tests/` as well.")

    # ------------------------------------------------------------------ 6c. status for the night watch
    s.user("For monitoring and the night watch: `harbor-sync status` prints the watermark and its age and exits 1 if "
           "the watermark is older than 45 minutes, so our Icinga check can call it. Below that, arrivals for today "
           "and tomorrow per pier; the night watch asks for that every evening.")
    s.say("One problem with the 45-minute rule: the watermark is the newest `updated_at` we've stored, not the "
          "time of the last run. At night nobody changes bookings for hours, so the watermark ages although every "
          "run succeeds, and the check would page you for nothing. The same goes for the maintenance window.\n\n"
          "Better: record the time of the last *successful* run (a small `sync_runs` table, written at the end of "
          "`run_sync` even when nothing changed) and alert on that. The watermark is still printed, "
          "for information. OK?",
          thinking="Watermark = max updated_at, not last run time. Quiet nights would alert. Need last_success. "
                   "Separate table sync_runs(name, last_success): sync_state.watermark is NOT NULL, so a run that "
                   "never stored a booking has no row to update there.")
    s.user("Right, alert on the last successful run. 45 minutes stays, two missed runs plus slack.")
    s.act(read(st, offset=ln(st, "CREATE TABLE IF NOT EXISTS sync_state"), limit=6), read("tests/conftest.py", offset=30, limit=30))
    s.act(edit(st, '''CREATE TABLE IF NOT EXISTS sync_state (
    name       text PRIMARY KEY,
    watermark  timestamptz NOT NULL
);
"""''', '''CREATE TABLE IF NOT EXISTS sync_state (
    name       text PRIMARY KEY,
    watermark  timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS sync_runs (
    name          text PRIMARY KEY,
    last_success  timestamptz NOT NULL
);
"""

ARRIVALS = """
SELECT b.pier, k.arrival, b.code, k.vessel_name, k.vessel_length_m, k.guests, k.status
FROM bookings k JOIN berths b ON b.id = k.berth_id
WHERE k.arrival BETWEEN %(first)s AND %(last)s
  AND k.status IN ('requested', 'confirmed', 'checked_in')
ORDER BY b.pier, k.arrival, b.code
"""'''),
          edit(st, '''    def close(self) -> None:
        self.conn.close()
''', '''    def mark_success(self, when: datetime, name: str = "bookings") -> None:
        with self.conn.transaction():
            self.conn.execute(
                "INSERT INTO sync_runs (name, last_success) VALUES (%s, %s) "
                "ON CONFLICT (name) DO UPDATE SET last_success = excluded.last_success",
                (name, when),
            )

    def last_success(self, name: str = "bookings") -> datetime | None:
        row = self.conn.execute("SELECT last_success FROM sync_runs WHERE name = %s", (name,)).fetchone()
        value = row[0] if row else None
        return value if isinstance(value, datetime) else None

    def arrivals(self, first: date, last: date) -> list[Arrival]:
        rows = self.conn.execute(ARRIVALS, {"first": first, "last": last}).fetchall()
        return [Arrival(*row) for row in rows]

    def close(self) -> None:
        self.conn.close()
'''),
          edit(st, "from collections.abc import Iterable\nfrom datetime import datetime\n",
               "from collections.abc import Iterable\nfrom datetime import date, datetime\n"),
          edit(st, "from harbor_sync.models import Berth, Booking\n", "from harbor_sync.models import Arrival, Berth, Booking\n"),
          edit(m, '''    @property
    def active(self) -> bool:
        return self.status in ("requested", "confirmed", "checked_in")
''', '''    @property
    def active(self) -> bool:
        return self.status in ("requested", "confirmed", "checked_in")


@dataclass(frozen=True)
class Arrival:
    """One line of the night watch's list: who arrives at which berth."""

    pier: str
    arrival: date
    berth_code: str
    vessel_name: str
    vessel_length_m: Decimal
    guests: int
    status: str
'''))
    status_py = '''"""`harbor-sync status`: is the sync alive, and who arrives today and tomorrow."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import groupby

from harbor_sync.models import Arrival

MAX_AGE = timedelta(minutes=45)  # two missed 15-minute runs plus slack


def _age(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


def render_status(now: datetime, last_success: datetime | None, watermark: datetime | None,
                  arrivals: list[Arrival]) -> tuple[str, int]:
    """The text to print and the exit code (0 ok, 1 stale or never run)."""
    if last_success is None:
        head, code = "CRITICAL no successful sync run recorded", 1
    elif now - last_success > MAX_AGE:
        head, code = f"CRITICAL last successful sync {_age(now - last_success)} ago (limit {_age(MAX_AGE)})", 1
    else:
        head, code = f"OK last successful sync {_age(now - last_success)} ago", 0
    lines = [head, f"watermark {watermark.isoformat() if watermark else '-'}", ""]
    if not arrivals:
        lines.append("no arrivals today or tomorrow")
    for pier, group in groupby(arrivals, key=lambda a: a.pier):
        lines.append(f"Pier {pier}")
        for a in group:
            lines.append(f"  {a.arrival:%a %d.%m.}  {a.berth_code:<5} {a.vessel_name:<20} {a.vessel_length_m:>5} m  "
                         f"{a.guests} guests  {a.status}")
    return "\\n".join(lines), code
'''
    s.act(write("src/harbor_sync/status.py", status_py),
          edit(sy, '''    if latest > since:
        store.set_watermark(latest)
    log.info("sync done''', '''    if latest > since:
        store.set_watermark(latest)
    store.mark_success(datetime.now(UTC))
    log.info("sync done'''),
          edit(cl, '''    sub.add_parser("migrate", help="create or update the database schema")
''', '''    sub.add_parser("migrate", help="create or update the database schema")
    sub.add_parser("status", help="last successful run (exit 1 if stale) and the next arrivals")
'''),
          edit(cl, '''        elif args.command == "backfill":''', '''        elif args.command == "status":
            now = datetime.now(UTC)
            today = now.astimezone(BERLIN).date()
            text, code = render_status(now, store.last_success(), store.get_watermark(),
                                       store.arrivals(today, today + timedelta(days=1)))
            print(text)
            return code
        elif args.command == "backfill":'''),
          edit(cl, "from datetime import UTC, date, datetime, time\n",
               "from datetime import UTC, date, datetime, time, timedelta\nfrom zoneinfo import ZoneInfo\n"),
          edit(cl, "from harbor_sync.store import Store\n",
               "from harbor_sync.status import render_status\nfrom harbor_sync.store import Store\n"),
          edit(cl, "def _utc_date(text: str) -> datetime:", 'BERLIN = ZoneInfo("Europe/Berlin")  # "today" is the harbour\'s today\n\n\ndef _utc_date(text: str) -> datetime:'),
          thinking="mark_success at the end of run_sync, after the watermark. status command: now in UTC, 'today' "
                   "in Europe/Berlin (the night watch's today). Exit code from render_status.")
    status_tests = '''from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from harbor_sync.models import Arrival
from harbor_sync.status import render_status

NOW = datetime(2026, 2, 3, 21, 40, tzinfo=UTC)
ARRIVALS = [
    Arrival("A", date(2026, 2, 3), "A-03", "Seeschwalbe", Decimal("10.40"), 3, "confirmed"),
    Arrival("A", date(2026, 2, 4), "A-11", "Kiekut", Decimal("8.20"), 2, "requested"),
    Arrival("C", date(2026, 2, 4), "C-27", "Havfrue", Decimal("12.90"), 4, "confirmed"),
]


def test_ok_when_recent():
    text, code = render_status(NOW, NOW - timedelta(minutes=12), NOW - timedelta(hours=3), ARRIVALS)
    assert code == 0
    assert text.splitlines()[0] == "OK last successful sync 12 min ago"


def test_critical_when_stale():
    text, code = render_status(NOW, NOW - timedelta(minutes=50), None, [])
    assert code == 1
    assert text.splitlines()[0] == "CRITICAL last successful sync 50 min ago (limit 45 min)"


def test_critical_when_never_run():
    assert render_status(NOW, None, None, [])[1] == 1


def test_quiet_night_is_ok():
    # no booking changed for 5 hours, but the runs succeed: no alert
    _, code = render_status(NOW, NOW - timedelta(minutes=3), NOW - timedelta(hours=5), [])
    assert code == 0


def test_arrivals_grouped_by_pier():
    text, _ = render_status(NOW, NOW, NOW, ARRIVALS)
    lines = text.splitlines()[3:]
    assert lines[0] == "Pier A" and lines[3] == "Pier C"
    assert lines[1].split()[:4] == ["Tue", "03.02.", "A-03", "Seeschwalbe"]
'''
    s.act(write("tests/test_status.py", status_tests))
    unit_status = ["tests/test_status.py::test_ok_when_recent", "tests/test_status.py::test_critical_when_stale",
                   "tests/test_status.py::test_critical_when_never_run", "tests/test_status.py::test_quiet_night_is_ok",
                   "tests/test_status.py::test_arrivals_grouped_by_pier"]
    unit = (HS_TEST_MODELS_NAMES + unit_scan + unit_cli + unit_client + unit_config + unit_redact + unit_retry
            + unit_status + unit_sync2)
    attr_tb = '''store = <conftest.MemoryStore object at 0x7f9e1a2c4f50>

    def test_first_run_starts_at_epoch(store):
        client = FakeClient([[make_booking(1)]])
>       run_sync(client, store)

tests/test_sync.py:22: 
_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ 

    def run_sync(client: BookingSource, store: BookingSink) -> SyncResult:
        ...
>       store.mark_success(datetime.now(UTC))
E       AttributeError: 'MemoryStore' object has no attribute 'mark_success'

src/harbor_sync/sync.py:45: AttributeError'''
    sync_runs = [t for t in unit_sync2 if "backfill" not in t and "failed_run" not in t] + [unit_cli[0]]
    failures = {t: attr_tb.replace("test_first_run_starts_at_epoch", t.split("::")[1]) for t in sync_runs
                if t.split("::")[1] in ("test_first_run_starts_at_epoch", "test_watermark_is_latest_updated_at",
                                        "test_empty_page_does_not_move_watermark",
                                        "test_watermark_written_once_after_all_pages", "test_bookings_are_upserted")}
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, failures=failures, seconds=1.12,
                     deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("uv run mypy --strict src",
               f"{sy}:{ln(sy, 'store.mark_success(datetime.now(UTC))')}: error: \"BookingSink\" has no attribute \"mark_success\"  [attr-defined]\n"
               "Found 1 error in 1 file (checked 11 source files)\n", code=1))
    s.act(edit("src/harbor_sync/ports.py", '''    def set_watermark(self, value: datetime, name: str = "bookings") -> None: ...
''', '''    def set_watermark(self, value: datetime, name: str = "bookings") -> None: ...

    def mark_success(self, when: datetime, name: str = "bookings") -> None: ...
'''),
          edit("tests/conftest.py", '''        self.watermark = watermark
        self.watermark_writes: list[datetime] = []
''', '''        self.watermark = watermark
        self.watermark_writes: list[datetime] = []
        self.successes: list[datetime] = []
'''),
          edit("tests/conftest.py", '''    def set_watermark(self, value, name: str = "bookings") -> None:
        self.watermark = value
        self.watermark_writes.append(value)
''', '''    def set_watermark(self, value, name: str = "bookings") -> None:
        self.watermark = value
        self.watermark_writes.append(value)

    def mark_success(self, when, name: str = "bookings") -> None:
        self.successes.append(when)
'''),
          edit("tests/test_sync.py", '''    assert store.watermark == start
    assert store.watermark_writes == []


''', '''    assert store.watermark == start
    assert store.watermark_writes == []
    assert store.successes == []


def test_quiet_run_records_success():
    start = datetime(2025, 11, 30, tzinfo=UTC)
    store = MemoryStore(watermark=start)
    run_sync(FakeClient([[]]), store)
    assert store.watermark_writes == [] and len(store.successes) == 1


'''),
          text="Both point at the same gap: the sink needs `mark_success` in the Protocol and in the test fake. Also a "
               "test that a run with no changes still records success (the quiet-night case), and that a failed "
               "run doesn't.")
    unit_sync3 = unit_sync2[:5] + ["tests/test_sync.py::test_quiet_run_records_success"] + unit_sync2[5:]
    unit = (HS_TEST_MODELS_NAMES + unit_scan + unit_cli + unit_client + unit_config + unit_redact + unit_retry
            + unit_status + unit_sync3)
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.1, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("uv run mypy --strict src && uv run ruff check", "Success: no issues found in 11 source files\nAll checks passed!\n"))
    s.act(bash("uv run harbor-sync migrate && uv run harbor-sync status",
               "harbor-sync: HARBOR_API_TOKEN is not set (the Quayline partner token; see .env.example)\n", code=2),
          text="Trying it against the local development database:")
    s.say("That's a real problem, not just my environment: `status` and `migrate` never talk to the partner, but "
          "`load_settings` demands the token for every command. Icinga would need the live token just to check "
          "freshness, which is exactly where it shouldn't be. I'll make the token required only for the commands "
          "that call the API (`run`, `berths`, `backfill`).",
          thinking="Settings.api_token is required at load time. Split: load_settings(require_token: bool). For "
                   "status/migrate, construct no client at all. Settings.api_token becomes str with default '' "
                   "and the client refuses an empty token.")
    s.act(read("src/harbor_sync/cli.py", offset=ln(cl, "def main("), limit=45))
    s.act(edit("src/harbor_sync/config.py", '''def load_settings(env: Mapping[str, str] = os.environ) -> Settings:
    token = env.get("HARBOR_API_TOKEN", "").strip()
    if not token:
        raise ConfigError("HARBOR_API_TOKEN is not set (the Quayline partner token; see .env.example)")''',
               '''def load_settings(env: Mapping[str, str] = os.environ, *, require_token: bool = True) -> Settings:
    """Settings from the environment; commands that never call the partner API pass require_token=False."""
    token = env.get("HARBOR_API_TOKEN", "").strip()
    if require_token and not token:
        raise ConfigError("HARBOR_API_TOKEN is not set (the Quayline partner token; see .env.example)")'''),
          edit("src/harbor_sync/cli.py", '''    try:
        settings = load_settings()
    except ConfigError as exc:''', '''    needs_api = args.command in ("run", "berths", "backfill")
    try:
        settings = load_settings(require_token=needs_api)
    except ConfigError as exc:'''),
          edit("src/harbor_sync/cli.py", '''    client = QuaylineClient(settings)
''', '''    client = QuaylineClient(settings) if needs_api else None
'''),
          edit("src/harbor_sync/cli.py", '''        client.close()
        store.close()''', '''        if client is not None:
            client.close()
        store.close()'''))
    s.act(bash("uv run mypy --strict src", "\n".join(
        f"{cl}:{n}: error: Argument 1 to \"{fn}\" has incompatible type \"QuaylineClient | None\"; expected \"BookingSource\"  [arg-type]"
        for fn, n in sorted([("refresh_berths", ln(cl, "            refresh_berths(client, store)")),
                             ("run_backfill", ln(cl, "run_backfill(client, store, args.since")),
                             ("run_sync", ln(cl, "            run_sync(client, store)"))], key=lambda x: x[1]))
        + "\nFound 3 errors in 1 file (checked 11 source files)\n", code=1),
          thinking="mypy can't see that needs_api implies client is not None. Restructure: build the client inside "
                   "the branches that need it, via a small helper, instead of Optional juggling.")
    s.act(edit("src/harbor_sync/cli.py", '''    client = QuaylineClient(settings) if needs_api else None
''', '''    client = QuaylineClient(settings) if needs_api else None

    def api() -> QuaylineClient:
        assert client is not None, f"{args.command} was not expected to call the partner API"
        return client
'''),
          edit("src/harbor_sync/cli.py", "            refresh_berths(client, store)", "            refresh_berths(api(), store)"),
          edit("src/harbor_sync/cli.py", "            run_backfill(client, store, args.since, dry_run=args.dry_run)",
               "            run_backfill(api(), store, args.since, dry_run=args.dry_run)"),
          edit("src/harbor_sync/cli.py", "            run_sync(client, store)", "            run_sync(api(), store)"),
          edit("tests/test_cli.py", '''def test_missing_token_exits_2(monkeypatch, capsys):''', '''def test_status_needs_no_token(monkeypatch, capsys):
    monkeypatch.delenv("HARBOR_API_TOKEN", raising=False)
    store = MemoryStore()
    store.close = lambda: None
    store.last_success = lambda: None
    store.arrivals = lambda first, last: []
    monkeypatch.setattr(cli, "Store", lambda dsn: store)
    monkeypatch.setattr(cli, "QuaylineClient", lambda settings: pytest.fail("status must not build a client"))
    assert cli.main(["status"]) == 1  # never ran: CRITICAL, but no token needed
    assert "CRITICAL no successful sync run recorded" in capsys.readouterr().out


def test_missing_token_exits_2(monkeypatch, capsys):'''))
    unit_cli = unit_cli[:2] + ["tests/test_cli.py::test_status_needs_no_token"] + unit_cli[2:]
    unit = (HS_TEST_MODELS_NAMES + unit_scan + unit_cli + unit_client + unit_config + unit_redact + unit_retry
            + unit_status + unit_sync3)
    s.act(bash("uv run mypy --strict src", "Success: no issues found in 11 source files\n"),
          run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.12, deselected=HS_INTEGRATION, rootdir=rootdir),
          bash("uv run harbor-sync migrate && uv run harbor-sync status; echo \"exit $?\"",
               "CRITICAL no successful sync run recorded\nwatermark 2026-01-28T16:02:44.718204+00:00\n\n"
               "Pier B\n  Tue 03.02.  B-12  Nordlicht              9.60 m  2 guests  confirmed\n"
               "  Wed 04.02.  B-07  Seeschwalbe           10.40 m  3 guests  confirmed\n"
               "Pier D\n  Wed 04.02.  D-02  Polarstern            14.10 m  5 guests  requested\nexit 1\n"))
    s.say("`harbor-sync status` is in, and works without a token now. Against the local database it says CRITICAL "
          "(no successful run recorded there yet) and exits 1, followed by the arrivals per pier:\n\n"
          "- Exit 1 with `CRITICAL ...` when the last successful run is older than 45 minutes or there was none; "
          "the watermark is shown but not judged, so quiet nights don't alert.\n"
          "- `run_sync` records the time in a new `sync_runs` table at the end of every successful run (run "
          "`harbor-sync migrate` once after deploying; it creates the table).\n"
          "- Arrivals today and tomorrow (Europe/Berlin dates), active bookings only, grouped by pier.\n"
          "- The token is only required by `run`, `berths` and `backfill`; `status` and `migrate` never build a "
          "partner client (tested).\n"
          f"- {len(unit)} unit tests, mypy and ruff clean. The SQL of `arrivals` and `mark_success` only ran against "
          "your local database just now; there are no integration tests for them. Want me to add some for you to "
          "run on the VPN?")
    s.user("Yes, add them; I'll run them tomorrow from the office.")
    s.act(edit("tests/test_store.py", '''def test_upsert_berths(store):''', '''def test_mark_success_without_watermark(store):
    when = datetime(2026, 2, 3, 21, 0, tzinfo=UTC)
    store.mark_success(when)
    assert store.last_success() == when
    assert store.get_watermark() is None


def test_mark_success_keeps_watermark(store):
    store.set_watermark(datetime(2026, 2, 3, 20, 0, tzinfo=UTC))
    store.mark_success(datetime(2026, 2, 3, 21, 0, tzinfo=UTC))
    assert store.get_watermark() == datetime(2026, 2, 3, 20, 0, tzinfo=UTC)


def test_arrivals_only_active_and_sorted(store):
    store.upsert_berths([Berth("brt_001", "A-01", "A", max_length_m=12, max_beam_m=4, has_power=True)])
    store.upsert_bookings([make_booking(41), make_booking(81, status="cancelled")])
    rows = store.arrivals(date(2025, 12, 1), date(2025, 12, 2))
    assert [(r.berth_code, r.status) for r in rows] == [("A-01", "confirmed")]


def test_upsert_berths(store):'''),
          edit("tests/test_store.py", "from datetime import UTC, datetime, timedelta\n", "from datetime import UTC, date, datetime, timedelta\n"))
    s.act(bash("uv run pytest --collect-only -q -m integration | tail -3",
               "tests/test_store.py::test_arrivals_only_active_and_sorted\ntests/test_store.py::test_upsert_berths\n\n"
               f"{HS_INTEGRATION + 3}/{len(unit) + HS_INTEGRATION + 3} tests collected ({len(unit)} deselected) in 0.31s\n"),
          text="Only collecting them, not running:")
    s.say(f"Three integration tests added to `tests/test_store.py` (collected, not run): `mark_success` without and "
          f"with a watermark, and `arrivals` returning only active bookings in order. "
          f"`uv run pytest -m integration` on the VPN runs all {HS_INTEGRATION + 3}.")

    # ------------------------------------------------------------------ 6d. the production backfill
    failing_page = 61
    prod_lines = []
    t0 = datetime(2026, 2, 3, 15, 2, 11)
    for page in range(1, failing_page + 1):
        t0 += timedelta(milliseconds=gen.randint(900, 1900))
        done_n = page * 200 if page < failing_page else (failing_page - 1) * 200
        if page < failing_page:
            prod_lines.append(f"{t0:%Y-%m-%d %H:%M:%S},{gen.randint(100, 999)} INFO httpx HTTP Request: GET "
                              "https://api.quayline.example/v2/marinas/mar_kiel_sporthafen/bookings?updated_since="
                              f"2025-08-18T00%3A00%3A00%2B00%3A00&limit=200{'' if page == 1 else '&cursor=c_' + gen.randbytes(14).hex()} "
                              "\"HTTP/1.1 200 OK\"")
            prod_lines.append(f"{t0:%Y-%m-%d %H:%M:%S},{gen.randint(100, 999)} INFO harbor_sync.sync backfill "
                              f"page={page} bookings=200 so_far={done_n} dry_run=False")
    prod_out = "\n".join(prod_lines[-30:]) + f"""
{t0:%Y-%m-%d %H:%M:%S},{gen.randint(100, 999)} INFO httpx HTTP Request: GET https://api.quayline.example/v2/marinas/mar_kiel_sporthafen/bookings?updated_since=2025-08-18T00%3A00%3A00%2B00%3A00&limit=200&cursor=c_{gen.randbytes(14).hex()} "HTTP/1.1 200 OK"
Traceback (most recent call last):
  File "/home/dana/src/harbor-sync/.venv/bin/harbor-sync", line 8, in <module>
    sys.exit(main())
             ^^^^^^
  File "/home/dana/src/harbor-sync/src/harbor_sync/cli.py", line {ln(cl, 'run_backfill(api(), store, args.since')}, in main
    run_backfill(api(), store, args.since, dry_run=args.dry_run)
  File "/home/dana/src/harbor-sync/src/harbor_sync/sync.py", line {ln_after(sy, 'def run_backfill(', 'for page in client.bookings_since(since):')}, in run_backfill
    for page in client.bookings_since(since):
  File "/home/dana/src/harbor-sync/src/harbor_sync/client.py", line {ln(c, 'page, cursor = self.bookings_page(updated_since, cursor)')}, in bookings_since
    page, cursor = self.bookings_page(updated_since, cursor)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/dana/src/harbor-sync/src/harbor_sync/client.py", line {ln(c, 'bookings = [Booking.from_api(item)')}, in bookings_page
    bookings = [Booking.from_api(item) for item in payload["data"]]
                ^^^^^^^^^^^^^^^^^^^^^^
  File "/home/dana/src/harbor-sync/src/harbor_sync/models.py", line {ln(m, 'raise ValueError(f"unknown booking status')}, in from_api
    raise ValueError(f"unknown booking status {{status!r}} in booking {{item.get('id')}}")
ValueError: unknown booking status 'waitlisted' in booking bk_06231
"""
    s.wait_until("2026-02-03T14:03:31")
    s.shell("HARBOR_API_TOKEN=$(pass show quayline/live) HARBOR_DATABASE_URL=postgresql://harbor@localhost:15432/harbor "
            "uv run harbor-sync backfill --since 2025-08-18 2>&1 | tail -n 50", prod_out, code=1)
    s.user(f"I ran the production backfill now from my laptop through the SSH tunnel, it's quiet. It died on page {failing_page}: the partner has "
           "apparently added a 'waitlisted' status. What now? Did we lose the 60 pages?")
    s.say("Nothing is lost, and nothing is half-written:\n\n"
          f"- Pages 1-{failing_page - 1} are stored: each page is upserted in its own transaction, and page "
          f"{failing_page} failed while *parsing*, before anything was written.\n"
          "- The backfill never touches the watermark, and the timer's runs have carried on normally.\n\n"
          "Fix: add `waitlisted` to the known statuses, then simply re-run the backfill from 2025-08-18 (upserts are "
          "idempotent; the first 60 pages are rewritten with identical data, about 1.5 minutes).\n\n"
          "Two questions before I change it:\n1. Is a waitlisted booking *active*? That decides whether it shows on "
          "the night watch's arrivals list and in `Booking.active`.\n2. Unknown statuses abort the whole run. I'd "
          "keep that (a new status changes meaning, you want to hear about it), but the alternative is to skip "
          "such bookings with a warning.",
          thinking="Each page: upsert in its own transaction; the exception is raised in from_api inside "
                   "bookings_page, before upsert of page 61. Watermark untouched by backfill. Ask about semantics.")
    s.user("Waitlisted means no berth assigned yet: not active, and it must not show on the arrivals list. Keep "
           "crashing on unknown statuses, I want to hear about them.")
    s.act(read(m, offset=1, limit=12), bash("grep -n \"'requested', 'confirmed', 'checked_in'\\|STATUSES\\|active\" -r src",
                                           f"{st}:{ln(st, 'AND k.status IN')}:  AND k.status IN ('requested', 'confirmed', 'checked_in')\n"
                                           f"{m}:{ln(m, 'STATUSES = (')}:STATUSES = (\"requested\", \"confirmed\", \"checked_in\", \"checked_out\", \"cancelled\", \"no_show\")\n"
                                           f"{m}:{ln(m, 'if status not in STATUSES:')}:        if status not in STATUSES:\n"
                                           f"{m}:{ln(m, 'def active(self)')}:    def active(self) -> bool:\n"))
    s.act(edit(m, 'STATUSES = ("requested", "confirmed", "checked_in", "checked_out", "cancelled", "no_show")',
               '# "waitlisted" (since 2026-02): no berth assigned yet, so not active\n'
               'STATUSES = ("requested", "waitlisted", "confirmed", "checked_in", "checked_out", "cancelled", "no_show")'),
          edit("tests/test_models.py", '''ACTIVE = {"requested": True, "confirmed": True, "checked_in": True,''',
               '''ACTIVE = {"requested": True, "waitlisted": False, "confirmed": True, "checked_in": True,'''),
          edit("docs/partner-api.md", "## Berths\n", "Booking statuses: `requested`, `waitlisted` (since 2026-02, no berth yet), "
               "`confirmed`, `checked_in`, `checked_out`, `cancelled`, `no_show`. Unknown statuses stop a run on "
               "purpose.\n\n## Berths\n"),
          text="`active` and the arrivals query both list the active statuses explicitly, so `waitlisted` stays out of "
               "both without further changes; only the known-status list, the tests and the docs change.")
    models_names = [n for n in HS_TEST_MODELS_NAMES]
    models_names.insert(models_names.index("tests/test_models.py::test_status_parsed[confirmed]"), "tests/test_models.py::test_status_parsed[waitlisted]")
    models_names.insert(models_names.index("tests/test_models.py::test_active[confirmed-True]"), "tests/test_models.py::test_active[waitlisted-False]")
    unit = (models_names + unit_scan + unit_cli + unit_client + unit_config + unit_redact + unit_retry
            + unit_status + unit_sync3)
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.13, deselected=HS_INTEGRATION + 3, rootdir=rootdir))
    s.say(f"`waitlisted` is a known status now (not active, so it's neither in `Booking.active` nor on the arrivals "
          f"list), the docs list all statuses, and the parametrized tests cover it; {len(unit)} unit tests pass. "
          "Re-run the backfill from 2025-08-18.")
    s.wait_until("2026-02-03T14:31:20")
    s.shell("HARBOR_API_TOKEN=$(pass show quayline/live) HARBOR_DATABASE_URL=postgresql://harbor@localhost:15432/harbor "
            "uv run harbor-sync backfill --since 2025-08-18 2>&1 | tail -n 3",
            "2026-02-03 15:31:40,112 INFO harbor_sync.sync backfill page=124 bookings=200 so_far=24800 dry_run=False\n"
            "2026-02-03 15:31:40,903 INFO harbor_sync.sync backfill page=125 bookings=71 so_far=24871 dry_run=False\n"
            "2026-02-03 15:31:40,904 INFO harbor_sync.sync backfill done since=2025-08-18T00:00:00+00:00 pages=125 "
            "bookings=24871\n")
    s.user("Done, 24,871 bookings, and bk_04127 is back with berth B-07. (Yes, I ran it from my uncommitted working "
           "tree.)")
    s.say("Good: the lost bookings are back, and the next timer run continues from the unchanged watermark. "
          "Everything since this morning is still uncommitted in your working tree.")
    s.user("Let's get it committed. But first, change the timer after all, the units are in deploy/: no runs "
           "between 02:00 and 02:30.")
    s.act(read("deploy/harbor-sync.timer"), read("deploy/harbor-sync.service"))
    s.act(edit("deploy/harbor-sync.timer", "OnCalendar=*:0/15\n",
               "# every 15 minutes, except during the partner's maintenance window (02:00-02:30 Europe/Berlin)\n"
               "OnCalendar=*-*-* 00,01,03..23:0/15 Europe/Berlin\n"
               "OnCalendar=*-*-* 02:30,45 Europe/Berlin\n"),
          text="Two `OnCalendar` lines: every quarter hour except in hour 2, plus 02:30 and 02:45.")
    s.act(bash("systemd-analyze calendar --iterations=7 '*-*-* 00,01,03..23:0/15 Europe/Berlin' '*-*-* 02:30,45 Europe/Berlin' "
               "--base-time='2026-02-04 01:20 Europe/Berlin' | grep -E 'Original|Iteration|Next'",
               "  Original form: *-*-* 00,01,03..23:0/15 Europe/Berlin\n"
               "    Next elapse: Wed 2026-02-04 01:30:00 CET\n       Iter. #2: Wed 2026-02-04 01:45:00 CET\n"
               "       Iter. #3: Wed 2026-02-04 03:00:00 CET\n       Iter. #4: Wed 2026-02-04 03:15:00 CET\n"
               "       Iter. #5: Wed 2026-02-04 03:30:00 CET\n       Iter. #6: Wed 2026-02-04 03:45:00 CET\n"
               "       Iter. #7: Wed 2026-02-04 04:00:00 CET\n"
               "  Original form: *-*-* 02:30,45 Europe/Berlin\n"
               "    Next elapse: Wed 2026-02-04 02:30:00 CET\n       Iter. #2: Wed 2026-02-04 02:45:00 CET\n"
               "       Iter. #3: Thu 2026-02-05 02:30:00 CET\n       Iter. #4: Thu 2026-02-05 02:45:00 CET\n"
               "       Iter. #5: Fri 2026-02-06 02:30:00 CET\n       Iter. #6: Fri 2026-02-06 02:45:00 CET\n"
               "       Iter. #7: Sat 2026-02-07 02:30:00 CET\n"))
    s.say("The timer has no runs at 02:00 and 02:15 any more and resumes at 02:30 (checked with `systemd-analyze "
          "calendar`: 01:30, 01:45, then 02:30, 02:45, 03:00). After deploying: `systemctl daemon-reload && "
          "systemctl restart harbor-sync.timer`.\n\nOne consequence: the gap from 01:45 to 02:30 is exactly the "
          "45 minutes of `status`, and with the timer's randomized delay a check just before 02:30 could go "
          "CRITICAL every night. I'd raise `MAX_AGE` to 50 minutes.")
    s.user("Good catch. Make it 50.")
    s.act(edit("src/harbor_sync/status.py", "MAX_AGE = timedelta(minutes=45)  # two missed 15-minute runs plus slack",
               "MAX_AGE = timedelta(minutes=50)  # covers the 45-minute maintenance gap (01:45 -> 02:30) plus slack"),
          edit("tests/test_status.py", '''    text, code = render_status(NOW, NOW - timedelta(minutes=50), None, [])
    assert code == 1
    assert text.splitlines()[0] == "CRITICAL last successful sync 50 min ago (limit 45 min)"''',
               '''    text, code = render_status(NOW, NOW - timedelta(minutes=55), None, [])
    assert code == 1
    assert text.splitlines()[0] == "CRITICAL last successful sync 55 min ago (limit 50 min)"


def test_maintenance_gap_is_ok():
    # last run 01:45, checked at 02:29:59 just before the 02:30 run
    _, code = render_status(NOW, NOW - timedelta(minutes=44, seconds=59), None, [])
    assert code == 0'''))
    unit_status = unit_status[:2] + ["tests/test_status.py::test_maintenance_gap_is_ok"] + unit_status[2:]
    unit = (models_names + unit_scan + unit_cli + unit_client + unit_config + unit_redact + unit_retry
            + unit_status + unit_sync3)
    s.act(run_pytest('uv run pytest -q -m "not integration"', unit, seconds=1.12, deselected=HS_INTEGRATION + 3, rootdir=rootdir))
    s.say(f"`MAX_AGE` is 50 minutes now, with a test for a check just before the 02:30 run; {len(unit)} unit tests pass.")


    s.user("Write a short docs/runbook.md for whoever is on call: what a CRITICAL from `status` means and what to do, "
           "how to run a backfill, how to rotate the token. One page.")
    runbook = '''# harbor-sync runbook (on call)

## `harbor-sync status` is CRITICAL

The last successful sync is older than 50 minutes. Bookings in our database are getting stale;
the harbour office and the night watch may see outdated berth assignments.

1. `journalctl -u harbor-sync -n 50 --no-pager` on ops-2: what did the last runs say?
2. `partner API returned 401`: the token is invalid or expired. See *Rotate the token*.
3. `returned 503` or connection errors: the partner is down. Check their status page; the runs
   retry on their own and catch up completely once the partner is back. Nothing to do.
4. Anything else (a traceback from our code): leave the timer running and call Dana.

A failed run never loses data: the next successful run fetches everything since the last
complete one.

## Backfill

Needed only if bookings were skipped by a bug. Safe while the timer runs.

```sh
sudo -u harbor /opt/harbor-sync/.venv/bin/harbor-sync backfill --since 2025-08-18 --dry-run | tail
sudo -u harbor /opt/harbor-sync/.venv/bin/harbor-sync backfill --since 2025-08-18
```

## Rotate the token

The partner rotates it quarterly (next: before 2026-03-31).

1. Get the new token from the partner portal; store it with `pass insert quayline/live`.
2. ...
'''
    s.act(bash("ls docs && grep -n 'EnvironmentFile\\|ExecStart' deploy/harbor-sync.service",
               "partner-api.md\nsamples\n10:EnvironmentFile=/etc/harbor-sync/env\n11:ExecStart=/opt/harbor-sync/.venv/bin/harbor-sync run\n"))
    s.act(write("docs/runbook.md", runbook.replace("2. ...\n", "2. Put it into the service environment and restart the timer.\n"
                                                   "3. Check: `harbor-sync status` after the next run.\n")))
    s.say("`docs/runbook.md` covers the three cases in one page: what CRITICAL means with a short decision list "
          "(401, 503, our own bug), the backfill with a dry run first, and token rotation.")
    s.user("Good, but the on-call people don't have pass, and the rotation section is vague. The token for ops-2 "
           "lives in /etc/harbor-sync/env (root only). Rotating means editing that file; nothing needs a restart "
           "because each run is a new process.")
    s.act(edit("docs/runbook.md", '''1. Get the new token from the partner portal; store it with `pass insert quayline/live`.
2. Put it into the service environment and restart the timer.
3. Check: `harbor-sync status` after the next run.
''', '''1. Get the new token from the partner portal (Dana or the harbour master have access).
2. `sudoedit /etc/harbor-sync/env` on ops-2 and replace the value of `HARBOR_API_TOKEN=`.
   Nothing needs a restart: every run is a new process and reads the file.
3. Start one run now and look at it:
   `sudo systemctl start harbor-sync.service && journalctl -u harbor-sync -n 5 --no-pager`
4. Never paste the token into a ticket, a chat or this repository.
'''))
    s.say("Fixed: the rotation is now four concrete steps on ops-2 (`sudoedit /etc/harbor-sync/env`, no restart, "
          "one manual run to check), and nothing in the runbook assumes `pass`.")
    s.wait_until("2026-02-03T15:23:40")
    s.user("By the way, I rotated the token with the partner ten minutes ago.")
    s.say("Then production is failing right now, I'm afraid: ops-2 still runs 0.7.2, and 0.7.2 has the *old* token "
          "hard-coded in `config.py`. It ignores `/etc/harbor-sync/env` for the token, so every run since the "
          "rotation gets a 401. Can you check the journal on ops-2?",
          thinking="0.7.2's load_settings doesn't read HARBOR_API_TOKEN at all; Settings.api_token defaults to the "
                   "constant. Rotation invalidated it. The 45-minute alert doesn't exist yet either (status is new). "
                   "Fastest fix: deploy 0.8.0 with the new token in /etc/harbor-sync/env.")
    s.shell("ssh ops-2 journalctl -u harbor-sync -n 6 --no-pager -o cat",
            "Starting harbor-sync.service - Sync marina bookings...\n"
            "2026-02-03 16:15:01,904 INFO httpx HTTP Request: GET https://api.quayline.example/v2/marinas/"
            "mar_kiel_sporthafen/bookings?updated_since=2026-02-03T15%3A12%3A40.118240%2B00%3A00&limit=100 "
            "\"HTTP/1.1 401 Unauthorized\"\n"
            "2026-02-03 16:15:01,905 ERROR harbor_sync partner API returned 401: {\"error\":\"invalid_token\","
            "\"message\":\"token has been revoked\"}\n"
            "harbor-sync.service: Main process exited, code=exited, status=1/FAILURE\n"
            "harbor-sync.service: Failed with result 'exit-code'.\n"
            "Failed to start harbor-sync.service - Sync marina bookings.\n")
    s.user("Yep, 401s since 16:15. Nothing is lost though, right? Let's commit now and I deploy 0.8.0 right after.")
    s.say("Nothing is lost: the failed runs didn't move the watermark (even 0.7.2 only moves it after a page was "
          "stored), so the first run of 0.8.0 fetches everything since 16:12. For the deploy: put the new token "
          "into `/etc/harbor-sync/env` *before* the first 0.8.0 run, then `harbor-sync migrate` (creates "
          "`sync_runs`), then reload the timer units. Committing now.")

    # ------------------------------------------------------------------ 7. wrap-up
    s.user("Quickly then: changelog and README, version 0.8.0, ruff, mypy and the unit tests, then show me the "
           "diff stat.")
    s.act(read("CHANGELOG.md"), read("README.md"), read("pyproject.toml", offset=1, limit=12))
    s.act(edit("CHANGELOG.md", "# Changelog\n\n", '''# Changelog

## 0.8.0 (unreleased)
- **Fix: bookings were lost.** Since 0.7.0 every run stopped after the first page (the client read
  `cursor`, the API sends `next_cursor`), and the watermark moved per page although the API orders
  by booking id. Runs now follow all pages and move the watermark once, after a complete run.
- `harbor-sync backfill --since YYYY-MM-DD [--dry-run]` re-syncs everything changed since a date
  without touching the watermark (done in production on 2026-02-03: 24,871 bookings).
- `harbor-sync status` for monitoring: exit 1 if the last successful run is older than 50 minutes;
  also lists today's and tomorrow's arrivals per pier. Run `harbor-sync migrate` once (new table
  `sync_runs`).
- Settings come from `HARBOR_*` environment variables; `HARBOR_API_TOKEN` is required (the token
  in `config.py` is gone and has been rotated). See `.env.example`. Token-shaped strings are masked
  in all log output.
- Retries with exponential backoff and jitter for 429, 502-504 and connection errors;
  `Retry-After` is honoured.
- New booking status `waitlisted` (not active). Unknown statuses still stop a run.
- Pre-commit hook `scripts/check_secrets.py` refuses partner tokens and private keys.
- `docs/runbook.md` for whoever is on call; the timer skips 02:00-02:30.
- `mypy --strict src` is clean (Protocols for the client and the store in `ports.py`).

'''),
          edit("README.md", '''uv sync
uv run pytest -m "not integration"   # unit tests''', '''uv sync
uv tool run pre-commit install        # once per clone: refuses commits containing tokens or keys
uv run pytest -m "not integration"   # unit tests'''),
          edit("README.md", '''uv run ruff check
```''', '''uv run ruff check
uv run mypy --strict src
```'''),
          edit("README.md", '''A systemd timer on `ops-2` starts `harbor-sync run` every 15 minutes.''',
               '''A systemd timer on `ops-2` starts `harbor-sync run` every 15 minutes (not between 02:00 and
02:30, the partner's maintenance window).'''),
          edit("README.md", '''Berths change rarely; `harbor-sync berths` refreshes them and runs nightly.
''', '''Berths change rarely; `harbor-sync berths` refreshes them and runs nightly.

The watermark only moves after a complete run, so a failed run is simply redone by the next one.
`harbor-sync backfill --since 2025-08-18` re-fetches everything changed since a date and leaves the
watermark alone; it is safe to run while the timer runs (an upsert never replaces a newer version).

`harbor-sync status` is what Icinga calls: it exits 1 when the last successful run is older than
50 minutes, and prints today's and tomorrow's arrivals per pier for the night watch.
'''),
          edit("pyproject.toml", 'version = "0.7.2"', 'version = "0.8.0"'),
          edit("src/harbor_sync/__init__.py", '__version__ = "0.7.2"', '__version__ = "0.8.0"'))
    long_help = next(l for l in s.fs[cl].split("\n") if "re-fetch all bookings" in l)
    unused_line = ln("tests/test_cli.py", "from harbor_sync.sync import run_backfill")
    s.act(bash("uv run ruff check --output-format concise",
               f"{cl}:{ln(cl, long_help)}:111: E501 Line too long ({len(long_help)} > 110)\n"
               f"tests/test_cli.py:{unused_line}:30: F401 [*] `harbor_sync.sync.run_backfill` imported but unused\n"
               "Found 2 errors.\n[*] 1 fixable with the `--fix` option.\n", code=1))
    s.act(edit(cl, long_help,
               '    p_backfill = sub.add_parser(\n        "backfill", help="re-fetch all bookings changed since a date; the watermark is left alone"\n    )'),
          edit("tests/test_cli.py", "from harbor_sync.sync import run_backfill\n", ""),
          text="Two leftovers of mine: a help text over the line limit, and an import in `test_cli.py` I ended up "
               "not using.")
    s.act(bash("uv run ruff check && uv run ruff format --check src tests scripts && uv run mypy --strict src",
               "All checks passed!\n25 files already formatted\nSuccess: no issues found in 11 source files\n"))
    s.act(run_pytest('uv run pytest -v -m "not integration"', unit, verbose=True, seconds=1.15,
                     deselected=HS_INTEGRATION + 3, rootdir=rootdir),
          bash("git status --short && git diff --stat", git_status(tracked, s.fs) + git_diff_stat(tracked, s.fs)))
    new_files = sorted(p for p in s.fs if p not in tracked)
    s.say(f"Version 0.8.0; changelog and README updated. ruff (two findings of mine fixed: a long help line and an "
          f"unused import), mypy and {len(unit)} unit tests are clean. The diff stat above covers the tracked files; "
          f"there are also {len(new_files)} new files: " + ", ".join(f"`{p}`" for p in new_files) + ".")
    s.user("Commit in two commits: first the pagination and watermark fix as \"fix(sync): follow next_cursor, move "
           "the watermark only after a complete run\", then everything else as \"feat: token from env, retries, "
           "backfill, status, secret scan\".")
    s.say("One snag: `client.py`, `sync.py` and `tests/test_sync.py` mix both commits (the client has the cursor "
          "fix and the retries; `sync.py` the watermark fix, the types, `mark_success` and the backfill). "
          "`git add -p` is interactive, which I can't drive. Two ways:\n\n"
          "1. I put fix-only versions of those files in place (exactly their state right after this morning's fix), "
          "commit them with the two client/sync test files, then restore the full files and commit the rest. Each "
          "commit then passes the unit tests on its own.\n"
          "2. Everything in one commit.\n\nI'd do 1.",
          thinking="Partial staging needed. The fix commit must not include cli.py or config.py changes. Reuse the "
                   "exact state after the morning's fix for client.py, sync.py, test_client.py, test_sync.py. "
                   "Verify by stashing everything unstaged, including untracked files such as retry.py.")
    s.user("1.")
    full = {p: s.fs[p] for p in fix_state}
    s.act(bash("mkdir -p /tmp/hs-split && cp --parents src/harbor_sync/client.py src/harbor_sync/sync.py "
               "tests/test_client.py tests/test_sync.py /tmp/hs-split/ && find /tmp/hs-split -type f | sort",
               "".join(f"/tmp/hs-split/{p}\n" for p in sorted(fix_state))),
          text="Saving the full versions first.")
    s.act(*(write(p, fix_state[p]) for p in sorted(fix_state)),
          text="Now the fix-only versions: `next_cursor` in the client, the single watermark write in `sync.py`, and "
               "the tests that came with them.")
    fix_tests = HS_TEST_MODELS_NAMES + unit_client + unit_sync
    s.act(bash("git add " + " ".join(sorted(fix_state)) + " && git stash push --keep-index --include-untracked -q && "
               "PYTHONDONTWRITEBYTECODE=1 uv run pytest -q -p no:cacheprovider -m 'not integration' ; "
               "git stash pop -q && git diff --cached --stat",
               pytest_output(fix_tests, seconds=0.87, deselected=HS_INTEGRATION)[0]
               + git_diff_stat(tracked, s.fs, sorted(fix_state))),
          thinking="Stash everything not staged (including untracked files), so the test run sees exactly the "
                   "commit's content. Then pop.")
    after_fix = {**tracked, **fix_state}
    s.act(bash('git commit -q -m "fix(sync): follow next_cursor, move the watermark only after a complete run" && '
               "cp -r /tmp/hs-split/src /tmp/hs-split/tests . && git add -A && git status --short",
               git_status(after_fix, {**s.fs, **full}, staged=True), files=full),
          text="The fix-only state passes on its own. Committing it, then restoring the full files:")
    s.act(run_pytest("PYTHONDONTWRITEBYTECODE=1 uv run pytest -q -p no:cacheprovider -m 'not integration'", unit,
                     seconds=1.14, deselected=HS_INTEGRATION + 3),
          bash("git diff --cached --name-only | xargs uv run python scripts/check_secrets.py && "
               'git commit -q -m "feat: token from env, retries, backfill, status, secret scan" && git log --oneline -3 && '
               "git status --short && rm -rf /tmp/hs-split",
               "9f4c2e1 (HEAD -> main) feat: token from env, retries, backfill, status, secret scan\n"
               "d37a8b5 fix(sync): follow next_cursor, move the watermark only after a complete run\n"
               "a81c3f0 (origin/main) Store guests per booking\n"))
    final = s.say("Two commits on `main`, nothing pushed:\n\n"
                  "- `d37a8b5` fix(sync): follow next_cursor, move the watermark only after a complete run "
                  "(client.py, sync.py and their tests only; passes the unit tests on its own)\n"
                  "- `9f4c2e1` feat: token from env, retries, backfill, status, secret scan (the secret-scan hook "
                  "ran on it and passed)\n\n"
                  "The working tree is clean. For the deploy, in this order: new token into "
                  "`/etc/harbor-sync/env`, deploy 0.8.0, `harbor-sync migrate`, `systemctl daemon-reload && "
                  "systemctl restart harbor-sync.timer`, one manual run. Later: point Icinga at `harbor-sync "
                  "status` and run the new integration tests from the office.")
    s.label(final, "ready-for-review")
    return s


# ===================================================================================================
# main
# ===================================================================================================

SESSIONS = [
    ("tidewatch-units.jsonl", session_tidewatch),
    ("budgetbox-duckdb.jsonl", session_budgetbox),
    ("harbor-sync-long.jsonl", session_harbor_sync),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: examples/sessions)")
    parser.add_argument("--quiet", action="store_true", help="print nothing")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, build in SESSIONS:
        session = build()
        text = "\n".join(session.lines()) + "\n"
        (args.out / name).write_text(text, encoding="utf-8")
        if not args.quiet:
            leaves = {e["id"] for e in session.entries} - {e["parentId"] for e in session.entries}
            print(f"{name}: {len(session.entries)} entries, {len(leaves)} leaves, "
                  f"{session.source_tokens()} source tokens (chars/4), {len(text.encode()) // 1024} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
