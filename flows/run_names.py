"""What the Prefect UI shows of a run: task runs named by what they do and tagged with the session and
the stage, and the run's summary in the flow run's logs (flows.ticks.log_to_run), so the UI alone tells
what a run did."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flows.run_result import SessionOutcome


def session_label(file_path: str | None, session_id: str) -> str:
    """The session's file name, or its short id when it has none (an ingested session's file is gone)."""
    from pathlib import PurePath

    return PurePath(file_path).name if file_path else session_id[:8]


def session_tags(session_id: str, stage: str) -> list[str]:
    return [f"session:{session_id}", f"stage:{stage}"]


def replay_name(label: str) -> str:
    return f"replay · {label}"


def stage_name(prepared: Any, label: str) -> str:
    """``observer · s0.jsonl · entries 0000000a–0000001f``; the reflector and dropper: ``· at <tip>``."""
    stage = prepared.request.stage
    chunk = getattr(prepared.input, "chunk", None)
    if chunk:
        return f"{stage} · {label} · entries {chunk[0].entry_id}–{chunk[-1].entry_id}"
    return f"{stage} · {label} · at {prepared.request.tip}"


def project_stage_name(inp: Any) -> str:
    """``project · github.com/acme/app · 12 new lines from 2 sessions``."""
    return f"project · {inp.project_id} · {_count(len(inp.new), 'new line')} from {_count(len(inp.new_sessions()), 'session')}"


def project_summary(outcome: Any) -> str:
    """``project github.com/acme/app: recorded, 3 reflections, 1 retired`` (or why nothing was)."""
    said = f"project {outcome.project_id}: {outcome.outcome}"
    if outcome.outcome == "recorded":
        said += f", {_count(len(outcome.reflections), 'reflection')}, {len(outcome.retirements)} retired"
    why = outcome.error or outcome.reason
    return f"{said} ({why})" if why else said


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def session_summary(label: str, result: SessionOutcome) -> str:
    """``s0.jsonl (00000000): observer 3, reflector 1 (4 stages run), 2 compactions, 0 errors``."""
    per_stage: dict[str, int] = {}
    for branch in result.branches:
        for stage, n in branch.stages_run().items():
            per_stage[stage] = per_stage.get(stage, 0) + n
    compactions = sum(branch.compactions for branch in result.branches)
    stages = ", ".join(f"{stage} {n}" for stage, n in per_stage.items()) or "no stage"
    errors = result.failures() + (1 if result.error else 0)
    line = (f"{label} ({result.session_id[:8]}): {stages} ({_count(sum(per_stage.values()), 'stage')} run), "
            f"{_count(compactions, 'compaction')}, {_count(errors, 'error')}")
    return line + (f": {result.error}" if result.error else "")


def run_summary(run_id: str, results: list[SessionOutcome], skipped: int, errors: list[str]) -> str:
    stages = sum(r.stages() for r in results)
    failed = len(errors) + sum(1 for r in results if r.error)
    return (f"run {run_id}: {_count(len(results), 'session')} replayed, {skipped} unchanged (skipped), "
            f"{_count(stages, 'stage')} run, {_count(failed, 'error')}")
