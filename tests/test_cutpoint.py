"""Pi's compaction cut point under the ``legacy`` rules (pi-sessions.md §2.3, §2.4), quirks included.
The Pi 1.6 rules (the default) are tested in test_cutpoint_pi16.py.

Branches are written as lists of ``BranchEntry``; results of ``find_cut_point`` are
(firstKeptIndex, turnStartIndex, isSplitTurn). The comments walk the budget backwards from the end.
"""

from __future__ import annotations

import pytest

from om_core.pi.branch_entry import BranchEntry
from om_core.pi.cutpoint import (
    DEFAULT_KEEP_RECENT_TOKENS,
    CutPoint,
    NothingToCompact,
    find_cut_point,
    is_cut_point,
)

from om_core.pi.cutpoint import compaction_cut_point as _compaction_cut_point

_n = 0


def compaction_cut_point(branch, *args, **kwargs):
    return _compaction_cut_point(branch, *args, rules="legacy", **kwargs)


def _id() -> str:
    global _n
    _n += 1
    return f"e{_n}"


def msg(role: str, tokens: int | None) -> BranchEntry:
    return BranchEntry(_id(), "message", role, tokens)


def U(tokens: int = 10) -> BranchEntry:
    return msg("user", tokens)


def A(tokens: int = 10) -> BranchEntry:
    return msg("assistant", tokens)


def T(tokens: int = 10) -> BranchEntry:
    return msg("toolResult", tokens)


def BASH(tokens: int = 10) -> BranchEntry:
    return msg("bashExecution", tokens)


def CM(tokens: int = 10) -> BranchEntry:
    return BranchEntry(_id(), "custom_message", None, tokens)


def BS(tokens: int = 10) -> BranchEntry:
    return BranchEntry(_id(), "branch_summary", None, tokens)


def other(entry_type: str) -> BranchEntry:
    return BranchEntry(_id(), entry_type, None, None)


def TL() -> BranchEntry:
    return other("thinking_level_change")


def LABEL() -> BranchEntry:
    return other("label")


def CUSTOM() -> BranchEntry:
    return other("custom")


def COMP() -> BranchEntry:
    return other("compaction")


def cut(entries: list[BranchEntry], keep: int, start: int = 0, end: int | None = None) -> tuple[int, int, bool]:
    return find_cut_point(entries, start, len(entries) if end is None else end, keep)


# ------------------------------------------------------------------ valid cut points


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (msg("user", 1), True),
        (msg("assistant", 1), True),
        (msg("bashExecution", 1), True),
        (msg("custom", 1), True),
        (msg("branchSummary", 1), True),
        (msg("compactionSummary", 1), True),
        (msg("toolResult", 1), False),  # never a cut point
        (msg("system", None), False),
        (msg("hookMessage", None), False),
        (BranchEntry("x", "custom_message", None, 1), True),
        (BranchEntry("x", "branch_summary", None, 1), True),
        (BranchEntry("x", "compaction", None, None), False),
        (BranchEntry("x", "thinking_level_change", None, None), False),
        (BranchEntry("x", "model_change", None, None), False),
        (BranchEntry("x", "custom", None, None), False),
        (BranchEntry("x", "label", None, None), False),
        (BranchEntry("x", "session_info", None, None), False),
    ],
    ids=lambda v: f"{v.entry_type}/{v.role}" if isinstance(v, BranchEntry) else str(v),
)
def test_is_cut_point(entry, expected):
    assert is_cut_point(entry) is expected


# ------------------------------------------------------------------ no cut points / budget not reached


def test_no_cut_points_keeps_everything_from_start():
    assert cut([T(), TL(), T()], keep=1) == (0, -1, False)


def test_no_cut_points_in_the_range_returns_start():
    # the user at 0 is outside [1, 4)
    assert cut([U(), T(), TL(), T()], keep=1, start=1) == (1, -1, False)


def test_budget_never_reached_takes_the_first_cut_point():
    # 10+10+10+10+10 = 50 < 100 -> cutPoints[0] = 0 (user)
    assert cut([U(), A(), T(), U(), A()], keep=100) == (0, -1, False)


def test_budget_never_reached_first_cut_point_after_leading_tool_result():
    # cutPoints = [1, 2]; 50 + 10 + 10 = 70 < 1000 -> cutPoints[0] = 1; entries[0] is a message: no absorption
    assert cut([T(50), U(), A()], keep=1000) == (1, -1, False)


# ------------------------------------------------------------------ crossing the budget


def test_budget_reached_exactly_counts():
    # i=3 A: 5; i=2 U: 10 >= 10 -> smallest cut point >= 2 is 2 (user)
    assert cut([U(5), A(5), U(5), A(5)], keep=10) == (2, -1, False)


def test_budget_one_more_moves_the_cut_back():
    # i=3: 5; i=2: 10 < 11; i=1 A: 15 >= 11 -> cut 1 (assistant): split turn starting at user 0
    assert cut([U(5), A(5), U(5), A(5)], keep=11) == (1, 0, True)


def test_crossing_at_a_tool_result_cuts_at_the_next_cut_point():
    # i=4 T: 10; i=3 A: 20; i=2 T: 30 >= 30 -> cut points >= 2: [3] -> 3 (assistant, never the toolResult)
    # absorption: entries[2] is a message -> stays 3; turn start: A(3), T(2), A(1), U(0) -> 0
    assert cut([U(), A(), T(), A(), T()], keep=30) == (3, 0, True)


def test_crossing_at_a_trailing_tool_result_keeps_the_first_cut_point():
    # cutPoints = [1, 2]; i=3 T: 100 >= 50 but no cut point >= 3 -> cutPoints[0] = 1 stays
    # (a cut at the nearest earlier cut point would give 2)
    assert cut([T(1), U(1), A(1), T(100)], keep=50) == (1, -1, False)


def test_only_message_entries_count_toward_the_budget():
    # i=5 A: 1; i=4 U: 2; i=3 BS and i=2 CM add nothing (would give 102 and cut at 3);
    # i=1 A: 3 >= 3 -> cut 1 (assistant); entries[0] is a message; turn start U(0)
    entries = [U(1), A(1), CM(100), BS(100), U(1), A(1)]
    assert cut(entries, keep=3) == (1, 0, True)


def test_messages_without_an_estimate_count_zero():
    # system message (tokens None) counts 0: i=3 A: 5; i=2 system: 5; i=1 A: 10 >= 10 -> cut 1
    assert cut([U(5), A(5), msg("system", None), A(5)], keep=10) == (1, 0, True)


def test_budget_counts_only_inside_the_range():
    # end=3: entries 3 and 4 are ignored. i=2 U: 10; i=1 A: 20 >= 20 -> cut 1; turn start 0
    assert cut([U(), A(), U(), A(1000), U(1000)], keep=20, end=3) == (1, 0, True)


# ------------------------------------------------------------------ backward absorption


def test_absorption_over_settings_labels_and_custom_stops_at_a_message():
    # i=6 T: 10; i=5 A: 20 >= 20 -> cut 5; absorb 4 (label), 3 (thinking), stop at T(2) (a message)
    # cut 3 is not a user message -> turn start: TL(3), T(2), A(1), U(0) -> 0
    entries = [U(), A(), T(), TL(), LABEL(), A(), T()]
    assert cut(entries, keep=20) == (3, 0, True)


def test_absorption_stops_at_a_compaction():
    # i=4 A: 10; i=3 U: 20 -> cut 3; absorb 2 (custom); entries[1] is a compaction -> stop at 2
    # cut 2 is a custom entry -> turn start: CUSTOM(2), COMP(1), U(0) -> 0
    entries = [U(), COMP(), CUSTOM(), U(), A()]
    assert cut(entries, keep=20) == (2, 0, True)


def test_absorption_never_goes_below_start():
    # start=2: i=4 A: 10; i=3 U: 20 -> cut 3; absorb 2 (thinking); 2 == start -> stop
    # turn start search covers [2, 2] only: TL -> none -> (2, -1, False)
    entries = [U(), A(), TL(), U(), A()]
    assert cut(entries, keep=20, start=2) == (2, -1, False)


def test_absorption_onto_custom_message_and_branch_summary():
    # i=5 A: 10; i=4 U: 20 -> cut 4; absorb 3 (branch_summary), 2 (custom_message); entries[1] is a message
    # cut 2 is a custom_message -> it starts a turn itself: (2, 2, True)
    entries = [U(), A(), CM(), BS(), U(), A()]
    assert cut(entries, keep=20) == (2, 2, True)


def test_absorption_applies_to_the_cut_points_0_default():
    # budget never reached -> cutPoints[0] = 1; absorb the thinking change at 0 -> cut 0;
    # not a user message, and no turn start at or before 0 -> (0, -1, False)
    assert cut([TL(), U(), A()], keep=1000) == (0, -1, False)


# ------------------------------------------------------------------ quirk A


def test_quirk_a_previous_turn_becomes_the_prefix():
    # i=4 A: 10; i=3 U: 20 -> cut 3 (a user message: no split turn without absorption)
    # absorption moves the cut onto the thinking change at 2 -> "not a user message"
    # turn start: TL(2), A(1), U(0) -> 0, isSplitTurn True
    entries = [U(), A(), TL(), U(), A()]
    assert cut(entries, keep=20) == (2, 0, True)


def test_without_the_non_message_entry_the_same_cut_is_a_clean_turn():
    # control for quirk A: i=3 A: 10; i=2 U: 20 -> cut 2, a user message -> (2, -1, False)
    assert cut([U(), A(), U(), A()], keep=20) == (2, -1, False)


# ------------------------------------------------------------------ quirk B


def test_quirk_b_cut_at_bash_execution():
    # i=3 A: 10; i=2 BASH: 20 -> cut 2; entries[1] is a message; bashExecution starts a turn -> (2, 2, True)
    assert cut([U(), A(), BASH(), A()], keep=20) == (2, 2, True)


def test_quirk_b_cut_at_custom_message():
    # i=4 A: 10; i=3 CM: skipped; i=2 T: 20 -> cut points >= 2: [3, 4] -> 3 (custom_message)
    # entries[2] is a message -> no absorption; custom_message starts a turn -> (3, 3, True)
    assert cut([U(), A(), T(), CM(), A()], keep=20) == (3, 3, True)


def test_quirk_b_cut_at_branch_summary():
    # same walk as above with a branch_summary at 3
    assert cut([U(), A(), T(), BS(), A()], keep=20) == (3, 3, True)


def test_cut_at_custom_role_message_is_not_a_turn_start():
    # a `custom` role message is a cut point but does not start a turn:
    # i=3 A: 10; i=2 custom: 20 -> cut 2; turn start: custom(2), A(1), U(0) -> 0
    assert cut([U(), A(), msg("custom", 10), A()], keep=20) == (2, 0, True)


def test_split_turn_without_a_turn_start_in_range():
    # start=2 after a compaction at 1: i=4 A: 10 -> cut 4; absorb: entries[3] is T -> stop
    # turn start search in [2, 4]: A, T, A -> none (the user at 0 is outside) -> (4, -1, False)
    entries = [U(), COMP(), A(), T(), A()]
    assert cut(entries, keep=10, start=2) == (4, -1, False)


# ------------------------------------------------------------------ compaction_cut_point


def test_default_keep_recent_tokens_is_20000():
    assert DEFAULT_KEEP_RECENT_TOKENS == 20_000
    # i=3 A: 19999; i=2 U: 20000 >= 20000 -> cut 2 (user). With 19999 the cut would be 3; with 20001, 1.
    branch = [U(1), A(1), U(1), A(19999)]
    result = compaction_cut_point(branch)
    assert (result.firstKeptPosition, result.turnStartPosition, result.isSplitTurn) == (2, -1, False)


def test_compaction_cut_point_reports_id_and_positions():
    branch = [U(5), A(5), U(5), A(5)]
    # keep 11: i=3: 5; i=2: 10; i=1: 15 >= 11 -> cut 1 (assistant), turn start 0
    assert compaction_cut_point(branch, 11) == CutPoint(
        firstKeptEntryId=branch[1].entry_id, firstKeptPosition=1, turnStartPosition=0, isSplitTurn=True,
        tokensBefore=20, cutPointRules="legacy")  # no usage: the sum of the estimates


def test_compaction_cut_point_starts_after_the_last_compaction():
    # boundary = [3, 6): only 10 + 10 = 20 tokens after the compaction at 2 < 150, so the budget is
    # never reached (counting U(100)+A(100) before the compaction would cross it) -> cutPoints[0] = 4;
    # absorb the thinking change at 3 (= start) -> cut 3; turn start in [3, 3]: none
    branch = [U(100), A(100), COMP(), TL(), U(10), A(10)]
    result = compaction_cut_point(branch, 150)
    assert result == CutPoint(firstKeptEntryId=branch[3].entry_id, firstKeptPosition=3, turnStartPosition=-1,
                              isSplitTurn=False, tokensBefore=20, cutPointRules="legacy")


def test_compaction_cut_point_uses_the_latest_of_several_compactions():
    # compactions at 1 and 4; boundary [5, 7): i=6 A: 10; i=5 U: 20 -> cut 5 (user)
    branch = [U(), COMP(), U(), A(), COMP(), U(), A()]
    result = compaction_cut_point(branch, 20)
    assert (result.firstKeptPosition, result.turnStartPosition, result.isSplitTurn) == (5, -1, False)


def test_compaction_cut_point_positions_are_branch_indexes():
    # boundary [2, 5): i=4 A: 10; i=3 T: 20 -> cut points >= 3: [4] -> 4; turn start in [2, 4]: U at 2
    branch = [A(), COMP(), U(), T(), A()]
    result = compaction_cut_point(branch, 20)
    assert (result.firstKeptPosition, result.turnStartPosition, result.isSplitTurn) == (4, 2, True)
    assert result.firstKeptEntryId == branch[4].entry_id


def test_compaction_cut_point_without_cut_points_keeps_from_the_boundary():
    # boundary [2, 4): T and TL only -> (start=2, -1, False)
    branch = [U(), COMP(), T(), TL()]
    result = compaction_cut_point(branch, 1)
    assert (result.firstKeptPosition, result.turnStartPosition, result.isSplitTurn) == (2, -1, False)
    assert result.firstKeptEntryId == branch[2].entry_id


def test_nothing_to_compact_when_the_branch_ends_with_a_compaction():
    with pytest.raises(NothingToCompact):
        compaction_cut_point([U(), A(), COMP()])


def test_nothing_to_compact_on_an_empty_branch():
    with pytest.raises(NothingToCompact):
        compaction_cut_point([])


def test_nothing_to_compact_is_a_value_error():
    assert issubclass(NothingToCompact, ValueError)
