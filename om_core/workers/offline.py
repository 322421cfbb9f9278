"""The offline baseline: extractive workers that need no model and no API key.

It is a fallback, named as one: deterministic rules pick what a careful note-taker would keep, and
submit it through the same checks as a model's tool calls.

* observer: user assertions, requirements and corrections (critical/high), user questions
  (medium), other user requests (high), errors (high), finished work the assistant reports
  (medium), files the assistant touched (medium), failed requests (medium); a note the checks
  refuse as a changed state of an earlier one is submitted again naming it, "(supersedes [id])";
* reflector: user constraints that recur across observations, and files worked on again and again;
* dropper: proposes the safest candidates in SPEC §8's order and never an uncovered observation
  of high or critical relevance.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from typing import Any

from om_core.redaction.redact import redact_line, redact_payload

from om_core.workers.checks import DropCheck, ObservationCheck, ReflectionCheck
from om_core.workers.inputs import DropperInput, ObserverInput, ReflectorInput, SourceEntry
from om_core.workers.sentences import (CONJUNCTION, first_sentence, is_absolute, is_directive, one_line,
                                       sentences)
from om_core.workers.reflection_dropper import ReflectionDropCheck, ReflectionDropperInput, offline_reflection_drops
from om_core.workers.llm import LoopResult

OFFLINE_NAME = "offline"

_CORRECTION = re.compile(r"(?i)^(no[,.!]|nope|wrong|that'?s (not|wrong)|not (what|like) |actually\b|i said\b|"
                         r"stop\b|don'?t\b|do not\b|instead\b|undo\b|revert\b)|\b(that'?s wrong|you (missed|forgot|broke))\b")
_QUESTION = re.compile(r"(?i)^(what|why|how|when|where|which|who|can|could|should|would|is|are|does|do|did|will)\b")
_DONE = re.compile(r"(?i)\b(done|fixed|implemented|added|created|updated|removed|refactored|finished|completed|"
                   r"all (tests|checks) pass|tests? pass(es|ed)?|now works|works now|resolved)\b")
_ERROR_TEXT = re.compile(r"(?i)(traceback|\berror\b|exception|failed|cannot|not found|no such file|denied)")
_WRITE_TOOLS = {"edit": "edited", "write": "wrote", "multi_edit": "edited", "apply_patch": "patched"}


def _texts(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


def _observation(entry: SourceEntry, content: str, relevance: str, sources: list[str] | None = None) -> dict:
    return {"timestamp": entry.timestamp, "content": content, "relevance": relevance,
            "sourceEntryIds": sources or [entry.entry_id]}


def observe_entries(chunk: list[SourceEntry]) -> list[dict]:
    """The extractive observer's proposals for one chunk."""
    out: list[dict] = []
    touched: dict[str, list[tuple[SourceEntry, str]]] = defaultdict(list)
    for entry in chunk:
        message = entry.message()
        role = entry.role
        if entry.entry_type == "branch_summary":
            summary = entry.obj.get("summary")
            if isinstance(summary, str) and summary.strip():
                out.append(_observation(entry, "Returned from another branch of the conversation: "
                                        + first_sentence(summary), "medium"))
            continue
        if entry.entry_type == "custom_message":
            text = _texts(entry.obj.get("content"))
            if text.strip():
                out.append(_observation(entry, f"Extension note ({entry.obj.get('customType', 'custom')}): "
                                        + first_sentence(text), "low"))
            continue
        if role == "user":
            text = _texts(message.get("content")).strip()
            if not text or text.startswith("/"):
                continue
            if _CORRECTION.search(text):
                out.append(_observation(entry, "User corrected the assistant: " + one_line(text), "critical"))
            elif any(is_directive(sentence) for sentence in sentences(text)):
                out.append(_observation(entry, "User required: " + one_line(text), "critical"))
            elif text.rstrip().endswith("?") or _QUESTION.match(text):
                out.append(_observation(entry, "User asked: " + one_line(text), "medium"))
            else:
                out.append(_observation(entry, "User requested: " + one_line(text), "high"))
        elif role == "assistant":
            stop = message.get("stopReason")
            content = message.get("content") if isinstance(message.get("content"), list) else []
            for block in content:
                if isinstance(block, dict) and block.get("type") == "toolCall":
                    verb = _WRITE_TOOLS.get(str(block.get("name")))
                    args = block.get("arguments") if isinstance(block.get("arguments"), dict) else {}
                    path = args.get("path") or args.get("file_path")
                    if verb and isinstance(path, str):
                        touched[path].append((entry, verb))
            if stop == "error" and message.get("errorMessage"):
                out.append(_observation(entry, "Assistant request failed: " + one_line(str(message["errorMessage"]), 200),
                                        "medium"))
            elif stop == "stop":
                text = _texts([b for b in content if isinstance(b, dict) and b.get("type") == "text"]).strip()
                if text and _DONE.search(text):
                    out.append(_observation(entry, "Assistant reported: " + first_sentence(text), "medium"))
        elif role == "toolResult" and message.get("isError"):
            lines = [line for line in _texts(message.get("content")).splitlines() if line.strip()]
            # the line that names the error, else the last one (build tools print banners first)
            telling = next((line for line in lines if _ERROR_TEXT.search(line)), lines[-1] if lines else "(no output)")
            out.append(_observation(entry, f"Tool {message.get('toolName', 'call')} failed: {one_line(telling, 240)}",
                                    "high"))
        elif role == "bashExecution":
            code = message.get("exitCode")
            command = one_line(str(message.get("command", "")), 160)
            if message.get("cancelled"):
                out.append(_observation(entry, f"User ran `{command}`; it was cancelled", "low"))
            elif code not in (None, 0):
                tail = next((line for line in reversed(str(message.get("output", "")).splitlines()) if line.strip()), "")
                out.append(_observation(entry, f"User ran `{command}`; it failed with exit code {code}: "
                                        + one_line(tail, 200), "high"))
            else:
                out.append(_observation(entry, f"User ran `{command}` (exit code 0)", "medium"))
    for path, uses in touched.items():
        verbs = Counter(verb for _, verb in uses)
        how = ", ".join(f"{verb} {n} time{'s' if n > 1 else ''}" for verb, n in sorted(verbs.items()))
        sources = list(dict.fromkeys(e.entry_id for e, _ in uses))
        out.append(_observation(uses[-1][0], f"Assistant modified {path} ({how})", "medium", sources))
    out.sort(key=lambda o: o["timestamp"])  # stable: chronological, file lists at their last edit
    return out


_IDENTIFIER = re.compile(r"`[^`]{2,60}`|@?[\w.\-]*[/_.][\w./\-]+|\b[a-z]+[A-Z]\w*|\b[A-Z][a-z]+[A-Z]\w*")


def _constraint_sentences(text: str) -> list[str]:
    """The directives among the text's sentences; one still opening with a conjunction had no sentence
    before it to join, so it is left out (its antecedent is elsewhere)."""
    return [one_line(sentence, 300) for sentence in sentences(text)
            if is_directive(sentence) and not CONJUNCTION.match(sentence)]


def _identifiers(text: str) -> set[str]:
    return {m.group().strip("`@").rstrip(".").lower() for m in _IDENTIFIER.finditer(text) if len(m.group()) > 3}


def reflect_observations(inp: ReflectorInput) -> list[dict]:
    """Standing user constraints (absolute ones, and ones about a subject the user returns to), and
    files the work keeps returning to."""
    proposals: list[dict] = []
    users = [c.observation for c in inp.covered
             if c.observation.content.startswith(("User required:", "User corrected the assistant:"))]
    by_subject: dict[str, list[tuple[object, str]]] = defaultdict(list)
    for obs in users:
        said = obs.content.split(":", 1)[1]
        for sentence in _constraint_sentences(said):
            if is_absolute(sentence):
                proposals.append({"content": f"Standing user constraint: {sentence}",
                                  "supportingObservationIds": [obs.id]})
            for subject in _identifiers(sentence):
                by_subject[subject].append((obs, sentence))
    for subject, said in sorted(by_subject.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        ids = list(dict.fromkeys(o.id for o, _ in said))
        if len(ids) >= 2:
            proposals.append({"content": one_line(f"User keeps steering on {subject}: {said[0][1]}", 400),
                              "supportingObservationIds": ids})
    files: dict[str, list[str]] = defaultdict(list)
    for c in inp.covered:
        match = re.match(r"Assistant modified (\S+) \(", c.observation.content)
        if match:
            files[match.group(1)].append(c.observation.id)
    for path, ids in sorted(files.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:3]:
        if len(ids) >= 3:
            proposals.append({"content": f"The work keeps returning to {path}.", "supportingObservationIds": ids})
    return proposals[:12]


def drop_candidates(inp: DropperInput, check: DropCheck) -> list[str]:
    """SPEC §8's safety order, without uncovered high or critical observations."""
    safe = [obs_id for obs_id, c in inp.active.items()
            if not (c.coverage == "none" and c.observation.relevance in ("high", "critical"))]
    return sorted(safe, key=check.safety_key)[: inp.max_drops]


def _redact_value(text: str) -> str:
    """Most strings of an entry are short and recur (roles, types, names, paths: three in four calls
    on the real sessions), so they go through the cached ``redact_line``; long texts (an entry seen
    again as the next stage's context) through ``redact_payload``, bounded by the characters it keeps."""
    return redact_line(text) if len(text) <= _CACHED_LENGTH else redact_payload(text)


_CACHED_LENGTH = 256


def redact_strings(value: Any) -> Any:
    """``value`` (parsed JSON) with every string redacted; iterative, since entries can nest
    deeper than Python's recursion limit."""
    if isinstance(value, str):
        return _redact_value(value)
    if not isinstance(value, (dict, list)):
        return value
    out: dict | list = {} if isinstance(value, dict) else []
    stack = [(value, out)]
    while stack:
        src, dst = stack.pop()
        for key, item in (src.items() if isinstance(src, dict) else enumerate(src)):
            if isinstance(item, (dict, list)):
                child: Any = {} if isinstance(item, dict) else []
                stack.append((item, child))
            else:
                child = _redact_value(item) if isinstance(item, str) else item
            if isinstance(dst, dict):
                dst[key] = child
            else:
                dst.append(child)
    return out


class OfflineBrain:
    """The extractive baseline, used when no model is configured (or by the name ``offline``).

    Its observations quote the session, and they reach compaction summaries (which Pi sends to its
    model), so it reads redacted entries and observations: a secret is cut out whole before any
    excerpt could cut it in half."""

    offline = True
    name = OFFLINE_NAME

    def __init__(self, redact_secrets: bool = True) -> None:
        self.redact_secrets = redact_secrets
        self.calls: list = []  # it calls no model

    def observe(self, inp: ObserverInput, check: ObservationCheck) -> LoopResult:
        chunk = inp.chunk
        if self.redact_secrets:
            chunk = [dataclasses.replace(e, obj=redact_strings(e.obj)) for e in chunk]
        receipts = [check.submit({"observations": observe_entries(chunk)})]
        if check.changed_states:  # a changed state of an earlier note: say which note it replaces
            receipts.append(check.submit({"observations": [
                {**item, "content": f"{item['content']} (supersedes [{note_id}])"}
                for item, note_id in check.changed_states]}))
        return LoopResult(turns=0, finished=True, receipts=receipts)

    def reflect(self, inp: ReflectorInput, check: ReflectionCheck) -> LoopResult:
        if self.redact_secrets:
            inp = dataclasses.replace(inp, covered=[c.model_copy(update={"observation": c.observation.model_copy(
                update={"content": _redact_value(c.observation.content)})}) for c in inp.covered])
        return LoopResult(turns=0, finished=True, receipts=[check.submit({"reflections": reflect_observations(inp)})])

    def drop(self, inp: DropperInput, check: DropCheck) -> LoopResult:
        return LoopResult(turns=0, finished=True,
                          receipts=[check.submit({"ids": drop_candidates(inp, check), "reason": "offline safety order"})])

    def drop_reflections(self, inp: ReflectionDropperInput, check: ReflectionDropCheck) -> LoopResult:
        """The named fallback: the safest candidates by the check's own rank, no judgement of content."""
        return LoopResult(turns=0, finished=True, receipts=[check.submit(
            {"ids": offline_reflection_drops(inp), "reason": "offline fallback: orphan-free, oldest evidence first"})])
