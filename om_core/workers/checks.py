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
from datetime import datetime
from typing import Any, ClassVar

from om_core.ledger import RELEVANCE_ORDER, Observation, Reflection, memory_id
from om_core.prompts import TRUNCATION_MARKER
from om_core.render import observation_line
from om_core.js_length import js_len

MAX_CONTENT_CHARS = 10_000
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}$")
COVERAGE_ORDER = {"strong": 0, "partial": 1, "none": 2}

TokenCounter = Callable[[str], int]


def pi_token_counter(text: str) -> int:
    """Pi's estimate of a rendered line: ceil(UTF-16 length / 4)."""
    return math.ceil(js_len(text) / 4)


def _timestamp(value: Any) -> str | None:
    """``YYYY-MM-DD HH:MM``; an ISO timestamp is accepted and shortened."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    if _TIMESTAMP.match(value):
        return value
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.strftime("%Y-%m-%d %H:%M")


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


@dataclass
class ObservationCheck(_ItemCheck):
    tool: ClassVar[str] = "record_observations"
    key: ClassVar[str] = "observations"
    chunk_ids: set[str]
    known_ids: set[str]  # recorded before (dropped ones too)

    def _one(self, item: Any) -> str:
        content = _content(item)
        timestamp = _timestamp(item.get("timestamp"))
        if timestamp is None:
            raise _Rejected("timestamp must be YYYY-MM-DD HH:MM")
        relevance = item.get("relevance")
        relevance = relevance.strip().lower() if isinstance(relevance, str) else relevance
        if relevance not in RELEVANCE_ORDER:
            raise _Rejected("relevance must be low, medium, high or critical")
        sources = _cited_ids(item, "sourceEntryIds", "entry ids", self.chunk_ids,
                             "sourceEntryIds {} are not entries of this chunk")
        obs_id = memory_id(content)
        if self._seen(obs_id, self.known_ids):
            return f"duplicate [{obs_id}]: already recorded, skipped"
        line = observation_line(obs_id, timestamp, relevance, content)
        self.accepted.append(Observation(id=obs_id, content=content, timestamp=timestamp, relevance=relevance,
                                         sourceEntryIds=sources, tokenCount=self.count_tokens(line)))
        return f"recorded [{obs_id}]"


@dataclass
class ReflectionCheck(_ItemCheck):
    tool: ClassVar[str] = "record_reflections"
    key: ClassVar[str] = "reflections"
    active_ids: set[str]
    existing_ids: set[str]

    def _one(self, item: Any) -> str:
        content = _content(item, single_line=True)
        support = _cited_ids(item, "supportingObservationIds", "observation ids", self.active_ids,
                             "{} are not active observations")
        refl_id = memory_id(content)
        if self._seen(refl_id, self.existing_ids):
            return f"duplicate [{refl_id}]: this reflection already exists, skipped"
        self.accepted.append(Reflection(id=refl_id, content=content, supportingObservationIds=support,
                                        tokenCount=self.count_tokens(content)))
        return f"recorded [{refl_id}]"


@dataclass
class DropCheck:
    """Collects proposed ids; the final choice keeps at most ``max_drops``, safest first."""

    tool: ClassVar[str] = "drop_observations"
    duplicates: ClassVar[int] = 0  # an id proposed again is no new proposal, nor a rejection
    active: dict[str, Any]  # obs id -> CoveredObservation (with .coverage and .observation)
    max_drops: int
    order: dict[str, int]  # obs id -> age order (smaller = older)
    proposed: list[str] = field(default_factory=list)
    ignored: int = 0
    malformed: int = 0
    reason: str | None = None

    @property
    def problems(self) -> int:
        """Ignored ids and malformed calls so far; a submit that adds none is a clean receipt."""
        return self.ignored + self.malformed

    def submit(self, args: Any) -> str:
        if not isinstance(args, dict) or not isinstance(args.get("ids"), list):
            self.malformed += 1
            return 'rejected: expected {"ids": [...], "reason": "..."}'
        if isinstance(args.get("reason"), str):
            self.reason = args["reason"]
        lines = []
        for value in args["ids"]:
            if not isinstance(value, str) or value not in self.active:
                self.ignored += 1
                lines.append(f"ignored {value!r}: not an active observation")
            elif value in self.proposed:
                lines.append(f"already proposed [{value}]")
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

    def safety_key(self, obs_id: str) -> tuple[int, int, int]:
        covered = self.active[obs_id]
        return (COVERAGE_ORDER[covered.coverage], RELEVANCE_ORDER[covered.observation.relevance], self.order[obs_id])

    def selected(self) -> list[str]:
        """Strong coverage before partial before none, then low before critical, then oldest first."""
        if len(self.proposed) <= self.max_drops:
            return list(self.proposed)
        return sorted(self.proposed, key=self.safety_key)[: self.max_drops]
