"""Pi's compaction cut point, exactly as ``prepareCompaction`` / ``findCutPoint`` choose it
(pi-sessions.md §2.3–2.4), including both quirks the reference flags:

* Quirk A: backward absorption can move the cut onto a non-message entry, which then is "not a user
  message", so the previous turn becomes the split turn's prefix.
* Quirk B: a cut at bashExecution, custom_message or branch_summary is a split turn whose turn start
  is the cut itself.

Only ``message`` entries count toward ``keepRecentTokens``; custom_message and branch_summary
entries are valid cut points but add nothing to the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

DEFAULT_KEEP_RECENT_TOKENS = 20_000

_CUT_ROLES = frozenset({"user", "assistant", "bashExecution", "custom", "branchSummary", "compactionSummary"})


@dataclass(frozen=True, slots=True)
class BranchEntry:
    """The few facts about a branch entry that the cut point looks at."""

    entry_id: str
    entry_type: str
    role: str | None
    tokens_pi: int | None  # Pi's estimate; None for entries Pi estimates as 0


class CutPoint(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    firstKeptEntryId: str
    firstKeptPosition: int
    turnStartPosition: int
    isSplitTurn: bool


class NothingToCompact(ValueError):
    """prepareCompaction would return undefined (empty branch, or it already ends with a compaction)."""


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
    """(firstKeptIndex, turnStartIndex, isSplitTurn) over ``entries[start:end]``."""
    cut_points = [i for i in range(start, end) if is_cut_point(entries[i])]
    if not cut_points:
        return start, -1, False
    cut_index = cut_points[0]
    accumulated = 0
    for i in range(end - 1, start - 1, -1):
        entry = entries[i]
        if entry.entry_type != "message":
            continue
        accumulated += entry.tokens_pi or 0
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


def compaction_cut_point(branch: Sequence[BranchEntry], keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS,
                         after: int | None = None) -> CutPoint:
    """The cut point Pi's prepareCompaction picks when compacting at the end of ``branch``.

    ``after``: the position of a compaction that is not an entry of ``branch`` (a simulated one,
    which Pi would have written right after that position); it bounds the cut like an entry would.
    """
    if not branch:
        raise NothingToCompact("the branch is empty")
    if branch[-1].entry_type == "compaction" or after == len(branch) - 1:
        raise NothingToCompact("the branch already ends with a compaction")
    previous = max((i for i, e in enumerate(branch) if e.entry_type == "compaction"), default=-1)
    if after is not None:
        previous = max(previous, after)
    first_kept, turn_start, split = find_cut_point(branch, previous + 1, len(branch), keep_recent_tokens)
    return CutPoint(
        firstKeptEntryId=branch[first_kept].entry_id,
        firstKeptPosition=first_kept,
        turnStartPosition=turn_start,
        isSplitTurn=split,
    )
