"""Build small Pi sessions in code (v3 format unless asked otherwise), the way Pi appends them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any


def iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


class SessionBuilder:
    """Appends entries as children of the current leaf; ``go(id)`` moves the leaf (like /tree)."""

    def __init__(self, session_id: str = "11111111-2222-3333-4444-555555555555", *, version: int | None = 3,
                 start: str = "2026-01-15T14:00:00", cwd: str = "/home/dev/project", step_seconds: int = 60) -> None:
        self.session_id = session_id
        self.version = version
        self.clock = datetime.fromisoformat(start).replace(tzinfo=timezone.utc)
        self.step = timedelta(seconds=step_seconds)
        self.header: dict[str, Any] = {"type": "session", "id": session_id, "timestamp": iso(self.clock), "cwd": cwd}
        if version is not None:
            self.header["version"] = version
        self.entries: list[dict[str, Any]] = []
        self.leaf: str | None = None
        self._n = 0

    # -------------------------------------------------------------- plumbing

    def _tick(self) -> datetime:
        self.clock += self.step
        return self.clock

    def next_id(self) -> str:
        self._n += 1
        return f"{self._n:08x}"

    def append(self, entry: dict[str, Any], entry_id: str | None = None) -> str:
        ts = self._tick()
        entry_id = entry_id or self.next_id()
        full: dict[str, Any] = {"type": entry["type"]}
        if self.version is None or self.version >= 2:
            full.update({"id": entry_id, "parentId": self.leaf})
        full["timestamp"] = iso(ts)
        full.update({k: v for k, v in entry.items() if k != "type"})
        self.entries.append(full)
        self.leaf = entry_id
        return entry_id

    def go(self, entry_id: str | None) -> None:
        self.leaf = entry_id

    def ms(self) -> int:
        return int(self.clock.timestamp() * 1000)

    # -------------------------------------------------------------- messages

    def message(self, message: dict[str, Any]) -> str:
        message = {**message}
        message.setdefault("timestamp", int((self.clock + self.step).timestamp() * 1000))
        return self.append({"type": "message", "message": message})

    def user(self, text: str | list) -> str:
        content = [{"type": "text", "text": text}] if isinstance(text, str) else text
        return self.message({"role": "user", "content": content})

    def assistant(self, text: str | None = None, *, tool_calls: list[tuple[str, str, dict]] | None = None,
                  thinking: str | None = None, stop_reason: str | None = None, model: str = "claude-sonnet-4-5",
                  error: str | None = None) -> str:
        content: list[dict[str, Any]] = []
        if thinking is not None:
            content.append({"type": "thinking", "thinking": thinking, "thinkingSignature": "sig"})
        if text is not None:
            content.append({"type": "text", "text": text})
        for call_id, name, args in tool_calls or []:
            content.append({"type": "toolCall", "id": call_id, "name": name, "arguments": args})
        msg: dict[str, Any] = {
            "role": "assistant", "content": content, "api": "anthropic-messages", "provider": "anthropic",
            "model": model,
            "usage": {"input": 100, "output": 20, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 120,
                      "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
            "stopReason": stop_reason or ("toolUse" if tool_calls else "stop"),
        }
        if error:
            msg["errorMessage"] = error
        return self.message(msg)

    def tool_result(self, call_id: str, name: str, text: str, *, is_error: bool = False,
                    images: int = 0) -> str:
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        content += [{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}] * images
        return self.message({"role": "toolResult", "toolCallId": call_id, "toolName": name, "content": content,
                             "isError": is_error})

    def bash(self, command: str, output: str, exit_code: int = 0) -> str:
        return self.message({"role": "bashExecution", "command": command, "output": output, "exitCode": exit_code,
                             "cancelled": False, "truncated": False})

    def system(self, content: str = "You are Pi.") -> str:
        return self.message({"role": "system", "content": content, "sections": {"preamble": content}})

    # -------------------------------------------------------------- other entries

    def custom_message(self, custom_type: str, content: str | list, display: bool = True) -> str:
        return self.append({"type": "custom_message", "customType": custom_type, "content": content,
                            "display": display})

    def custom(self, custom_type: str, data: Any) -> str:
        return self.append({"type": "custom", "customType": custom_type, "data": data})

    def branch_summary(self, summary: str, from_id: str | None = None) -> str:
        return self.append({"type": "branch_summary", "fromId": from_id or self.leaf or "root", "summary": summary,
                            "fromHook": False})

    def compaction(self, summary: str, first_kept: str | None, tokens_before: int = 50_000,
                   details: Any = None, from_hook: bool = False) -> str:
        entry: dict[str, Any] = {"type": "compaction", "summary": summary, "firstKeptEntryId": first_kept,
                                 "tokensBefore": tokens_before, "fromHook": from_hook}
        if details is not None:
            entry["details"] = details
        return self.append(entry)

    def thinking_level(self, level: str) -> str:
        return self.append({"type": "thinking_level_change", "thinkingLevel": level})

    def model_change(self, provider: str = "anthropic", model_id: str = "claude-sonnet-4-5") -> str:
        return self.append({"type": "model_change", "provider": provider, "modelId": model_id})

    def label(self, target: str, label: str) -> str:
        return self.append({"type": "label", "targetId": target, "label": label})

    # -------------------------------------------------------------- output

    def work_turns(self, turns: int, topic: str) -> None:
        """``turns`` rounds of coding work: a request, a tool call, its result, and a closing answer."""
        for i in range(turns):
            self.user(f"Step {i} of the {topic} work: please handle the next part carefully and report back. " * 3)
            call = f"c{i}"
            self.assistant(f"Reading the {topic} module for step {i}.",
                           tool_calls=[(call, "read", {"path": f"src/{topic}_{i}.py"})])
            self.tool_result(call, "read", f"def {topic}_{i}():\n    return {i}\n" * 12)
            self.assistant(f"Done with step {i} of {topic}: the function returns {i} and the tests pass. " * 2)

    def lines(self) -> list[str]:
        return [json.dumps(self.header)] + [json.dumps(e, ensure_ascii=False) for e in self.entries]

    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text(), encoding="utf-8")
        return path


def incompressible_sessions(folder: Path, count: int = 20) -> list[Path]:
    """About 4 MB of text that does not compress (DuckDB compresses repeated text)."""
    import random

    paths = []
    for n in range(count):
        rng = random.Random(n)
        b = SessionBuilder(f"f{n:07x}-1111-2222-3333-444444444444")
        for i in range(200):
            words = " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
                             for _ in range(160))
            (b.user if i % 2 == 0 else b.assistant)(f"file {n} line {i} {words}")
        paths.append(b.write(folder / f"s{n:02d}.jsonl"))
    return paths
