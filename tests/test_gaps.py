"""Compaction gaps (SPEC §10): classification, gap-safe boundaries, and the real archive."""

from __future__ import annotations

import json

import pytest
from builders import SessionBuilder
from typer.testing import CliRunner

from conftest import workspace
from om_core.store import db as dbmod
from flows.cli.main import app
from om_core.memory.gaps import GapReport, compaction_gaps, gap_safe_position, gaps
from om_core.ingest import ingest
from om_core.ledger.records import memory_id


def obs(content: str, sources: list[str]) -> dict:
    return {"id": memory_id(content), "content": content, "timestamp": "2026-01-15 14:00", "relevance": "high",
            "sourceEntryIds": sources, "tokenCount": 10}


def folded(observations: list[dict]) -> dict:
    return {"type": "om.folded", "version": 1, "fullFold": False, "observations": observations, "reflections": []}


def gap_session(tmp_path, covers_key: str, with_record: bool = True):
    """u1 a1 u2 a2 u3 a3 [record covering covers_key] u4 a4, then an extension compaction keeping from u3."""
    b = SessionBuilder()
    ids = {}
    for n in range(1, 4):
        ids[f"u{n}"] = b.user(f"request {n} " * 20)
        ids[f"a{n}"] = b.assistant(f"answer {n} " * 20)
    o = obs("the first request was handled", [ids["u1"]])
    if with_record:
        b.custom("om.observations.recorded", {"observations": [o], "coversUpToId": ids[covers_key]})
    ids["u4"] = b.user("request 4")
    ids["a4"] = b.assistant("answer 4")
    summary_obs = [o] if with_record and covers_key in ("a1", "u2", "a2") else []
    details = folded(summary_obs) if summary_obs else None
    ids["c"] = b.compaction("summary", ids["u3"], details=details, from_hook=details is not None)
    path = b.write(tmp_path / "s.jsonl")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [path])
    return db, ids


def classes(db) -> list[tuple[str, str, int]]:
    report = gaps(workspace(db))
    return [(c.origin, c.class_, c.gap_messages) for c in report.compactions]


def test_no_gap_when_the_included_batch_reaches_the_kept_tail(tmp_path):
    db, ids = gap_session(tmp_path, "a2")  # C = a2 (position 3), F = u3 (position 4): nothing between
    assert classes(db) == [("imported", "no_gap", 0)]


def test_observer_lag_when_no_record_reaches_that_far(tmp_path):
    db, ids = gap_session(tmp_path, "a1")  # C = a1 (1); u2 and a2 lie in (C, F) and no record reaches F
    report = gaps(workspace(db))
    [c] = report.compactions
    assert (c.class_, c.gap_messages, c.c_position, c.first_kept_position) == ("observer_lag", 2, 1, 4)
    assert c.gap_tokens > 0


def test_native_fallback_when_nothing_is_covered_through_f(tmp_path):
    # the only record covers a3, past F = u3: excluded, so the projection is empty and Pi's own
    # summarizer would have run
    db, ids = gap_session(tmp_path, "a3")
    assert classes(db) == [("pi", "native_fallback", 0)]


def test_cross_boundary_when_a_batch_reaches_past_f(tmp_path):
    b = SessionBuilder()
    u1 = b.user("first request " * 30)
    b.assistant("first answer " * 30)
    early = obs("an early batch", [u1])
    b.custom("om.observations.recorded", {"observations": [early], "coversUpToId": u1})
    u2 = b.user("second request " * 30)
    b.assistant("second answer " * 30)
    u3 = b.user("third request " * 30)
    a3 = b.assistant("third answer " * 30)
    late = obs("a batch that read past the boundary", [u2, a3])
    b.custom("om.observations.recorded", {"observations": [late], "coversUpToId": a3})
    b.user("fourth request")
    b.assistant("fourth answer")
    b.compaction("summary", u3, details=folded([early]), from_hook=True)
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [b.write(tmp_path / "s.jsonl")])
    [c] = gaps(workspace(db)).compactions
    # positions: u1 0, a1 1, record 2, u2 3, a2 4, u3 5, a3 6, record 7 -> C = 0, F = 5, reach = 6
    assert (c.class_, c.c_position, c.first_kept_position, c.watermark_reach) == ("cross_boundary", 0, 5, 6)
    assert c.gap_messages == 3  # a1, u2, a2: raw messages in neither the summary nor the kept tail
    [safe] = gaps(workspace(db), gap_safe=True).compactions
    assert (safe.first_kept_position, safe.gap_messages, safe.class_) == (1, 0, "no_gap")
    assert safe.gap_safe["plain_first_kept_entry_id"] == u3 and safe.gap_safe["kept_tail_growth_tokens"] > 0


def test_gap_safe_moves_f_back_to_the_first_uncovered_message_and_never_forward():
    class Row:
        def __init__(self, position, role):
            self.position, self.role, self.entry_type, self.is_source = position, role, "message", True
            self.raw = json.dumps({"message": {"role": role, "toolCallId": "call1",
                                               "content": [{"type": "toolCall", "id": "call1"}]}})

        @property
        def raw_message(self):
            return True

    roles = ["user", "assistant", "toolResult", "assistant", "user", "assistant"]
    rows = {i: Row(i, r) for i, r in enumerate(roles)}
    assert gap_safe_position(rows, [4], 4) == 4  # C = F - 0: nothing uncovered, F stays
    assert gap_safe_position(rows, [0], 4) == 1  # first uncovered message after C = 0 is the assistant at 1
    # the first uncovered message is a tool result: F goes back to the assistant that made the call
    assert gap_safe_position(rows, [1], 4) == 1
    assert gap_safe_position(rows, [], 4) == 0
    # an orphan tool result (no assistant names its call): the nearest earlier assistant message
    rows[2].raw = json.dumps({"message": {"role": "toolResult", "toolCallId": "lost"}})
    assert gap_safe_position(rows, [1], 4) == 1


@pytest.mark.real_sessions
def test_before_compaction_gaps_with_the_offline_baseline(before_compaction_offline):
    db_path, _ = before_compaction_offline
    result = CliRunner().invoke(app, ["--db", str(db_path), "gaps", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    by_origin = {}
    for c in data["compactions"]:
        by_origin.setdefault(c["origin"], []).append(c)
    assert len(by_origin["pi"]) == 2  # both archived compactions are classified
    assert {c["first_kept_entry_id"] for c in by_origin["pi"]} == {
        e for e in (by_origin["pi"][0]["first_kept_entry_id"], by_origin["pi"][1]["first_kept_entry_id"])}
    assert len(by_origin["simulated"]) >= 4  # two archive twins and the proactive ones
    for c in data["compactions"]:
        assert c["class"] in ("cross_boundary", "observer_lag", "no_gap", "native_fallback")
    assert sum(data["totals"].values()) == len({(c["session_id"], c["compaction_id"]) for c in data["compactions"]})
    # simulated compactions are gap-safe already (the setting is on by default)
    assert all(c["gap_messages"] == 0 for c in by_origin["simulated"] if c["class"] != "native_fallback")
    safe = json.loads(CliRunner().invoke(app, ["--db", str(db_path), "gaps", "--gap-safe", "--json"]).stdout)
    assert safe["compactions"] and all(c["gap_messages"] == 0 for c in safe["compactions"])
    assert all(c["class"] in ("no_gap", "native_fallback") for c in safe["compactions"])
    moved = [c for c in safe["compactions"] if c["gap_safe"] and c["gap_safe"]["moved"]]
    assert moved and all(c["gap_safe"]["kept_tail_growth_tokens"] > 0 for c in moved)


def test_compaction_gaps_library_matches_view(tmp_path):
    db, ids = gap_session(tmp_path, "a1")
    with dbmod.reading(db) as con:
        report = compaction_gaps(con, None)
        view = con.execute("SELECT class, gap_messages FROM compaction_gaps").fetchall()
    assert [(c.class_, c.gap_messages) for c in report.compactions] == view


def test_gaps_help_explains_its_columns_and_every_class():
    import re

    text = CliRunner().invoke(app, ["gaps", "--help"], env={"COLUMNS": "100"}).stdout
    columns = dict(re.findall(r"^\s+(F|C|gap msgs|gap tokens)\s{2,}(\S.*?)\s*$", text, re.MULTILINE))
    assert set(columns) == {"F", "C", "gap msgs", "gap tokens"}
    assert "first kept entry" in columns["F"] and "watermark" in columns["C"]
    for name in ("no_gap", "cross_boundary", "observer_lag", "native_fallback"):  # every class gaps() counts
        assert re.search(rf"^\s+{name}\s{{2,}}\S", text, re.MULTILINE), name
    assert set(GapReport().totals()) == {"no_gap", "cross_boundary", "observer_lag", "native_fallback"}
