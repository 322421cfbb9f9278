"""A thread-safe board of per-session progress that `om run` draws live (in-process runs only)."""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_sessions: dict[str, dict[str, Any]] = {}


def start(session_ids: list[str]) -> None:
    with _lock:
        _sessions.clear()
        for sid in session_ids:
            _sessions[sid] = {"session_id": sid, "state": "waiting", "position": 0, "of": 0, "stages": 0,
                              "compactions": 0, "failures": 0, "last": ""}


def update(event: dict[str, Any]) -> None:
    with _lock:
        row = _sessions.setdefault(event["session_id"], {"session_id": event["session_id"], "state": "running",
                                                         "position": 0, "of": 0, "stages": 0, "compactions": 0,
                                                         "failures": 0, "last": ""})
        if event.get("error"):
            row["state"], row["last"] = "error", event["error"][:80]
            return
        if event.get("done"):
            row["state"] = "done" if row["state"] != "error" else "error"
            return
        row["state"] = "running"
        row["position"], row["of"] = event.get("position", 0) + 1, event.get("of", 0)
        if event.get("stage") == "compaction":
            row["compactions"] += 1
        elif event.get("outcome") != "skipped":
            row["stages"] += 1
        if event.get("outcome") == "failed":
            row["failures"] += 1
        row["last"] = f"{event.get('stage')}: {event.get('outcome')}"


def snapshot() -> list[dict[str, Any]]:
    with _lock:
        return [dict(row) for row in _sessions.values()]
