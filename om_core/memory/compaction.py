"""The compaction service: the one path from Pi's cut point to the summary a compaction writes.

Every compaction goes through ``compact_at``: the live hook (``om_core.usecases.live``), ``om compact``,
``om export --compact`` (``om_core.usecases.export``) and the replay's simulated compactions
(``om_core.replay.compaction``). It takes the compaction projection at F (SPEC §4) in one ``World``,
adds the project's memory in the file's world (a setting, off by default), applies the summary
budget ``compactionSummaryMaxTokens`` (SPEC §13) and renders the summary once
(``om_core.memory.render.render_summary``). The answer is a decision: a summary for F, or the
``DeclineReason`` for which Pi's native summarizer runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

import duckdb

from om_core.memory.views import (CompactionResult, DeclineReason, KeptFolds, compaction_projection,
                                  projection_lines)
from om_core.memory.render import left_out_line, render_summary
from om_core.pi.js_length import js_len
from om_core.redaction.redact import redact_line
from om_core.settings import Settings
from om_core.store.catalog import resolve_session, resolve_tip

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

__all__ = ["World", "DeclineReason", "compact_at", "compact", "summary_tokens", "select_newest_first"]

# A budget counted in tokens is checked on the whole rendered text; lines counted one by one may
# merge differently, so a selection that overshoots is redone on a smaller budget this many times.
_FIT_ATTEMPTS = 6


class World(StrEnum):
    """Which compactions set M (SPEC §4): the session file's own, or the replay's simulated too."""

    FILE = "file"
    REPLAYED = "replayed"


def summary_tokens(text: str, settings: Settings) -> int:
    """A summary's tokens in the settings' counter (SPEC §12): Pi's estimate (4 characters a token,
    JavaScript string length) or the real tokenizer."""
    if settings.tokenCounter == "tiktoken":
        from om_core.pi.tokens import count_text_tokens

        return count_text_tokens(text)
    return math.ceil(js_len(text) / 4)


def _units(settings: Settings) -> tuple[Callable[[str], int], int]:
    """How a part of the summary is measured for the selection, and units per budget token: characters
    for Pi's estimate (exact: the whole is their sum), tokens for the tokenizer (checked on the whole)."""
    if settings.tokenCounter == "tiktoken":
        from om_core.pi.tokens import count_text_tokens

        return count_text_tokens, 1
    return js_len, 4


def select_newest_first(observation_costs: Sequence[int], reflection_costs: Sequence[int],
                        capacity: int) -> tuple[set[int], set[int]]:
    """The records a budget of ``capacity`` keeps (SPEC §13), as indexes into each list (oldest
    first): observations get at least half, newest first; reflections the rest, newest first; then
    observations take what reflections left. A record too large for what remains is skipped, and
    the selection goes on with older ones."""
    kept_obs: set[int] = set()
    kept_refl: set[int] = set()
    used = 0
    for i in reversed(range(len(observation_costs))):
        if used + observation_costs[i] <= capacity / 2:
            kept_obs.add(i)
            used += observation_costs[i]
    for i in reversed(range(len(reflection_costs))):
        if used + reflection_costs[i] <= capacity:
            kept_refl.add(i)
            used += reflection_costs[i]
    for i in reversed(range(len(observation_costs))):
        if i not in kept_obs and used + observation_costs[i] <= capacity:
            kept_obs.add(i)
            used += observation_costs[i]
    return kept_obs, kept_refl


def compact_at(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, first_kept: str, settings: Settings, *,
               world: World, instructions: str | None = None,
               pool_max_tokens: int | None = None, kept: KeptFolds | None = None) -> CompactionResult:
    """The compaction at F = ``first_kept`` on the branch ending at ``tip``: the projection in ``world``
    (pool budget ``observationsPoolMaxTokens`` unless given), the project's memory in the file's world,
    ``instructions`` (Pi's ``customInstructions``) after the memory, all within
    ``compactionSummaryMaxTokens``. ``summary`` None with ``declined`` set: Pi's native summary runs.
    The om.folded details list the records the summary shows. ``kept``: the branch's folds read before
    (``compaction_projection``)."""
    pool = settings.observationsPoolMaxTokens if pool_max_tokens is None else pool_max_tokens
    result = compaction_projection(con, session_id, tip, first_kept, pool, replayed=world is World.REPLAYED,
                                   kept=kept)
    result.summaryMaxTokens = budget = settings.summary_max_tokens
    if result.declined is not None:
        return result
    project = None
    if world is World.FILE and settings.projectMemoryInCompaction:  # a session's first compaction may
        from om_core.memory.project_memory import compaction_project_section  # carry its project's memory

        project = compaction_project_section(con, session_id, tip, settings)
    observations, reflections = result.rows()
    refl_lines, obs_lines = projection_lines(observations, reflections)
    whole = render_summary(refl_lines, obs_lines, project_section=project, instructions=instructions)
    assert whole is not None  # the projection holds records
    result.summary, result.summaryTokens = whole, summary_tokens(whole, settings)
    if result.summaryTokens <= budget:  # the common case: the summary as SPEC §5 renders it
        return result
    measure, per_token = _units(settings)
    refl_costs = [measure(redact_line(line)) + 1 for line in refl_lines]  # + the newline that joins it
    obs_costs = [measure(redact_line(line)) + 1 for line in obs_lines]
    reserve = left_out_line(len(obs_lines), len(refl_lines), budget)
    overhead = measure(render_summary(["x"], ["x"], project_section=project, left_out=reserve,
                                      instructions=instructions) or "") - 2 * (measure("x") + 1)
    capacity = budget * per_token - overhead
    for _ in range(_FIT_ATTEMPTS):
        kept_obs, kept_refl = select_newest_first(obs_costs, refl_costs, capacity) if capacity > 0 else (set(), set())
        if not kept_obs and not kept_refl:
            break
        left_obs, left_refl = len(obs_lines) - len(kept_obs), len(refl_lines) - len(kept_refl)
        text = render_summary([line for i, line in enumerate(refl_lines) if i in kept_refl],
                              [line for i, line in enumerate(obs_lines) if i in kept_obs],
                              project_section=project, left_out=left_out_line(left_obs, left_refl, budget),
                              instructions=instructions)
        assert text is not None
        used = summary_tokens(text, settings)
        if used <= budget:
            result.keep({observations[i]["id"] for i in kept_obs}, {reflections[i]["id"] for i in kept_refl})
            result.summary, result.summaryTokens = text, used
            return result
        capacity -= (used - budget) * per_token
    result.keep(set(), set())
    result.summary, result.summaryTokens, result.declined = None, None, DeclineReason.NOTHING_FITS
    return result


def compact(ws: Workspace, session: str, first_kept: str, leaf: str | None = None,
            pool_max_tokens: int | None = None, *, replayed: bool = False,
            instructions: str | None = None, kept: KeptFolds | None = None) -> CompactionResult:
    """``compact_at`` by session reference (id, prefix or file) and leaf (default: the current one) with
    the workspace's settings: `om compact` and the live hook (``kept``: its branch's folds read before)."""
    with ws.read() as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        return compact_at(con, sid, tip, first_kept, ws.settings,
                          world=World.REPLAYED if replayed else World.FILE, instructions=instructions,
                          pool_max_tokens=pool_max_tokens, kept=kept)
