"""`om status` against what the next `om run` does: a clock is due exactly when the planner replays
the session and the replay runs its stage at the branch's last turn end; otherwise status says why,
in words (om_core/usecases/status.py)."""

from __future__ import annotations

import json

import pytest
from builders import SessionBuilder
from typer.testing import CliRunner

from om_core.store import db as dbmod
from om_core.ingest import ingest
from om_core.replay.branch import replay_events
from om_core.replay.engine import replay_session
from om_core.replay.plan import due_sessions, fingerprints, record_replay
from om_core.settings import Settings
from om_core.usecases.status import status
from om_core.workers.llm import LoopResult
from om_core.workers.offline import OfflineBrain
from om_core.workers.stages import compute_stage
from om_core.store.workspace import Workspace

SID = "5a7e0000-0000-4000-8000-000000000001"
SETTINGS = Settings(observeAfterTokens=120, reflectAfterTokens=250, compactAfterTokens=100_000, keepRecentTokens=150,
                    observationsPoolMaxTokens=400, observationsPoolTargetTokens=200, clockBasis="source")


class Brain(OfflineBrain):
    """The offline baseline (so its stage keys are the ones `om run` without a model uses), whose
    reflector records nothing on purpose or whose observer does; it counts what it was asked."""

    def __init__(self, empty: str = "reflector") -> None:
        super().__init__()
        self.empty = empty
        self.asked: list[str] = []

    def observe(self, inp, check):
        self.asked.append("observer")
        if self.empty == "observer":
            return LoopResult(turns=0, finished=True, receipts=[check.submit({"observations": []})])
        return super().observe(inp, check)

    def reflect(self, inp, check):
        self.asked.append("reflector")
        if self.empty == "reflector":
            return LoopResult(turns=0, finished=True, receipts=[check.submit({"reflections": []})])
        return super().reflect(inp, check)


def replay(con, brain: Brain, *, drain: bool = True, record: bool = True,
           settings: Settings = SETTINGS) -> dict[str, list[str]]:
    """Replay the session in process as the flow does (and record the replay as the flow does when it
    commits); returns, per tip, the stages the brain was asked there."""
    ws = Workspace.on_connection(con, settings)
    asked: dict[str, list[str]] = {}

    def compute(prepared):
        before = len(brain.asked)
        computed = compute_stage(prepared, brain, settings)
        asked.setdefault(prepared.request.tip, []).extend(brain.asked[before:])
        return computed

    replay_session(ws, SID, brain, drain=drain, run_id="run-1", compute=compute)
    if record:
        [(_, printed)] = fingerprints(con, [SID], settings, "offline", drain).items()
        record_replay(con, SID, printed.now, "run-1")
    return asked


def last_turn_end(sb: SessionBuilder) -> str:
    from om_core.replay.branch import ReplayEntry

    branch = [ReplayEntry(i, e["id"], e["type"], e.get("message", {}).get("role"), 0, 0, True, None)
              for i, e in enumerate(sb.entries)]
    return sb.entries[[e.position for e in replay_events(branch) if e.kind == "turn_end"][-1]]["id"]


@pytest.fixture
def session(tmp_path):
    sb = SessionBuilder(SID)
    sb.work_turns(6, "alpha")
    path = sb.write(tmp_path / "s.jsonl")
    con = dbmod.connect(tmp_path / "om.duckdb")
    ws = Workspace.on_connection(con, SETTINGS)
    ingest(ws, [path])
    yield sb, path, con, ws
    con.close()


def test_after_a_complete_replay_nothing_is_due_and_status_says_why(session):
    sb, _, con, ws = session
    replay(con, Brain(empty="reflector"))
    assert due_sessions(con, [SID], SETTINGS, "offline", True)[0] == []  # the planner: nothing to replay
    s = status(ws, SID)
    assert not s.next_run.replays and "unchanged since its last complete replay" in s.next_run.why
    assert s.clocks["reflector"].reached  # its clock is past the threshold (the reflector recorded nothing) ...
    assert not any(c.due for c in s.clocks.values())  # ... yet nothing is due, because nothing would run
    assert "deliberate empty result" in s.clocks["reflector"].why  # and when replayed, this input is not asked again


def test_after_new_lines_due_is_what_the_replay_runs(session):
    sb, path, con, _ = session
    settings = SETTINGS.model_copy(update={"reflectAfterTokens": 100_000})
    ws = Workspace.on_connection(con, settings)
    replay(con, Brain(empty="nothing"), settings=settings)
    sb.work_turns(3, "beta")
    sb.write(path)
    ingest(ws, [path])
    s = status(ws, SID)
    assert s.next_run.replays and "changed since its last complete replay" in s.next_run.why
    assert s.next_run.last_turn_end == last_turn_end(sb)
    assert s.clocks["observer"].due and s.clocks["observer"].why is None  # the new turns are past its threshold
    assert not s.clocks["reflector"].due and s.clocks["reflector"].why.startswith("below its threshold")
    brain = Brain(empty="nothing")
    replay(con, brain, drain=False, record=False, settings=settings)  # the turn ends only: no drain after them
    assert set(brain.asked) == {"observer"}


def test_a_backed_off_observer_is_not_due_and_status_says_so(session):
    sb, _, con, ws = session
    replay(con, Brain(empty="observer"), drain=False, record=False)  # never completed: om run replays it
    s = status(ws, SID)
    assert s.next_run.replays and "never replayed" in s.next_run.why
    observer = s.clocks["observer"]
    assert observer.reached and not observer.due and observer.why.startswith("backed off")
    brain = Brain(empty="observer")
    replay(con, brain, drain=False, record=False)
    assert brain.asked == []  # the replay asks nothing either


def test_status_text_names_the_next_run_and_the_reason(session, tmp_path):
    from flows.cli.main import app

    _, _, con, _ = session
    replay(con, Brain(empty="reflector"))
    con.close()
    env = {"COLUMNS": "200", "OM_OBSERVE_AFTER_TOKENS": "120", "OM_REFLECT_AFTER_TOKENS": "250",
           "OM_COMPACT_AFTER_TOKENS": "100000", "OM_KEEP_RECENT_TOKENS": "150", "OM_OBSERVATIONS_POOL_MAX_TOKENS": "400",
           "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "200", "OM_CLOCK_BASIS": "source"}
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "om.duckdb"), "status", SID], env=env)
    assert result.exit_code == 0, result.output
    assert "next om run (offline): unchanged since its last complete replay" in result.stdout
    assert "reflector: past its threshold; when replayed, not run: this exact input gave a deliberate empty" \
        in result.stdout
    rows = [line.split("│")[1:-1] for line in result.stdout.splitlines() if line.startswith("│")]
    assert [r[0].strip() for r in rows] == ["observer", "reflector", "dropper", "compaction"]
    assert all(r[4].strip() in ("no", "") for r in rows)
    data = json.loads(CliRunner().invoke(app, ["--db", str(tmp_path / "om.duckdb"), "status", SID, "--json"],
                                         env=env).stdout)
    assert data["next_run"]["replays"] is False
    assert list(data["clocks"]) == ["observer", "reflector", "dropper", "compaction"]
    assert data["clocks"]["reflector"]["reached"] is True and data["clocks"]["reflector"]["due"] is False


class ModelBrain(Brain):
    """The same answers under a model's name (its stage keys are that model's, as `om run --model` makes)."""

    name = "openai/fake-model"


def test_after_a_run_with_a_model_status_is_about_that_model_not_the_offline_baseline(session, tmp_path):
    """After `om run --model M`, `om status` said the next `om run (offline)` replays
    the session. With no model given or configured, the status is about the model of the session's
    last replay (its rerun replays nothing), and says that a plain om run would use the offline one."""
    from flows.cli.main import app
    from om_core.store.runs import finish_run, start_run

    _, _, con, ws = session
    start_run(con, "run-1", "run", {"targets": ["s.jsonl"], "drain": True, "model": ModelBrain.name})
    replay(con, ModelBrain(empty="reflector"), record=False)
    [(_, printed)] = fingerprints(con, [SID], SETTINGS, ModelBrain.name, True).items()
    record_replay(con, SID, printed.now, "run-1")
    finish_run(con, "run-1", "ok", {"sessions": 1, "errors": []})  # keeps the start's model
    s = status(ws, SID)
    assert (s.next_run.model, s.next_run.model_from) == (ModelBrain.name, "its last replay")
    assert not s.next_run.replays and "unchanged since its last complete replay" in s.next_run.why
    assert status(ws, SID, model="offline").next_run.replays  # the offline baseline would replay it
    con.close()
    env = {"COLUMNS": "80", "OM_OBSERVE_AFTER_TOKENS": "120", "OM_REFLECT_AFTER_TOKENS": "250",
           "OM_COMPACT_AFTER_TOKENS": "100000", "OM_KEEP_RECENT_TOKENS": "150", "OM_OBSERVATIONS_POOL_MAX_TOKENS": "400",
           "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "200", "OM_CLOCK_BASIS": "source"}
    result = CliRunner().invoke(app, ["--db", str(tmp_path / "om.duckdb"), "status", SID], env=env)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # wrapped at 80 columns
    assert (f"next om run --model {ModelBrain.name} (the model of its last replay): unchanged since its last "
            "complete replay") in text, result.stdout
    assert "next om run (offline)" not in text
    assert "plain om run, with no model configured, uses the offline baseline" in text


@pytest.mark.parametrize("backoff", [False, True])
def test_the_reflector_after_an_empty_result_is_asked_again_unless_it_backs_off(tmp_path, backoff):
    """The extension asks the reflector again at every turn end while its clock is
    due, so om does by default (asking only when its input changed: after each recorded observer
    chunk); with reflectorBackoff it waits, as the observer does, for another reflectAfterTokens of
    source after each empty result."""
    sb = SessionBuilder(SID)
    sb.work_turns(16, "alpha")
    path = sb.write(tmp_path / "s.jsonl")
    settings = SETTINGS.model_copy(update={"reflectorBackoff": backoff})
    con = dbmod.connect(tmp_path / "om.duckdb")
    try:
        ws = Workspace.on_connection(con, settings)
        ingest(ws, [path])
        brain = Brain(empty="reflector")
        asked = replay(con, brain, drain=False, record=False, settings=settings)
        leaf = con.execute("SELECT leaf_id FROM sessions WHERE session_id = ?", [SID]).fetchone()[0]
        source = {}  # entry id -> source tokens up to and including it
        total = 0
        for entry_id, tokens in con.execute("SELECT entry_id, CASE WHEN is_source THEN tokens_pi ELSE 0 END "
                                            "FROM branch_detail(?, ?) ORDER BY position", [SID, leaf]).fetchall():
            total += tokens
            source[entry_id] = total
        at = [source[tip] for tip, stages in asked.items() if "reflector" in stages]
        gaps = [b - a for a, b in zip(at, at[1:])]
        assert len(at) >= 3
        if backoff:
            assert all(gap >= settings.reflectAfterTokens for gap in gaps)
        else:
            assert min(gaps) < settings.reflectAfterTokens  # asked again before another threshold of source
            assert len(at) == sum(1 for s in brain.asked if s == "observer") - 1  # after each chunk but the first
    finally:
        con.close()
