"""Replaying an archived branch the way the extension would have lived it (SPEC §9).

Events are derived from the branch: a turn ends at the last entry before the next assistant or user
message (or at the branch end); the agent settles at the last entry before the next user message
(or at the branch end); Pi's own compaction entries are points where the extension would have
folded. At each event the progress clocks (SQL) decide which stages are due.

The clocks are read from SQL at the first event and again after anything changes the ledger or the
compactions on the branch; between reads, a clock grows by the source tokens of the entries passed,
taken from the same branch rows (prefix sums), so a 1,000-entry branch costs a handful of queries.
With ``clockBasis`` usage (SPEC §7) the observer and reflector clocks are the provider's context
growth since their watermark, from running sums over the branch (``ContextUsage``), falling back to
the source-token clock where usage cannot measure it.
Stages run through a ``StageRunner`` (om_core.replay.stage_runner, the one runner of every stage),
compactions through ``simulate_compaction``.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from om_core.replay.compaction import SimulatedCompaction, simulate_compaction, stored_simulation
from om_core.store.catalog import branch_for_cut_point
from om_core.store.db import rows_as_dicts
from om_core.pi.cutpoint import CutPoint, NothingToCompact, PreviousCompaction, compaction_cut_point
from om_core.memory.views import USAGE_CLOCKS, clocks as sql_clocks
from om_core.memory.usage_clock import ContextUsage
from om_core.settings import Settings
from om_core.store.sqlfiles import query
from om_core.workers.stage_kinds import (
    CLOCKED_STAGES,
    OWN_CLOCK_STAGES,
    STAGES,
    Stage,
    StageOutcome,
    StageRequest,
    run_in_order,
    silent,
)
from om_core.replay.stage_runner import StageRunner
from om_core.workers.stages import prepare_stage

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

# Stages whose input is read from the ledger on the branch alone (not from the entries after a
# watermark): the reflector's (its current reflections, active observations, observation watermark).
LEDGER_INPUT = frozenset({"reflector"})

EventKind = Literal["archive_compaction", "turn_end", "settled"]
_KIND_ORDER = {"archive_compaction": 0, "turn_end": 1, "settled": 2}


@dataclass(frozen=True)
class ReplayEntry:
    position: int
    entry_id: str
    entry_type: str | None
    role: str | None
    tokens_pi: int
    tokens: int
    is_source: bool
    first_kept_entry_id: str | None
    extension_folded: bool = False  # a compaction the extension already folded (valid om.folded details)


@dataclass(frozen=True)
class Event:
    position: int
    kind: EventKind


def _is(entry: ReplayEntry, *roles: str) -> bool:
    return entry.entry_type == "message" and entry.role in roles


def replay_events(branch: list[ReplayEntry]) -> list[Event]:
    """turn_end, settled and archive_compaction events of a branch, in replay order."""
    n = len(branch)
    events: set[Event] = set()
    following = [i for i, e in enumerate(branch) if _is(e, "user", "assistant")]
    users = [i for i, e in enumerate(branch) if _is(e, "user")]
    for i, entry in enumerate(branch):
        if _is(entry, "assistant"):
            k = bisect.bisect_right(following, i)
            events.add(Event(following[k] - 1 if k < len(following) else n - 1, "turn_end"))
        elif _is(entry, "user"):
            k = bisect.bisect_right(users, i)
            events.add(Event(users[k] - 1 if k < len(users) else n - 1, "settled"))
        elif entry.entry_type == "compaction" and i > 0:
            events.add(Event(i, "archive_compaction"))
    if n:
        events.add(Event(n - 1, "settled"))  # the agent has settled at the end of the branch in any case
    return sorted(events, key=lambda e: (e.position, _KIND_ORDER[e.kind]))


Compactor = Callable[..., SimulatedCompaction]
Progress = Callable[[dict[str, Any]], None]


@dataclass
class BranchReport:
    session_id: str
    leaf: str
    entries: int
    events: int = 0
    stages: dict[str, int] = field(default_factory=dict)  # "observer:recorded" -> count
    compactions: int = 0
    native_fallbacks: int = 0
    failures: list[str] = field(default_factory=list)
    drained: bool = False
    drain_first_kept: str | None = None  # drained: where Pi cuts the finished branch (F), where it would compact
    def stages_run(self) -> dict[str, int]:
        """Stage runs by stage (observer, reflector, …), the skipped ones left out."""
        per_stage: dict[str, int] = {}
        for key, n in self.stages.items():
            stage, _, outcome = key.partition(":")
            if outcome != "skipped":
                per_stage[stage] = per_stage.get(stage, 0) + n
        return per_stage

    def count(self, outcome: StageOutcome) -> None:
        key = f"{outcome.stage}:{outcome.outcome}"
        self.stages[key] = self.stages.get(key, 0) + 1
        if outcome.outcome == "failed":
            self.failures.append(f"{outcome.stage} at {outcome.tip}: {outcome.error}")


class BranchReplayer:
    """One branch's replay; ``runner`` runs its stages (None: an outlook, which runs none)."""

    def __init__(self, ws: Workspace, session_id: str, leaf: str, runner: StageRunner | None, *,
                 drain: bool = True, compactor: Compactor = simulate_compaction, run_id: str | None = None,
                 progress: Progress | None = None) -> None:
        self.db = ws  # the workspace: its database and its settings
        self.session_id = session_id
        self.leaf = leaf
        self.settings: Settings = ws.settings
        self.runner = runner
        self.drain = drain
        self.compactor = compactor
        self.run_id = run_id
        self.progress = progress or (lambda _: None)
        self._clock_at: int | None = None
        self._clock_from: dict[str, int] = {}
        self._marks: dict[str, int | None] = {}
        self._version = 0  # counts this replay's own changes to the ledger and the compactions
        self._unchanged: dict[str, tuple[int, int, StageOutcome]] = {}  # stage -> (position, version, outcome)
        self._asked_at: dict[str, int] = {}  # stage -> the position it was last asked at
        self._idle_at: dict[str, tuple[int, int]] = {}  # own-clock stage -> (position, version) it found nothing at

    # ---------------------------------------------------------------- branch facts

    def _load(self) -> None:
        params = {"session_id": self.session_id, "tip": self.leaf}
        with self.db.read() as con:
            self.branch = [ReplayEntry(**row) for row in rows_as_dicts(con.execute(query("replay_branch"), params))]
            changes = {r["position"] for r in rows_as_dicts(con.execute(query("ledger_anchor_positions"), params))}
            compactions = rows_as_dicts(con.execute(query("compaction_anchor_positions"), params))
            empty = rows_as_dicts(con.execute(query("empty_runs"), params))
            # the stages on their own clock: where their records sit (the clock starts after the latest)
            self.own_records = {stage.kind: [r["position"] for r in rows_as_dicts(con.execute(
                query("record_anchor_positions"), {**params, "kind": stage.record_kind}))] for stage in OWN_CLOCK_STAGES}
            self.cut_branch = branch_for_cut_point(con, self.session_id, self.leaf)  # Pi's view of each entry
        self.usage = ContextUsage(self.cut_branch) if self.settings.clockBasis == "usage" else None
        self.changes = sorted(changes | {c["position"] for c in compactions})
        # simulated compactions (this run's and earlier runs'): each bounds the cut points after it
        simulated = [c for c in compactions if c["simulated"]]
        self.simulated_at = sorted(c["position"] for c in simulated)
        self.simulated_kept = {c["position"]: c["simulated_first_kept"] for c in simulated}
        self.position = {e.entry_id: e.position for e in self.branch}
        self.empty_runs: dict[str, list[int]] = {"observer": [], "reflector": []}  # per stage that may back off
        for r in empty:
            self.empty_runs[r["stage"]].append(r["position"])
        use_tiktoken = self.settings.tokenCounter == "tiktoken"
        self.prefix = [0]
        for e in self.branch:
            self.prefix.append(self.prefix[-1] + ((e.tokens if use_tiktoken else e.tokens_pi) if e.is_source else 0))

    def tokens_between(self, start: int, end: int) -> int:
        """Source tokens at positions start..end inclusive."""
        if end < start:
            return 0
        return self.prefix[end + 1] - self.prefix[max(start, 0)]

    def _changed(self, position: int) -> None:
        bisect.insort(self.changes, position)
        self._clock_at = None
        self._version += 1

    # ---------------------------------------------------------------- clocks

    def clocks(self, t: int) -> dict[str, int]:
        """Clock values at position t: SQL decides where each clock starts; tokens are summed here."""
        stale = self._clock_at is None or self._clock_at > t
        if not stale:
            k = bisect.bisect_right(self.changes, self._clock_at)
            stale = k < len(self.changes) and self.changes[k] <= t
        if stale:
            with self.db.read() as con:
                read = sql_clocks(con, self.session_id, self.branch[t].entry_id, self.settings.model_copy(
                    update={"clockBasis": "source"}))  # the usage clocks are measured here, incrementally
            self._clock_at = t
            self._clock_from = {name: c.from_position for name, c in read.items()}
            self._marks = {name: (None if c.watermark_entry_id is None else self.position.get(c.watermark_entry_id))
                           for name, c in read.items()}
        values = {name: self.tokens_between(start, t) for name, start in self._clock_from.items()}
        if self.usage is not None:  # observer and reflector on the provider's usage, where it can be measured
            for name in USAGE_CLOCKS:
                measured = self.usage.clock(t, self._marks.get(name))
                if measured.tokens is not None:
                    values[name] = measured.tokens
        return values

    def backoff_holds(self, stage: Stage, t: int) -> bool:
        """After a deliberate empty run, wait for another threshold of source (SPEC §9: the observer's
        backoff; the reflector's only with ``reflectorBackoff``: the extension asks it again while its
        clock is due)."""
        runs = self.empty_runs[stage.kind]
        k = bisect.bisect_right(runs, t)
        if k == 0:
            return False
        empty_at = runs[k - 1]  # the latest empty run at or before t
        watermark = self._marks.get(stage.kind)
        if watermark is not None and watermark >= empty_at:
            return False
        return self.tokens_between(empty_at + 1, t) < stage.threshold(self.settings)

    def not_due(self, stage: Stage, t: int) -> str | None:
        """Why a stage with a clock is not due at turn end t (None: it is due). It is due once its clock
        reaches its threshold, unless it backs off after an empty result and that backoff holds (SPEC §9)."""
        clock, threshold = self.clocks(t)[stage.kind], stage.threshold(self.settings)
        if clock < threshold:
            return f"below its threshold ({clock:,} of {threshold:,} tokens)"
        if stage.backs_off(self.settings) and self.backoff_holds(stage, t):
            runs = self.empty_runs[stage.kind]
            empty_at = runs[bisect.bisect_right(runs, t) - 1]
            return (f"backed off: it gave an empty result on purpose at {self.branch[empty_at].entry_id} and waits "
                    f"for another {threshold:,} source tokens ({self.tokens_between(empty_at + 1, t):,} so far)")
        return None

    def due(self, stage: Stage, t: int) -> bool:
        return self.not_due(stage, t) is None

    def own_clock(self, stage: Stage, t: int) -> int:
        """Source tokens at t since the stage's own latest record on the branch (all of them before its
        first): the reflection dropper's clock (SPEC §13)."""
        records = self.own_records[stage.kind]
        k = bisect.bisect_right(records, t)
        return self.tokens_between(records[k - 1] + 1 if k else 0, t)

    def proactive_cut(self, t: int) -> CutPoint | str:
        """Where a proactive compaction at settled point t cuts, or why there is none there: the
        compaction clock is below its threshold, or Pi would not compact (pi-sessions.md §7.4)."""
        clock, threshold = self.clocks(t)["compaction"], self.settings.compact_threshold
        if clock < threshold:
            return f"below its threshold ({clock:,} of {threshold:,} tokens)"
        try:
            return self.cut_point(t)
        except NothingToCompact as exc:
            return f"Pi would not compact there: {exc}"

    # ---------------------------------------------------------------- running

    def _repeat(self, t: int, req: StageRequest) -> StageOutcome | None:
        """The outcome a stage whose input is the ledger alone (``LEDGER_INPUT``) gave at an earlier
        position, where nothing changed the ledger since: the same input, so the same stage key and the
        same answer from the exactly-once state (already appended, or empty before). The profile's
        largest cost was the reflector read again at every turn end while due, only to find this."""
        last = self._unchanged.get(req.stage)
        if last is None or req.reflection_watermark is not None or req.chunk_until is not None:
            return None
        position, version, outcome = last
        if not self._unchanged_since(position, version, t):
            return None
        self.runner.check()  # the run's breaker and budget stop a repeated stage as they stop any other
        return outcome.model_copy(update={"tip": req.tip, "receipts": [], "calls": []})

    def _stage(self, report: BranchReport, t: int, req: StageRequest) -> StageOutcome:
        outcome = self._repeat(t, req)
        self._asked_at[req.stage] = t
        if outcome is None:
            outcome = self.runner(req)
            if req.stage in LEDGER_INPUT and outcome.outcome in ("skipped", "empty") and not outcome.ledger_id:
                self._unchanged[req.stage] = (t, self._version, outcome)
        if not silent(outcome, req):
            report.count(outcome)
        if outcome.ledger_id:
            self._changed(t)
            if req.stage in self.own_records:
                bisect.insort(self.own_records[req.stage], t)
        if outcome.outcome == "empty" and req.stage in self.empty_runs:
            bisect.insort(self.empty_runs[req.stage], t)
        self.progress({"session_id": self.session_id, "leaf": self.leaf, "position": t, "of": len(self.branch),
                       "stage": req.stage, "outcome": outcome.outcome, "calls": len(outcome.calls)})
        return outcome

    def _request(self, t: int, stage: Stage, chunk_until: int | None = None) -> StageRequest:
        return StageRequest(self.session_id, self.branch[t].entry_id, stage.kind, chunk_until=chunk_until)

    def _run(self, report: BranchReport, t: int, stage: Stage) -> list[StageOutcome]:
        """The stage and its follow-ups (the dropper after a recording reflector); nothing while the
        watermark it needs is missing (the reflector needs an observation watermark)."""
        if stage.needs is not None and self._marks.get(stage.needs) is None:
            return []
        return run_in_order(lambda req: self._stage(report, t, req), self._request(t, stage))

    def _unchanged_since(self, position: int, version: int, t: int) -> bool:
        """Nothing changed the ledger on the branch after ``position`` up to t (this replay's records
        and earlier runs' alike)."""
        k = bisect.bisect_right(self.changes, position)
        return version == self._version and position <= t and not (k < len(self.changes) and self.changes[k] <= t)

    def _turn_end(self, report: BranchReport, t: int) -> None:
        """Each stage with a clock, in order, when due (SPEC §9), then the stages on their own clock."""
        for stage in CLOCKED_STAGES:
            if self.due(stage, t) and any(o.outcome == "failed" for o in self._run(report, t, stage)):
                return  # a failure skips the later stages of this turn
        self._own_clocks(report, t)

    def _own_clocks(self, report: BranchReport, t: int) -> None:
        """The stages on their own clock (the reflection dropper, SPEC §13) due at t: one that just ran
        here as a follow-up is not asked again; nor is one that found nothing to do while the ledger
        stayed as it was (its input is the ledger alone). Each runs with the watermark of the stage it
        follows (the reflector's), as its follow-up would."""
        for stage in OWN_CLOCK_STAGES:
            idle = self._idle_at.get(stage.kind)
            if (self._asked_at.get(stage.kind) == t or (idle is not None and self._unchanged_since(*idle, t))
                    or self.own_clock(stage, t) < stage.own_clock(self.settings)):
                continue
            self.clocks(t)  # the watermarks at t
            mark = self._marks.get(stage.after)
            if mark is None:
                continue
            req = StageRequest(self.session_id, self.branch[t].entry_id, stage.kind,
                               reflection_watermark=self.branch[mark].entry_id)
            if not self._stage(report, t, req).ledger_id:
                self._idle_at[stage.kind] = (t, self._version)

    def _compact(self, report: BranchReport, t: int, tip: int, first_kept: str, trigger: str) -> None:
        result = self.compactor(self.db, self.session_id, tip=self.branch[tip].entry_id,
                                anchor=self.branch[t].entry_id, first_kept=first_kept, trigger=trigger,
                                settings=self.settings, run_id=self.run_id)
        if not result.existed:
            report.compactions += 1
            report.native_fallbacks += int(result.native_fallback)
            self._changed(t)
            if t not in self.simulated_at:
                bisect.insort(self.simulated_at, t)
            self.simulated_kept[t] = result.kept_first or result.first_kept
        self.progress({"session_id": self.session_id, "leaf": self.leaf, "position": t, "of": len(self.branch),
                       "stage": "compaction", "outcome": "native_fallback" if result.native_fallback else "folded"})

    def cut_point(self, t: int) -> CutPoint:
        """Pi's cut point if it compacted with the branch ending at t; the latest simulated compaction
        at or before t bounds it like a written entry would."""
        k = bisect.bisect_right(self.simulated_at, t)
        after = None
        if k:
            position = self.simulated_at[k - 1]
            after = PreviousCompaction(position, self.simulated_kept.get(position))
        return compaction_cut_point(self.cut_branch[: t + 1], self.settings.keepRecentTokens, after=after,
                                    rules=self.settings.cutPointRules)

    def run(self) -> BranchReport:
        self._load()
        report = BranchReport(self.session_id, self.leaf, len(self.branch))
        if not self.branch:
            return report
        events = replay_events(self.branch)
        report.events = len(events)
        for event in events:
            t = event.position
            if event.kind == "archive_compaction":
                # The ledger as it stood when Pi compacted: records anchored before the entry. A
                # compaction the extension folded itself already holds what the agent saw.
                first_kept = self.branch[t].first_kept_entry_id
                if (first_kept is not None and self.position.get(first_kept, t) < t
                        and not self.branch[t].extension_folded):
                    self._compact(report, t, t - 1, first_kept, "archive")
            elif event.kind == "turn_end":
                self._turn_end(report, t)
            elif isinstance(cut := self.proactive_cut(t), CutPoint):
                self._compact(report, t, t, cut.firstKeptEntryId, "proactive")
        if self.drain:
            self._drain(report)
        return report

    def drain_cut(self) -> int | None:
        """Where Pi would cut the finished branch at its tip (the position of F), or None where Pi
        would not compact there."""
        try:
            return self.cut_point(len(self.branch) - 1).firstKeptPosition
        except NothingToCompact:
            return None

    def _drain(self, report: BranchReport) -> None:
        """A finished branch: observe until nothing is uncovered, then one reflector/dropper pass.

        The chunks end exactly before Pi's cut point F at the tip, and the kept tail from F on is
        observed as a chunk of its own: the next compaction at or after F then includes every
        observation of the history before it (no batch crosses the boundary, SPEC §9, §10)."""
        end = len(self.branch) - 1
        observer, reflector = STAGES["observer"], STAGES["reflector"]
        first_kept = self.drain_cut()
        for until in ([first_kept - 1] if first_kept else []) + [None]:
            while True:  # each chunk moves the watermark, so this ends
                outcome = self._stage(report, end, self._request(end, observer, chunk_until=until))
                if outcome.outcome == "failed":
                    return
                if outcome.outcome != "recorded" or not outcome.ledger_id:
                    break  # nothing left uncovered (up to the bound), or a deliberate empty chunk
            if outcome.outcome == "empty":
                break  # a deliberate empty chunk: its span stays uncovered, the drain goes no further
        ran = self._run(report, end, reflector) if self.clocks(end)[reflector.kind] > 0 else []
        if not any(o.outcome == "failed" for o in ran):
            self._own_clocks(report, end)
        report.drained = True
        report.drain_first_kept = self.branch[first_kept].entry_id if first_kept else None


    # ---------------------------------------------------------------- outlook (om status)

    def outlook(self, model: str) -> Outlook:
        """What a replay of this branch would do at its end if it ran now with ``model``, by the same
        rules as ``run`` and the stage runner's own preparation, without running anything."""
        self._load()
        end = len(self.branch) - 1
        if end < 0:
            return Outlook(None, {stage.kind: "the branch is empty" for stage in CLOCKED_STAGES}, "the branch is empty", 0)
        turn_ends = [e.position for e in replay_events(self.branch) if e.kind == "turn_end"]
        stages = {stage.kind: self._stage_outlook(stage, turn_ends[-1], model) if turn_ends
                  else "no turn has ended on this branch yet" for stage in CLOCKED_STAGES}
        cut = self.proactive_cut(end)
        compaction = cut if isinstance(cut, str) else None
        if compaction is None:
            with self.db.read() as con:
                if stored_simulation(con, self.session_id, self.branch[end].entry_id, cut.firstKeptEntryId, "proactive"):
                    compaction = "an earlier run already simulated this compaction"
        self.clocks(end)  # the watermarks at the end
        mark = self._marks.get("observer")
        return Outlook(self.branch[turn_ends[-1]].entry_id if turn_ends else None, stages, compaction,
                       self.tokens_between(0 if mark is None else mark + 1, end))

    def _stage_outlook(self, stage: Stage, t: int, model: str) -> str | None:
        why = self.not_due(stage, t)
        if why is not None:
            return why
        with self.db.read() as con:  # no input, already appended, or this input was answered empty before
            prepared, outcome = prepare_stage(con, self._request(t, stage), self.settings, model)
        return None if prepared is not None else outcome.reason


@dataclass(frozen=True)
class Outlook:
    """What the next replay of a branch would do at its end (``BranchReplayer.outlook``)."""

    last_turn_end: str | None  # where the clocked stages run last (the entry id; None: no turn ended yet)
    stages: dict[str, str | None]  # observer, reflector: None if it would run there, else why not
    compaction: str | None  # None if a proactive compaction would be simulated at the branch end, else why not
    uncovered_tokens: int  # source tokens after the observer's watermark: what a drain observes in any case


def branch_outlook(ws: Workspace, session_id: str, tip: str, model: str) -> Outlook:
    """``BranchReplayer.outlook`` of the branch ending at ``tip``, with the workspace's settings."""
    return BranchReplayer(ws, session_id, tip, None).outlook(model)


def session_leaves(ws: Workspace, session_id: str) -> list[str]:
    """Every leaf of a session, in file order (branches sharing a prefix share its records)."""
    with ws.read() as con:
        return [row["entry_id"] for row in rows_as_dicts(con.execute(query("session_leaves"),
                                                                     {"session_id": session_id}))]


def replay_branches(ws: Workspace, session_id: str, runner: StageRunner, *, drain: bool = True,
                    run_id: str | None = None, progress: Progress | None = None) -> list[BranchReport]:
    """Replay every branch of a session, in file order, one stage at a time, with the workspace's settings
    (the replay engine's loop: om_core.replay.engine.replay_payload)."""
    return [BranchReplayer(ws, session_id, leaf, runner, drain=drain, run_id=run_id, progress=progress).run()
            for leaf in session_leaves(ws, session_id)]
