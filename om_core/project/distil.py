"""What the project stage asks and what it accepts: its prompt and tool (our own words), the
check of each tool call, and the offline baseline (extractive, no model; a fallback, named as one).
``om_core.project.stage`` reads the stage's input and runs and records it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from om_core.ledger.records import memory_id, memory_references
from om_core.memory.project_memory import ProjectReflection, Retirement
from om_core.workers.checks import MAX_CONTENT_CHARS, pi_token_counter
from om_core.workers.near_duplicates import NearDuplicates, normalised_words

if TYPE_CHECKING:
    from om_core.project.stage import ProjectInput

# ---------------------------------------------------------------- the prompt (our own words)

PROJECT_SYSTEM = """\
You keep the memory of a software project across the coding sessions that worked in it. Each \
session between a user and an AI coding agent kept its own memory: dated observations and durable \
reflections. From them you distil project reflections: what an agent starting a new session in this \
repository should know before its first step. Code, not you, makes ids, counts tokens and checks \
every item.

"## Project memory" lists the current project reflections, one per line: \
`[id] content (supports: id, ...)`. "## New session memory" lists what the project's sessions \
recorded since you last read them, under one heading per session: its reflections \
`[id] reflection: content` and its critical observations `[id] YYYY-MM-DD HH:MM [critical] content`.

Record (record_project_reflections) only what holds beyond one session:
- the user's standing preferences, rules and constraints for this repository, in their terms;
- lasting facts about the project: its layout, architecture, commands, tools and versions, with \
exact identifiers copied as written (paths, names, flags, error text);
- decisions that still hold, with their reasons; a pitfall met again, with its fix.
Leave out one session's task, progress or open requests, guesses, and what the project memory \
already says. Each project reflection is one line of plain prose that stands on its own, and cites \
in supportingIds the ids of the session memory lines it rests on: ids from "## New session \
memory", or the supports of a project reflection it replaces. When new session memory changes what \
a project reflection says, write the replacement and name the old one in its content: \
"(supersedes [id])"; the old one is then retired. Retire (retire, with a short reason) a project \
reflection the new memory shows to be no longer true.

Most calls add few project reflections or none. To record nothing, answer in a few words without \
calling the tool. Each tool call gets a receipt; one that rejects an item gives you another turn: \
send only the corrected items."""

RECORD_PROJECT_REFLECTIONS_TOOL = (
    "record_project_reflections",
    "Record project reflections, each citing the session memory ids it rests on; retire outdated ones.",
    {"type": "object", "properties": {
        "reflections": {"type": "array", "items": {
            "type": "object",
            "properties": {"content": {"type": "string", "description": "One line"},
                           "supportingIds": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
            "required": ["content", "supportingIds"]}},
        "retire": {"type": "array", "items": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "reason": {"type": "string"}},
            "required": ["id", "reason"]}}},
     "required": ["reflections"]},
)


# ---------------------------------------------------------------- the check


class _Rejected(Exception):
    pass


_SUPERSEDES = re.compile(r"\s*\(supersedes(?: \[[0-9a-f]{12}\],?)+\)\s*$")


@dataclass
class ProjectCheck:
    """Checks one tool call of the project stage: accepted reflections (ids made here, support only
    from this project's sessions) and retirements (of current project reflections)."""

    tool = RECORD_PROJECT_REFLECTIONS_TOOL[0]
    allowed: set[str]
    held: dict[str, set[str]]
    memory: list[ProjectReflection]
    count_tokens: Any = pi_token_counter
    accepted: list[ProjectReflection] = field(default_factory=list)
    retired: list[Retirement] = field(default_factory=list)
    duplicates: int = 0
    rejected: int = 0

    def __post_init__(self) -> None:
        self._current = {r.id: r for r in self.memory}
        self._similar = NearDuplicates(((r.id, r.content, r.supportingIds) for r in self.memory),
                                       ids=self.allowed | set(self.held) | set(self._current))

    @property
    def problems(self) -> int:
        return self.rejected

    def submit(self, args: Any) -> str:
        if not isinstance(args, dict) or not isinstance(args.get("reflections", []), list) \
                or not isinstance(args.get("retire", []), list):
            self.rejected += 1
            return 'rejected: expected {"reflections": [...], "retire": [...]}'
        lines = []
        for n, item in enumerate(args.get("reflections") or [], start=1):
            lines.append(f"{n}. {self._one(item)}")
        for item in args.get("retire") or []:
            lines.append(f"retire: {self._retire(item)}")
        return f"{self.tool} receipt:\n" + ("\n".join(lines) if lines else "(nothing given)")

    def _one(self, item: Any) -> str:
        try:
            return self._accept(item)
        except _Rejected as exc:
            self.rejected += 1
            return f"rejected: {exc}"

    def _accept(self, item: Any) -> str:
        if not isinstance(item, dict) or not isinstance(item.get("content"), str) or not item["content"].strip():
            raise _Rejected("content must be non-empty text")
        content = item["content"].strip()
        if "\n" in content or "\r" in content:
            raise _Rejected("content must be a single line")
        if len(content) > MAX_CONTENT_CHARS:
            content = content[:MAX_CONTENT_CHARS] + " [… truncated]"
        support = item.get("supportingIds")
        if not isinstance(support, list) or not support or not all(isinstance(s, str) and s for s in support):
            raise _Rejected("supportingIds must be a non-empty list of session memory ids")
        support = list(dict.fromkeys(support))
        outside = [s for s in support if s not in self.allowed]
        if outside:
            elsewhere = [s for s in outside if s in self.held]
            hint = (" (they are this project's, but neither new nor cited by a current project reflection)"
                    if elsewhere else "")
            raise _Rejected(f"supportingIds {', '.join(outside)} are not session memory ids of this input{hint}")
        named = memory_references(content)
        unknown = [i for i in named if i not in self._current]
        if unknown:
            raise _Rejected(f"content names [{'], ['.join(unknown)}], which is no current project reflection")
        refl_id = memory_id(content)
        if refl_id in self._current or any(a.id == refl_id for a in self.accepted):
            self.duplicates += 1
            return f"duplicate [{refl_id}]: this project reflection exists, skipped"
        plain = _SUPERSEDES.sub("", content)
        earlier = self._similar.of(plain, support)
        if earlier is not None and earlier not in named:
            self.duplicates += 1
            return f"duplicate [{refl_id}]: nearly the same as project reflection [{earlier}], skipped"
        self.accepted.append(ProjectReflection(id=refl_id, content=content, supportingIds=support,
                                               tokenCount=self.count_tokens(content)))
        self._similar.add(refl_id, plain, support)
        for old in named:
            self._retire_id(old, f"superseded by [{refl_id}]")
        return f"recorded [{refl_id}]" + (f", retiring {', '.join(named)}" if named else "")

    def _retire(self, item: Any) -> str:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            self.rejected += 1
            return 'rejected: expected {"id": ..., "reason": ...}'
        if item["id"] not in self._current:
            self.rejected += 1
            return f"rejected {item['id']!r}: not a current project reflection"
        reason = " ".join(str(item.get("reason") or "").split())[:1000] or "retired by the project stage"
        self._retire_id(item["id"], reason)
        return f"retired [{item['id']}]"

    def _retire_id(self, refl_id: str, reason: str) -> None:
        if not any(r.id == refl_id for r in self.retired):
            self.retired.append(Retirement(id=refl_id, reason=reason))


# ---------------------------------------------------------------- the offline baseline

_ABSOLUTE = re.compile(r"(?i)\b(never|always|must( not)?|do not|don'?t|not allowed|only|forbid(s|den)?|required?)\b")
_IN_SESSIONS = re.compile(r" \(in \d+ sessions?\)$")
MAX_OFFLINE_PROPOSALS = 20


_SUFFIX = re.compile(r"(ing|es|ed|s)$")
OFFLINE_SIMILARITY = 0.8  # two sessions' lines saying the same thing in slightly other words


def _stems(text: str) -> tuple[str, ...]:
    words = [p for w in normalised_words(_IN_SESSIONS.sub("", text)) for p in (w.split("-") if "-" in w else [w]) if p]
    return tuple(_SUFFIX.sub("", w) if len(w) > 4 else w for w in words)


class _Similar:
    """The offline baseline's grouping of lines across sessions: normalised words with plural and verb
    endings cut, difflib's ratio at least ``OFFLINE_SIMILARITY``, the same numbers and identifiers."""

    def __init__(self, texts: list[tuple[str, str]] = ()) -> None:  # type: ignore[assignment]
        self.known: list[tuple[str, tuple[str, ...]]] = []
        for key, text in texts:
            self.add(key, text)

    def add(self, key: str, text: str) -> None:
        self.known.append((key, _stems(text)))

    def of(self, text: str) -> str | None:
        from difflib import SequenceMatcher

        words = _stems(text)
        marks = {w for w in words if any(c.isdigit() or c in "./:@#_+" for c in w)}
        for key, other in self.known:
            if marks != {w for w in other if any(c.isdigit() or c in "./:@#_+" for c in w)}:
                continue
            if SequenceMatcher(None, words, other, autojunk=False).ratio() >= OFFLINE_SIMILARITY:
                return key
        return None


def _in_sessions(text: str, n: int) -> str:
    return f"{text} (in {n} session{'s' if n != 1 else ''})"


def distil_offline(inp: ProjectInput) -> dict[str, Any]:
    """The extractive baseline's proposals (a fallback, named as one). Each new session reflection, and
    each critical observation that states an absolute rule or recurs in two or more sessions, becomes a
    project reflection worded as recorded, with the number of sessions it was seen in; near-duplicates
    across sessions are one reflection citing all of them. A new line that repeats a current project
    reflection replaces it (supersedes) with the wider support and count."""
    clusters: list[dict[str, Any]] = []
    similar = _Similar()
    for item in inp.new:
        text = item.content.strip()
        found = similar.of(text)
        if found is None:
            similar.add(str(len(clusters)), text)
            clusters.append({"text": text, "items": [item]})
        else:
            clusters[int(found)]["items"].append(item)
    current = _Similar([(r.id, _SUPERSEDES.sub("", r.content)) for r in inp.memory])
    by_id = {r.id: r for r in inp.memory}
    proposals: list[dict[str, Any]] = []
    for cluster in clusters:
        items = cluster["items"]
        ids = list(dict.fromkeys(i.id for i in items))
        sessions = set().union(*(inp.held.get(i, {x.session_id for x in items if x.id == i}) for i in ids))
        replaces = current.of(cluster["text"])
        if replaces is not None:
            old = by_id[replaces]
            support = list(dict.fromkeys(old.supportingIds + ids))
            if support == old.supportingIds:
                continue  # nothing it does not rest on already
            sessions |= set().union(*(inp.held.get(s, set()) for s in old.supportingIds))
            proposals.append({"content": f"{_in_sessions(cluster['text'], len(sessions))} (supersedes [{replaces}])",
                              "supportingIds": support})
            continue
        durable = any(i.kind == "reflection" for i in items) or len(sessions) >= 2 or _ABSOLUTE.search(cluster["text"])
        if durable:
            proposals.append({"content": _in_sessions(cluster["text"], len(sessions)), "supportingIds": ids})
    return {"reflections": proposals[:MAX_OFFLINE_PROPOSALS]}
