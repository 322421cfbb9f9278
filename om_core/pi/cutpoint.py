"""Pi's compaction cut point: where ``prepareCompaction`` cuts a branch, whether it compacts at all,
and the ``tokensBefore`` it records. Two rule sets (setting ``cutPointRules``):

``pi-1.6`` (the default, pi-sessions.md §7): Pi 1.6 cuts a *projection* of the branch (the newest
compaction, the entries it kept, the entries after it), with ``context_edit`` entries applied to
what their targets contribute; every entry weighs what its context messages estimate (custom
messages, branch summaries, system prompts and user images included); trailing tool results cut at
the last candidate; a recovery suffix; absorption stops at any entry that contributes a message;
and Pi declines when there is nothing to summarize.

``legacy`` (§2.3–§2.4, Pi before 1.6), with both quirks the reference flags:

* Quirk A: backward absorption can move the cut onto a non-message entry, which then is "not a user
  message", so the previous turn becomes the split turn's prefix.
* Quirk B: a cut at bashExecution, custom_message or branch_summary is a split turn whose turn start
  is the cut itself.
  Only ``message`` entries count toward ``keepRecentTokens`` there; custom_message and
  branch_summary entries are valid cut points but add nothing to the budget.

Positions reported are branch positions (a projected entry keeps its position on the branch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_snake

from om_core.pi.branch_entry import BranchEntry, CurrentSystemMessage, message_tokens

DEFAULT_KEEP_RECENT_TOKENS = 20_000
CutPointRules = Literal["pi-1.6", "legacy"]
DEFAULT_RULES: CutPointRules = "pi-1.6"

_CUT_ROLES = frozenset({"user", "assistant", "bashExecution", "custom", "branchSummary", "compactionSummary"})
_TURN_START_ROLES = frozenset({"user", "bashExecution", "custom", "branchSummary", "compactionSummary"})
_NO_EDIT = object()  # an entry no context_edit has touched


class CutPoint(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    firstKeptEntryId: str
    firstKeptPosition: int
    turnStartPosition: int
    isSplitTurn: bool
    tokensBefore: int | None = None
    cutPointRules: CutPointRules = DEFAULT_RULES

    def as_json(self) -> dict[str, Any]:
        """What om prints (`om cutpoint --json`): snake_case; the fields keep Pi's names."""
        return {to_snake(name): value for name, value in self.model_dump().items()}


class NothingToCompact(ValueError):
    """prepareCompaction would return undefined: Pi does not compact here (the message says why)."""


@dataclass(frozen=True, slots=True)
class PreviousCompaction:
    """A compaction that is not an entry of the branch (one the replay simulated): Pi would have
    written it right after ``position``, keeping from ``first_kept_entry_id``."""

    position: int
    first_kept_entry_id: str | None
    summary_tokens: int = 0


# ====================================================================== legacy rules (§2.3–§2.4)


def is_cut_point(entry: BranchEntry) -> bool:
    if entry.entry_type == "message":
        return entry.role in _CUT_ROLES
    return entry.entry_type in ("branch_summary", "custom_message")


def _starts_turn(entry: BranchEntry) -> bool:
    if entry.entry_type in ("branch_summary", "custom_message"):
        return True
    return entry.entry_type == "message" and entry.role in ("user", "bashExecution")


def find_turn_start(entries: Sequence[BranchEntry], index: int, start: int) -> int:
    for i in range(index, start - 1, -1):
        if _starts_turn(entries[i]):
            return i
    return -1


def find_cut_point(entries: Sequence[BranchEntry], start: int, end: int, keep_recent_tokens: int) -> tuple[int, int, bool]:
    """Legacy rules: (firstKeptIndex, turnStartIndex, isSplitTurn) over ``entries[start:end]``."""
    cut_points = [i for i in range(start, end) if is_cut_point(entries[i])]
    if not cut_points:
        return start, -1, False
    cut_index = cut_points[0]
    accumulated = 0
    for i in range(end - 1, start - 1, -1):
        entry = entries[i]
        if entry.entry_type != "message":
            continue
        accumulated += entry.legacy_tokens()
        if accumulated >= keep_recent_tokens:
            # The smallest cut point at or after i; if none, the cutPoints[0] default stands.
            cut_index = next((c for c in cut_points if c >= i), cut_index)
            break
    while cut_index > start and entries[cut_index - 1].entry_type not in ("compaction", "message"):
        cut_index -= 1  # backward absorption of settings, labels, custom and summary entries
    cut = entries[cut_index]
    if cut.entry_type == "message" and cut.role == "user":
        return cut_index, -1, False
    turn_start = find_turn_start(entries, cut_index, start)
    return cut_index, turn_start, turn_start != -1


def usable_usage(message: dict) -> int | None:
    """The context size an assistant message's usage reports, when it can be used (pi-sessions.md
    §7.5, SPEC §7): not aborted or errored; ``totalTokens`` when > 0, else the sum of input, output,
    cacheRead and cacheWrite when all four are numbers and the sum is > 0."""
    if message.get("role") != "assistant" or message.get("stopReason") in ("aborted", "error"):
        return None
    usage = message.get("usage")
    if not isinstance(usage, dict):
        return None
    total = usage.get("totalTokens")
    if _number(total) and total > 0:
        return _int(total)
    parts = [usage.get(k) for k in ("input", "output", "cacheRead", "cacheWrite")]
    if all(_number(p) for p in parts) and sum(parts) > 0:
        return _int(sum(parts))
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: float) -> int:
    return int(value) if float(value).is_integer() else value  # type: ignore[return-value]


def _legacy_tokens_before(branch: Sequence[BranchEntry], start: int, summary_tokens: int | None) -> int:
    """§2.4 step 3: estimateContextTokens over the messages from the previous compaction entry on
    (§2.2 estimate; the last assistant that is neither aborted nor an error and has a usage)."""
    estimates: list[int] = [] if summary_tokens is None else [summary_tokens]
    usage_at, usage_total = None, 0
    for entry in branch[max(start, 0):]:
        for message in entry.context_messages():
            estimates.append(message_tokens(message, "legacy"))
            usage = message.get("usage")
            if (message.get("role") == "assistant" and message.get("stopReason") not in ("aborted", "error")
                    and isinstance(usage, dict)):
                usage_at = len(estimates) - 1
                total = usage.get("totalTokens")
                if not (_number(total) and total):
                    total = sum(p for p in (usage.get(k) for k in ("input", "output", "cacheRead", "cacheWrite"))
                                if _number(p))
                usage_total = _int(total)
    if usage_at is None:
        return sum(estimates)
    return usage_total + sum(estimates[usage_at + 1:])


def _legacy_cut(branch: Sequence[BranchEntry], keep_recent_tokens: int, after: PreviousCompaction | None) -> CutPoint:
    previous = max((i for i, e in enumerate(branch) if e.entry_type == "compaction"), default=-1)
    messages_from, summary_tokens = previous, None  # the range includes the compaction entry itself
    if after is not None and after.position >= previous:
        previous = after.position
        messages_from, summary_tokens = previous + 1, after.summary_tokens
    first_kept, turn_start, split = find_cut_point(branch, previous + 1, len(branch), keep_recent_tokens)
    if not branch[first_kept].entry_id:
        raise NothingToCompact("the first kept entry has no id (the session needs migration)")
    tokens_before = _legacy_tokens_before(branch, messages_from, summary_tokens)
    return CutPoint(firstKeptEntryId=branch[first_kept].entry_id, firstKeptPosition=first_kept,
                    turnStartPosition=turn_start, isSplitTurn=split, tokensBefore=tokens_before,
                    cutPointRules="legacy")


# ====================================================================== Pi 1.6 rules (§7)


def _replace_content(message: dict, replacement: Any) -> dict:
    """What an edited entry contributes: its message with the replacement as content."""
    role = message.get("role")
    if role in ("branchSummary", "compactionSummary"):
        return {**message, "summary": replacement if isinstance(replacement, str) else ""}
    if role == "bashExecution":
        return {**message, "output": replacement if isinstance(replacement, str) else ""}
    edited = {k: v for k, v in message.items() if k != "_tokens"}
    edited["content"] = replacement
    return edited


@dataclass(slots=True)
class ProjectedEntry:
    """One item of Pi 1.6's projection (§7.1): an entry with the messages it contributes."""

    position: int  # on the branch
    entry: BranchEntry
    messages: tuple[dict, ...]  # after context edits
    natural: bool  # contributes messages before any edit ("visible by nature")
    emptied: bool = False  # a context_edit with a null replacement emptied it
    is_compaction_summary: bool = False  # the projection's first item: the newest compaction
    _tokens: int | None = None

    @property
    def entry_type(self) -> str:
        return self.entry.entry_type

    @property
    def roles(self) -> frozenset[str]:
        return frozenset(m.get("role") for m in self.messages)

    @property
    def tokens(self) -> int:
        if self._tokens is None:
            self._tokens = sum(message_tokens(m) for m in self.messages)
        return self._tokens

    def is_candidate(self) -> bool:
        return self.entry_type != "compaction" and bool(self.roles & _CUT_ROLES)

    def starts_turn(self) -> bool:
        return self.entry_type != "compaction" and bool(self.roles & _TURN_START_ROLES)

    def usage(self) -> int | None:
        for message in reversed(self.messages):
            total = usable_usage(message)
            if total is not None:
                return total
        return None


def edited_contributions(branch: Sequence[BranchEntry]) -> dict[int, Any]:
    """position -> the replacement the latest context_edit on the branch gives that earlier entry."""
    edits: dict[int, Any] = {}
    index: dict[str, int] | None = None
    for p, entry in enumerate(branch):
        if entry.entry_type != "context_edit" or entry.edit_target_id is None:
            continue
        if index is None:
            index = {}
            for q, e in enumerate(branch):
                index.setdefault(e.entry_id, q)
        q = index.get(entry.edit_target_id)
        if q is not None and q < p:
            edits[q] = entry.edit_replacement
    return edits


def _projected(position: int, entry: BranchEntry, edits: dict[int, Any]) -> ProjectedEntry:
    natural = entry.context_messages() if entry.entry_type != "compaction" else ()
    replacement = edits.get(position, _NO_EDIT)
    if replacement is _NO_EDIT or not natural:
        return ProjectedEntry(position, entry, natural, bool(natural), _tokens=entry.context_tokens if natural else 0)
    if replacement is None:
        return ProjectedEntry(position, entry, (), True, emptied=True)
    return ProjectedEntry(position, entry, tuple(_replace_content(m, replacement) for m in natural), True)


@dataclass(slots=True)
class Projection:
    items: list[ProjectedEntry]
    window_start: int  # the search window: items[window_start:]
    barrier: int  # branch position of the latest compaction or context_edit (-1: none)


def project_branch(branch: Sequence[BranchEntry], after: PreviousCompaction | None = None) -> Projection:
    """Pi 1.6's projection of a branch (§7.1)."""
    edits = edited_contributions(branch)
    newest = max((i for i, e in enumerate(branch) if e.entry_type == "compaction"), default=-1)
    barrier = max([newest] + [i for i, e in enumerate(branch) if e.entry_type == "context_edit"])
    simulated = after is not None and after.position >= newest
    if simulated:
        barrier = max(barrier, after.position)
    if newest < 0 and not simulated:
        return Projection([_projected(p, e, edits) for p, e in enumerate(branch)], 0, barrier)
    if simulated:
        cut_at, first_kept = after.position + 1, after.first_kept_entry_id  # it sits right after branch[position]
        summary = ProjectedEntry(after.position, BranchEntry("", "compaction", None, None),
                                 ({"role": "compactionSummary", "_tokens": after.summary_tokens},), True,
                                 is_compaction_summary=True)
    else:
        cut_at, first_kept = newest, branch[newest].first_kept_entry_id
        compaction = branch[newest]
        summary = ProjectedEntry(newest, compaction, compaction.context_messages(), True, is_compaction_summary=True,
                                 _tokens=compaction.context_tokens)
    items = [summary]
    start = next((i for i in range(cut_at) if branch[i].entry_id == first_kept), None) if first_kept else None
    if start is not None:  # the kept range, without system prompt messages
        items.extend(_projected(p, branch[p], edits) for p in range(start, cut_at)
                     if not (branch[p].entry_type == "message" and branch[p].role == "system"))
    after_compaction = cut_at if simulated else newest + 1
    items.extend(_projected(p, branch[p], edits) for p in range(after_compaction, len(branch)))
    return Projection(items, 1, barrier)


def _pi16_cut(items: Sequence[ProjectedEntry], start: int, end: int, keep_recent_tokens: int) -> tuple[int, int, bool]:
    """(cut, turnStart, isSplitTurn) as indices into ``items`` (§7.3)."""
    candidates = [i for i in range(start, end) if items[i].is_candidate()]
    if not candidates:
        cut = start
        exceeded = False
    else:
        cut = candidates[0]
        exceeded = False
        accumulated = 0
        for i in range(end - 1, start - 1, -1):
            tokens = items[i].tokens
            if tokens == 0:
                continue
            accumulated += tokens
            if accumulated >= keep_recent_tokens:
                exceeded = True
                # the first candidate at or after i; inside trailing tool results, the last candidate
                cut = next((c for c in candidates if c >= i), candidates[-1])
                break
    if exceeded and _recovery_suffix(items, cut, end):
        cut += 1
    while cut > start:  # absorption: only over entries that contribute nothing
        before = items[cut - 1]
        if before.entry_type == "compaction" or before.messages:
            break
        cut -= 1
    if items[cut].starts_turn():
        return cut, -1, False
    for i in range(cut - 1, start - 1, -1):
        if items[i].starts_turn():
            return cut, i, True
    return cut, -1, False


def _recovery_suffix(items: Sequence[ProjectedEntry], cut: int, end: int) -> bool:
    """§7.3.4: everything after the cut is invisible or emptied, at least one emptied entry is an
    assistant message, and neither a compaction nor an edit that replaces a live entry is among them."""
    suffix = items[cut + 1:end]
    if not suffix:
        return False
    emptied_positions = {it.position for it in items if it.emptied}
    emptied_assistant = False
    for it in suffix:
        if it.entry_type == "compaction":
            return False
        if it.natural and not it.emptied:
            return False
        if it.emptied and it.entry.entry_type == "message" and it.entry.role == "assistant":
            emptied_assistant = True
        if it.entry_type == "context_edit" and it.entry.edit_replacement is not None:
            target = next((x.position for x in items if x.entry.entry_id == it.entry.edit_target_id), None)
            if target is None or target not in emptied_positions:
                return False
    return emptied_assistant


def tokens_before(projection: Projection) -> int:
    """§7.5: the last usable assistant usage after the latest context_edit or compaction, plus the
    estimates of the messages after it (system messages too); otherwise the current system message (every
    system message in the projection replayed into one) plus every other message."""
    items = projection.items
    for k in range(len(items) - 1, -1, -1):
        it = items[k]
        if it.is_compaction_summary or it.position <= projection.barrier:
            break
        usage = it.usage()
        if usage is not None:
            return usage + sum(x.tokens for x in items[k + 1:])
    system = CurrentSystemMessage()
    other = 0
    for it in items:
        for message in it.messages:
            if message.get("role") == "system":
                system.add(message)
            else:
                other += message_tokens(message)
    return system.tokens() + other


def _pi16_cut_point(branch: Sequence[BranchEntry], keep_recent_tokens: int, after: PreviousCompaction | None) -> CutPoint:
    projection = project_branch(branch, after)
    items = projection.items
    start, end = projection.window_start, len(items)
    if start >= end:
        raise NothingToCompact("the branch already ends with a compaction")
    cut, turn_start, split = _pi16_cut(items, start, end, keep_recent_tokens)
    kept = items[cut]
    if not kept.entry.entry_id:
        raise NothingToCompact("the first kept entry has no id (the session needs migration)")
    history_end = turn_start if split else cut

    def has_messages(lo: int, hi: int) -> bool:
        return any(m.get("role") != "system" for it in items[lo:hi] if it.entry_type != "compaction"
                   for m in it.messages)

    if not has_messages(start, history_end) and not (split and has_messages(turn_start, cut)):
        raise NothingToCompact(
            "nothing to summarize: no message before the cut at position "
            f"{kept.position} (everything after the last compaction fits in keepRecentTokens {keep_recent_tokens}, "
            "or only the system prompt precedes the cut)")
    return CutPoint(firstKeptEntryId=kept.entry.entry_id, firstKeptPosition=kept.position,
                    turnStartPosition=items[turn_start].position if split else -1, isSplitTurn=split,
                    tokensBefore=tokens_before(projection), cutPointRules="pi-1.6")


# ====================================================================== both


def compaction_cut_point(branch: Sequence[BranchEntry], keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS,
                         after: int | PreviousCompaction | None = None, *,
                         rules: CutPointRules = DEFAULT_RULES) -> CutPoint:
    """The cut point Pi's prepareCompaction picks when compacting at the end of ``branch``, or
    ``NothingToCompact`` where Pi declines (§7.4; legacy: only an empty branch or one that ends with a
    compaction).

    ``after``: a compaction that is not an entry of ``branch`` (a simulated one, which Pi would have
    written right after that position); it bounds the cut like an entry would. A bare position means
    one that kept nothing before it.
    """
    if isinstance(after, int):
        after = PreviousCompaction(after, None)
    if not branch:
        raise NothingToCompact("the branch is empty")
    if branch[-1].entry_type == "compaction" or (after is not None and after.position == len(branch) - 1):
        raise NothingToCompact("the branch already ends with a compaction")
    if rules == "legacy":
        return _legacy_cut(branch, keep_recent_tokens, after)
    if rules != "pi-1.6":
        raise ValueError(f"unknown cutPointRules {rules!r}; known: pi-1.6, legacy")
    return _pi16_cut_point(branch, keep_recent_tokens, after)
