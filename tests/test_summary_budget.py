"""The summary budget compactionSummaryMaxTokens (SPEC §13) through the one compaction service:
`om compact`, `om export --compact`, the live hook and the replay's simulated compactions all give a
summary that fits the budget, newest records first, with one line saying what was left out; a
budget no record fits declines (Pi's native summary runs); under the budget nothing changes."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
from conftest import workspace
from flows.cli.main import app
from om_core.ingest import ingest
from om_core.memory.compaction import DeclineReason, World, compact, compact_at, select_newest_first, summary_tokens
from om_core.memory.views import compaction_projection
from om_core.usecases.export import export_session
from om_core.usecases.live import CompactRequest, compact_live
from om_core.replay.compaction import simulate_compaction
from om_core.settings import Settings
from om_core.store import db as dbmod
from test_memory import mid, o, observed, r, reflected

SID = "0000b0d9-3e30-4000-8000-00000000000b"
LEFT_OUT = "left out to keep this summary within"


def long_session(days: int = 20) -> SessionBuilder:
    """Twenty days of work, an observation record and a reflection each day."""
    sb = SessionBuilder(SID)
    for day in range(days):
        sb.user(f"day {day}: continue the migration of module {day}")
        turn = sb.assistant(f"working on module {day} " + "detail " * 40)
        items = [o(f"day {day} note {k}: module {day} step {k} " + "context " * 12, ts=f"2026-01-{day + 1:02d} 10:0{k}",
                   tok=30) for k in range(3)]
        observed(sb, turn, *items)
        reflected(sb, turn, r(f"reflection of day {day}: module {day} follows the pattern " + "rule " * 10,
                              [f"day {day} note 0: module {day} step 0 " + "context " * 12], tok=20))
    sb.user("what next?")
    sb.assistant("next module")
    return sb


@pytest.fixture
def long_db(tmp_path):
    sb = long_session()
    path = sb.write(tmp_path / "long.jsonl")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [path])
    return db, path, sb


def _tip_and_f(db):
    with dbmod.reading(db) as con:
        tip = dbmod.scalar(con, "session_leaf", {"session_id": SID})
    return tip


def test_selection_gives_observations_half_newest_first_and_skips_what_is_too_large():
    # observations alone would take everything: they get their half, reflections the rest
    assert select_newest_first([10] * 10, [10] * 10, 100) == ({5, 6, 7, 8, 9}, {5, 6, 7, 8, 9})
    # few reflections: observations reclaim what reflections leave
    assert select_newest_first([10] * 10, [10], 100) == ({1, 2, 3, 4, 5, 6, 7, 8, 9}, {0})
    # few observations: reflections take what observations leave
    assert select_newest_first([10], [10] * 10, 100) == ({0}, {1, 2, 3, 4, 5, 6, 7, 8, 9})
    # a record too large for what remains is skipped, and older ones still come in
    assert select_newest_first([10, 10, 60], [], 50) == ({0, 1}, set())
    assert select_newest_first([], [], 50) == (set(), set())


def test_under_the_budget_the_summary_is_the_projection_as_spec_5_renders_it(long_db):
    db, _, _ = long_db
    tip = _tip_and_f(db)
    settings = Settings()
    with dbmod.reading(db) as con:
        plain = compaction_projection(con, SID, tip, tip, settings.observationsPoolMaxTokens)
        result = compact_at(con, SID, tip, tip, settings, world=World.FILE)
    assert result.summaryTokens <= settings.summary_max_tokens == 8000
    assert result.summary == plain.summary and LEFT_OUT not in result.summary
    assert result.details() == plain.details() and (result.leftOutObservations, result.leftOutReflections) == (0, 0)


@pytest.mark.parametrize("counter", ["pi", "tiktoken"])
def test_a_small_budget_keeps_the_newest_records_and_says_what_it_left_out(long_db, counter):
    db, _, _ = long_db
    tip = _tip_and_f(db)
    settings = Settings(compactionSummaryMaxTokens=900, tokenCounter=counter, observationsPoolMaxTokens=100)  # a full fold: reflections too
    with dbmod.reading(db) as con:
        whole = compaction_projection(con, SID, tip, tip, settings.observationsPoolMaxTokens)
        result = compact_at(con, SID, tip, tip, settings, world=World.FILE)
    assert summary_tokens(whole.summary, settings) > 900
    assert result.declined is None and summary_tokens(result.summary, settings) == result.summaryTokens <= 900
    left = result.leftOutObservations + result.leftOutReflections
    assert left == len(whole.observationIds) + len(whole.reflectionIds) - len(result.observationIds) - len(
        result.reflectionIds) > 0
    assert result.summary.splitlines()[-1].startswith(f"({left} older memory records ({result.leftOutObservations} "
                                                      f"observations, {result.leftOutReflections} reflection")
    # newest first: what is kept is the tail of each list, shown in fold order
    assert result.observationIds == whole.observationIds[-len(result.observationIds):]
    assert result.reflectionIds == whole.reflectionIds[-len(result.reflectionIds):]
    assert result.reflectionIds and result.observationIds
    # observations got at least half of what the records use (in the counter's units)
    from om_core.pi.tokens import count_text_tokens

    size = len if counter == "pi" else count_text_tokens
    shown = result.summary.splitlines()
    obs_size = sum(size(line) + 1 for line in shown if line[1:13] in set(result.observationIds))
    refl_size = sum(size(line) + 1 for line in shown if line[1:13] in set(result.reflectionIds))
    # (at least half of the budget is theirs: short of half of what is used by less than one record)
    largest = max(size(line) + 1 for line in whole.summary.splitlines() if line[1:13] in set(whole.observationIds))
    assert obs_size + largest >= 0.5 * (obs_size + refl_size) and refl_size > 0
    # the om.folded details list what the summary shows; every shown id is in the text
    details = result.details()
    assert [x["id"] for x in details["observations"]] == result.observationIds
    assert all(f"[{i}]" in result.summary for i in result.observationIds + result.reflectionIds)
    assert not any(f"[{i}]" in result.summary for i in whole.observationIds[:-len(result.observationIds)])


def test_a_budget_no_record_fits_declines(long_db):
    db, _, _ = long_db
    tip = _tip_and_f(db)
    with dbmod.reading(db) as con:
        result = compact_at(con, SID, tip, tip, Settings(compactionSummaryMaxTokens=200), world=World.REPLAYED)
    assert result.summary is None and result.declined is DeclineReason.NOTHING_FITS
    assert result.details()["observations"] == [] and result.leftOutObservations == 60


def test_the_budget_derives_from_the_context_window():
    assert Settings().summary_max_tokens == 8000
    assert Settings(contextWindow=64_000).summary_max_tokens == 8000
    assert Settings(contextWindow=200_000).summary_max_tokens == 25_000
    assert Settings(contextWindow=200_000, compactionSummaryMaxTokens=3000).summary_max_tokens == 3000
    assert Settings().derived()["compactionSummaryMaxTokens"] == (8000, "8000, as no contextWindow is set")


def test_every_compaction_path_fits_the_budget(long_db, tmp_path):
    """om compact, om export --compact, the live hook and a simulated compaction: one service."""
    db, path, _ = long_db
    settings = Settings(compactionSummaryMaxTokens=900, keepRecentTokens=50)
    ws = workspace(db, settings)
    tip = _tip_and_f(db)
    summaries = {}
    summaries["compact"] = compact(ws, SID, tip, tip).summary
    report = export_session(ws, SID, tmp_path / "out.jsonl", compact=True)
    assert report.compaction is not None, report.compaction_skipped
    entry = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[-1])
    summaries["export"] = entry["summary"]
    assert len(entry["details"]["observations"]) < 60
    live = compact_live(ws, CompactRequest(session_file=str(path), leaf=tip, first_kept_entry_id=tip,
                                           tokens_before=10_000, custom_instructions="keep the module list"))
    summaries["live"] = live.compaction["summary"]
    assert live.left_out > 0 and summaries["live"].endswith("keep the module list")
    simulated = simulate_compaction(ws, SID, tip=tip, anchor=tip, first_kept=tip, trigger="threshold",
                                    settings=settings)
    with dbmod.reading(db) as con:
        summaries["simulated"] = con.execute("SELECT summary FROM om_internal.compactions WHERE compaction_id = ?",
                                             [simulated.compaction_id]).fetchone()[0]
    for where, text in summaries.items():
        assert text is not None and math.ceil(len(text) / 4) <= 900, where
        assert LEFT_OUT in text, where
    result = CliRunner().invoke(app, ["--db", str(db), "compact", SID, "--first-kept", tip, "--json"],
                                env={"OM_COMPACTION_SUMMARY_MAX_TOKENS": "900"})
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["summary_tokens"] <= data["summary_max_tokens"] == 900 and data["left_out"]["observations"] > 0
    assert mid("day 19 note 2: module 19 step 2 " + "context " * 12) in data["observations"]
