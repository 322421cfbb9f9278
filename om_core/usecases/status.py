"""`om status`: a branch's memory status (``om_core.memory.views``) with what the next `om run` would do
there, in words. Two rules decide it, and both are called here, never restated: the planner's
(``run_plan.replay_decision``: is the session replayed at all?) and the replay's own
(``BranchReplayer.outlook``: would each stage run at the branch's last turn end?)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from om_core.store.catalog import resolve_session, resolve_tip
from om_core.store.db import named_row
from om_core.memory.views import MemoryStatus, memory_status
from om_core.replay.branch import branch_outlook, session_leaves
from om_core.replay.plan import replay_decision

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

DROPPER_RULE = "runs only right after a reflector run that appended reflections"


class NextRun(BaseModel):
    """What `om run` (draining, with ``model``) would do with this branch now."""

    model: str
    model_from: str  # where the model came from: "--model", "configured", "its last replay", or "no model configured"
    replays: bool  # the planner replays the session (else nothing of it runs)
    why: str  # the planner's reason, in words
    last_turn_end: str | None = None  # where the observer and reflector run last on the branch
    uncovered_tokens: int = 0  # source tokens after the observer's watermark: a drain observes them


class Status(MemoryStatus):
    next_run: NextRun


def status(ws: Workspace, session: str, leaf: str | None = None, model: str | None = None) -> Status:
    """Memory status with the workspace's settings, and for each clock whether the next `om run` runs its
    stage (``due``) or why not (``why``). ``model``: the one `om run` would use (default: the configured
    model, else the offline baseline), which names the stage inputs already answered."""
    settings = ws.settings
    with ws.read() as con:
        sid = resolve_session(con, session)
        tip = resolve_tip(con, sid, leaf)
        model, model_from = _model_of_next_run(con, sid, model, settings)
        shown = memory_status(con, sid, tip, settings)
        replays, why = replay_decision(con, sid, settings, model)
    nxt = NextRun(model=model, model_from=model_from, replays=replays, why=why)
    if tip in session_leaves(ws, sid):
        outlook = branch_outlook(ws, sid, tip, model)
        nxt.last_turn_end, nxt.uncovered_tokens = outlook.last_turn_end, outlook.uncovered_tokens
        reasons = {**outlook.stages, "compaction": outlook.compaction, "dropper": DROPPER_RULE}
    else:
        interior = "not a leaf: om run replays the branches that end at the session's leaves"
        reasons = {name: interior for name in shown.clocks}
    for name, clock in shown.clocks.items():
        clock.why = reasons[name]
        clock.due = None if clock.threshold is None else replays and clock.why is None
    return Status(**shown.model_dump(exclude={"clocks"}), clocks=shown.clocks, next_run=nxt)


def _model_of_next_run(con, session_id: str, model: str | None, settings) -> tuple[str, str]:  # noqa: ANN001
    """The model the status is about, and where it came from: the one given, the configured one, else
    the one of the session's last complete replay (a run with --model: its rerun is what the user does
    next), else the offline baseline."""
    if model:
        return model, "--model"
    if settings.model:
        return settings.model.litellm_name, "configured"
    last = named_row(con, "last_replay", {"session_id": session_id})
    if last is not None and last["model"] and last["model"] != "offline":
        return last["model"], "its last replay"
    return "offline", "no model configured"
