"""A plain-Python reference of SPEC §2-§7, used only as a test oracle for the SQL.

It is written straight from the SPEC's words, shares no code with om_core, and favours clarity
over speed: validation (§2), fold (§3), projections and drift (§4), recall (§6), clocks (§7) and
coverage tiers (§8).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

OBS = "om.observations.recorded"
REFL = "om.reflections.recorded"
DROP = "om.observations.dropped"
HEX12 = re.compile(r"^[0-9a-f]{12}$")
RELEVANCE = {"low", "medium", "high", "critical"}


# ---------------------------------------------------------------- §2 validity


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and len(v) > 0


def _tokens(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def valid_observation(o: Any) -> bool:
    return (isinstance(o, dict) and isinstance(o.get("id"), str) and bool(HEX12.match(o["id"]))
            and _nonempty_str(o.get("content")) and _nonempty_str(o.get("timestamp"))
            and o.get("relevance") in RELEVANCE
            and isinstance(o.get("sourceEntryIds"), list) and len(o["sourceEntryIds"]) > 0
            and all(_nonempty_str(s) for s in o["sourceEntryIds"]) and _tokens(o.get("tokenCount")))


def valid_reflection(r: Any) -> bool:
    return (isinstance(r, dict) and isinstance(r.get("id"), str) and bool(HEX12.match(r["id"]))
            and _nonempty_str(r.get("content")) and "\n" not in r["content"] and "\r" not in r["content"]
            and isinstance(r.get("supportingObservationIds"), list) and len(r["supportingObservationIds"]) > 0
            and all(_nonempty_str(s) for s in r["supportingObservationIds"]) and _tokens(r.get("tokenCount")))


def valid_record(kind: str, data: Any) -> bool:
    if not isinstance(data, dict) or not _nonempty_str(data.get("coversUpToId")):
        return False
    if kind == OBS:
        items = data.get("observations")
        return isinstance(items, list) and len(items) > 0 and all(valid_observation(o) for o in items)
    if kind == REFL:
        items = data.get("reflections")
        return isinstance(items, list) and len(items) > 0 and all(valid_reflection(r) for r in items)
    if kind == DROP:
        items = data.get("observationIds")
        return isinstance(items, list) and len(items) > 0 and all(_nonempty_str(i) for i in items)
    return False


def valid_folded(d: Any) -> bool:
    return (isinstance(d, dict) and d.get("type") == "om.folded" and d.get("version") == 1
            and isinstance(d.get("fullFold"), bool)
            and isinstance(d.get("observations"), list) and all(valid_observation(o) for o in d["observations"])
            and isinstance(d.get("reflections"), list) and all(valid_reflection(r) for r in d["reflections"]))


# ---------------------------------------------------------------- the world


@dataclass
class OEntry:
    id: str
    parent: str | None  # effective parent (a forest)
    is_source: bool
    tokens_pi: int
    entry_type: str


@dataclass
class ORecord:
    ledger_id: str
    kind: str
    anchor: str
    origin: str  # imported | pipeline
    seq: int
    data: Any  # the raw payload; only valid ones take part


@dataclass
class OCompaction:
    compaction_id: str
    anchor: str
    origin: str  # pi | imported | simulated
    seq: int
    first_kept: str | None
    details: Any  # om.folded details (valid) for folded ones; None otherwise


@dataclass
class World:
    entries: dict[str, OEntry]
    records: list[ORecord] = field(default_factory=list)
    compactions: list[OCompaction] = field(default_factory=list)

    # ------------------------------------------------------------ §1 branches

    def branch(self, tip: str) -> list[str]:
        path = []
        node: str | None = tip
        while node is not None:
            path.append(node)
            node = self.entries[node].parent
        return path[::-1]

    def leaves(self) -> list[str]:
        parents = {e.parent for e in self.entries.values()}
        return [i for i in self.entries if i not in parents]

    # ------------------------------------------------------------ §2 branch-local records

    def branch_records(self, tip: str) -> tuple[list[str], dict[str, int], list[ORecord]]:
        path = self.branch(tip)
        pos = {e: i for i, e in enumerate(path)}
        recs = [r for r in self.records if r.anchor in pos and valid_record(r.kind, r.data)]
        recs.sort(key=lambda r: (pos[r.anchor], r.origin != "imported", r.seq))
        return path, pos, recs

    def branch_compactions(self, tip: str) -> list[OCompaction]:
        path = self.branch(tip)
        pos = {e: i for i, e in enumerate(path)}
        comps = [c for c in self.compactions if c.anchor in pos]
        comps.sort(key=lambda c: (pos[c.anchor], c.origin == "simulated", c.seq))
        return comps

    # ------------------------------------------------------------ §3 fold

    @staticmethod
    def fold(records: list[ORecord]) -> tuple[list[dict], list[dict]]:
        """(active observations, reflections) in first-seen order."""
        first_obs: dict[str, dict] = {}
        first_refl: dict[str, dict] = {}
        tombstones: set[str] = set()
        for r in records:
            if r.kind == OBS:
                for o in r.data["observations"]:
                    first_obs.setdefault(o["id"], o)
            elif r.kind == REFL:
                for x in r.data["reflections"]:
                    first_refl.setdefault(x["id"], x)
            else:
                tombstones.update(r.data["observationIds"])
        return [o for i, o in first_obs.items() if i not in tombstones], list(first_refl.values())

    def plain_fold(self, tip: str) -> tuple[list[dict], list[dict]]:
        """Fold through the tip by the records' own position: every record on the branch."""
        _, _, recs = self.branch_records(tip)
        return self.fold(recs)

    def recorded_observation_ids(self, tip: str) -> tuple[list[str], set[str]]:
        _, _, recs = self.branch_records(tip)
        seen: list[str] = []
        tomb: set[str] = set()
        for r in recs:
            if r.kind == OBS:
                for o in r.data["observations"]:
                    if o["id"] not in seen:
                        seen.append(o["id"])
            elif r.kind == DROP:
                tomb.update(r.data["observationIds"])
        return seen, tomb

    # ------------------------------------------------------------ §4 projections

    def _covered(self, pos: dict[str, int], r: ORecord, bound: int | None) -> bool:
        wm = r.data["coversUpToId"]
        return bound is not None and wm in pos and pos[wm] <= bound

    def full_projection(self, tip: str, boundary: str | None = None) -> tuple[list[dict], list[dict]]:
        path, pos, recs = self.branch_records(tip)
        b = pos[boundary or tip]
        return self.fold([r for r in recs if self._covered(pos, r, b)])

    def visible(self, tip: str, replayed: bool = False) -> tuple[list[dict], list[dict]]:
        """The latest folded compaction's lists: only those the file holds, or (replayed) simulated too."""
        folded = [c for c in self.branch_compactions(tip)
                  if c.details is not None and (replayed or c.origin != "simulated")]
        if not folded:
            return [], []
        d = folded[-1].details
        return list(d["observations"]), list(d["reflections"])

    def last_full_fold_position(self, tip: str, replayed: bool = False) -> int | None:
        """M: the latest full fold's first kept entry; the file's compactions only, unless replayed."""
        pos = {e: i for i, e in enumerate(self.branch(tip))}
        for c in reversed(self.branch_compactions(tip)):
            if c.origin == "simulated" and not replayed:
                continue
            if c.details is not None and c.details["fullFold"] and c.first_kept in pos:
                return pos[c.first_kept]
        return None

    def compaction_projection(self, tip: str, first_kept: str, pool_max: float,
                              replayed: bool = False) -> tuple[bool, list[dict], list[dict]]:
        path, pos, recs = self.branch_records(tip)
        f = pos[first_kept]
        m = self.last_full_fold_position(tip, replayed)
        normal = [r for r in recs if self._covered(pos, r, f if r.kind == OBS else m)]
        obs, refl = self.fold(normal)
        if sum(o["tokenCount"] for o in obs) >= pool_max:
            obs, refl = self.fold([r for r in recs if self._covered(pos, r, f)])
            return True, obs, refl
        return False, obs, refl

    def drift(self, tip: str, replayed: bool = False) -> tuple[list[str], list[str], list[str]]:
        full_obs, full_refl = self.full_projection(tip)
        vis_obs, vis_refl = self.visible(tip, replayed)
        fo, fr = [o["id"] for o in full_obs], [r["id"] for r in full_refl]
        vo, vr = [o["id"] for o in vis_obs], [r["id"] for r in vis_refl]
        return [i for i in fo if i not in vo], [i for i in fr if i not in vr], [i for i in vo if i not in fo]

    # ------------------------------------------------------------ §7 clocks

    def clocks(self, tip: str) -> dict[str, int]:
        path, pos, recs = self.branch_records(tip)

        def tokens_from(start: int) -> int:
            return sum(self.entries[e].tokens_pi for e in path[start:] if self.entries[e].is_source)

        out = {}
        for name, kind in (("observer", OBS), ("reflector", REFL), ("dropper", DROP)):
            marks = [pos[r.data["coversUpToId"]] for r in recs if r.kind == kind and r.data["coversUpToId"] in pos]
            out[name] = tokens_from(max(marks) + 1 if marks else 0)
        comps = self.branch_compactions(tip)
        if not comps:
            out["compaction"] = tokens_from(0)
        else:
            last = comps[-1]
            out["compaction"] = tokens_from(pos[last.first_kept] if last.first_kept in pos else pos[last.anchor] + 1)
        return out

    # ------------------------------------------------------------ §8 coverage

    def coverage(self, tip: str) -> list[tuple[str, str]]:
        obs, refl = self.plain_fold(tip)
        out = []
        for o in obs:
            n = sum(1 for r in refl if o["id"] in r["supportingObservationIds"])
            out.append((o["id"], "none" if n == 0 else "partial" if n == 1 else "strong"))
        return out

    # ------------------------------------------------------------ §6 recall

    def recall(self, tip: str, memory_id: str) -> dict[str, Any]:
        if not HEX12.match(memory_id):
            return {"status": "invalid_id"}
        path, pos, recs = self.branch_records(tip)
        dropped = {i for r in recs if r.kind == DROP for i in r.data["observationIds"]}
        obs_matches = [o for r in recs if r.kind == OBS for o in r.data["observations"] if o["id"] == memory_id]
        refl_matches = [x for r in recs if r.kind == REFL for x in r.data["reflections"] if x["id"] == memory_id]
        if not obs_matches and not refl_matches:
            return {"status": "not_found"}
        first_obs: dict[str, dict] = {}
        for r in recs:
            if r.kind == OBS:
                for o in r.data["observations"]:
                    first_obs.setdefault(o["id"], o)
        missing_support = []
        supporting = []
        for x in refl_matches:
            for s in x["supportingObservationIds"]:
                if s not in first_obs:
                    if s not in missing_support:
                        missing_support.append(s)
                elif s not in [o["id"] for o in supporting]:
                    supporting.append(first_obs[s])
        partial = bool(missing_support)
        for o in obs_matches + supporting:
            for src in o["sourceEntryIds"]:
                if src not in pos or not self.entries[src].is_source:
                    partial = True
        kind = "mixed" if obs_matches and refl_matches else "observation" if obs_matches else "reflection"
        return {
            "status": "found",
            "kind": kind,
            "collision": len(obs_matches) + len(refl_matches) > 1,
            "partial": partial,
            "observation_statuses": ["dropped" if o["id"] in dropped else "active" for o in obs_matches],
            "missing_support": missing_support,
        }
