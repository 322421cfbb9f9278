"""A plain-Python reference of the project fold, used only as a test oracle for the SQL
(``project_fold`` in sql/views/080_projects.sql). Written from the rule, sharing no code with om_core:
records in append order; the first occurrence of a reflection id wins (earliest record, then place in
it); every retired id is a tombstone, even one not seen yet, and its reason is that of the first
retirement naming it; supporting ids a user forgot are left out, and a reflection left with none is
retired by that."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PReflection:
    id: str
    content: str
    supporting_ids: list[str]
    token_count: float


@dataclass
class PRecord:
    kind: str  # recorded | retired
    reflections: list[PReflection] = field(default_factory=list)
    retirements: list[tuple[str, str]] = field(default_factory=list)  # (id, reason)


def project_fold(records: list[PRecord], forgotten: set[str]) -> list[dict]:
    first: dict[str, PReflection] = {}
    order: list[str] = []
    retired: dict[str, tuple[int, str]] = {}
    for n, record in enumerate(records, start=1):
        if record.kind == "recorded":
            for r in record.reflections:
                if r.id not in first:
                    first[r.id] = r
                    order.append(r.id)
        else:
            for refl_id, reason in record.retirements:
                retired.setdefault(refl_id, (n, reason))
    out = []
    for fold_order, refl_id in enumerate(order, start=1):
        r = first[refl_id]
        kept = [s for s in r.supporting_ids if s not in forgotten]
        if refl_id in retired:
            reason = retired[refl_id][1]
        elif not kept:
            reason = "its support was forgotten"
        else:
            reason = None
        out.append({"fold_order": fold_order, "id": refl_id, "content": r.content, "supporting_ids": kept,
                    "retired_at": retired[refl_id][0] if refl_id in retired else None, "retired_reason": reason,
                    "retired": reason is not None})
    return out
