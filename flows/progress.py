"""A thread-safe board of per-session progress that `om run` draws live (in-process runs only): each
session's file name beside its id, the run's elapsed time and an estimate of what is left."""

from __future__ import annotations

import threading
import time
from typing import Any

_lock = threading.Lock()
_sessions: dict[str, dict[str, Any]] = {}
_about: dict[str, dict[str, Any]] = {}  # session id -> {"file": name, "entries": count}, from the command
_clock: dict[str, float] = {}


def describe(about: dict[str, dict[str, Any]]) -> None:
    """What the command knows of the sessions before the run starts (file names, entry counts); the
    run's clock starts here, so the time Prefect takes to start counts as elapsed."""
    with _lock:
        _about.clear()
        _about.update(about)
        _clock["start"] = time.monotonic()


def start(session_ids: list[str]) -> None:
    with _lock:
        _sessions.clear()
        _clock.setdefault("start", time.monotonic())
        for sid in session_ids:
            _sessions[sid] = {"session_id": sid, "state": "waiting", "position": 0, "of": 0, "recorded": 0,
                              "calls": 0, "compactions": 0, "failures": 0, "last": ""}


def update(event: dict[str, Any]) -> None:
    with _lock:
        row = _sessions.setdefault(event["session_id"], {"session_id": event["session_id"], "state": "running",
                                                         "position": 0, "of": 0, "recorded": 0, "calls": 0,
                                                         "compactions": 0, "failures": 0, "last": ""})
        if event.get("error"):
            row["state"], row["last"] = "error", event["error"][:80]
            return
        if event.get("done"):
            row["state"] = "done" if row["state"] != "error" else "error"
            return
        row["state"] = "running"
        row["position"], row["of"] = event.get("position", 0) + 1, event.get("of", 0)
        # what a stage did, not that it was asked: most stage runs find their input answered before (an
        # empty result, a reflector whose ledger did not change) and call no model
        if event.get("stage") == "compaction":
            row["compactions"] += 1
        elif event.get("outcome") == "recorded":
            row["recorded"] += 1
        row["calls"] += int(event.get("calls") or 0)
        if event.get("outcome") == "failed":
            row["failures"] += 1
        row["last"] = f"{event.get('stage')}: {event.get('outcome')}"


def snapshot() -> list[dict[str, Any]]:
    with _lock:
        return [{**row, "file": _about.get(row["session_id"], {}).get("file")} for row in _sessions.values()]


def done_fraction(rows: list[dict[str, Any]]) -> float:
    """How much of the run is done: each session weighted by its entries (finished ones count whole,
    running ones by their position on the branch being replayed, waiting ones not at all)."""
    total = done = 0.0
    for row in rows:
        weight = max(1, int(_about.get(row["session_id"], {}).get("entries") or row["of"] or 1))
        total += weight
        if row["state"] in ("done", "error"):
            done += weight
        elif row["of"]:
            done += weight * min(1.0, row["position"] / row["of"])
    return done / total if total else 0.0


def timing(rows: list[dict[str, Any]], now: float | None = None) -> tuple[float, float | None]:
    """Seconds elapsed since the run started, and an estimate of the seconds left (None until a
    twentieth of the work is done: earlier, the rate says little)."""
    now = time.monotonic() if now is None else now
    with _lock:
        elapsed = now - _clock.get("start", now)
    fraction = done_fraction(rows)
    if fraction < 0.05 or elapsed <= 0:
        return elapsed, None
    return elapsed, elapsed * (1 - fraction) / fraction
