"""Gap-free compaction's decisions (SPEC §13): catch up, retain, or decline. Pure functions over
positions and token counts: no database, no model, no clock; every compaction path (the live hook,
`om compact`, `om export --compact`, simulated compactions) asks them the same questions with its own
facts.

- ``needs_catch_up``: the observer is behind Pi's proposed F (a source entry between the observation
  watermark and F is uncovered) and some coverage exists: the caller may run up to
  ``compactionCatchUpMaxChunks`` observer chunks, then asks again with the new watermark.
- ``retained_first_kept``: F moved back to the first uncovered source entry (to the assistant message
  that made the call when that entry is a tool result), never forward.
- ``decide``: with the summary rendered at that F, whether the compaction goes ahead there or declines
  to Pi's own summary: over ``compactionMaxRetainedTokens``, nothing freed, or Pi's overflow recovery.
"""

from __future__ import annotations


from pydantic import BaseModel, ConfigDict

from om_core.memory.views import DeclineReason


class SpanEntry(BaseModel):
    """One entry of the branch, as the decisions need it."""

    model_config = ConfigDict(frozen=True)

    position: int
    entry_id: str
    is_source: bool
    tokens: int = 0  # source tokens (Pi's estimate), 0 for any other entry
    tool_result: bool = False
    call_position: int | None = None  # a tool result's: the assistant message that made the call


class Branch(BaseModel):
    """The branch a compaction is decided on: its entries (positions 0..tip, in order) and where the
    context starts now (the latest compaction's F, 0 without one)."""

    entries: list[SpanEntry]
    context_start: int = 0

    def first_uncovered(self, watermark: int | None, first_kept: int) -> int | None:
        """The first source entry after the observation watermark and before F (None: none)."""
        start = -1 if watermark is None else watermark
        for entry in self.entries[start + 1: first_kept]:
            if entry.is_source:
                return entry.position
        return None

    def tokens(self, start: int, end: int) -> int:
        """Source tokens at positions start..end-1."""
        return sum(e.tokens for e in self.entries[max(start, 0): max(end, 0)] if e.is_source)


def needs_catch_up(branch: Branch, watermark: int | None, first_kept: int, max_chunks: int) -> bool:
    """Whether a catch-up observer may run: chunks allowed, some coverage, and a gap before F."""
    return max_chunks > 0 and watermark is not None and branch.first_uncovered(watermark, first_kept) is not None


def retained_first_kept(branch: Branch, watermark: int | None, first_kept: int) -> int:
    """F moved back to the first uncovered source entry, or Pi's F when nothing before it is uncovered.
    A tool result is no place to start the kept tail (Pi's own rule): the assistant message that made
    the call is. Never forward."""
    first = branch.first_uncovered(watermark, first_kept)
    if first is None:
        return first_kept
    entry = branch.entries[first]
    if entry.tool_result and entry.call_position is not None:
        first = entry.call_position
    return min(first, first_kept)


class Decision(BaseModel):
    """Where the compaction keeps from, or why it declines."""

    first_kept: int  # position of F (Pi's when declined)
    moved: bool = False
    declined: DeclineReason | None = None
    retained_tokens: int = 0  # source tokens kept from F to the tip, plus the summary's
    freed_tokens: int = 0  # source tokens the compaction takes out of the context

    @property
    def goes_ahead(self) -> bool:
        return self.declined is None


def decide(branch: Branch, proposed: int, first_kept: int, summary_tokens: int | None, *,
           max_retained_tokens: int, overflow: bool) -> Decision:
    """The compaction at ``first_kept`` (``retained_first_kept``'s answer for Pi's ``proposed`` F) with a
    summary of ``summary_tokens`` (None: the projection renders nothing). At Pi's own F it goes ahead as
    Pi proposed; a moved F must fit the retention budget, free something, and not be an overflow's
    recovery (which must free what Pi asked for)."""
    tip = len(branch.entries)
    freed = branch.tokens(branch.context_start, first_kept)
    retained = branch.tokens(first_kept, tip) + (summary_tokens or 0)
    decision = Decision(first_kept=first_kept, moved=first_kept != proposed, retained_tokens=retained,
                        freed_tokens=freed)
    if summary_tokens is None:
        decision.declined = DeclineReason.EMPTY_PROJECTION
    elif not decision.moved:
        return decision
    elif overflow:
        decision.declined = DeclineReason.OVERFLOW_RECOVERY
    elif freed <= 0:
        decision.declined = DeclineReason.NOTHING_FREED
    elif retained > max_retained_tokens:
        decision.declined = DeclineReason.OVER_BUDGET
    if decision.declined is not None:
        decision.first_kept, decision.moved = proposed, False
    return decision


DECLINED_WHY = {
    DeclineReason.NO_COVERAGE: "no observation covers anything before Pi's cut yet",
    DeclineReason.EMPTY_PROJECTION: "no memory before the cut of this session yet",
    DeclineReason.OVER_BUDGET: "keeping every unobserved message would retain {retained} tokens, over "
                          "compactionMaxRetainedTokens {budget}",
    DeclineReason.NOTHING_FREED: "keeping every unobserved message would free nothing",
    DeclineReason.OVERFLOW_RECOVERY: "Pi compacts to recover from a context overflow, and keeping every unobserved "
                                "message would not free what it needs",
}
