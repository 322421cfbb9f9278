"""The memory as a worker request carries it (SPEC §8, §13): the ledger's records laid out so a
provider cache serves the earlier prompt as a prefix, within ``workerMemoryMaxTokens``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from om_core.ledger.lines import observation_line
from om_core.settings import Settings
from om_core.workers.prompts import reflection_memory_line


def memory_line(row: dict[str, Any]) -> str:
    """One memory item as workers read it: an observation's rendered line, or
    ``[id] reflection: … (supports: …)``."""
    if row["item_kind"] == "observation":
        return observation_line(row["id"], row["ts"], row["relevance"], row["content"])
    return reflection_memory_line(row["id"], row["content"], list(row["supporting_observation_ids"]))


@dataclass
class MemoryLayout:
    """The memory as the workers read it: ``lines`` in ledger order, and ``dropped``, the ids of the
    records among them dropped since the lines were laid out (listed after them)."""

    lines: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryBudget:
    """What a worker request's memory may hold (``workerMemoryMaxTokens``, SPEC §13): observations at
    least half, reflections the rest, each side reclaiming what the other leaves; ``newest_first``
    for the observer and the reflector, the oldest records for the droppers (pruning old records is
    their job). ``count`` measures a line in the settings' counter."""

    max_tokens: int
    newest_first: bool
    count: Callable[[str], int]

    @classmethod
    def of(cls, settings: Settings, newest_first: bool) -> MemoryBudget:
        from om_core.pi.tokens import count_text_tokens
        from om_core.workers.checks import pi_token_counter

        return cls(settings.worker_memory_max_tokens, newest_first,
                   pi_token_counter if settings.tokenCounter == "pi" else count_text_tokens)

    def apply(self, shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records of ``shown`` (in layout order) that fit, in the same order."""
        from om_core.memory.compaction import select_newest_first

        costs = [self.count(memory_line(r)) + 1 for r in shown]
        if sum(costs) <= self.max_tokens:
            return shown
        obs = [i for i, r in enumerate(shown) if r["item_kind"] == "observation"]
        refl = [i for i, r in enumerate(shown) if r["item_kind"] != "observation"]
        if not self.newest_first:  # the selection takes the tail of each list: give it the oldest there
            obs, refl = obs[::-1], refl[::-1]
        kept_obs, kept_refl = select_newest_first([costs[i] for i in obs], [costs[i] for i in refl], self.max_tokens)
        keep = {obs[i] for i in kept_obs} | {refl[i] for i in kept_refl}
        return [r for i, r in enumerate(shown) if i in keep]


def laid_out_memory(rows: list[dict[str, Any]], full_fold_tokens: int,
                    budget: MemoryBudget | None = None) -> MemoryLayout:
    """Current reflections and observations in ledger order (the order they were first recorded),
    laid out so that between two stages the memory only grows at its end: a provider cache serves the
    earlier prompt as a prefix. A drop does not cut its line out of the middle; the id is listed
    after the memory instead, until the lines shown reach ``full_fold_tokens`` of observations
    (``observationsPoolMaxTokens``, the pool pressure at which a compaction's full fold applies drops,
    SPEC §4): then the memory is laid out anew without them. Walked in record order, so the layout
    is a function of the branch's ledger alone (``rows``: ``ledger_at``'s, dropped ones included)."""
    events: list[tuple[int, int, int, dict[str, Any]]] = []  # (record order, 0 item | 1 drop, place, row)
    for r in rows:
        never_shown = r["dropped"] and r["dropped_at"] < r["rec_order"]  # tombstoned before it was recorded
        if never_shown:
            continue
        events.append((r["rec_order"], 0, r["fold_order"], r))
        if r["dropped"]:
            events.append((r["dropped_at"], 1, r["fold_order"], r))
    events.sort(key=lambda e: e[:3])
    shown: dict[str, dict[str, Any]] = {}
    pending: list[dict[str, Any]] = []  # observation and reflection drops (SPEC §13) alike
    tokens = 0.0
    for _, drop, _, r in events:
        if drop:
            pending.append(r)
        else:
            shown[r["id"] + r["item_kind"]] = r
            if r["item_kind"] == "observation":
                tokens += r["token_count"]
        if pending and tokens >= full_fold_tokens:  # a full fold: the memory is laid out anew
            for gone in pending:
                shown.pop(gone["id"] + gone["item_kind"])
                if gone["item_kind"] == "observation":
                    tokens -= gone["token_count"]
            pending = []
    kept = list(shown.values()) if budget is None else budget.apply(list(shown.values()))
    return MemoryLayout([memory_line(r) for r in kept], [r["id"] for r in pending])
