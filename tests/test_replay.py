"""Replay of an archived branch (SPEC §9): its events, Pi's own compactions in the archive, and the
cut points of proactive compactions."""

from __future__ import annotations

import hashlib

import pytest

from builders import SessionBuilder
from conftest import workspace
from om_core.store import db as dbmod
from om_core.memory import views as memory
from om_core.pi.cutpoint import BranchEntry, NothingToCompact, PreviousCompaction, compaction_cut_point
from om_core.ingest import ingest
from om_core.replay.branch import Event, ReplayEntry, replay_events
from om_core.replay.engine import replay_session
from om_core.settings import Settings
from om_core.store.workspace import Workspace
from om_core.workers.run_config import ModelConfig, make_brain

SETTINGS = Settings(observeAfterTokens=120, reflectAfterTokens=250, compactAfterTokens=600, keepRecentTokens=150,
                    observationsPoolMaxTokens=400, observationsPoolTargetTokens=200, gapSafeCompaction=False)


def branch_of(*kinds: str) -> list[ReplayEntry]:
    """A branch from 'user', 'assistant', 'toolResult' (messages) or any other entry type."""
    out = []
    for i, kind in enumerate(kinds):
        message = kind in ("user", "assistant", "toolResult")
        out.append(ReplayEntry(i, f"{i + 1:08x}", "message" if message else kind, kind if message else None,
                               10, 10, message or kind == "custom_message", None))
    return out


def test_turn_ends_and_settle_points():
    branch = branch_of("user", "assistant", "toolResult", "assistant", "user", "assistant")
    assert replay_events(branch) == [
        Event(2, "turn_end"),  # the assistant at 1 and its tool result
        Event(3, "turn_end"),
        Event(3, "settled"),  # the last entry before the next user message
        Event(5, "turn_end"),
        Event(5, "settled"),  # the end of the branch
    ]


def test_a_branch_without_a_user_message_settles_at_its_end():
    branch = branch_of("custom_message", "assistant", "toolResult")
    assert replay_events(branch) == [Event(2, "turn_end"), Event(2, "settled")]


def test_a_pi_compaction_entry_is_an_event_of_its_own():
    branch = branch_of("user", "assistant", "compaction", "user", "assistant")
    assert Event(2, "archive_compaction") in replay_events(branch)


def entries(n: int) -> list[BranchEntry]:
    return [BranchEntry(f"{i:08x}", "message", "user" if i % 2 == 0 else "assistant", 100) for i in range(n)]


def test_a_simulated_compaction_bounds_the_next_cut_like_an_entry_would_legacy():
    branch = entries(10)
    # keepRecentTokens 250 is reached at position 7 (counting 9, 8, 7 from the end)
    assert compaction_cut_point(branch, 250, rules="legacy").firstKeptPosition == 7
    # a compaction simulated right after position 7: the cut may not go back before it, and the
    # budget is never reached after it, so the first cut point after it stands (Pi's default)
    assert compaction_cut_point(branch, 250, after=7, rules="legacy").firstKeptPosition == 8
    assert compaction_cut_point(branch, 250, after=2, rules="legacy").firstKeptPosition == 7
    with pytest.raises(NothingToCompact):
        compaction_cut_point(branch, 250, after=9, rules="legacy")  # the branch would end with that compaction


def test_a_simulated_compaction_bounds_the_next_cut_like_an_entry_would_pi16():
    branch = entries(10)
    assert compaction_cut_point(branch, 250).firstKeptPosition == 7
    # simulated right after 7, keeping from 6: the projection is [summary, 6, 7, 8, 9]; 9, 8, 7 reach
    # 300 >= 250 at 7 (an assistant) -> cut 7, a split turn starting at the user at 6; only the turn
    # prefix is left to summarize, so Pi compacts
    cut = compaction_cut_point(branch, 250, after=PreviousCompaction(7, branch[6].entry_id))
    assert (cut.firstKeptPosition, cut.turnStartPosition, cut.isSplitTurn) == (7, 6, True)
    # keeping nothing: the window [8, 9] never reaches 250 -> cut at 8 (a user message) with
    # nothing before it: Pi declines
    with pytest.raises(NothingToCompact, match="nothing to summarize"):
        compaction_cut_point(branch, 250, after=PreviousCompaction(7, None))
    with pytest.raises(NothingToCompact):
        compaction_cut_point(branch, 250, after=PreviousCompaction(9, branch[8].entry_id))


def mid(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def replayed(tmp_path, sb: SessionBuilder, settings: Settings = SETTINGS) -> str:
    db_path = tmp_path / "om.duckdb"
    ingest(workspace(db_path), [sb.write(tmp_path / "s.jsonl")])
    con = dbmod.connect(db_path)
    try:
        brain = make_brain(ModelConfig(model="offline"), settings)
        replay_session(Workspace.on_connection(con, settings), sb.session_id, brain)
    finally:
        con.close()
    return str(db_path)


def simulated(db_path: str, session_id: str) -> list[tuple]:
    """(trigger, anchor position, first kept position) of the simulated compactions, in branch order."""
    with dbmod.reading(db_path) as con:
        leaf = con.execute("SELECT leaf_id FROM sessions WHERE session_id = ?", [session_id]).fetchone()[0]
        return con.execute(
            "SELECT trigger, anchor_pos, first_kept_pos FROM branch_compactions(?, ?) c "
            "JOIN om_internal.compactions f ON f.session_id = ? AND f.compaction_id = c.compaction_id "
            "WHERE c.origin = 'simulated' ORDER BY anchor_pos", [session_id, leaf, session_id]).fetchall()


def test_the_extensions_own_fold_in_the_archive_is_kept_not_folded_again(tmp_path):
    sb = SessionBuilder("7e91c0de-0000-4000-8000-000000000001")
    sb.work_turns(3, "alpha")
    covers = sb.entries[-1]["id"]
    kept = sb.entries[-4]["id"]
    note = {"id": mid("alpha is finished"), "content": "alpha is finished", "timestamp": "2026-01-15 14:30",
            "relevance": "high", "sourceEntryIds": [covers], "tokenCount": 8}
    sb.custom("om.observations.recorded", {"observations": [note], "coversUpToId": covers})
    details = {"type": "om.folded", "version": 1, "fullFold": False, "observations": [note], "reflections": []}
    folded_id = sb.compaction("rendered by the extension", kept, details=details, from_hook=True)
    sb.work_turns(2, "beta")
    native_id = sb.compaction("Pi's own summary", sb.entries[-4]["id"])
    sb.work_turns(2, "gamma")

    db_path = replayed(tmp_path, sb)
    with dbmod.reading(db_path) as con:
        anchors = {r[0]: r[1] for r in con.execute(
            "SELECT anchor_entry_id, trigger FROM om_internal.compactions WHERE session_id = ? AND origin = 'simulated'",
            [sb.session_id]).fetchall()}
        leaf = con.execute("SELECT leaf_id FROM sessions WHERE session_id = ?", [sb.session_id]).fetchone()[0]
        assert folded_id not in anchors  # what the agent saw there is the extension's own fold
        assert anchors.get(native_id) == "archive"  # Pi's native compaction gets what the extension would have folded
        # at the extension's compaction, visible memory is exactly its stored lists
        visible = memory.visible_memory(con, sb.session_id, folded_id)
        assert [o.id for o in visible.observations] == [note["id"]]
        assert visible.reflections == []
        # later folds are the replay's own: the agent still sees the extension's fold at the leaf, and the
        # replayed view shows the newest simulated one
        assert memory.visible_memory(con, sb.session_id, leaf) == visible
        assert memory.replayed_memory(con, sb.session_id, leaf).observations
        assert memory.replayed_memory(con, sb.session_id, leaf) != visible


@pytest.mark.parametrize("rules", ["legacy", "pi-1.6"])
def test_proactive_compactions_never_cut_before_the_previous_compaction(tmp_path, rules):
    sb = SessionBuilder("7e91c0de-0000-4000-8000-000000000002")
    sb.work_turns(24, "delta")
    # a kept tail almost as large as the threshold: the clock (counted from the last first kept entry)
    # is due again soon after each compaction, while a cut 500 tokens back would reach before it
    db_path = replayed(tmp_path, sb, SETTINGS.model_copy(update={"keepRecentTokens": 500, "cutPointRules": rules}))
    rows = [r for r in simulated(db_path, sb.session_id) if r[0] == "proactive"]
    assert len(rows) >= 3, rows
    for (_, previous_anchor, previous_kept), (_, _, first_kept) in zip(rows, rows[1:]):
        if rules == "legacy":  # the earlier Pi cuts only after the previous compaction entry
            assert first_kept > previous_anchor, rows
        else:  # Pi 1.6 cuts the projection: the previous compaction's kept range is in its window
            assert first_kept >= previous_kept, rows


@pytest.mark.parametrize("rules", ["pi-1.6", "legacy"])
def test_no_proactive_compaction_where_pi_declines(tmp_path, rules):
    sb = SessionBuilder("7e91c0de-0000-4000-8000-000000000009")
    sb.work_turns(6, "epsilon")
    # the compaction clock is due early (600), but the whole branch fits in keepRecentTokens: Pi 1.6
    # has nothing to summarize before the cut and does not compact; the earlier Pi compacted anyway
    settings = SETTINGS.model_copy(update={"keepRecentTokens": 1_000_000, "cutPointRules": rules})
    rows = [r for r in simulated(replayed(tmp_path, sb, settings), sb.session_id) if r[0] == "proactive"]
    if rules == "pi-1.6":
        assert rows == []
    else:
        assert rows and all(first_kept == 0 for _, _, first_kept in rows[:1])
