"""The memory ledger's records (SPEC §2): wire models, validation, ids, and import into DuckDB.

Validation is strict and all-or-nothing per record: one bad item invalidates its whole record (and
one bad item in ``om.folded`` details invalidates those details). Invalid records, unknown ``om.*``
types and the extension's older V2 formats are ignored everywhere; the ingest counts them and keeps
a row in ``ledger_rejects`` so analysts can see why.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import duckdb
import pyarrow as pa
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, StrictBool,
                      StrictStr, ValidationError, field_validator)

from om_core.store.db import insert_arrow, named_rows, scalar
from om_core.ledger.lines import observation_line, reflection_line
from om_core.pi.session import loads_line
from om_core.store.sqlfiles import query

OBSERVATIONS_RECORDED = "om.observations.recorded"
REFLECTIONS_RECORDED = "om.reflections.recorded"
OBSERVATIONS_DROPPED = "om.observations.dropped"
REFLECTIONS_DROPPED = "om.reflections.dropped"  # SPEC §13
LEDGER_KINDS = (OBSERVATIONS_RECORDED, REFLECTIONS_RECORDED, OBSERVATIONS_DROPPED, REFLECTIONS_DROPPED)
FOLDED_TYPE = "om.folded"

Relevance = Literal["low", "medium", "high", "critical"]
RELEVANCE_ORDER = {"low": 0, "medium": 1, "high": 2, "critical": 3}
_MEMORY_ID = re.compile(r"[0-9a-f]{12}")

NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]


def memory_id(content: str) -> str:
    """Observation and reflection ids: the first 12 hex digits of SHA-256 of the content (UTF-8)."""
    return hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def is_memory_id(value: Any) -> bool:
    return isinstance(value, str) and bool(_MEMORY_ID.fullmatch(value))


_MEMORY_REFERENCE = re.compile(r"\[([0-9a-f]{12})\]")


def memory_references(content: str) -> list[str]:
    """The memory ids a note names in brackets (``… (supersedes [3f9a0c1b2d4e])``), in order, once each:
    how an observation or reflection says which earlier one it replaces."""
    return list(dict.fromkeys(_MEMORY_REFERENCE.findall(content)))


# om's notes on a record it appended, kept beside the wire fields (as pydantic extras, so they travel
# with a computed stage result) and stored in columns of their own; a session file never holds them
# (om export writes the wire fields only).
TS_REPAIRED_FROM = "tsRepairedFrom"  # an observation: the time the model gave, when the checks replaced it
DROP_REASON = "reason"  # a drop record: the reason the dropper gave
RETIRES = "retires"  # a reflections record: {new reflection id: [the current ones its "(supersedes [id])" retires]}
SUPERSEDED = "superseded"  # the ``kind`` of a reflection drop record a superseding reflection wrote


def om_note(item: BaseModel, key: str) -> Any:
    return (item.model_extra or {}).get(key)


def _token_count(value: Any) -> float:
    # JSON.parse reads an integer beyond a double as Infinity, so such a count is not finite either
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1.7976931348623157e308:
        raise ValueError("tokenCount must be a finite number >= 0")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError("tokenCount must be a finite number >= 0")
    return value


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


def _memory_id_field(kind: str) -> Any:
    """The ``id`` of an observation or reflection: a memory id, or an error that names the kind."""

    def check(value: str) -> str:
        if not is_memory_id(value):
            raise ValueError(f"{kind} id must be 12 lowercase hex characters")
        return value

    return Annotated[StrictStr, AfterValidator(check)]


ObservationId = _memory_id_field("observation")
ReflectionId = _memory_id_field("reflection")
TokenCount = Annotated[int | float, BeforeValidator(_token_count)]


class Observation(_Wire):
    id: ObservationId
    content: NonEmptyStr
    timestamp: NonEmptyStr
    relevance: Relevance
    sourceEntryIds: list[NonEmptyStr] = Field(min_length=1)
    tokenCount: TokenCount

    def line(self) -> str:
        """The rendered line its tokenCount counts (SPEC §2, §5)."""
        return observation_line(self.id, self.timestamp, self.relevance, self.content)


class Reflection(_Wire):
    id: ReflectionId
    content: NonEmptyStr
    supportingObservationIds: list[NonEmptyStr] = Field(min_length=1)
    tokenCount: TokenCount

    @field_validator("content")
    @classmethod
    def _single_line(cls, v: str) -> str:
        if "\n" in v or "\r" in v:
            raise ValueError("reflection content must be a single line")
        return v

    def line(self) -> str:
        return reflection_line(self.id, self.content)


class ObservationsRecorded(_Wire):
    observations: list[Observation] = Field(min_length=1)
    coversUpToId: NonEmptyStr


class ReflectionsRecorded(_Wire):
    reflections: list[Reflection] = Field(min_length=1)
    coversUpToId: NonEmptyStr


class ObservationsDropped(_Wire):
    observationIds: list[NonEmptyStr] = Field(min_length=1)
    coversUpToId: NonEmptyStr


class ReflectionsDropped(_Wire):
    """Reflection ids tombstoned (SPEC §13). ``replacedBy`` (a retirement by a newer reflection) and
    ``kind`` are what some versions add: accepted whatever their shape, kept and written back as read."""

    reflectionIds: list[NonEmptyStr] = Field(min_length=1)
    coversUpToId: NonEmptyStr
    replacedBy: JsonValue = None
    kind: JsonValue = None


class FoldedDetails(_Wire):
    """``details`` of a compaction the extension (or this project) folded from the ledger."""

    type: Literal["om.folded"]
    version: Literal[1]
    fullFold: StrictBool
    observations: list[Observation]
    reflections: list[Reflection]

    @field_validator("version", mode="before")
    @classmethod
    def _version_is_the_number_one(cls, value: Any) -> Any:
        # the extension checks `version === 1`: the JSON number 1 (1.0 alike), never `true`
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != 1:
            raise ValueError("version must be the number 1")
        return 1


RECORD_MODELS: dict[str, type[_Wire]] = {
    OBSERVATIONS_RECORDED: ObservationsRecorded,
    REFLECTIONS_RECORDED: ReflectionsRecorded,
    OBSERVATIONS_DROPPED: ObservationsDropped,
    REFLECTIONS_DROPPED: ReflectionsDropped,
}

LedgerPayload = ObservationsRecorded | ReflectionsRecorded | ObservationsDropped | ReflectionsDropped


def parse_record(kind: str, data: Any) -> LedgerPayload | None:
    """The record if ``data`` is a valid V3 record of ``kind``; None otherwise (ignored, never fatal)."""
    model = RECORD_MODELS.get(kind)
    if model is None or not isinstance(data, dict):
        return None
    try:
        return model.model_validate(data)  # type: ignore[return-value]
    except ValidationError:
        return None


def parse_folded(details: Any) -> FoldedDetails | None:
    if not isinstance(details, dict) or details.get("type") != FOLDED_TYPE:
        return None
    try:
        return FoldedDetails.model_validate(details)
    except ValidationError:
        return None


def rejection_reason(kind: str, data: Any) -> str:
    """A short, human reason why a record was ignored."""
    model = RECORD_MODELS.get(kind)
    if model is None:
        return "unknown or V2 om.* type"
    if not isinstance(data, dict):
        return "data is not an object"
    try:
        model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"invalid {where}: {first['msg']}"[:300]
    return "valid"


# ------------------------------------------------------------------ rows


@dataclass
class LedgerRows:
    """Column lists for the ledger tables, filled record by record and written with one insert each."""

    records: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "ledger_id", "kind", "covers_up_to_id", "anchor_entry_id", "origin", "created_at",
        "run_id", "stage", "stage_key")})
    observations: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "ledger_id", "item_index", "obs_id", "content", "ts", "relevance", "source_entry_ids",
        "token_count", "ts_repaired_from")})
    reflections: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "ledger_id", "item_index", "refl_id", "content", "supporting_observation_ids",
        "token_count")})
    drops: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "ledger_id", "item_index", "obs_id", "reason")})
    reflection_drops: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "ledger_id", "item_index", "refl_id", "reason", "replaced_by", "kind")})
    folds: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "compaction_id", "origin", "anchor_entry_id", "first_kept_entry_id", "folded", "full_fold",
        "summary", "note", "trigger", "gap_safe", "plain_first_kept_entry_id", "created_at", "run_id")})
    fold_items: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "compaction_id", "item_kind", "item_index", "id", "content", "ts", "relevance",
        "source_entry_ids", "supporting_observation_ids", "token_count")})
    rejects: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "session_id", "entry_id", "kind", "reason", "run_id")})

    def add_record(self, session_id: str, ledger_id: str, kind: str, payload: LedgerPayload, *, anchor: str,
                   origin: str, created_at: str | None, run_id: str | None, stage: str | None = None,
                   stage_key: str | None = None) -> None:
        _append(self.records, session_id=session_id, ledger_id=ledger_id, kind=kind,
                covers_up_to_id=payload.coversUpToId, anchor_entry_id=anchor, origin=origin, created_at=created_at,
                run_id=run_id, stage=stage, stage_key=stage_key)
        if isinstance(payload, ObservationsRecorded):
            for i, o in enumerate(payload.observations):
                _append(self.observations, session_id=session_id, ledger_id=ledger_id, item_index=i, obs_id=o.id,
                        content=o.content, ts=o.timestamp, relevance=o.relevance,
                        source_entry_ids=list(o.sourceEntryIds), token_count=float(o.tokenCount),
                        ts_repaired_from=_text_note(o, TS_REPAIRED_FROM))
        elif isinstance(payload, ReflectionsRecorded):
            for i, r in enumerate(payload.reflections):
                _append(self.reflections, session_id=session_id, ledger_id=ledger_id, item_index=i, refl_id=r.id,
                        content=r.content, supporting_observation_ids=list(r.supportingObservationIds),
                        token_count=float(r.tokenCount))
        elif isinstance(payload, ReflectionsDropped):
            reason = _text_note(payload, DROP_REASON)
            replaced, kind = (None if v is None else json.dumps(v, ensure_ascii=False) for v in
                              (payload.replacedBy, payload.kind))
            for i, refl_id in enumerate(payload.reflectionIds):
                _append(self.reflection_drops, session_id=session_id, ledger_id=ledger_id, item_index=i,
                        refl_id=refl_id, reason=reason, replaced_by=replaced, kind=kind)
        else:
            reason = _text_note(payload, DROP_REASON)
            for i, obs_id in enumerate(payload.observationIds):
                _append(self.drops, session_id=session_id, ledger_id=ledger_id, item_index=i, obs_id=obs_id,
                        reason=reason)

    def add_fold(self, session_id: str, compaction_id: str, *, origin: str, anchor: str, first_kept: str | None,
                 details: FoldedDetails | None, summary: str | None, note: str | None, trigger: str | None,
                 created_at: str | None, run_id: str | None, gap_safe: bool | None = None,
                 plain_first_kept: str | None = None) -> None:
        _append(self.folds, session_id=session_id, compaction_id=compaction_id, origin=origin, anchor_entry_id=anchor,
                first_kept_entry_id=first_kept, folded=details is not None,
                full_fold=details.fullFold if details else None, summary=summary, note=note, trigger=trigger,
                gap_safe=gap_safe, plain_first_kept_entry_id=plain_first_kept, created_at=created_at, run_id=run_id)
        if details is None:
            return
        for i, o in enumerate(details.observations):
            _append(self.fold_items, session_id=session_id, compaction_id=compaction_id, item_kind="observation",
                    item_index=i, id=o.id, content=o.content, ts=o.timestamp, relevance=o.relevance,
                    source_entry_ids=list(o.sourceEntryIds), supporting_observation_ids=None,
                    token_count=float(o.tokenCount))
        for i, r in enumerate(details.reflections):
            _append(self.fold_items, session_id=session_id, compaction_id=compaction_id, item_kind="reflection",
                    item_index=i, id=r.id, content=r.content, ts=None, relevance=None, source_entry_ids=None,
                    supporting_observation_ids=list(r.supportingObservationIds), token_count=float(r.tokenCount))

    def reject(self, session_id: str, entry_id: str, kind: str | None, reason: str, run_id: str | None) -> None:
        _append(self.rejects, session_id=session_id, entry_id=entry_id, kind=kind, reason=reason, run_id=run_id)

    @property
    def empty(self) -> bool:
        return not any(cols[next(iter(cols))] for cols in self._tables().values())

    def _tables(self) -> dict[str, dict[str, list]]:
        return {"records": self.records, "observations": self.observations, "reflections": self.reflections,
                "drops": self.drops, "reflection_drops": self.reflection_drops, "folds": self.folds, "fold_items": self.fold_items, "rejects": self.rejects}

    def write(self, con: duckdb.DuckDBPyConnection) -> None:
        """Insert every collected row; call inside the caller's transaction."""
        for name, cols in self._tables().items():
            if not cols[next(iter(cols))]:
                continue
            table = pa.table({k: pa.array(v, _ARROW_TYPES.get(k, pa.string())) for k, v in cols.items()})
            insert_arrow(con, "ledger_batch", table, _INSERTS[name])


_ARROW_TYPES = {
    "item_index": pa.int32(),
    "source_entry_ids": pa.list_(pa.string()),
    "supporting_observation_ids": pa.list_(pa.string()),
    "token_count": pa.float64(),
    "folded": pa.bool_(),
    "full_fold": pa.bool_(),
    "gap_safe": pa.bool_(),
}


# The insert of each table, its columns listed by name (sql/queries/ledger.sql).
_INSERTS = {
    "records": "insert_ledger_records",
    "observations": "insert_ledger_observations",
    "reflections": "insert_ledger_reflections",
    "drops": "insert_ledger_drops",
    "reflection_drops": "insert_ledger_reflection_drops",
    "folds": "insert_ledger_folds",
    "fold_items": "insert_ledger_fold_items",
    "rejects": "insert_ledger_rejects",
}


def _text_note(item: BaseModel, key: str) -> str | None:
    """An om note as a column value: text, or nothing (an imported record's extra field of another type)."""
    value = om_note(item, key)
    return value[:2000] if isinstance(value, str) and value else None


def _append(cols: dict[str, list], **row: Any) -> None:
    """One row, by column name: every column of the table, no other."""
    if row.keys() != cols.keys():
        raise ValueError(f"ledger row columns {sorted(row)} differ from the table's {sorted(cols)}")
    for key, value in row.items():
        cols[key].append(value)


# ------------------------------------------------------------------ import of entries the extension wrote


@dataclass
class ImportCounts:
    records: int = 0
    folded_compactions: int = 0
    invalid: int = 0
    ignored_types: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"records": self.records, "folded_compactions": self.folded_compactions, "invalid": self.invalid,
                "ignored_types": self.ignored_types}


def import_entries(con: duckdb.DuckDBPyConnection, session_id: str, entries: Iterable[Any], run_id: str | None,
                   counts: ImportCounts) -> None:
    """Import ``custom`` om.* ledger entries and om.folded compactions from parsed session entries."""
    rows = LedgerRows()
    for e in entries:
        if e.entry_type == "custom" and isinstance(e.custom_type, str) and e.custom_type.startswith("om."):
            data = e.obj.get("data")
            payload = parse_record(e.custom_type, data)
            if payload is None:
                if e.custom_type in RECORD_MODELS:
                    counts.invalid += 1
                else:
                    counts.ignored_types += 1
                rows.reject(session_id, e.entry_id, e.custom_type, rejection_reason(e.custom_type, data), run_id)
                continue
            rows.add_record(session_id, e.entry_id, e.custom_type, payload, anchor=e.entry_id, origin="imported",
                            created_at=e.timestamp, run_id=run_id)
            counts.records += 1
        elif e.entry_type == "compaction":
            details = e.obj.get("details")
            if not (isinstance(details, dict) and isinstance(details.get("type"), str)
                    and details["type"].startswith("om.")):
                continue  # Pi's own compaction
            folded = parse_folded(details)
            if folded is None:
                reason = "invalid om.folded details" if details.get("type") == FOLDED_TYPE else "V2 or unknown om.* details"
                if details.get("type") == FOLDED_TYPE:
                    counts.invalid += 1
                else:
                    counts.ignored_types += 1
                rows.reject(session_id, e.entry_id, str(details.get("type")), reason, run_id)
                continue
            summary = e.obj.get("summary")
            rows.add_fold(session_id, e.entry_id, origin="imported", anchor=e.entry_id,
                          first_kept=e.first_kept_entry_id, details=folded,
                          summary=summary if isinstance(summary, str) else None, note=None, trigger=None,
                          created_at=e.timestamp, run_id=run_id)
            counts.folded_compactions += 1
    if not rows.empty:
        rows.write(con)


@dataclass(slots=True)
class StoredEntry:
    """The fields of a stored entry that ledger import needs."""

    entry_id: str
    entry_type: str | None
    custom_type: str | None
    timestamp: str | None
    first_kept_entry_id: str | None
    obj: dict


def ledger_candidates(con: duckdb.DuckDBPyConnection, session_id: str, run_id: str | None) -> list[StoredEntry]:
    """Stored entries that may hold ledger records: om.* custom entries and compactions."""
    out = []
    for row in named_rows(con, "ledger_candidates", {"session_id": session_id, "run_id": run_id}):
        obj = loads_line(row["raw"])  # deep nesting and lone surrogates as the ingest read them
        ts = obj.get("timestamp")
        out.append(StoredEntry(entry_id=row["entry_id"], entry_type=row["entry_type"], custom_type=row["custom_type"],
                               timestamp=ts if isinstance(ts, str) else None,
                               first_kept_entry_id=row["first_kept_entry_id"], obj=obj))
    return out


def forget_imported(con: duckdb.DuckDBPyConnection, session_id: str) -> None:
    """Remove what ingest imported for a session (its file is being re-read)."""
    for name in ("delete_imported_observations", "delete_imported_reflections", "delete_imported_drops",
                 "delete_imported_reflection_drops",
                 "delete_imported_records", "delete_imported_fold_items", "delete_imported_folds",
                 "delete_ledger_rejects"):
        con.execute(query(name), {"session_id": session_id})


# ------------------------------------------------------------------ records this project appends


def mint_ledger_id(con: duckdb.DuckDBPyConnection, session_id: str, seed: str) -> str:
    """An 8-hex id (Pi's entry id shape) unused by the session's entries, records and compactions."""
    salt = 0
    while True:
        candidate = hashlib.sha256(f"{session_id}\x00{seed}\x00{salt}".encode()).hexdigest()[:8]
        taken = scalar(con, "ledger_id_taken", {"session_id": session_id, "id": candidate})
        if not taken:
            return candidate
        salt += 1


def append_record(con: duckdb.DuckDBPyConnection, session_id: str, kind: str, payload: LedgerPayload, *,
                  anchor_entry_id: str, run_id: str | None = None, stage: str | None = None,
                  stage_key: str | None = None, created_at: str | None = None) -> str:
    """Append one pipeline record anchored after ``anchor_entry_id``; returns its ledger id.

    The caller owns the transaction, so a stage's records land together or not at all.
    """
    if kind not in RECORD_MODELS or not isinstance(payload, RECORD_MODELS[kind]):
        raise ValueError(f"payload does not match record kind {kind}")
    seed = stage_key or f"{kind}\x00{anchor_entry_id}\x00{payload.model_dump_json()}"
    ledger_id = mint_ledger_id(con, session_id, seed)
    rows = LedgerRows()
    rows.add_record(session_id, ledger_id, kind, payload, anchor=anchor_entry_id, origin="pipeline",
                    created_at=created_at, run_id=run_id, stage=stage, stage_key=stage_key)
    rows.write(con)
    return ledger_id


def store_simulated_compaction(con: duckdb.DuckDBPyConnection, session_id: str, *, anchor_entry_id: str,
                               first_kept_entry_id: str | None, details: FoldedDetails | None,
                               summary: str | None, note: str | None = None, trigger: str | None = None,
                               run_id: str | None = None, seed: str | None = None, gap_safe: bool = False,
                               plain_first_kept_entry_id: str | None = None) -> str:
    """Store a compaction this project simulated; ``details`` None records a native fallback."""
    compaction_id = mint_ledger_id(con, session_id, seed or f"compaction\x00{anchor_entry_id}\x00{first_kept_entry_id}")
    rows = LedgerRows()
    rows.add_fold(session_id, compaction_id, origin="simulated", anchor=anchor_entry_id,
                  first_kept=first_kept_entry_id, details=details, summary=summary, note=note, trigger=trigger,
                  created_at=None, run_id=run_id, gap_safe=gap_safe,
                  plain_first_kept=plain_first_kept_entry_id or first_kept_entry_id)
    rows.write(con)
    return compaction_id
