"""The reflection dropper (SPEC §13): the fourth session stage, which retires reflections when the
active reflections outgrow ``reflectionsPoolTargetTokens``.

Its input shows each active reflection with evidence computed here, not by the model: the newest
time among its supporting observations (dropped ones included), how many of them are still active
or already dropped, and its orphan risk (supporting observations already dropped that no other
active reflection cites: dropping this reflection would lose what they meant). Its check keeps at
most ``max_drops`` of the proposals: orphan-free candidates first, then the oldest evidence. The
record it appends is ``om.reflections.dropped`` (``replacedBy``, for a retirement by a newer
reflection, is the reflector's to set; this stage leaves it out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import duckdb

from om_core.ledger.records import DROP_REASON, Reflection
from om_core.memory.views import reflection_from_row
from om_core.ledger.lines import reflection_line
from om_core.settings import Settings
from om_core.store import db as dbmod
from om_core.store.sqlfiles import query
from om_core.workers.checks import MALFORMED_DROP_CALL, TokenCounter, drop_call_ids
from om_core.workers.inputs import _digest, max_drops
from om_core.workers.memory_layout import MemoryBudget, MemoryLayout, laid_out_memory


@dataclass(frozen=True)
class ReflectionCandidate:
    """One active reflection with the evidence the reflection dropper decides on."""

    reflection: Reflection
    tokens: int  # its rendered line ``[id] content``, in the settings' counter
    last_evidence: str | None  # newest timestamp among its supporting observations (dropped included)
    support_active: int
    support_dropped: int
    orphan_risk: tuple[str, ...]  # dropped supporting observations no other active reflection cites
    order: int  # fold order among the active reflections (0 = oldest)

    def rank(self) -> tuple[int, str, int]:
        """Safest first: orphan-free, then the oldest evidence, then the oldest reflection."""
        return (1 if self.orphan_risk else 0, self.last_evidence or "", self.order)

    def line(self) -> str:
        risk = f"orphan risk {len(self.orphan_risk)}" if self.orphan_risk else "no orphan risk"
        return (f"{self.reflection.id} last evidence {self.last_evidence or 'unknown'}; support "
                f"{self.support_active} active, {self.support_dropped} dropped; {risk}")


@dataclass
class ReflectionDropperInput:
    session_id: str
    tip: str
    candidates: list[ReflectionCandidate]
    pool_tokens: int
    target_tokens: int
    max_drops: int
    watermark: str  # the reflector run's reflection watermark: the record's coversUpToId
    memory: MemoryLayout = field(default_factory=MemoryLayout)  # as the workers read it

    @property
    def reflections(self) -> list[Reflection]:
        return [c.reflection for c in self.candidates]

    def stage_key(self, model: str) -> str:
        return _digest(["reflection-dropper", model, self.session_id, [c.line() for c in self.candidates],
                        [r.line() for r in self.reflections], self.max_drops, self.watermark])


def evidence(rows: list[dict[str, Any]], count_tokens: TokenCounter) -> list[ReflectionCandidate]:
    """The active reflections of ``ledger_coverage`` rows with their evidence, in fold order."""
    observations = {r["id"]: r for r in rows if r["item_kind"] == "observation"}
    active = [r for r in rows if r["item_kind"] == "reflection" and not r["dropped"]]
    cited_by: dict[str, int] = {}
    for r in active:
        for obs_id in set(r["supporting_observation_ids"]):
            cited_by[obs_id] = cited_by.get(obs_id, 0) + 1
    out = []
    for order, r in enumerate(sorted(active, key=lambda x: x["fold_order"])):
        support = [observations[i] for i in dict.fromkeys(r["supporting_observation_ids"]) if i in observations]
        dropped = [o for o in support if o["dropped"]]
        times = [o["ts"] for o in support if o["ts"]]
        out.append(ReflectionCandidate(
            reflection=reflection_from_row(r), tokens=count_tokens(reflection_line(r["id"], r["content"])),
            last_evidence=max(times) if times else None, support_active=len(support) - len(dropped),
            support_dropped=len(dropped), orphan_risk=tuple(o["id"] for o in dropped if cited_by.get(o["id"], 0) <= 1),
            order=order))
    return out


def reflection_dropper_input(con: duckdb.DuckDBPyConnection, session_id: str, tip: str, settings: Settings,
                             reflection_watermark: str | None,
                             count_tokens: TokenCounter) -> ReflectionDropperInput | None:
    """None unless the active reflections are over ``reflectionsPoolTargetTokens`` (measured on their
    rendered lines) and a reflection watermark is given."""
    if reflection_watermark is None:
        return None
    rows = dbmod.rows_as_dicts(con.execute(query("ledger_coverage"), {"session_id": session_id, "tip": tip}))
    candidates = evidence(rows, count_tokens)
    pool = sum(c.tokens for c in candidates)
    target = settings.reflectionsPoolTargetTokens
    if pool <= target or not candidates:
        return None
    return ReflectionDropperInput(session_id, tip, candidates, pool, target, max_drops(pool, target, len(candidates)),
                                  reflection_watermark, laid_out_memory(rows, settings.observationsPoolMaxTokens,
                                                                        MemoryBudget.of(settings, newest_first=False)))


@dataclass
class ReflectionDropCheck:
    """Collects proposed reflection ids; the final choice keeps at most ``max_drops``, safest first
    (``ReflectionCandidate.rank``)."""

    tool: ClassVar[str] = "drop_reflections"
    duplicates: ClassVar[int] = 0
    active: dict[str, ReflectionCandidate]
    max_drops: int
    proposed: list[str] = field(default_factory=list)
    ignored: int = 0
    malformed: int = 0
    reason: str | None = None

    @property
    def problems(self) -> int:
        return self.ignored + self.malformed

    @property
    def rejected(self) -> int:
        return self.ignored

    def submit(self, args: Any) -> str:
        ids = drop_call_ids(self, args)
        if ids is None:
            return MALFORMED_DROP_CALL
        lines = []
        for value in ids:
            if not isinstance(value, str) or value not in self.active:
                self.ignored += 1
                lines.append(f"ignored {value!r}: not an active reflection")
            elif value in self.proposed:
                lines.append(f"already proposed [{value}]")
            else:
                self.proposed.append(value)
                lines.append(f"proposed [{value}]")
        lines.append(f"{len(self.proposed)} proposed so far; at most {self.max_drops} will be dropped")
        return "drop_reflections receipt:\n" + "\n".join(lines)

    @property
    def accepted(self) -> list[str]:
        if len(self.proposed) <= self.max_drops:
            return list(self.proposed)
        return sorted(self.proposed, key=lambda i: self.active[i].rank())[: self.max_drops]

    @property
    def notes(self) -> dict[str, str]:
        return {DROP_REASON: self.reason} if self.reason else {}


def offline_reflection_drops(inp: ReflectionDropperInput) -> list[str]:
    """The offline baseline's proposal, a named fallback for runs without a model: the ``max_drops``
    safest candidates by rank (orphan-free, oldest evidence first)."""
    return [c.reflection.id for c in sorted(inp.candidates, key=ReflectionCandidate.rank)[: inp.max_drops]]

