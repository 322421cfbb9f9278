"""The offline baseline: extractive observer, reflector and dropper that need no
model, run through the same stages and checks as a model, on a small built session and on the real
sample session ../shared/sessions/before-compaction.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
from conftest import workspace
from om_core.store import db as dbmod
from om_core.store.catalog import resolve_tip
from flows.cli.main import app
from om_core.ingest import ingest
from om_core.memory.views import active_memory, clocks, coverage, ledger_rows
from om_core.settings import Settings
from om_core.store.workspace import Workspace
from om_core.replay.stage_runner import observe_now, reflect_now
from om_core.workers.run_config import ModelConfig

SID = "0ff11e00-0000-4000-8000-000000000001"
BEFORE_ID = "ffae836b-9420-4060-ac13-7745215f90ff"
OFFLINE = ModelConfig(model="offline")
E = {n: f"{n:08x}" for n in range(1, 30)}
RELEVANCE_ORDER = {"low": 0, "medium": 1, "high": 2, "critical": 3}
COVERAGE_ORDER = {"strong": 0, "partial": 1, "none": 2}


pytestmark = pytest.mark.usefixtures("isolated_home")


def invoke(args: list[str]):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def state(db, sid: str):
    with dbmod.reading(db) as con:
        tip = resolve_tip(con, sid, None)
        memory = active_memory(ledger_rows(con, sid, tip))
        covered = coverage(con, sid, tip)
        branch = {r[0]: r[1] for r in con.execute("SELECT entry_id, is_source FROM branch_detail(?, ?)",
                                                  [sid, tip]).fetchall()}
        # coverage, not the usage clock: the source tokens after the observation watermark (SPEC §7)
        clock = clocks(con, sid, tip, Settings(clockBasis="source"))["observer"]
        return tip, memory, covered, branch, clock


def work_session() -> SessionBuilder:
    b = SessionBuilder(SID)
    b.user("We must always use PostgreSQL 16 for the orders service.")  # E1 assertion / requirement
    b.assistant("Noted.")  # E2
    b.user("What does the retry policy do?")  # E3 question
    b.assistant("It retries transient errors with backoff.")  # E4
    b.user("No, that's wrong: the table is called order_items.")  # E5 correction
    b.assistant(None, tool_calls=[("c1", "edit", {"path": "src/orders.py", "oldText": "orders_item",
                                                  "newText": "order_items"})])  # E6
    b.tool_result("c1", "edit", "Error: could not find the exact text in src/orders.py", is_error=True)  # E7
    b.assistant(None, tool_calls=[("c2", "edit", {"path": "src/orders.py", "oldText": "order_item",
                                                  "newText": "order_items"})])  # E8
    b.tool_result("c2", "edit", "Applied 1 edit.")  # E9
    b.assistant(None, tool_calls=[("c3", "write", {"path": "src/schema.sql",
                                                   "content": "CREATE TABLE order_items (id int);"})])  # E10
    b.tool_result("c3", "write", "Wrote 34 bytes.")  # E11
    b.assistant("Fixed the table name in src/orders.py and added src/schema.sql.")  # E12 finished work
    b.bash("pytest -q", "1 failed, 3 passed", 1)  # E13 failing command
    return b


def by_source(observations) -> dict[tuple[str, ...], list]:
    out: dict[tuple[str, ...], list] = {}
    for o in observations:
        out.setdefault(tuple(o.sourceEntryIds), []).append(o)
    return out


def test_offline_observer_rules_on_a_small_session(tmp_path, db_path):
    ingest(workspace(db_path), [work_session().write(tmp_path / "s.jsonl")])
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, OFFLINE)
    assert (outcome.outcome, outcome.model, outcome.rejected, outcome.turns) == ("recorded", "offline", 0, 0)
    tip, memory, _, _, clock = state(db_path, SID)
    found = by_source(memory.observations)

    [assertion] = found[(E[1],)]
    assert assertion.relevance == "critical"
    assert "We must always use PostgreSQL 16 for the orders service." in assertion.content
    assert assertion.timestamp == "2026-01-15 14:01"

    [question] = found[(E[3],)]
    assert question.relevance == "medium"
    assert "What does the retry policy do?" in question.content
    assert "asked" in question.content.lower()

    [correction] = found[(E[5],)]
    assert correction.relevance == "critical"
    assert "order_items" in correction.content and "correct" in correction.content.lower()

    [tool_error] = found[(E[7],)]
    assert tool_error.relevance == "high"
    assert "could not find the exact text in src/orders.py" in tool_error.content

    # edits grouped per file, citing every assistant entry that touched it
    [orders_file] = found[(E[6], E[8])]
    assert "src/orders.py" in orders_file.content and "2" in orders_file.content
    [schema_file] = found[(E[10],)]
    assert "src/schema.sql" in schema_file.content

    [done] = found[(E[12],)]
    assert "Fixed the table name" in done.content

    [failed_run] = found[(E[13],)]
    assert failed_run.relevance == "high" and "pytest -q" in failed_run.content and "1" in failed_run.content

    # nothing from the plain acknowledgements
    assert (E[2],) not in found and (E[4],) not in found
    for o in memory.observations:
        assert o.id == hashlib.sha256(o.content.encode()).hexdigest()[:12]
        assert o.tokenCount == math.ceil(len(o.line()) / 4)
    assert clock.watermark_entry_id == E[13] and clock.tokens == 0


def test_offline_reflector_and_dropper_on_a_small_session(tmp_path, db_path):
    ingest(workspace(db_path), [work_session().write(tmp_path / "s.jsonl")])
    observe_now(Workspace.open(db_path, settings=Settings()), SID, None, OFFLINE)
    _, before, covered_before, _, _ = state(db_path, SID)
    pool = sum(o.tokenCount for o in before.observations)
    target = 30
    settings = Settings(observationsPoolMaxTokens=60, observationsPoolTargetTokens=target)
    assert pool > target

    reflector, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, OFFLINE)
    assert (reflector.outcome, reflector.model) == ("recorded", "offline")
    _, after_reflect_memory, _, _, _ = state(db_path, SID)
    reflections = after_reflect_memory.reflections
    constraint = next(o for o in before.observations if o.sourceEntryIds == [E[1]])
    assert any(r.supportingObservationIds == [constraint.id] and "PostgreSQL 16" in r.content for r in reflections)
    active_before = {o.id for o in before.observations}
    for r in reflections:
        assert set(r.supportingObservationIds) <= active_before
        assert "\n" not in r.content

    # the dropper ran (reflections were appended, pool over target) and followed SPEC §8's safety order
    assert dropper.stage == "dropper" and dropper.outcome == "recorded"
    cites = {o.id: sum(o.id in r.supportingObservationIds for r in reflections) for o in before.observations}
    tier = {k: "none" if n == 0 else "partial" if n == 1 else "strong" for k, n in cites.items()}
    limit = max(1, min(len(before.observations),
                       math.ceil((pool - target) / (pool / len(before.observations)))))
    _, after, _, _, _ = state(db_path, SID)
    dropped = [o for o in before.observations if o.id not in {a.id for a in after.observations}]
    assert 1 <= len(dropped) <= limit
    order = {o.id: i for i, o in enumerate(before.observations)}
    key = lambda o: (COVERAGE_ORDER[tier[o.id]], RELEVANCE_ORDER[o.relevance], order[o.id])  # noqa: E731
    # never an uncovered high or critical observation
    assert not [o for o in dropped if tier[o.id] == "none" and o.relevance in ("high", "critical")]
    # what was dropped is the safest prefix of the eligible candidates
    eligible = sorted((o for o in before.observations
                       if not (tier[o.id] == "none" and o.relevance in ("high", "critical"))), key=key)
    assert [o.id for o in sorted(dropped, key=key)] == [o.id for o in eligible[:len(dropped)]]


def test_cli_says_it_uses_the_offline_baseline(tmp_path, db_path):
    ingest(workspace(db_path), [work_session().write(tmp_path / "s.jsonl")])
    result = invoke(["--db", str(db_path), "observe", SID])
    assert result.exit_code == 0, result.output
    assert "offline baseline" in result.output
    assert "observer: appended" in result.output
    result = invoke(["--db", str(db_path), "reflect", SID, "--model", "offline"])
    assert result.exit_code == 0, result.output
    assert "offline baseline" in result.output
    result = invoke(["--db", str(db_path), "observe", SID, "--json"])
    data = json.loads(result.stdout)
    assert data["offline"] is True and data["outcome"] == "skipped"


@pytest.mark.real_sessions
def test_offline_baseline_on_before_compaction(before_compaction, tmp_path, db_path):
    ingest(workspace(db_path), [before_compaction])
    first = invoke(["--db", str(db_path), "observe", BEFORE_ID])
    assert first.exit_code == 0, first.output
    assert "offline baseline" in first.output
    runs = 1
    while True:
        outcome = observe_now(Workspace.open(db_path, settings=Settings()), BEFORE_ID, None, OFFLINE)
        runs += 1
        assert outcome.outcome in ("recorded", "empty", "skipped"), outcome.error
        if outcome.outcome == "skipped":
            break
        assert runs < 100
    tip, memory, _, branch, clock = state(db_path, BEFORE_ID)
    assert clock.tokens == 0  # nothing left uncovered
    assert len(memory.observations) >= 20

    stages = reflect_now(Workspace.open(db_path, settings=Settings()), BEFORE_ID, None, OFFLINE)
    assert stages[0].outcome == "recorded"
    tip, memory, _, branch, _ = state(db_path, BEFORE_ID)
    assert memory.reflections

    # every observation cites entries that exist on the branch and are source entries
    with dbmod.reading(db_path) as con:
        recorded = con.execute("SELECT obs_id, source_entry_ids FROM observations WHERE session_id = ?",
                               [BEFORE_ID]).fetchall()
    for obs_id, sources in recorded:
        assert sources, obs_id
        for entry_id in sources:
            assert entry_id in branch, (obs_id, entry_id)
            assert branch[entry_id] is True, (obs_id, entry_id)

    # every reflection cites only active observations
    active = {o.id for o in memory.observations}
    if len(stages) == 1 or stages[1].outcome != "recorded":
        for r in memory.reflections:
            assert set(r.supportingObservationIds) <= active, r
    else:  # a drop after the reflections may retire what they cite: check against the pool before it
        with dbmod.reading(db_path) as con:
            dropped = {r[0] for r in con.execute("SELECT obs_id FROM drops WHERE session_id = ?",
                                                 [BEFORE_ID]).fetchall()}
        for r in memory.reflections:
            assert set(r.supportingObservationIds) <= active | dropped, r

    view = invoke(["--db", str(db_path), "view", BEFORE_ID, "--full"])
    assert view.exit_code == 0, view.output
    summary = view.stdout
    assert "## Reflections" in summary and "## Observations" in summary
    assert "AgentSession" in summary
    assert "refactor.md" in summary
