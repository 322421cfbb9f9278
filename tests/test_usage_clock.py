"""Observer and reflector clocks on the provider's usage (SPEC §7): U(t) - baseline, by hand, and
against the real Pi 1.6.0 (skipped where .ci/pi holds no Pi).

Sizes as in test_cutpoint_pi16: ``b.user(n)`` estimates to n tokens; ``usage(x)`` is a usage whose
totalTokens is x.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import SessionBuilder
from fake_openai import FakeOpenAI, http_error, tool_call
from fake_openai import text as reply
from pi_rpc import RpcPi, agent_dir, missing, os_env, session_entries
from test_cutpoint_pi16 import BASH, READ, Branch, text, usage
from typer.testing import CliRunner

from flows.cli.main import app
from conftest import workspace
from om_core.ingest import ingest
from om_core.pi.cutpoint import usable_usage
from om_core.memory.views import clocks
from om_core.memory.usage_clock import ContextUsage


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


# ------------------------------------------------------------------ Pi 1.6's system prompt messages

# Real Pi 1.6 writes the system prompt as a message entry: empty content, its sections and the JSON
# declarations of the tools it adds (toolsAdded); a tool loadout change later writes another one that
# patches them. READ's JSON is 198 characters, BASH's 99; a list adds its brackets and commas.


def first_turn_refused() -> Branch:
    b = Branch()
    b.thinking_change()  # 0
    b.system(0, sections={"preamble": "p" * 200, "tools": "t" * 200}, toolsAdded=[READ])  # 1: 400 + 200 -> 150
    b.user(40)  # 2
    b.assistant(40, usage(0), stop="error")  # 3: the provider refused the first request
    b.user(40)  # 4
    b.assistant(40, usage(1691))  # 5: the first usable usage
    b.tool_result(50)  # 6
    return b


def test_the_first_measurement_counts_the_system_prompts_tools():
    """Before any usable usage Pi's context is the system prompt, its tool declarations included, plus
    the other messages; the extension's clock without a watermark is that context (realTokensSinceAnchor:
    max(0, current))."""
    b = first_turn_refused()
    assert clock(b, 2, None).tokens == 150 + 40 == 190
    assert clock(b, 3, None).tokens == 150 + 40 + 40 == 230  # om had 100 + 80: the tools left out
    assert clock(b, 5, None).tokens == 1691
    assert clock(b, 6, None).tokens == 1691 + 50
    # the observer ran after the refused turn (watermark at 2): no usage at or before it, the source clock
    assert clock(b, 6, 2).tokens is None


def loadout_change_after_the_usage() -> Branch:
    b = Branch()
    b.system(0, sections={"preamble": "p" * 200}, toolsAdded=[READ, BASH])  # 0: 200 + 300 -> 125
    b.user(40)  # 1
    b.assistant(40, usage(2000))  # 2
    b.system(0, sections={"tools": "t" * 80}, toolsRemoved=[{"name": "bash"}])  # 3: 80 -> 20
    b.user(40)  # 4
    b.assistant(40, usage(0), stop="error")  # 5
    return b


def test_a_system_message_after_the_last_usage_is_part_of_the_context():
    b = loadout_change_after_the_usage()
    # U(5) = 2's usage 2000 + 3: 20 + 4: 40 + 5: 40 (om left the system message out: 2080)
    assert clock(b, 5, None).tokens == 2100
    assert clock(b, 5, 2).tokens == 100  # its growth since a watermark at 2


def two_system_messages_before_any_usage() -> Branch:
    b = Branch()
    b.system(100, sections={"preamble": "p" * 200, "tools": "t" * 120, "docs": "d" * 80},
             toolsAdded=[READ, BASH])  # 0: 400 + 400 + 300 = 1100 -> 275
    b.user(40)  # 1
    b.assistant(40, usage(0), stop="error")  # 2
    b.system(2, sections={"tools": "t" * 40, "docs": None}, toolsRemoved=[{"name": "bash"}])  # 3: 8 + 40 -> 12
    b.user(40)  # 4
    b.assistant(40, usage(0), stop="error")  # 5
    return b


def test_without_usage_the_system_messages_count_as_the_one_pi_replays():
    """Pi replays every system message into one (pi-ai's getCurrentSystemMessage): contents joined by a
    blank line, sections patched by name (null removes one), tools after each removal and addition."""
    b = two_system_messages_before_any_usage()
    assert clock(b, 2, None).tokens == 275 + 40 + 40
    # at 5: contents 400 + 2 + 8 = 410, sections preamble 200 + tools 40 = 240 (docs removed), tools
    # [READ] 200: 850 chars -> 213; plus 1, 2, 4, 5: 160. (Each one on its own: 275 + 12 + 160 = 447;
    # the latest alone, as om had it: 12 + 160 = 172.)
    assert clock(b, 5, None).tokens == 213 + 160 == 373


def without_timestamps() -> Branch:
    b = Branch()
    b.message({"role": "system", "content": text(100), "sections": {}})  # 0: no timestamp field
    b.user(40)  # 1
    b.message({"role": "system", "content": "", "toolsAdded": [READ]})  # 2
    b.user(40)  # 3
    return b


def test_a_system_message_without_timestamp_or_tools_is_no_system_prompt():
    b = without_timestamps()
    assert clock(b, 1, None).tokens == 40  # Pi builds no current system message from 0
    assert clock(b, 3, None).tokens == 150 + 40 + 40  # a declared tool makes one: 400 + 200 -> 150


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


# ------------------------------------------------------------------ the real Pi 1.6.0

# Pi records a new system message when an extension changes the tool loadout before a request.
LOADOUT = """export default function (pi: any) {
  pi.on("before_agent_start", (event: unknown) => {
    if (JSON.stringify(event).includes("[drop-edit]")) pi.setActiveTools(pi.getActiveTools().filter((n: string) => n !== "edit"));
  });
}
"""


@pytest.mark.skipif(missing() is not None, reason=missing() or "")
def test_the_context_is_pi_s_own_on_a_session_real_pi_writes(tmp_path):
    """Real Pi 1.6.0 in RPC mode, the fake model as its provider: after each prompt, Pi's own
    getContextUsage (get_session_stats) equals om's context at the file's last entry, and without a
    watermark the observer clock is that context (the extension's realTokensSinceAnchor). The first
    request is refused (the first measurement is the system prompt with its tools and the prompt), one
    turn calls a tool, and a loadout change comes right before another refused request."""
    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    (project / "notes.md").write_text("The ledger keeps its entries in PostgreSQL.\n" * 20)
    (tmp_path / "loadout.ts").write_text(LOADOUT)
    prompts = [("Start on the ledger service. " * 8, [http_error(400, "refused")]),
               ("Read notes.md, please. " * 8, [tool_call("read", {"path": "notes.md"}), reply("Read it. " * 30)]),
               ("[drop-edit] No more edits. " * 8, [http_error(400, "refused")]),
               ("Then summarize the notes. " * 8, [reply("A summary. " * 40)])]
    seen = []
    with FakeOpenAI() as server:
        agent_dir(home, server.base_url, {})
        pi = RpcPi(home, project, os_env(), session_dir=tmp_path / "sessions", extensions=[tmp_path / "loadout.ts"])
        try:
            for prompt, replies in prompts:
                server.add(*replies)
                pi.prompt(prompt)
                context = pi.call({"type": "get_session_stats"})["data"]["contextUsage"]["tokens"]
                path = Path(pi.call({"type": "get_state"})["data"]["sessionFile"])
                seen.append((session_entries(path)[-1]["id"], context))
        finally:
            pi.close()
    entries = session_entries(path)
    assert sum(e["type"] == "message" and e["message"]["role"] == "system" for e in entries) == 2
    assert [e["message"]["stopReason"] for e in entries if e.get("message", {}).get("role") == "assistant"] == [
        "error", "toolUse", "stop", "error", "stop"]
    ws = workspace(tmp_path / "om.duckdb")
    ingest(ws, [path])
    with ws.read() as con:
        measured = [(leaf, clocks(con, entries[0]["id"], leaf, ws.settings)["observer"]) for leaf, _ in seen]
    assert [(leaf, c.context_tokens, c.tokens, c.basis) for leaf, c in measured] == [
        (leaf, context, context, "usage") for leaf, context in seen]
