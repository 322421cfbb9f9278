"""A scripted model for pipeline tests and benchmarks: answers each worker's prompt with a valid tool
call built from the prompt itself (its clean receipt ends the stage), and a plain-text "done" when it
is asked again with the receipt (the ``agentClosingTurn`` loop)."""

from __future__ import annotations

import hashlib
import re
import threading

from fake_openai import Reply, text, tool_call

from om_core.workers import prompts

_CHUNK = re.compile(r"^## New entries \((\S+) to (\S+)\)$", re.MULTILINE)
_FIRST_STAMP = re.compile(r"^=== (\d{4}-\d{2}-\d{2}) ===\n\n\[\S+ [^\]\n]*?(\d{2}:\d{2})\]", re.MULTILINE)
_OBSERVATION = re.compile(r"^\[([0-9a-f]{12})\] \d{4}-\d{2}-\d{2} \d{2}:\d{2} \[", re.MULTILINE)
_COVERED = re.compile(r"^(?:strong|partial): (.+)$", re.MULTILINE)


def stage_key(body: dict) -> str:
    """The identity of a stage's input: its system prompt and first user message."""
    messages = body["messages"]
    return hashlib.sha256((messages[0]["content"] + "\x00" + messages[1]["content"]).encode()).hexdigest()[:16]


_TASK = re.compile(r"^## Task: (observe|reflect|drop reflections|drop)$", re.MULTILINE)
_CANDIDATE = re.compile(r"^([0-9a-f]{12}) last evidence ", re.MULTILINE)
_DROPPED = re.compile(r"^## Dropped since\n(.+)$", re.MULTILINE)


def user_text(body: dict) -> str:
    content = body["messages"][1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


_SESSION_REFLECTION = re.compile(r"^\[([0-9a-f]{12})\] reflection: (.+)$", re.MULTILINE)


def stage_of(body: dict) -> str:
    """The worker a request is from, by its task (the three share their system prompt and tools), or
    the project stage (a system prompt of its own)."""
    from om_core.project.distil import PROJECT_SYSTEM

    if body["messages"][0]["content"] == PROJECT_SYSTEM:
        return "project"
    assert body["messages"][0]["content"] == prompts.WORKER_SYSTEM
    return {"observe": "observer", "reflect": "reflector", "drop": "dropper",
            "drop reflections": "reflection-dropper"}[_TASK.search(user_text(body)).group(1)]


class ScriptedWorkers:
    """A responder for FakeOpenAI. ``fail_every`` injects an HTTP 429 on every n-th request, but never
    on more than ``MAX_FAILS_IN_A_ROW`` requests of one stage in a row, so a stage always succeeds
    within the retries the tests give it (otherwise concurrent stages could, rarely, exhaust them)."""

    MAX_FAILS_IN_A_ROW = 2

    def __init__(self, fail_every: int = 0, delay: float = 0.0) -> None:
        self.fail_every = fail_every
        self.delay = delay
        self.count = 0
        self.lock = threading.Lock()
        self.completed: set[str] = set()  # stage keys answered (computed: every answer is accepted in full)
        self.answered: list[str] = []  # stage key of every successful answer, in order
        self.asked_after_completion: list[str] = []  # stage keys asked again once computed
        self.failed = 0
        self.fails_in_a_row: dict[str, int] = {}

    def __call__(self, body: dict) -> Reply:
        key = stage_key(body)
        with self.lock:
            self.count += 1
            fail = (self.fail_every and self.count % self.fail_every == 0
                    and self.fails_in_a_row.get(key, 0) < self.MAX_FAILS_IN_A_ROW)
            self.fails_in_a_row[key] = self.fails_in_a_row.get(key, 0) + 1 if fail else 0
            if fail:
                self.failed += 1
        if fail:
            return Reply(status=429, delay=self.delay,
                         error_body={"error": {"message": "rate limited", "type": "rate_limit_error"}})
        messages = body["messages"]
        if messages[-1]["role"] == "tool":  # the closing turn, only asked with agentClosingTurn
            reply = text("done")
        else:
            with self.lock:
                if key in self.completed:
                    self.asked_after_completion.append(key)
            reply = self._first_turn(body)
            with self.lock:
                self.completed.add(key)
        reply.delay = self.delay
        with self.lock:
            self.answered.append(key)
        return reply

    def _first_turn(self, body: dict) -> Reply:
        stage = stage_of(body)
        user = user_text(body)
        if stage == "observer":
            first, last = _CHUNK.search(user).groups()
            stamp = _FIRST_STAMP.search(user)
            return tool_call("record_observations", {"observations": [
                {"timestamp": f"{stamp.group(1)} {stamp.group(2)}" if stamp else "2026-01-15 14:00",
                 "content": f"Work happened between {first} and {last}.", "relevance": "medium",
                 "sourceEntryIds": list(dict.fromkeys([first, last]))}]})
        if stage == "project":  # one project reflection per session reflection shown (at most 4), citing it
            shown = _SESSION_REFLECTION.findall(user.split("## Task", 1)[-1])[:4]
            if not shown:
                return text("nothing here holds beyond its session")
            return tool_call("record_project_reflections", {"reflections": [
                {"content": f"Across sessions: {content}", "supportingIds": [rid]} for rid, content in shown]})
        if stage == "reflection-dropper":  # proposes every candidate: the check keeps the safest ones
            return tool_call("drop_reflections", {"ids": _CANDIDATE.findall(user), "reason": "superseded"})
        dropped = {i.strip() for line in _DROPPED.findall(user) for i in line.split(",")}
        active = [obs_id for obs_id in _OBSERVATION.findall(user) if obs_id not in dropped]
        covered = {i.strip() for line in _COVERED.findall(user) for i in line.split(",")}
        if stage == "reflector":
            uncovered = [obs_id for obs_id in active if obs_id not in covered][:2]
            if not uncovered:
                return text("nothing durable to add")
            return tool_call("record_reflections", {"reflections": [
                {"content": f"A durable point drawn from {' and '.join(uncovered)}.",
                 "supportingObservationIds": uncovered}]})
        return tool_call("drop_observations", {"ids": active[:2], "reason": "oldest"})
