"""Memory as the SQL views compute it: fold, projections, compaction, drift, clocks, coverage, status.

Every function here runs one of the macros in ``sql/views`` and shapes the rows into pydantic
models; none of them folds or projects in Python.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

import duckdb
from pydantic import BaseModel, Field, PrivateAttr

from om_core.store.catalog import branch_for_cut_point, resolve_session, resolve_tip
from om_core.store.db import named_rows, scalar
from om_core.errors import EntryNotFound, InvalidArgument
from om_core.ledger.records import Observation, Reflection
from om_core.ledger.lines import observation_line, reflection_line
from om_core.memory.render import render_summary
from om_core.settings import Settings

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def observation_from_row(row: dict[str, Any]) -> Observation:
    return Observation.model_construct(
        id=row["id"], content=row["content"], timestamp=row["ts"], relevance=row["relevance"],
        sourceEntryIds=list(row["source_entry_ids"]), tokenCount=_number(row["token_count"]),
    )


def reflection_from_row(row: dict[str, Any]) -> Reflection:
    return Reflection.model_construct(
        id=row["id"], content=row["content"], supportingObservationIds=list(row["supporting_observation_ids"]),
        tokenCount=_number(row["token_count"]),
    )


class MemoryView(BaseModel):
    observations: list[Observation] = Field(default_factory=list)
    reflections: list[Reflection] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.observations and not self.reflections

    def summary(self) -> str | None:
        return render_summary([r.line() for r in self.reflections], [o.line() for o in self.observations])

    def observation_tokens(self) -> float:
        return sum(o.tokenCount for o in self.observations)

    def wire(self) -> dict[str, Any]:
        return {"observations": [o.model_dump(mode="json") for o in self.observations],
                "reflections": [r.model_dump(mode="json") for r in self.reflections]}


def split_rows(rows: Iterable[dict[str, Any]]) -> MemoryView:
    """Projection rows (item_kind, fold_order, id, …) as a MemoryView in fold order."""
    view = MemoryView()
    for row in sorted(rows, key=lambda r: (r["item_kind"], r["fold_order"])):
        if row["item_kind"] == "observation":
            view.observations.append(observation_from_row(row))
        else:
            view.reflections.append(reflection_from_row(row))
    return view


def require_on_branch(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, entry_id: str, what: str) -> int:
    position = scalar(con, "position_on_branch", {"session_id": session_id, "tip": tip, "entry_id": entry_id})
    if position is None:
        raise EntryNotFound(f"{what} {entry_id!r} is not on the branch ending at {tip}")
    return position


# ------------------------------------------------------------------ projections


def full_memory(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, boundary: str | None = None) -> MemoryView:
    """Full projection at ``boundary`` (default: the tip): the records covered through it."""
    boundary = boundary or tip
    require_on_branch(con, session_id, tip, boundary, "boundary")
    return split_rows(named_rows(con, "full_projection", {"session_id": session_id, "tip": tip, "boundary": boundary}))


def visible_memory(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> MemoryView:
    """What the agent sees: the lists of the latest folded compaction the session file holds on the
    branch (the extension's om.folded ones); simulated compactions never count here."""
    return split_rows(named_rows(con, "visible_projection", {"session_id": session_id, "tip": tip}))


def replayed_memory(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> MemoryView:
    """The replayed view: the lists of the latest folded compaction on the branch, the replay's
    simulated ones included; what the extension would have shown, not what the agent saw."""
    return split_rows(named_rows(con, "replayed_projection", {"session_id": session_id, "tip": tip}))


class FoldRef(BaseModel):
    """The compaction a visible or replayed view comes from."""

    compaction_id: str
    origin: str  # imported (the session file's om.folded compaction) | simulated (the replay's)
    first_kept_entry_id: str | None
    full_fold: bool | None


def latest_folds(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> tuple[FoldRef | None, FoldRef | None, int]:
    """(the visible view's compaction, the replayed view's compaction, simulated folds on the branch)."""
    refs: dict[bool, FoldRef | None] = {}
    simulated = 0
    for row in named_rows(con, "latest_folds", {"session_id": session_id, "tip": tip}):
        simulated = int(row["simulated_folds"])
        refs[bool(row["replayed"])] = None if row["compaction_id"] is None else FoldRef(
            compaction_id=row["compaction_id"], origin=row["origin"], first_kept_entry_id=row["first_kept_entry_id"],
            full_fold=row["full_fold"])
    return refs.get(False), refs.get(True), simulated


def ledger_rows(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> list[dict[str, Any]]:
    return named_rows(con, "ledger_at", {"session_id": session_id, "tip": tip})


def active_memory(rows: Iterable[dict[str, Any]]) -> MemoryView:
    """The plain fold through the tip (``ledger_rows``): current reflections and active observations,
    what the workers read."""
    return split_rows(r for r in rows if not r["dropped"])


class DeclineReason(StrEnum):
    """Why a compaction renders no summary, so Pi's native summarizer runs instead."""

    EMPTY_PROJECTION = "empty-projection"  # no record covered before F (SPEC §5)
    NOTHING_FITS = "nothing-fits"  # records exist, none fits compactionSummaryMaxTokens (SPEC §13)
    # gap-free compaction's declines (SPEC §13, om_core.memory.gap_free)
    NO_COVERAGE = "no-coverage"  # no observation covers anything before F: nothing to fold
    OVER_BUDGET = "over-budget"  # kept tail plus summary over compactionMaxRetainedTokens
    NOTHING_FREED = "nothing-freed"  # F moved back to where the context already starts
    OVERFLOW_RECOVERY = "overflow-recovery"  # Pi compacts to recover from a context overflow: it must free


class CompactionResult(BaseModel):
    """A compaction projection, and once the compaction service (``om_core.memory.compaction``) has
    applied the summary budget, its decision: the summary with the records it shows, or why it
    declined. Built straight from the query rows: this is the hot path of every compaction, so the
    full records are materialised only when asked for (``details``, ``memory``)."""

    fullFold: bool
    firstKeptEntryId: str
    observationIds: list[str]  # the records the summary shows
    reflectionIds: list[str]
    summary: str | None
    world: Literal["file", "replayed"] = "file"  # which compactions set M (SPEC §4)
    observationWatermarkPosition: int | None = None  # C of SPEC §10: largest watermark included
    normalObservationTokens: float = 0
    declined: DeclineReason | None = None  # set with summary None
    summaryTokens: int | None = None  # the summary as the budget measures it (settings' tokenCounter)
    summaryMaxTokens: int | None = None  # the budget applied (None: the unbudgeted projection)
    leftOutObservations: int = 0  # projection records the budget left out of the summary
    leftOutReflections: int = 0
    _observations: list[dict[str, Any]] = PrivateAttr(default_factory=list)  # projection rows, by column
    _reflections: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    def details(self) -> dict[str, Any]:
        """The om.folded object stored with the compaction (SPEC §5)."""
        return {
            "type": "om.folded", "version": 1, "fullFold": self.fullFold,
            "observations": [{"id": o["id"], "content": o["content"], "timestamp": o["ts"], "relevance": o["relevance"],
                              "sourceEntryIds": list(o["source_entry_ids"]), "tokenCount": _number(o["token_count"])}
                             for o in self._observations],
            "reflections": [{"id": r["id"], "content": r["content"],
                             "supportingObservationIds": list(r["supporting_observation_ids"]),
                             "tokenCount": _number(r["token_count"])} for r in self._reflections],
        }

    @property
    def memory(self) -> MemoryView:
        d = self.details()
        return MemoryView(observations=[Observation.model_construct(**o) for o in d["observations"]],
                          reflections=[Reflection.model_construct(**r) for r in d["reflections"]])

    def keep(self, observation_ids: set[str], reflection_ids: set[str]) -> None:
        """Narrow the records to those the summary shows (the om.folded details list them: visible
        memory is what the agent was shown; the others stay in the ledger and full memory)."""
        self._observations = [o for o in self._observations if o["id"] in observation_ids]
        self._reflections = [r for r in self._reflections if r["id"] in reflection_ids]
        self.leftOutObservations += len(self.observationIds) - len(self._observations)
        self.leftOutReflections += len(self.reflectionIds) - len(self._reflections)
        self.observationIds = [o["id"] for o in self._observations]
        self.reflectionIds = [r["id"] for r in self._reflections]

    def rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The projection rows (observations, reflections) in fold order."""
        return self._observations, self._reflections

    def as_json(self) -> dict[str, Any]:
        return {
            "world": self.world,
            "full_fold": self.fullFold,
            "observations": self.observationIds,
            "reflections": self.reflectionIds,
            "summary": self.summary,
            "declined": None if self.declined is None else self.declined.value,
            "summary_tokens": self.summaryTokens,
            "summary_max_tokens": self.summaryMaxTokens,
            "left_out": {"observations": self.leftOutObservations, "reflections": self.leftOutReflections},
            "details": self.details(),
        }


def kept_entry(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, first_kept: str) -> str:
    """The branch entry F stands for: F itself, or, for one of this project's records (an entry Pi can
    keep first in the file om export writes), the entry it is anchored to."""
    entry = scalar(con, "kept_entry", {"session_id": session_id, "tip": tip, "entry_id": first_kept})
    if entry is None:
        raise EntryNotFound(f"first kept entry {first_kept!r} is not on the branch ending at {tip} "
                            "(neither an entry nor one of om's records there)")
    return entry


def projection_lines(observations: list[dict[str, Any]],
                     reflections: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(reflection lines, observation lines) of projection rows, as the summary shows them."""
    return ([reflection_line(r["id"], r["content"]) for r in reflections],
            [observation_line(o["id"], o["ts"], o["relevance"], o["content"]) for o in observations])


# A branch's compaction folds as read before, by (F, pool limit, replayed): a reader that holds the
# branch keeps them while its records and compactions stay the same (a live session between answers:
# om_core.memory.gap_free_compaction.BranchRows), each the decision row and the projection's rows.
KeptFolds = dict[tuple[str, float, bool], tuple[str, dict[str, Any], list[dict[str, Any]]]]


def compaction_projection(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, first_kept: str,
                          pool_max_tokens: float, *, replayed: bool = False,
                          kept: KeptFolds | None = None) -> CompactionResult:
    """Compaction projection at F with its normal/full-fold decision (SPEC §4), rendered (SPEC §5).

    By default in the session file's world: M comes from the compactions the file holds, so this is
    what the extension computes on the file om export writes. ``replayed`` adds the compactions a
    replay simulated (what the extension would have computed had it lived the session). ``kept``: the
    folds of this branch read before, valid while its records and compactions are unchanged (the
    fold's rows do not depend on entries after them): the rows at this F are taken from there, or
    read and put there."""
    key = (first_kept, pool_max_tokens, replayed)
    found = kept.get(key) if kept is not None else None
    if found is None:
        entry = kept_entry(con, session_id, tip, first_kept)
        params = {"session_id": session_id, "tip": tip, "first_kept": entry, "pool_max": pool_max_tokens,
                  "replayed": replayed}
        decision = named_rows(con, "compaction_decision", params)[0]
        items = named_rows(con, "compaction_projection", {  # in fold order, observations first
            "session_id": session_id, "tip": tip, "first_kept": entry, "others_through": decision["others_through"]})
        found = (entry, decision, items)
        if kept is not None:
            kept[key] = found
    _, decision, items = found
    observations = [r for r in items if r["item_kind"] == "observation"]
    reflections = [r for r in items if r["item_kind"] == "reflection"]
    result = CompactionResult(
        fullFold=bool(decision["full_fold"]),
        firstKeptEntryId=first_kept,
        world="replayed" if replayed else "file",
        observationIds=[o["id"] for o in observations],
        reflectionIds=[r["id"] for r in reflections],
        summary=render_summary(*projection_lines(observations, reflections)),
        declined=None if observations or reflections else DeclineReason.EMPTY_PROJECTION,
        observationWatermarkPosition=decision["c_pos"],
        normalObservationTokens=_number(decision["normal_tokens"]),
    )
    result._observations = observations
    result._reflections = reflections
    return result


class Drift(BaseModel):
    observations_only_in_full: list[str] = Field(default_factory=list)
    reflections_only_in_full: list[str] = Field(default_factory=list)
    visible_no_longer_active: list[str] = Field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.observations_only_in_full) + len(self.reflections_only_in_full) + len(self.visible_no_longer_active)


def drift(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, replayed: bool = False) -> Drift:
    """Full memory against visible memory, or against the replayed view with ``replayed``."""
    out = Drift()
    lists = {"observation_only_in_full": out.observations_only_in_full,
             "reflection_only_in_full": out.reflections_only_in_full,
             "visible_not_active": out.visible_no_longer_active}
    for row in named_rows(con, "memory_drift", {"session_id": session_id, "tip": tip, "replayed": replayed}):
        lists[row["drift"]].append(row["id"])
    return out


class Clock(BaseModel):
    name: str
    tokens: int  # the clock's value on its basis (provider usage growth, or source tokens in the chosen counter)
    tokens_pi: int  # the source-token clock in Pi's estimate
    tokens_tiktoken: int  # the source-token clock in the real tokenizer
    threshold: int | None
    reached: bool | None  # tokens >= threshold
    watermark_entry_id: str | None
    from_position: int
    basis: Literal["usage", "source"] = "source"  # what ``tokens`` measures (SPEC §7)
    context_tokens: int | None = None  # usage basis: U(t), Pi's context estimate at the tip
    baseline_tokens: int | None = None  # usage basis: the context at the anchor
    fallback: str | None = None  # clockBasis usage, but measured on source tokens: why
    due: bool | None = None  # `om status`: the next `om run` runs this stage (om_core.usecases.status)
    why: str | None = None  # `om status`: why the stage would not run when its branch is replayed


USAGE_CLOCKS = ("observer", "reflector")  # the compaction and dropper clocks always count source tokens
CLOCK_ORDER = ("observer", "reflector", "dropper", "compaction")  # as `om status` lists them


def clocks(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings) -> dict[str, Clock]:
    """The four progress clocks at ``tip`` (SPEC §7) with ``settings`` (the workspace's): observer and
    reflector on the provider's usage when ``clockBasis`` is ``usage`` and it can be measured, else on
    source tokens."""
    thresholds = {"observer": settings.observeAfterTokens, "reflector": settings.reflectAfterTokens,
                  "dropper": None, "compaction": settings.compact_threshold}
    out: dict[str, Clock] = {}
    usage = tip_position = None
    if settings.clockBasis == "usage":
        from om_core.memory.usage_clock import ContextUsage

        branch = branch_for_cut_point(con, session_id, tip)
        usage, tip_position = ContextUsage(branch), len(branch) - 1
    for row in named_rows(con, "progress_clocks", {"session_id": session_id, "tip": tip}):
        used = int(row["tokens"] if settings.tokenCounter == "tiktoken" else row["tokens_pi"])
        extra: dict[str, Any] = {}
        if usage is not None and row["clock"] in USAGE_CLOCKS and tip_position >= 0:
            measured = usage.clock(tip_position, row["watermark_pos"])
            extra = {"context_tokens": measured.context_tokens, "baseline_tokens": measured.baseline_tokens}
            if measured.tokens is None:
                extra["fallback"] = measured.reason
            else:
                used, extra["basis"] = measured.tokens, "usage"
        threshold = thresholds[row["clock"]]
        out[row["clock"]] = Clock(
            name=row["clock"], tokens=used, tokens_pi=int(row["tokens_pi"]), tokens_tiktoken=int(row["tokens"]),
            threshold=threshold, reached=None if threshold is None else used >= threshold,
            watermark_entry_id=row["watermark_entry_id"], from_position=row["from_pos"], **extra,
        )
    return {name: out[name] for name in sorted(out, key=CLOCK_ORDER.index)}


class CoveredObservation(BaseModel):
    observation: Observation
    citingReflections: int
    coverage: str  # none | partial | strong


def coverage(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> list[CoveredObservation]:
    rows = named_rows(con, "coverage_tiers", {"session_id": session_id, "tip": tip})
    rows.sort(key=lambda r: r["fold_order"])
    return [CoveredObservation(observation=observation_from_row({**r, "id": r["obs_id"]}),
                               citingReflections=r["citing_reflections"], coverage=r["coverage"]) for r in rows]


# ------------------------------------------------------------------ status


class ReplayedStatus(BaseModel):
    """The replayed view in `om status`: what the extension would have shown had it run live, from the
    latest folded compaction the replay simulated (or the file's own when that is newer). Never what
    the agent saw."""

    label: str = "replayed"
    compaction: FoldRef | None = None
    simulated_compactions: int = 0  # folded simulated compactions on the branch
    observations: int = 0
    reflections: int = 0
    observation_tokens: int | float = 0
    drift: Drift = Field(default_factory=Drift)


class MemoryStatus(BaseModel):
    session_id: str
    tip: str
    observations: dict[str, int]  # recorded, active, dropped, visible
    reflections: dict[str, int]  # recorded, active, dropped (SPEC §13), visible
    visible_compaction: FoldRef | None = None  # the file's om.folded compaction visible memory comes from
    drift: Drift
    replayed: ReplayedStatus = Field(default_factory=ReplayedStatus)
    clocks: dict[str, Clock]
    pools: dict[str, Any]
    last_errors: list[dict[str, Any]] = Field(default_factory=list)


def memory_status(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings) -> MemoryStatus:
    state = ledger_rows(con, session_id, tip)
    obs = [r for r in state if r["item_kind"] == "observation"]
    refl = [r for r in state if r["item_kind"] == "reflection"]
    visible = visible_memory(con, session_id, tip)
    visible_ref, replayed_ref, simulated = latest_folds(con, session_id, tip)
    replayed = replayed_memory(con, session_id, tip)
    active_tokens = sum(r["token_count"] for r in obs if not r["dropped"])
    visible_tokens = visible.observation_tokens()
    errors = named_rows(con, "last_errors", {"session_id": session_id})
    return MemoryStatus(
        session_id=session_id,
        tip=tip,
        observations={"recorded": len(obs), "active": sum(not r["dropped"] for r in obs),
                      "dropped": sum(bool(r["dropped"]) for r in obs), "visible": len(visible.observations)},
        reflections={"recorded": len(refl), "active": sum(not r["dropped"] for r in refl),
                     "dropped": sum(bool(r["dropped"]) for r in refl), "visible": len(visible.reflections)},
        visible_compaction=visible_ref,
        drift=drift(con, session_id, tip),
        replayed=ReplayedStatus(compaction=replayed_ref, simulated_compactions=simulated,
                                observations=len(replayed.observations), reflections=len(replayed.reflections),
                                observation_tokens=_number(replayed.observation_tokens()),
                                drift=drift(con, session_id, tip, replayed=True)),
        clocks=clocks(con, session_id, tip, settings),
        pools={
            "active_tokens": _number(active_tokens), "visible_tokens": _number(visible_tokens),
            "max_tokens": settings.observationsPoolMaxTokens, "target_tokens": settings.pool_target_tokens,
            "active_pressure": round(active_tokens / settings.observationsPoolMaxTokens, 4),
            "visible_pressure": round(visible_tokens / settings.observationsPoolMaxTokens, 4),
            "active_over_target": active_tokens > settings.pool_target_tokens,
        },
        last_errors=errors,
    )


# ------------------------------------------------------------------ by path, for the CLI


class ViewResult(BaseModel):
    """`om view`: one of the three views, and what the others hold when the one asked for is empty."""

    session_id: str
    tip: str
    which: str  # visible | full | replayed
    memory: MemoryView
    compaction: FoldRef | None = None  # visible / replayed: the compaction the lists come from
    fullCounts: tuple[int, int] | None = None  # (observations, reflections) of full memory, when asked
    replayedCounts: tuple[int, int] | None = None  # of the replayed view, when it differs from visible
    offline: bool = False  # the offline baseline wrote some of the session's memory


def session_offline(ws: Workspace, session: str) -> bool:
    """``offline_memory`` of a session named as a SESSION argument names it."""
    with ws.read() as con:
        return offline_memory(con, resolve_session(con, session))


def offline_memory(con: duckdb.DuckDBPyConnection, session_id: str) -> bool:
    """Whether the offline baseline (extractive rules, no model) recorded any of the session's memory."""
    return bool(scalar(con, "offline_memory", {"session_id": session_id}))


def view(ws: Workspace, session: str, leaf: str | None = None, full: bool = False,
         replayed: bool = False) -> ViewResult:
    """Visible memory by default, full memory with ``full``, the replayed view with ``replayed``. An empty
    visible view also reports full memory's and the replayed view's sizes, so the caller can point on."""
    if full and replayed:
        raise InvalidArgument("choose one of --full and --replayed")
    with ws.read() as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        offline = offline_memory(con, sid)
        if full:
            return ViewResult(session_id=sid, tip=tip, which="full", memory=full_memory(con, sid, tip),
                              offline=offline)
        visible_ref, replayed_ref, _ = latest_folds(con, sid, tip)
        if replayed:
            return ViewResult(session_id=sid, tip=tip, which="replayed", memory=replayed_memory(con, sid, tip),
                              compaction=replayed_ref, offline=offline)
        result = ViewResult(session_id=sid, tip=tip, which="visible", memory=visible_memory(con, sid, tip),
                            compaction=visible_ref, offline=offline)
        if result.memory.empty:
            everything = full_memory(con, sid, tip)
            result.fullCounts = (len(everything.observations), len(everything.reflections))
            if replayed_ref is not None and replayed_ref != visible_ref:
                other = replayed_memory(con, sid, tip)
                result.replayedCounts = (len(other.observations), len(other.reflections))
        return result
