"""Code, not the model, makes ids, token counts and validation (SPEC §8).

Each check takes the arguments of one tool call, keeps what is valid, and returns a short receipt
(recorded, duplicate, rejected and why) that goes back to the model so it can correct itself.
The offline baseline submits through the same checks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

from om_core.ledger.records import (DROP_REASON, RELEVANCE_ORDER, RETIRES, TS_REPAIRED_FROM, Observation, Reflection,
                                   memory_id, memory_references)
from om_core.workers.near_duplicates import NearDuplicates
from om_core.workers.prompts import TRUNCATION_MARKER
from om_core.ledger.lines import observation_line
from om_core.pi.js_length import js_len

MAX_CONTENT_CHARS = 10_000
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}$")
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
COVERAGE_ORDER = {"strong": 0, "partial": 1, "none": 2}

# An observation's time must lie within its cited entries' times, give or take this much (times are
# shown to the minute; a model that rounds up, or stamps the question a cited answer replies to, is
# no wrong clock). A time further out is replaced by the first cited entry's time.
EVENT_TIME_TOLERANCE = timedelta(minutes=5)
TokenCounter = Callable[[str], int]


def pi_token_counter(text: str) -> int:
    """Pi's estimate of a rendered line: ceil(UTF-16 length / 4)."""
    return math.ceil(js_len(text) / 4)


def _timestamp(value: Any) -> str:
    """``YYYY-MM-DD HH:MM``; an ISO timestamp is accepted and shortened (one with a zone, in UTC as
    entries are shown). A date alone is refused: it would be stored as midnight."""
    if not isinstance(value, str):
        raise _Rejected("timestamp must be YYYY-MM-DD HH:MM")
    value = value.strip()
    if _TIMESTAMP.match(value):
        return value
    if _DATE_ONLY.match(value):
        raise _Rejected("timestamp must give the time of day too (YYYY-MM-DD HH:MM): take it from the cited "
                        "entry's header")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _Rejected("timestamp must be YYYY-MM-DD HH:MM") from None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(timezone.utc)
    return parsed.strftime("%Y-%m-%d %H:%M")


def _minute(value: str) -> datetime | None:
    try:
        return datetime.strptime(value, "%Y-%m-%d %H:%M")
    except ValueError:
        return None


def event_time(proposed: str, cited_times: list[str]) -> str:
    """The observation's time: as proposed when it lies within its cited entries' times (with
    ``EVENT_TIME_TOLERANCE``), else the first cited entry's time. Entries without a time bound nothing."""
    times = [t for t in (_minute(c) for c in cited_times) if t is not None]
    when = _minute(proposed)
    if not times or when is None:
        return proposed
    if min(times) - EVENT_TIME_TOLERANCE <= when <= max(times) + EVENT_TIME_TOLERANCE:
        return proposed
    return next(c for c in cited_times if _minute(c) is not None)


def _id_list(value: Any) -> list[str] | None:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        return None
    return list(dict.fromkeys(value))  # keep order, drop repeats


def _items(args: Any, key: str) -> tuple[list[Any] | None, str | None]:
    if not isinstance(args, dict) or not isinstance(args.get(key), list):
        return None, f'expected {{"{key}": [...]}}'
    return args[key], None


class _Rejected(Exception):
    """One proposed item is not valid; the message is the receipt's reason."""


def _cited_ids(item: dict, key: str, what: str, allowed: set[str], outside: str) -> list[str]:
    """The item's ``key`` ids, each one of ``allowed``, or a rejection (``outside`` names the others)."""
    ids = _id_list(item.get(key))
    if ids is None:
        raise _Rejected(f"{key} must be a non-empty list of {what}")
    others = [i for i in ids if i not in allowed]
    if others:
        raise _Rejected(outside.format(", ".join(others)))
    return ids


def _content(item: Any, single_line: bool = False) -> str:
    """The item's content, stripped and capped (SPEC §8), or a rejection."""
    if not isinstance(item, dict):
        raise _Rejected("not an object")
    content = item.get("content")
    if not isinstance(content, str) or not content.strip():
        raise _Rejected("content must be non-empty text")
    content = content.strip()
    if single_line and ("\n" in content or "\r" in content):
        raise _Rejected("content must be a single line")
    if len(content) > MAX_CONTENT_CHARS:
        content = content[:MAX_CONTENT_CHARS] + TRUNCATION_MARKER
    return content


@dataclass(kw_only=True)
class _ItemCheck:
    """One receipt line per proposed item; ``_one`` accepts an item or raises ``_Rejected``."""

    tool: ClassVar[str]
    key: ClassVar[str]
    count_tokens: TokenCounter = pi_token_counter
    accepted: list[Any] = field(default_factory=list)
    duplicates: int = 0
    rejected: int = 0

    @property
    def problems(self) -> int:
        """Rejections so far; a submit that adds none is a clean receipt."""
        return self.rejected

    def submit(self, args: Any) -> str:
        items, problem = _items(args, self.key)
        if problem:
            self.rejected += 1
            return f"rejected: {problem}"
        lines = [f"{n}. {self._receipt(item)}" for n, item in enumerate(items, start=1)]
        return f"{self.tool} receipt:\n" + ("\n".join(lines) if lines else f"(no {self.key} given)")

    def _receipt(self, item: Any) -> str:
        try:
            return self._one(item)
        except _Rejected as exc:
            self.rejected += 1
            return f"rejected: {exc}"

    def _one(self, item: Any) -> str:
        raise NotImplementedError

    def _seen(self, item_id: str, before: set[str]) -> bool:
        """Whether the id was recorded before or accepted already in this run (a duplicate, skipped)."""
        if item_id in before or any(a.id == item_id for a in self.accepted):
            self.duplicates += 1
            return True
        return False


def _references(content: str, known: set[str]) -> list[str]:
    """The memory ids the content names in brackets, each a known one, or a rejection."""
    named = memory_references(content)
    unknown = [i for i in named if i not in known]
    if unknown:
        raise _Rejected(f"content names [{'], ['.join(unknown)}], which is no memory id on this branch: name an "
                        "earlier note by the id its memory line starts with")
    return named


# The fixed grammar by which a note attributes something to the user: its content starts with the
# word "User" or "The user" (any case; "User asked …", "The user's goal is …"). Such a note must
# cite an entry in the user's own words (``USER_ROLES``). Notes of the agent's start otherwise
# ("Agent proposed …", "Agent claimed …").
_USER_SUBJECT = re.compile(r"^\W*(?:the\s+)?user\b", re.IGNORECASE)
# Entry roles in the user's own words: a message, and a command the user ran (``!cmd``).
USER_ROLES = frozenset({"user", "bashExecution"})


def attributes_to_user(content: str) -> bool:
    """Whether a note says what the user said, asked, decided or required (``_USER_SUBJECT``)."""
    return _USER_SUBJECT.match(content) is not None


def _quoted(content: str, limit: int = 200) -> str:
    return content if len(content) <= limit else content[: limit - 1] + "…"


# The clause by which a note names what it replaces: "(supersedes [id])", or several ids in one clause
# ("(supersedes [id], [id])"). Other bracketed ids in a note are references, not replacements.
_SUPERSEDES = re.compile(r"\(supersedes\s+((?:\[[0-9a-f]{12}\](?:\s*(?:,|and)\s*)?)+)\)", re.IGNORECASE)


def superseded_ids(content: str) -> list[str]:
    """The memory ids a note names as the ones it replaces, in order, once each."""
    return list(dict.fromkeys(i for clause in _SUPERSEDES.findall(content) for i in memory_references(clause)))


def without_supersedes(content: str) -> str:
    """The note as it compares with earlier ones: the clause naming what it replaces is no part of what
    it says (a change of an earlier note, named, is compared as the change it records)."""
    return " ".join(_SUPERSEDES.sub(" ", content).split())


@dataclass
class ObservationCheck(_ItemCheck):
    """The observer's items. ``chunk_times``: the entry ids a note may cite with their times
    (``YYYY-MM-DD HH:MM``, '' when unknown), in branch order: the context shown before the chunk, then
    the chunk; ``user_ids``: those of them in the user's own words (``USER_ROLES``), which a note
    attributing something to the user must cite; ``known_ids``: every observation recorded on the
    branch (dropped ones too); ``active``: the active observations, whose near-duplicates are skipped
    (and whose changes of state must name them); ``memory_ids``: the ids a note may name
    (observations recorded on the branch, current reflections)."""

    tool: ClassVar[str] = "record_observations"
    key: ClassVar[str] = "observations"
    chunk_times: dict[str, str]
    known_ids: set[str]  # recorded before (dropped ones too)
    active: list[Observation] = field(default_factory=list)
    memory_ids: set[str] = field(default_factory=set)
    user_ids: frozenset[str] | None = None  # None: roles unknown, attribution unchecked
    repaired: int = 0  # times outside the cited entries', replaced (EVENT_TIME_TOLERANCE)
    # items refused as a change of state, each with the id of the note it changes (the offline
    # baseline, which has no second turn, names that note itself)
    changed_states: list[tuple[dict, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # ids are known, not guessed by their look: the entries a note may cite, the memory ids
        self._similar = NearDuplicates(((o.id, without_supersedes(o.content), o.sourceEntryIds)
                                        for o in self.active),
                                       ids=set(self.chunk_times) | self.memory_ids | self.known_ids)

    @property
    def chunk_ids(self) -> set[str]:
        return set(self.chunk_times)

    def _one(self, item: Any) -> str:
        content = _content(item, single_line=True)
        proposed = _timestamp(item.get("timestamp"))
        relevance = item.get("relevance")
        relevance = relevance.strip().lower() if isinstance(relevance, str) else relevance
        if relevance not in RELEVANCE_ORDER:
            raise _Rejected("relevance must be low, medium, high or critical")
        ids = _id_list(item.get("sourceEntryIds"))
        memory = [i for i in ids or () if i not in self.chunk_times and i in self.memory_ids | self.known_ids]
        if memory:
            raise _Rejected(f"sourceEntryIds {', '.join(memory)} are memory ids, not entries of this chunk: cite the "
                            "entries, and name an earlier note the new one replaces in its content, as "
                            "(supersedes [id])")
        sources = _cited_ids(item, "sourceEntryIds", "entry ids", self.chunk_ids,
                             "sourceEntryIds {} are not entries of this chunk or its context")
        # a note may name one recorded earlier in this stage, as the state-change receipt asks
        named = _references(content, self.memory_ids | self.known_ids | {a.id for a in self.accepted})
        obs_id = memory_id(content)
        if self._seen(obs_id, self.known_ids):
            return f"duplicate [{obs_id}]: already recorded, skipped"
        near = self._similar.match(without_supersedes(content), sources)
        if near is not None and not near.changed:
            self.duplicates += 1
            return f"duplicate [{obs_id}]: nearly the same as [{near.note_id}], skipped"
        if self.user_ids is not None and attributes_to_user(content) and not set(sources) & self.user_ids:
            raise _Rejected("the note says what the user said, asked, decided or required, but cites no message of "
                            "the user's: cite the user's own message, or write what the agent proposed or claimed "
                            "as \"Agent proposed …\" / \"Agent claimed …\"")
        if near is not None and near.note_id not in named:
            self.changed_states.append((item, near.note_id))
            raise _Rejected(f"nearly the same as [{near.note_id}] \"{_quoted(near.content)}\" but with a changed "
                            f"state: if it replaces that note, name it with (supersedes [{near.note_id}]); if it "
                            "is another fact, reword it to say so")
        cited = [self.chunk_times[i] for i in self.chunk_times if i in set(sources)]  # in branch order
        timestamp = event_time(proposed, cited)
        notes = {}
        if timestamp != proposed:
            notes[TS_REPAIRED_FROM] = proposed
            self.repaired += 1
        line = observation_line(obs_id, timestamp, relevance, content)
        self.accepted.append(Observation(id=obs_id, content=content, timestamp=timestamp, relevance=relevance,
                                         sourceEntryIds=sources, tokenCount=self.count_tokens(line), **notes))
        self._similar.add(obs_id, without_supersedes(content), sources)
        if notes:
            return (f"recorded [{obs_id}], at {timestamp}: {proposed} lies outside its cited entries' times, so "
                    "the first cited entry's time was taken")
        return f"recorded [{obs_id}]"


@dataclass
class ReflectionCheck(_ItemCheck):
    """The reflector's items. ``existing``: the current reflections (their near-duplicates are
    skipped, their changes of state must name them); ``existing_ids``: every reflection recorded on the
    branch (current and dropped); ``dropped_ids``: those dropped already. A reflection that names a
    current one as "(supersedes [id])" retires it in the same stage (``retired``, kept on the record
    as om's ``RETIRES`` note; the stage appends an ``om.reflections.dropped`` record for it); one that
    names a dropped one is accepted and retires nothing; one that names no reflection is refused."""

    tool: ClassVar[str] = "record_reflections"
    key: ClassVar[str] = "reflections"
    active_ids: set[str]
    existing_ids: set[str]
    existing: list[Reflection] = field(default_factory=list)
    dropped_ids: set[str] = field(default_factory=set)
    retired: dict[str, list[str]] = field(default_factory=dict)  # new reflection id -> the ids it retires

    def __post_init__(self) -> None:
        self._similar = NearDuplicates(((r.id, without_supersedes(r.content), r.supportingObservationIds)
                                        for r in self.existing),
                                       ids=self.active_ids | self.existing_ids)

    @property
    def notes(self) -> dict[str, dict[str, list[str]]]:
        """om's note on the record: which current reflections each new one retires."""
        return {RETIRES: dict(self.retired)} if self.retired else {}

    def _one(self, item: Any) -> str:
        content = _content(item, single_line=True)
        support = _cited_ids(item, "supportingObservationIds", "observation ids", self.active_ids,
                             "{} are not active observations")
        accepted = {a.id for a in self.accepted}
        named = _references(content, self.existing_ids | self.active_ids | accepted)
        current = ({r.id for r in self.existing} | accepted) - {i for ids in self.retired.values() for i in ids}
        replaced = superseded_ids(content)
        not_reflections = [i for i in replaced if i not in current and i not in self.existing_ids]
        if not_reflections:
            raise _Rejected(f"(supersedes [{'], ['.join(not_reflections)}]) names no reflection: a reflection "
                            "replaces only a reflection; name the one it replaces by the id its memory line starts "
                            "with, or leave the clause out")
        refl_id = memory_id(content)
        if self._seen(refl_id, self.existing_ids):
            return f"duplicate [{refl_id}]: this reflection already exists, skipped"
        near = self._similar.match(without_supersedes(content), support)
        if near is not None and not near.changed:
            self.duplicates += 1
            return f"duplicate [{refl_id}]: nearly the same as reflection [{near.note_id}], skipped"
        if near is not None and near.note_id not in named:
            raise _Rejected(f"nearly the same as reflection [{near.note_id}] \"{_quoted(near.content)}\" but with a "
                            f"changed state: if it replaces that reflection, name it with (supersedes "
                            f"[{near.note_id}]); if it is another conclusion, reword it to say so")
        self.accepted.append(Reflection(id=refl_id, content=content, supportingObservationIds=support,
                                        tokenCount=self.count_tokens(content)))
        self._similar.add(refl_id, without_supersedes(content), support)
        retiring = [i for i in replaced if i in current]
        if retiring:
            self.retired[refl_id] = retiring
        gone = [i for i in replaced if i not in current]
        return (f"recorded [{refl_id}]" + (f", retiring [{'], ['.join(retiring)}]" if retiring else "")
                + (f"; [{'], ['.join(gone)}] already dropped, nothing to retire" if gone else ""))


MAX_REASON_CHARS = 1_000
MALFORMED_DROP_CALL = 'rejected: expected {"ids": [...], "reason": "..."}'


def drop_call_ids(check: Any, args: Any) -> list[Any] | None:
    """A dropper's tool call (``{"ids": [...], "reason": "..."}``, both droppers alike): its ids, with
    its reason kept on ``check`` (one line, bounded); None for a malformed call, counted on ``check``."""
    if not isinstance(args, dict) or not isinstance(args.get("ids"), list):
        check.malformed += 1
        return None
    if isinstance(args.get("reason"), str) and args["reason"].strip():
        check.reason = " ".join(args["reason"].split())[:MAX_REASON_CHARS]
    return args["ids"]


@dataclass
class DropCheck:
    """Collects proposed ids; the final choice keeps at most ``max_drops``, safest first.
    ``keep_uncited_critical`` (om's guard beyond SPEC §8, on by default): a critical observation that
    no reflection cites is never dropped when it is one of ``guarded_ids`` (None: every one is);
    proposing it is no mistake to correct, so it gets no new turn. The stage passes the ones that cite
    the user's own words, newest first, up to a bound (``om_core.workers.guard.guarded_critical``): an
    observer that marks the agent's work critical, or marks everything critical, cannot pin the pool."""

    tool: ClassVar[str] = "drop_observations"
    duplicates: ClassVar[int] = 0  # an id proposed again is no new proposal, nor a rejection
    active: dict[str, Any]  # obs id -> CoveredObservation (with .coverage and .observation)
    max_drops: int
    order: dict[str, int]  # obs id -> age order (smaller = older)
    keep_uncited_critical: bool = True
    guarded_ids: frozenset[str] | None = None
    proposed: list[str] = field(default_factory=list)
    ignored: int = 0
    malformed: int = 0
    kept: int = 0  # proposals the guard kept
    reason: str | None = None

    @property
    def problems(self) -> int:
        """Ignored ids and malformed calls so far; a submit that adds none is a clean receipt."""
        return self.ignored + self.malformed

    def guarded(self, obs_id: str) -> bool:
        covered = self.active[obs_id]
        return (self.keep_uncited_critical and covered.coverage == "none" and covered.observation.relevance == "critical"
                and (self.guarded_ids is None or obs_id in self.guarded_ids))

    def submit(self, args: Any) -> str:
        ids = drop_call_ids(self, args)
        if ids is None:
            return MALFORMED_DROP_CALL
        lines = []
        for value in ids:
            if not isinstance(value, str) or value not in self.active:
                self.ignored += 1
                lines.append(f"ignored {value!r}: not an active observation")
            elif value in self.proposed:
                lines.append(f"already proposed [{value}]")
            elif self.guarded(value):
                self.kept += 1
                lines.append(f"kept [{value}]: a critical observation no reflection cites is never dropped")
            else:
                self.proposed.append(value)
                lines.append(f"proposed [{value}]")
        lines.append(f"{len(self.proposed)} proposed so far; at most {self.max_drops} will be dropped")
        return "drop_observations receipt:\n" + "\n".join(lines)

    @property
    def rejected(self) -> int:
        """Proposed ids that are not active observations (a malformed call counts in ``problems`` only)."""
        return self.ignored

    @property
    def accepted(self) -> list[str]:
        return self.selected()

    @property
    def notes(self) -> dict[str, str]:
        """om's notes on the drop record (stored in drops.reason, never written to a session file)."""
        return {DROP_REASON: self.reason} if self.reason else {}

    def safety_key(self, obs_id: str) -> tuple[int, int, int]:
        covered = self.active[obs_id]
        return (COVERAGE_ORDER[covered.coverage], RELEVANCE_ORDER[covered.observation.relevance], self.order[obs_id])

    def selected(self) -> list[str]:
        """Strong coverage before partial before none, then low before critical, then oldest first."""
        if len(self.proposed) <= self.max_drops:
            return list(self.proposed)
        return sorted(self.proposed, key=self.safety_key)[: self.max_drops]
