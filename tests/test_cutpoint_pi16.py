"""Pi 1.6's compaction rules (pi-sessions.md §7), the default: projection, estimate, cut point, split
turn, the cases where Pi declines, and tokensBefore. Every expected value is computed by hand in the
comments; where the earlier Pi (``legacy``, §2.3–§2.4) gives another answer, that is checked too.

Branches are built from entry objects as Pi writes them. Sizes: ``text(n)`` is ``4n`` characters, so
a message holding it estimates to ``n`` tokens.
"""

from __future__ import annotations

import pytest

from om_core.pi.branch_entry import BranchEntry, branch_entry
from om_core.pi.cutpoint import NothingToCompact, compaction_cut_point, project_branch
from om_core.pi.session import SessionParser

IMAGE = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
# Tool declarations as a Pi 1.6 system message lists them (toolsAdded): READ's JSON is 198 characters,
# [READ] 200; BASH's 99, [READ, BASH] 300.
READ = {"name": "read", "description": "d" * 166}
BASH = {"name": "bash", "description": "b" * 67}


def text(tokens: int) -> str:
    return "x" * (4 * tokens)


class Branch:
    """A linear branch of entry objects; each method appends one and returns its position."""

    def __init__(self) -> None:
        self.objs: list[dict] = []

    def add(self, obj: dict) -> int:
        self.objs.append({"id": f"e{len(self.objs)}", "parentId": f"e{len(self.objs) - 1}" if self.objs else None,
                          "timestamp": "2026-01-15T14:00:00.000Z", **obj})
        return len(self.objs) - 1

    def id(self, position: int) -> str:
        return self.objs[position]["id"]

    def message(self, message: dict) -> int:
        return self.add({"type": "message", "message": message})

    def user(self, tokens: int = 10, images: int = 0) -> int:
        return self.message({"role": "user", "content": [{"type": "text", "text": text(tokens)}] + [IMAGE] * images})

    def assistant(self, tokens: int = 10, usage: dict | None = None, stop: str = "stop") -> int:
        return self.message({"role": "assistant", "content": [{"type": "text", "text": text(tokens)}],
                             "stopReason": stop, "usage": usage or {}})

    def tool_result(self, tokens: int = 10) -> int:
        return self.message({"role": "toolResult", "toolCallId": "c", "toolName": "read",
                             "content": [{"type": "text", "text": text(tokens)}], "isError": False})

    def system(self, tokens: int, **fields) -> int:
        """A system prompt message as Pi 1.6 writes it (with a timestamp: Pi counts none without one)."""
        return self.message({"role": "system", "content": text(tokens), "sections": {}, "timestamp": 1768485600000,
                             **fields})

    def bash(self, tokens: int) -> int:
        return self.message({"role": "bashExecution", "command": "ls", "output": text(tokens)[2:]})

    def custom_message(self, tokens: int) -> int:
        return self.add({"type": "custom_message", "customType": "note", "content": text(tokens), "display": True})

    def branch_summary(self, tokens: int) -> int:
        return self.add({"type": "branch_summary", "fromId": "root", "summary": text(tokens)})

    def thinking_change(self) -> int:
        return self.add({"type": "thinking_level_change", "thinkingLevel": "high"})

    def compaction(self, first_kept: int | None, summary_tokens: int = 10, system_tokens: int | None = None) -> int:
        obj = {"type": "compaction", "summary": text(summary_tokens),
               "firstKeptEntryId": self.id(first_kept) if first_kept is not None else None, "tokensBefore": 1}
        if system_tokens is not None:
            obj["systemMessage"] = {"role": "system", "content": text(system_tokens), "sections": {},
                                    "timestamp": 1768485600000}
        return self.add(obj)

    def edit(self, target: int, replacement) -> int:
        return self.add({"type": "context_edit", "targetId": self.id(target), "replacement": replacement})

    def entries(self) -> list[BranchEntry]:
        parser = SessionParser()
        parser.feed(1, b'{"type":"session","version":3,"id":"s","timestamp":"2026-01-15T14:00:00.000Z","cwd":"/"}')
        import json

        out = []
        for n, obj in enumerate(self.objs, start=2):
            e = parser.feed(n, json.dumps(obj).encode())
            out.append(branch_entry(e.entry_id, e.entry_type, e.role, e.tokens_pi, e.obj, e.first_kept_entry_id))
        return out


def cut(b: Branch, keep: int, rules: str = "pi-1.6") -> tuple[int, int, bool]:
    c = compaction_cut_point(b.entries(), keep, rules=rules)
    return c.firstKeptPosition, c.turnStartPosition, c.isSplitTurn


def usage(total: int) -> dict:
    return {"input": total, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": total}


# ------------------------------------------------------------------ 7.1 projection


def projection_after_a_compaction() -> Branch:
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.user(40)  # 2  <- the compaction keeps from here
    b.system(100)  # 3  a system prompt inside the kept range: left out of the projection
    b.assistant(40)  # 4
    b.compaction(first_kept=2)  # 5
    b.user(40)  # 6
    b.assistant(40, usage(5000))  # 7
    return b


def test_projection_is_the_newest_compaction_its_kept_range_without_system_messages_and_what_follows():
    projection = project_branch(projection_after_a_compaction().entries())
    assert [it.position for it in projection.items] == [5, 2, 4, 6, 7]
    assert projection.window_start == 1  # the window starts right after the compaction


def test_cut_inside_the_kept_range_of_the_previous_compaction():
    b = projection_after_a_compaction()
    # window [2, 4, 6, 7]: 7: 40, 6: 80, 4: 120 >= 100 -> cut 4 (an assistant); 2 contributes a
    # message, so no absorption; 4 does not start a turn; back to 2 (a user): a split turn from 2
    assert cut(b, 100) == (4, 2, True)
    c = compaction_cut_point(b.entries(), 100)
    assert c.tokensBefore == 5000  # 7's usage, after the compaction, nothing after it
    # the earlier Pi cuts only after the compaction entry: [6, 7] = 80 < 100 -> cutPoints[0] = 6
    assert cut(b, 100, "legacy") == (6, -1, False)


def test_the_kept_system_prompt_does_not_weigh_in_the_budget():
    # 7: 40, 6: 80, 4: 120, 2: 160 >= 150 -> cut 2, the window start: nothing before it to summarize.
    # (Were the system prompt at 3 counted, 4 + 3 would reach 220 and cut at 4 with a turn prefix.)
    with pytest.raises(NothingToCompact, match="nothing to summarize"):
        cut(projection_after_a_compaction(), 150)


# ------------------------------------------------------------------ 7.2 estimate


def test_images_in_user_messages_count_1200_tokens_each():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.user(10, images=1)  # 2: 40 + 4800 chars = 1210 tokens under Pi 1.6, 10 under the earlier Pi
    b.assistant(40)  # 3
    # 3: 40, 2: 1250 >= 1000 -> cut 2, a user message: no split
    assert cut(b, 1000) == (2, -1, False)
    # legacy: 40 + 10 + 40 + 40 = 130 < 1000, never reached -> cutPoints[0] = 0
    assert cut(b, 1000, "legacy") == (0, -1, False)
    assert b.entries()[2].tokens_pi == 1210  # the stored estimate follows Pi 1.6


def test_custom_messages_and_branch_summaries_weigh_in_the_budget():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.custom_message(10)  # 2
    b.thinking_change()  # 3
    b.user(40)  # 4
    b.assistant(40)  # 5
    # 5: 40, 4: 80, 3: 0 (skipped), 2: 90 >= 90 -> cut 2 (a custom message starts a turn)
    assert cut(b, 90) == (2, -1, False)
    # legacy counts message entries only: 5, 4, 1: 120 >= 90 -> cut 1, then quirk: split from 0
    assert cut(b, 90, "legacy") == (1, 0, True)


# ------------------------------------------------------------------ 7.3 cut point


def test_trailing_tool_results_cut_at_the_last_candidate():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1 (the call)
    b.tool_result(200)  # 2
    b.tool_result(200)  # 3
    # 3: 200 >= 100 at a tool result with no candidate at or after it -> the last candidate, 1;
    # a split turn from the user at 0
    assert cut(b, 100) == (1, 0, True)
    # the earlier Pi kept everything: cutPoints[0] = 0
    assert cut(b, 100, "legacy") == (0, -1, False)


def recovery_branch() -> Branch:
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.user(40)  # 2
    b.assistant(40)  # 3
    b.assistant(40)  # 4  <- emptied by the edit at 5
    b.edit(4, None)  # 5
    return b


def test_recovery_suffix_moves_the_cut_over_an_emptied_assistant():
    # 5: 0, 4: 0 (emptied), 3: 40 >= 40 -> cut 3; after it only the emptied assistant 4 and the edit:
    # move forward one entry -> 4; 3 contributes a message (no absorption); 4 contributes nothing, so
    # it does not start a turn: back to the user at 2 -> a split turn from 2
    assert cut(recovery_branch(), 40) == (4, 2, True)


def test_recovery_suffix_blocked_by_an_edit_that_replaces_a_live_entry():
    b = recovery_branch()
    b.edit(2, [{"type": "text", "text": text(40)}])  # 6: replaces the user at 2, which is not emptied
    # 6, 5, 4: 0; 3: 40 -> cut 3; the suffix holds an edit with a replacement for a live entry: no move
    assert cut(b, 40) == (3, 2, True)


def test_recovery_suffix_needs_the_budget_to_be_exceeded():
    # the budget is never reached (1 + 40 * 4 = 160 < 1000): cut at the first candidate (0), no recovery;
    # nothing before it -> Pi declines
    with pytest.raises(NothingToCompact):
        cut(recovery_branch(), 1000)


def test_absorption_stops_at_a_custom_message():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.custom_message(10)  # 2
    b.thinking_change()  # 3
    b.user(40)  # 4
    b.assistant(40)  # 5
    # 5: 40, 4: 80 >= 80 -> cut 4; absorb the thinking change 3; the custom message at 2 contributes a
    # message: stop at 3. 3 contributes nothing (no turn start); back to 2, a custom message: a split
    # turn from 2
    assert cut(b, 80) == (3, 2, True)
    # the earlier Pi absorbs the custom message too and stops at the assistant 1 -> cut 2, quirk B
    assert cut(b, 80, "legacy") == (2, 2, True)


def test_absorption_stops_at_a_branch_summary():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.branch_summary(10)  # 2
    b.thinking_change()  # 3
    b.user(40)  # 4
    b.assistant(40)  # 5
    assert cut(b, 80) == (3, 2, True)
    assert cut(b, 80, "legacy") == (2, 2, True)


@pytest.mark.parametrize("kind", ["bash", "custom_message", "branch_summary"])
def test_a_cut_on_a_bash_execution_custom_message_or_branch_summary_is_never_a_split(kind):
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    getattr(b, kind)(40)  # 2
    b.assistant(40)  # 3
    # 3: 40, 2: 80 >= 80 -> cut 2; it starts a turn -> not a split
    assert cut(b, 80) == (2, -1, False)
    if kind == "bash":
        assert cut(b, 80, "legacy") == (2, 2, True)  # quirk B of the earlier Pi
    else:  # the earlier Pi does not count them: 3, 1: 80 -> cut 1, a split turn from 0
        assert cut(b, 80, "legacy") == (1, 0, True)


def test_split_turn_at_an_assistant_and_a_clean_cut_at_a_user():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.user(40)  # 2
    b.assistant(40)  # 3
    b.tool_result(40)  # 4
    b.assistant(40)  # 5
    # 5: 40, 4: 80 >= 80 at a tool result -> the first candidate at or after 4 is 5; split from 2
    assert cut(b, 80) == (5, 2, True)
    # 5, 4, 3: 120, 2: 160 >= 160 -> cut 2, a user: no split
    assert cut(b, 160) == (2, -1, False)


# ------------------------------------------------------------------ 7.4 when Pi declines


def test_declines_when_the_branch_ends_in_a_compaction():
    b = Branch()
    b.user(40)
    b.assistant(40)
    b.compaction(first_kept=0)
    with pytest.raises(NothingToCompact, match="ends with a compaction"):
        cut(b, 10)


def test_declines_when_the_cut_entry_has_no_id():
    entries = Branch()
    for _ in range(2):
        entries.user(40)
        entries.assistant(40)
    branch = entries.entries()
    # 3: 40 >= 40 -> cut 3, whose id is missing
    branch[3] = BranchEntry("", branch[3].entry_type, branch[3].role, branch[3].tokens_pi, messages=branch[3].messages)
    with pytest.raises(NothingToCompact, match="no id"):
        compaction_cut_point(branch, 40)


def test_declines_when_the_branch_fits_the_budget():
    b = Branch()
    b.user(40)
    b.assistant(40)
    # 80 < 20000: cut at the first candidate (0), nothing before it
    with pytest.raises(NothingToCompact, match="nothing to summarize"):
        cut(b, 20_000)
    assert cut(b, 20_000, "legacy") == (0, -1, False)  # the earlier Pi compacted anyway


def test_declines_when_only_the_system_prompt_precedes_the_cut():
    b = Branch()
    b.add({"type": "session_info", "name": "demo"})  # 0
    b.add({"type": "model_change", "provider": "anthropic", "modelId": "m"})  # 1
    b.system(500)  # 2
    b.user(40)  # 3
    b.assistant(40)  # 4
    # 4: 40, 3: 80 >= 80 -> cut 3 (a user); before it only the system prompt (and metadata)
    with pytest.raises(NothingToCompact, match="nothing to summarize"):
        cut(b, 80)
    # a budget the system prompt reaches: 4, 3, 2: 580 >= 100 -> the first candidate at or after 2 is 3
    with pytest.raises(NothingToCompact):
        cut(b, 100)
    b.assistant(40)  # 5: now 5, 4: 80 -> cut 4 (an assistant), a split turn from 3: its prefix is summarized
    assert cut(b, 80) == (4, 3, True)


# ------------------------------------------------------------------ context_edit


def edit_branch() -> Branch:
    b = Branch()
    b.user(40)  # 0
    b.assistant(40)  # 1
    b.user(40)  # 2
    b.assistant(100)  # 3  <- the edit at 4 targets it
    return b


def finish(b: Branch) -> Branch:
    b.user(40)  # 5
    b.assistant(40)  # 6
    return b


def test_without_an_edit():
    b = edit_branch()
    b.thinking_change()  # 4 (instead of an edit)
    # 6: 40, 5: 80, 3: 180 >= 150 -> cut 3, a split turn from 2
    assert cut(finish(b), 150) == (3, 2, True)


def test_a_context_edit_that_empties_an_entry():
    b = edit_branch()
    b.edit(3, None)  # 4
    # 6: 40, 5: 80, 4 and 3: 0, 2: 120, 1: 160 >= 150 -> cut 1, a split turn from 0
    assert cut(finish(b), 150) == (1, 0, True)
    # an emptied entry is never a candidate and is absorbed: 6, 5: 80 >= 80 -> cut 5; absorb 4 and 3
    # (they contribute nothing), stop at 2 -> cut 3, which does not start a turn: split from 2
    assert cut(finish(edit_branch_with_edit(None)), 80) == (3, 2, True)


def edit_branch_with_edit(replacement) -> Branch:
    b = edit_branch()
    b.edit(3, replacement)
    return b


def test_a_context_edit_that_replaces_an_entry():
    b = edit_branch_with_edit([{"type": "text", "text": text(50)}])  # 3 now weighs 50
    # 6: 40, 5: 80, 3: 130, 2: 170 >= 150 -> cut 2, a user: no split
    assert cut(finish(b), 150) == (2, -1, False)
    entries = finish(edit_branch_with_edit([{"type": "text", "text": text(50)}])).entries()
    assert not entries[4].tokens_pi and not branch_entry_is_source(entries[4])


def branch_entry_is_source(entry: BranchEntry) -> bool:
    from om_core.pi.session import is_source_entry

    return is_source_entry(entry.entry_type, entry.role)


# ------------------------------------------------------------------ 7.5 tokensBefore


def tokens_before(b: Branch, keep: int = 40) -> int:
    return compaction_cut_point(b.entries(), keep).tokensBefore


def test_tokens_before_from_usage():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40, usage(1000))  # 1
    b.tool_result(50)  # 2
    b.assistant(40, usage(9999), stop="aborted")  # 3: aborted, skipped
    b.user(40)  # 4
    # 1's usage 1000 + the estimates after it: 50 + 40 + 40
    assert tokens_before(b) == 1130


def test_tokens_before_from_the_usage_parts_when_total_tokens_is_zero():
    b = Branch()
    b.user(40)
    b.assistant(40, {"input": 300, "output": 20, "cacheRead": 600, "cacheWrite": 80, "totalTokens": 0})
    b.user(40)
    assert tokens_before(b) == 1000 + 40


def test_tokens_before_from_estimates_without_usable_usage():
    b = Branch()
    b.system(100)  # 0
    b.user(40)  # 1
    b.assistant(40, usage(5000), stop="error")  # 2: an error: not usable
    b.user(40)  # 3
    # the system prompt 100 + every other message: 40 + 40 + 40
    assert tokens_before(b) == 220


def tools_change_at_the_end() -> Branch:
    b = Branch()
    b.system(10)  # 0
    b.user(40)  # 1
    b.assistant(40)  # 2
    b.user(40)  # 3
    b.assistant(40)  # 4
    b.system(0, toolsRemoved=[BASH], toolsAdded=[READ])  # 5: a loadout change; its declarations [READ] -> 50
    return b


def test_a_system_messages_tool_declarations_weigh_in_the_budget():
    b = tools_change_at_the_end()
    # 5: 50, 4: 90 >= 90 -> cut 4 (an assistant), a split turn from 3. (Without the declarations 5 weighs
    # nothing: 4, 3, 2: 120 -> cut 2, a split from 1.)
    assert cut(b, 90) == (4, 3, True)
    # no usage: the system message Pi replays from 0 and 5: contents 40, tools [READ] 200 -> 60; + 160
    assert tokens_before(b) == 220


def test_tokens_before_replays_every_system_message():
    b = Branch()
    b.system(100, sections={"preamble": text(50), "docs": text(20)}, toolsAdded=[READ, BASH])  # 0
    b.user(40)  # 1
    b.assistant(40, usage(5000), stop="aborted")  # 2
    b.system(5, sections={"docs": None}, toolsRemoved=[BASH])  # 3
    b.user(40)  # 4
    # one system message: contents 400 + 2 + 20, sections: preamble 200 (docs removed), tools [READ]
    # 200: 822 chars -> 206; plus 1, 2, 4: 120
    assert tokens_before(b) == 326


def test_tokens_before_ignores_usage_from_before_the_latest_compaction():
    b = Branch()
    b.system(7)  # 0 (left out of the kept range; replaced by the compaction's stored system message)
    b.user(40)  # 1
    b.assistant(40, usage(1000))  # 2
    b.user(40)  # 3
    b.compaction(first_kept=3, summary_tokens=10, system_tokens=100)  # 4
    b.user(40)  # 5
    # no usable assistant after the compaction: its system message 100 + its summary 10 + 3: 40 + 5: 40
    assert tokens_before(b) == 190


def test_tokens_before_ignores_usage_from_before_a_context_edit():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40, usage(1000))  # 1
    b.edit(0, "hi")  # 2: replaces the user message's content with "hi" (1 token)
    b.user(40)  # 3
    assert tokens_before(b) == 1 + 40 + 40
