"""Observer and reflector clocks on the provider's usage (SPEC §7): U(t) - baseline, by hand.

Sizes as in test_cutpoint_pi16: ``b.user(n)`` estimates to n tokens; ``usage(x)`` is a usage whose
totalTokens is x.
"""

from __future__ import annotations

import json

from builders import SessionBuilder
from test_cutpoint_pi16 import Branch, usage
from typer.testing import CliRunner

from flows.cli.main import app
from conftest import workspace
from om_core.ingest import ingest
from om_core.cutpoint import usable_usage
from om_core.usage_clock import ContextUsage


def clock(b: Branch, t: int, watermark: int | None):
    return ContextUsage(b.entries()).clock(t, watermark)


def test_growth_after_a_watermark():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40, usage(1000))  # 1
    b.tool_result(50)  # 2  <- the watermark
    b.assistant(40, usage(1200))  # 3
    b.user(40)  # 4
    c = clock(b, 4, 2)
    # U(4) = 3's usage 1200 + 4: 40 = 1240; baseline = the last usable usage at or before 2: 1000
    assert (c.context_tokens, c.baseline_tokens, c.tokens) == (1240, 1000, 240)


def test_without_watermark_or_compaction_the_clock_is_the_context_itself():
    b = Branch()
    b.system(100)  # 0
    b.user(40)  # 1
    assert clock(b, 1, None).tokens == 140  # no usage yet: the system prompt 100 + 40
    b.assistant(40, usage(700))  # 2
    b.tool_result(10)  # 3
    assert clock(b, 3, None).tokens == 710


def extension_clock(b: Branch, t: int, watermark: int | None) -> int | None:
    """The extension's realTokensSinceAnchor (progress.ts), written out: with no compaction after the
    watermark, the context itself when there is no watermark, else its growth since the last usable
    assistant at or before the watermark (None: none, or a negative growth)."""
    entries = b.entries()[: t + 1]
    current = ContextUsage(b.entries()).context_at(t)  # Pi's getContextUsage, checked in test_cutpoint_pi16
    if watermark is None:
        return max(0, current)
    baseline = next((usable_usage(e.messages[0]) for e in reversed(entries[: watermark + 1])
                     if e.messages and usable_usage(e.messages[0]) is not None), None)
    return None if baseline is None or current < baseline else current - baseline


def test_the_first_measurement_is_the_first_usage_plus_what_follows_it():
    """At a session's first assistant message with usage (Pi 1.6: a system prompt first): the
    usage already holds the system prompt and the user's message, so the clock is that usage plus
    the entries after it, never the estimate of what it covers."""
    b = Branch()
    b.system(900)  # 0
    b.user(40)  # 1
    b.assistant(40, usage(0), stop="aborted")  # 2: no usable usage
    b.user(40)  # 3
    b.assistant(40, usage(1691))  # 4: the first usable usage
    b.tool_result(50)  # 5
    assert clock(b, 3, None).tokens == 900 + 40 + 40 + 40 == extension_clock(b, 3, None)  # before it: the estimate
    assert clock(b, 4, None).tokens == 1691 == extension_clock(b, 4, None)
    assert clock(b, 5, None).tokens == 1691 + 50 == extension_clock(b, 5, None)
    # a watermark before the first usable usage: no baseline, the source-token clock decides
    c = clock(b, 5, 1)
    assert c.tokens is None and extension_clock(b, 5, 1) is None and "no assistant usage" in c.reason
    # a watermark at it: the growth since
    assert clock(b, 5, 4).tokens == 50 == extension_clock(b, 5, 4)


def compacted() -> Branch:
    b = Branch()
    b.user(40)  # 0
    b.assistant(40, usage(1000))  # 1  <- the watermark
    b.user(40)  # 2
    b.compaction(first_kept=2)  # 3
    b.user(40)  # 4
    b.assistant(40, usage(600))  # 5
    b.user(40)  # 6
    return b


def test_after_a_compaction_the_baseline_is_the_first_assistant_after_it():
    c = clock(compacted(), 6, 1)
    # K = 3 > W = 1: baseline = 5's usage 600; U(6) = 600 + 40
    assert (c.context_tokens, c.baseline_tokens, c.tokens) == (640, 600, 40)


def test_before_any_assistant_after_a_compaction_the_context_is_unknown():
    c = clock(compacted(), 4, 1)
    assert c.tokens is None and c.context_tokens is None and "unknown" in c.reason


def test_a_negative_difference_falls_back_to_source_tokens():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40, usage(5000))  # 1  <- the watermark
    b.user(40)  # 2
    b.assistant(40, usage(800))  # 3: another model, a smaller basis
    b.user(40)  # 4
    c = clock(b, 4, 1)
    assert (c.context_tokens, c.baseline_tokens, c.tokens) == (840, 5000, None)
    assert "negative" in c.reason


def test_aborted_and_error_assistants_are_skipped():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40, usage(1000))  # 1
    b.user(40)  # 2
    b.assistant(40, usage(9000), stop="aborted")  # 3  <- the watermark
    b.assistant(40, usage(7000), stop="error")  # 4
    b.user(40)  # 5
    c = clock(b, 5, 3)
    # baseline: the last usable usage at or before 3 is 1's (3 is aborted): 1000
    # U(5): the last usable is still 1: 1000 + 2: 40 + 3: 40 + 4: 40 + 5: 40 = 1160
    assert (c.context_tokens, c.baseline_tokens, c.tokens) == (1160, 1000, 160)


def test_total_tokens_zero_uses_the_sum_of_the_parts():
    b = Branch()
    b.user(40)  # 0
    b.assistant(40, {"input": 300, "output": 20, "cacheRead": 600, "cacheWrite": 80, "totalTokens": 0})  # 1
    b.user(40)  # 2
    b.assistant(40, {"input": 1500, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0})  # 3
    c = clock(b, 3, 1)
    assert (c.context_tokens, c.baseline_tokens, c.tokens) == (1500, 1000, 500)
    b.assistant(40, {"input": 10, "output": None, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0})  # 4: unusable
    assert clock(b, 4, 1).context_tokens == 1500 + 40


# ------------------------------------------------------------------ om status


def test_status_shows_each_clocks_basis_and_the_clocks_at_a_leaf(tmp_path):
    sb = SessionBuilder("c10c0000-0000-4000-8000-000000000001")
    first = sb.user("Please start the work. " * 4)  # 92 chars -> 23
    reply = sb.assistant("Started. " * 4)  # usage totalTokens 120 (the builder's)
    sb.user("And now the next part. " * 4)  # 92 chars -> 23
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [sb.write(tmp_path / "s.jsonl")])
    runner = CliRunner()
    result = runner.invoke(app, ["--db", str(db), "status", sb.session_id, "--json"])
    assert result.exit_code == 0, result.output
    clocks = json.loads(result.stdout)["clocks"]
    # no watermark, no compaction: the clock is U(t) = the reply's usage 120 + the last user message 23
    assert clocks["observer"]["basis"] == "usage" and clocks["observer"]["tokens"] == 143
    assert clocks["reflector"]["tokens"] == 143 and clocks["compaction"]["basis"] == "source"
    assert clocks["observer"]["tokens_pi"] == 23 + 9 + 23  # the source-token clock stays reported
    at_first = json.loads(runner.invoke(app, ["--db", str(db), "status", sb.session_id, "--leaf", first,
                                              "--json"]).stdout)["clocks"]
    assert at_first["observer"]["tokens"] == 23 and at_first["observer"]["basis"] == "usage"  # no usage yet: the estimate
    at_reply = json.loads(runner.invoke(app, ["--db", str(db), "status", sb.session_id, "--leaf", reply,
                                              "--json"]).stdout)["clocks"]
    assert at_reply["observer"]["tokens"] == 120
    text = runner.invoke(app, ["--db", str(db), "status", sb.session_id])
    assert "usage" in text.stdout and "source" in text.stdout
    source = runner.invoke(app, ["--db", str(db), "status", sb.session_id, "--json"], env={"OM_CLOCK_BASIS": "source"})
    clocks = json.loads(source.stdout)["clocks"]
    assert clocks["observer"]["basis"] == "source" and clocks["observer"]["tokens"] == 55
