"""What a run of the flow gives back, as typed values from the flow to its callers: ``om run`` (its
closing table, its ``--json``), `om serve`'s tick line, and the runs row the flow finishes with.

A ``SessionOutcome`` is one session's replay as the flow reports it (its rows stay in the database);
a ``RunResult`` the whole run. How a run stopped early is one ``StopReason`` (om_core.errors), never
read back from the text of a message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from om_core.errors import StopReason
from om_core.replay.branch import BranchReport

if TYPE_CHECKING:
    from om_core.replay.engine import ReplayResult


class SessionOutcome(BaseModel):
    """One session's replay: its error (one line), how the run's guards stopped it, its branches' reports."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    error: str | None = None
    stop: StopReason | None = None
    stop_detail: str | None = None
    branches: list[BranchReport] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def stopped(self) -> bool:
        """The run's circuit breaker ended it (the run's one error line says why)."""
        return self.stop is StopReason.CIRCUIT

    @computed_field  # type: ignore[prop-decorator]
    @property
    def budget_stop(self) -> str | None:
        """--max-cost ended it, cleanly: the budget's words (a rerun resumes here)."""
        return self.stop_detail if self.stop is StopReason.BUDGET else None

    @classmethod
    def of(cls, result: ReplayResult) -> SessionOutcome:
        """From a replay's result."""
        return cls(session_id=result.session_id, error=result.error, stop=result.stop, stop_detail=result.stop_detail,
                   branches=result.branches)

    def stages(self, *, recorded_only: bool = False) -> int:
        """Stages its branches ran (not those skipped), or only those that recorded memory."""
        return sum(n for branch in self.branches for key, n in branch.stages.items()
                   if (key.endswith(":recorded") if recorded_only else not key.endswith(":skipped")))

    def failures(self) -> int:
        return sum(len(branch.failures) for branch in self.branches)


def no_ingest() -> dict[str, Any]:
    return {"files": [], "missing": []}


class RunResult(BaseModel):
    """A run of the flow: its sessions' outcomes, the run's own errors, what its ingest read, the
    sessions it skipped (unchanged since their last complete replay), the project stages after them,
    and how it stopped early (``stop``, with its one line in ``stopped``), if it did."""

    model_config = ConfigDict(extra="forbid")

    run_id: str | None = None
    sessions: list[SessionOutcome] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    ingest: dict[str, Any] = Field(default_factory=no_ingest)
    skipped: list[str] = Field(default_factory=list)
    projects: list[dict[str, Any]] = Field(default_factory=list)
    stop: StopReason | None = None
    stopped: str | None = None  # the stop's one line
    passive: bool = False  # the extension's "no background work": ingest only
    flow_run_id: str | None = None

    @property
    def busy(self) -> str | None:
        """Another process held the writer lock: its line (the run did nothing)."""
        return self.stopped if self.stop is StopReason.BUSY else None

    @property
    def failed(self) -> bool:
        return bool(self.errors) or any(s.error for s in self.sessions)

    def error_count(self) -> int:
        """The run's errors, its sessions' and their failed stages'."""
        return len(self.errors) + sum(1 for s in self.sessions if s.error) + sum(s.failures() for s in self.sessions)

    def stages_recorded(self) -> int:
        """Stage runs that appended memory. Not every stage asked: most find their input answered before
        (an empty result, a reflector whose ledger did not change), call no model and change nothing; a
        failed one counts among the errors."""
        return sum(s.stages(recorded_only=True) for s in self.sessions)

    def runs_detail(self) -> dict[str, Any]:
        """What the runs row keeps of it (``om_internal.runs.detail``)."""
        if self.passive:
            return {"sessions": 0, "passive": True}
        return {"sessions": len(self.sessions), "errors": self.errors + [s.error for s in self.sessions if s.error],
                "projects": [{k: p.get(k) for k in ("project_id", "outcome", "error")} for p in self.projects]}


class SessionRow(BaseModel):
    """A session's line of `om run`'s closing table and of its ``--json`` (the ``run_summary`` query's
    row, with the session's error)."""

    model_config = ConfigDict(extra="allow")

    session_id: str
    file: str | None = None  # the session's file, as ingested
    observations: int = 0
    reflections: int = 0
    drops: int = 0
    compactions: int = 0
    model_calls: int = 0
    tokens: int = 0
    cost: float | None = None
    unpriced_calls: int = 0
    errors: int = 0  # failed stages
    error: str | None = None  # the session's own error


class RunReport(BaseModel):
    """`om run`'s account of a run: ``--json`` prints it, the closing table shows it (one model, so the
    two say the same)."""

    run_id: str | None = None
    sessions: list[SessionRow] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    failures: list[dict[str, Any]] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    passive: bool = False
    cost: dict[str, Any] = Field(default_factory=dict)
    projects: list[dict[str, Any]] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    database: str | None = None
    offline: bool = False
    session_files: int | None = None  # set when the targets hold no session file at all

    def as_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)
