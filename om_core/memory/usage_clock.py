"""Progress clocks on the provider's usage (SPEC §7): how much the model's context grew since a
worker's anchor, measured as the extension (3.x) measures it.

At position t of a branch:

* U(t), the current context, is Pi's own ``tokensBefore`` estimate on the branch up to t
  (pi-sessions.md §7.5): the usage of the last assistant message with usable usage after the latest
  compaction or context_edit, plus the estimates of the entries after it, system messages included;
  without such a message, the current system message (Pi replays every system message into one)
  plus every other message of the projection. It is unknown when a compaction lies before t and no
  assistant message with usable usage follows it.
* the baseline of a worker whose latest watermark is at W, with K the latest compaction before t:
  if K > W, the usable usage of the first assistant message after K; else, with a W, the usable
  usage of the last assistant message at or before W; with neither, 0 (the clock is U(t) itself).
* the clock is U(t) - baseline, or None (the caller then uses the source-token clock) when U(t) is
  unknown, the baseline is missing, or the difference is negative (a change of model or provider).

Only compactions the file holds count here: a compaction the replay simulated never happened in
the archived session, so the recorded usage after it does not reflect it.

``ContextUsage`` precomputes running sums once per branch so that every query is O(1) (the replay
asks at every turn end); a branch with context edits falls back to Pi's projection where an edit
decides the estimate.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from om_core.pi.branch_entry import BranchEntry, CurrentSystemMessage, message_tokens
from om_core.pi.cutpoint import project_branch, tokens_before, usable_usage


@dataclass(frozen=True, slots=True)
class UsageClock:
    """One worker's clock on provider usage at t (``tokens`` None: fall back to source tokens)."""

    tokens: int | None
    context_tokens: int | None  # U(t)
    baseline_tokens: int | None
    reason: str | None = None  # why it fell back


class ContextUsage:
    """U(t) and the usage baselines of one branch."""

    def __init__(self, branch: Sequence[BranchEntry]) -> None:
        self.branch = branch
        self.prefix = [0]  # estimates of what each entry contributes (compactions aside)
        self.system_prefix = [0]  # the part of them that system messages contribute
        self.system_at: list[int] = []  # positions of system messages
        self.system_tokens: list[int] = []  # the current system message's estimate from each of them on
        self.usable: list[int] = []  # positions of assistant messages with usable usage
        self.usage: dict[int, int] = {}
        self.compactions: list[int] = []
        self.barriers: list[int] = []  # compactions and context edits
        self.edits: list[int] = []
        current = CurrentSystemMessage()
        for p, entry in enumerate(branch):
            tokens = system = 0
            if entry.entry_type == "compaction":
                self.compactions.append(p)
                self.barriers.append(p)
            elif entry.entry_type == "context_edit":
                self.edits.append(p)
                self.barriers.append(p)
            else:
                for message in entry.context_messages():
                    estimate = message_tokens(message)
                    tokens += estimate
                    if message.get("role") == "system":
                        system += estimate
                        current.add(message)
                        self.system_at.append(p)
                        self.system_tokens.append(current.tokens())
                    total = usable_usage(message)
                    if total is not None:
                        self.usable.append(p)
                        self.usage[p] = total
            self.prefix.append(self.prefix[-1] + tokens)
            self.system_prefix.append(self.system_prefix[-1] + system)

    @staticmethod
    def _last_at_or_before(positions: list[int], t: int) -> int | None:
        k = bisect.bisect_right(positions, t)
        return positions[k - 1] if k else None

    def _sum(self, start: int, end: int) -> int:
        """Estimates at positions start..end inclusive."""
        return self.prefix[end + 1] - self.prefix[start] if end >= start else 0

    def context_at(self, t: int) -> int | None:
        """U(t): Pi's tokensBefore estimate with the branch ending at t (None: unknown)."""
        barrier = self._last_at_or_before(self.barriers, t)
        a = self._last_at_or_before(self.usable, t)
        if a is not None and (barrier is None or a > barrier):
            return self.usage[a] + self._sum(a + 1, t)
        if self._last_at_or_before(self.compactions, t) is not None:
            return None  # no usable usage since the compaction
        if self._last_at_or_before(self.edits, t) is None:  # the current system message + every other message
            k = bisect.bisect_right(self.system_at, t)
            return (self.system_tokens[k - 1] if k else 0) + self._sum(0, t) - self.system_prefix[t + 1]
        return tokens_before(project_branch(self.branch[: t + 1]))  # an edit decides: Pi's projection

    def clock(self, t: int, watermark: int | None) -> UsageClock:
        """The growth of the context at t since a worker's anchor (watermark position W or None)."""
        context = self.context_at(t)
        k = self._last_at_or_before(self.compactions, t)
        if k is not None and (watermark is None or k > watermark):
            i = bisect.bisect_right(self.usable, k)
            first = self.usable[i] if i < len(self.usable) and self.usable[i] <= t else None
            baseline = None if first is None else self.usage[first]
            missing = "no assistant usage after the latest compaction"
        elif watermark is not None:
            last = self._last_at_or_before(self.usable, watermark)
            baseline = None if last is None else self.usage[last]
            missing = "no assistant usage at or before the watermark"
        else:
            baseline, missing = 0, None
        if context is None:
            return UsageClock(None, None, baseline, "context unknown: no assistant usage since the latest compaction")
        if baseline is None:
            return UsageClock(None, context, None, missing)
        if context < baseline:
            return UsageClock(None, context, baseline, "negative growth (the model or provider changed)")
        return UsageClock(context - baseline, context, baseline)

