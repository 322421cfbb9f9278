"""What the reader is sent under each condition, as Pi would send it.

Every condition ends with the question as the last user message. The history before it is:

* ``om``: the memory pipeline replays and drains the session with the worker model; a final
  compaction is taken before the question at Pi's cut point (``simulate_compaction``: the
  compaction projection, rendered without a model); the reader gets that summary in Pi's
  compaction wrapper, then the kept tail. An empty projection falls back to the native summary, as
  Pi would (and says so).
* ``native``: the same cut; the summary is written by the reader model in the manner of Pi's own
  compaction (our prompt), then the kept tail.
* ``oracle``: only the evidence sessions, in full.
* ``full``: the whole history, when it fits the reader's window; otherwise skipped, said so.

Pi sends message text without times; LongMemEval's questions need them, so every condition gets
the same convention: each user message starts with its date and time in brackets (the dates come
from ``haystack_dates``; the question's from ``question_date``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from om_core.eval import prompts as P
from om_core.store.catalog import branch_for_cut_point, resolve_tip
from om_core.replay.compaction import simulate_compaction
from om_core.pi.cutpoint import NothingToCompact, compaction_cut_point
from om_core.store.db import named_row, named_rows
from om_core.errors import OmError
from om_core.eval.data import Instance
from om_core.eval.haystack import Haystack, HistoryTurn
from om_core.replay.branch import BranchReport
from om_core.settings import Settings
from om_core.pi.tokens import count_text_tokens

CONDITIONS = ("om", "oracle", "native", "full")
MESSAGE_OVERHEAD_TOKENS = 4  # role and separators of one chat message, roughly


class MemoryIncomplete(OmError):
    """A memory stage failed, so the om memory of this instance is not complete; a rerun resumes it."""


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%d (%a) %H:%M")


def turn_message(turn: HistoryTurn) -> dict[str, str]:
    if turn.role == "user":
        return {"role": "user", "content": f"[{stamp(turn.at)}] {turn.content}"}
    return {"role": "assistant", "content": turn.content}


def question_message(instance: Instance) -> dict[str, str]:
    return {"role": "user", "content": f"[{stamp(instance.asked_at)}] {instance.question}"}


def summary_message(summary: str) -> dict[str, str]:
    return {"role": "user", "content": P.COMPACTION_SUMMARY_PREFIX + summary + P.COMPACTION_SUMMARY_SUFFIX}


def serialize(turns: list[HistoryTurn]) -> str:
    """The history as a summarizer reads it (Pi's ``[User]: …`` / ``[Assistant]: …`` serialization)."""
    parts = []
    for t in turns:
        parts.append(f"[User]: [{stamp(t.at)}] {t.content}" if t.role == "user" else f"[Assistant]: {t.content}")
    return "\n\n".join(parts)


def message_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(count_text_tokens(m.get("content") or "") + MESSAGE_OVERHEAD_TOKENS for m in messages)


@dataclass
class ReaderContext:
    """The messages the reader gets (after its system prompt), and facts about how they were made."""

    condition: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    summary: str | None = None
    first_kept_entry_id: str | None = None  # None: nothing was cut
    kept_turns: int = 0
    history_turns: int = 0
    tokens: int = 0
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # why this condition was not asked
    memory: dict[str, Any] = field(default_factory=dict)  # om: observations, reflections, full fold

    def facts(self) -> dict[str, Any]:
        return {"summary_chars": len(self.summary) if self.summary is not None else None,
                "first_kept_entry_id": self.first_kept_entry_id, "kept_turns": self.kept_turns,
                "history_turns": self.history_turns, "context_tokens": self.tokens, "notes": self.notes,
                **self.memory}


def _finish(ctx: ReaderContext, instance: Instance) -> ReaderContext:
    ctx.messages.append(question_message(instance))
    ctx.tokens = message_tokens(ctx.messages)
    return ctx


def whole_history(condition: str, instance: Instance, turns: list[HistoryTurn]) -> ReaderContext:
    """``full`` and ``oracle``: the turns as messages, no summary."""
    ctx = ReaderContext(condition, [turn_message(t) for t in turns], kept_turns=len(turns), history_turns=len(turns))
    return _finish(ctx, instance)


def compacted(condition: str, instance: Instance, haystack: Haystack, summary: str | None,
              first_kept: str | None, notes: list[str]) -> ReaderContext:
    """``om`` and ``native``: the summary in Pi's wrapper, then the kept tail from ``first_kept``."""
    start = haystack.position[first_kept] if first_kept is not None else 0
    kept = haystack.turns[start:]
    messages = ([summary_message(summary)] if summary else []) + [turn_message(t) for t in kept]
    ctx = ReaderContext(condition, messages, summary=summary, first_kept_entry_id=first_kept, kept_turns=len(kept),
                        history_turns=len(haystack.turns), notes=list(notes))
    return _finish(ctx, instance)


# ------------------------------------------------------------------ the cut, shared by om and native


def final_cut(db: Any, session_id: str, settings: Settings) -> tuple[str | None, str | None]:
    """(tip, F) of a manual compaction before the question, at Pi's cut point over the whole history.
    F is None where Pi would not compact (the history is within keepRecentTokens)."""
    with db.read() as con:
        tip = resolve_tip(con, session_id, None)
        branch = branch_for_cut_point(con, session_id, tip)
    try:
        cut = compaction_cut_point(branch, settings.keepRecentTokens, rules=settings.cutPointRules)
    except NothingToCompact:
        return tip, None
    if cut.firstKeptPosition == 0:  # nothing before the cut: Pi has nothing to summarize
        return tip, None
    return tip, cut.firstKeptEntryId


NO_CUT_NOTE = "no compaction: Pi would not compact this history (it fits keepRecentTokens); the reader sees all of it"


# ------------------------------------------------------------------ om


@dataclass
class OmMemory:
    summary: str | None
    first_kept: str | None
    notes: list[str]
    facts: dict[str, Any]


def om_memory(db: Any, haystack: Haystack, settings: Settings, branches: list[BranchReport],
              run_id: str | None = None) -> OmMemory:
    """The final compaction, after the session's replay and drain (``branches``: the replay's reports,
    om_core.replay.engine.replay_session on ``db``, the evaluation's workspace).

    The final compaction cuts where the drain cut (Pi's cut point at the tip, bounded by the latest
    compaction the replay simulated, as Pi would be), so no observed batch crosses it; where the
    drain had no cut, Pi's cut over the whole history.
    """
    sid = haystack.session_id
    failures = [f for r in branches for f in r.failures]
    if failures:
        raise MemoryIncomplete(f"{len(failures)} memory stage(s) failed: {failures[0]}")
    drained_at = branches[-1].drain_first_kept if branches else None  # a haystack has one branch
    with db.read() as con:  # stage runs, not the replay's outcome events (most of those reuse a result)
        stages = {r["stage_outcome"]: int(r["runs"]) for r in named_rows(con, "eval_stage_runs", {"session_id": sid})}
    tip, first_kept = final_cut(db, sid, settings)
    first_kept = drained_at or first_kept
    if first_kept is None:
        return OmMemory(None, None, [NO_CUT_NOTE], {"stages": stages})
    done = simulate_compaction(db, sid, tip=tip, anchor=tip, first_kept=first_kept, trigger="eval",
                               settings=settings, run_id=run_id)
    with db.read() as con:
        stored = named_row(con, "eval_compaction", {"session_id": sid, "compaction_id": done.compaction_id})
    notes = [stored["note"]] if stored["note"] else []
    facts = {"stages": stages, "compaction_id": done.compaction_id, "full_fold": stored["full_fold"],
             "observations": stored["observations"], "reflections": stored["reflections"],
             "plain_first_kept_entry_id": first_kept}
    return OmMemory(stored["summary"] if stored["folded"] else None, stored["first_kept_entry_id"] or first_kept,
                    notes, facts)

