"""What an ingest tells its caller: one ``FileReport`` per file, and the ``IngestReport`` of the run."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ReplacedSession(BaseModel):
    """What re-reading a rewritten file took away from one session it held before (SPEC §2)."""

    session_id: str
    now_session_id: str | None  # the session the file holds now (the same id: the session was re-read)
    entries_before: int
    entries_lost: int  # entry ids no longer in the file
    entries_changed: int  # entries still there whose line changed
    orphaned_ledger_ids: list[str] = Field(default_factory=list)  # this project's records orphaned by it
    not_a_migration: str | None = None  # a v1/v2 file rewritten otherwise than by Pi's migration: why

    @property
    def lost_anything(self) -> bool:
        return bool(self.entries_lost or self.entries_changed or self.orphaned_ledger_ids)

    def describe(self) -> str:
        if self.now_session_id == self.session_id:
            what = f"{self.entries_lost} of {self.entries_before} entries are no longer in the file"
            if self.entries_changed:
                what += f" and {self.entries_changed} changed"
        else:
            now = f"now holds session {self.now_session_id}" if self.now_session_id else "holds no session now"
            what = f"{now}; session {self.session_id} and its {self.entries_before} entries are gone"
        if self.not_a_migration:
            what += f" (not Pi's migration: {self.not_a_migration})"
        records = len(self.orphaned_ledger_ids)
        if records:
            what += (f"; {records} memory record(s) of this project lost their evidence: kept, marked orphaned "
                     "(the orphaned_records view)")
        return f"rewritten: {what}"


class FollowedRewrite(BaseModel):
    """A rewrite om followed (om_core/ingest/migration.py): Pi migrated the file in place, or the file is
    a pi --fork copy of another session; this project's memory now stands on its entries' ids."""

    session_id: str
    how: str  # migrated | forked
    from_session_id: str  # the same session (migrated) or the fork's source
    from_version: int  # the version of the entries om knew
    entries: int  # entries om knew, found again in the same order
    appended: int  # entries after them
    ids_changed: int  # of those entries, how many have another id now (a v1 file: all)
    records: int  # this project's records of the session now (a fork: copied)
    records_reanchored: int  # of them, anchored to an id the map gave
    compactions: int  # simulated compactions now (a fork: copied)
    compactions_reanchored: int
    orphaned: int  # records of the session still orphaned (an earlier rewrite's)

    def describe(self) -> str:
        ids = "got Pi's ids" if self.ids_changed else "kept their ids"
        appended = f" ({self.appended} appended since)" if self.appended else ""
        if self.how == "migrated":
            what = (f"migrated by Pi (v{self.from_version} → v3): its {self.entries} entries{appended} {ids}; "
                    f"{self.records_reanchored} of {self.records} memory record(s) and {self.compactions_reanchored} "
                    f"of {self.compactions} simulated compaction(s) re-anchored")
        else:
            what = (f"a copy of session {self.from_session_id} (pi --fork): its {self.entries} entries{appended} "
                    f"{ids}; {self.records} memory record(s) and {self.compactions} simulated compaction(s) carried "
                    f"over")
        return what + (f"; {self.orphaned} record(s) still orphaned" if self.orphaned else "; none orphaned")


class FileReport(BaseModel):
    path: str
    session_id: str | None = None
    status: str  # new | appended | rewritten | unchanged | no_header | duplicate_session | error
    entries_added: int = 0
    lines_quarantined: int = 0
    bytes_read: int = 0
    ledger: dict[str, int] = Field(default_factory=dict)  # imported records, folded compactions, ignored
    notes: list[str] = Field(default_factory=list)
    error: str | None = None
    replaced: list[ReplacedSession] = Field(default_factory=list)  # a rewrite that lost entries or evidence
    followed: list[FollowedRewrite] = Field(default_factory=list)  # Pi's migration or fork copy, re-anchored


class IngestReport(BaseModel):
    run_id: str
    files: list[FileReport] = Field(default_factory=list)
    missing_paths: list[str] = Field(default_factory=list)
    seconds: float = 0.0
    index_error: str | None = None  # the search index could not be brought up to date (om search catches up)

    @property
    def entries_added(self) -> int:
        return sum(f.entries_added for f in self.files)

    @property
    def lines_quarantined(self) -> int:
        return sum(f.lines_quarantined for f in self.files)

    def ledger_counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for f in self.files:
            for key, value in f.ledger.items():
                total[key] = total.get(key, 0) + value
        return total

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.files:
            out[f.status] = out.get(f.status, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "files": len(self.files),
            "by_status": self.counts(),
            "entries_added": self.entries_added,
            "lines_quarantined": self.lines_quarantined,
            "ledger": self.ledger_counts(),
            "bytes_read": sum(f.bytes_read for f in self.files),
            "missing_paths": self.missing_paths,
            "errors": [{"path": f.path, "error": f.error} for f in self.files if f.error],
            "rewrites": [{"path": f.path, **r.model_dump()} for f in self.files for r in f.replaced],
            "reanchored": [{"path": f.path, **r.model_dump()} for f in self.files for r in f.followed],
            "seconds": round(self.seconds, 3),
            **({"index_error": self.index_error} if self.index_error else {}),
        }


def no_header_error(lines: int) -> str:
    return f"not a Pi session file: no valid session header in {lines} line(s) (all kept in quarantine)"
