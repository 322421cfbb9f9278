"""A session written the way the TypeScript extension writes it imports unchanged, and the `om`
commands agree with it.

The session below is what Pi plus `pi-observational-memory` leave on disk: `custom` entries
`om.observations.recorded` / `om.reflections.recorded` / `om.observations.dropped` appended by
the workers, and three compactions made by the extension's hook, each carrying the `om.folded`
lists the extension folded at its `firstKeptEntryId`. The user runs with
`observationsPoolMaxTokens` = 160, so the second compaction is a full fold and the third is a
normal one after it. Token counts are ceil(rendered line / 4), as the extension counts them.

Every list in a compaction below was worked out by hand from SPEC §4:
- C1 at F = E12: no full fold yet (no M); observations covered through E12 = O1 O2 O3
  (35 + 34 + 33 = 102 < 160): normal, no reflections, no drops.
- C2 at F = E20: normal would be O1..O5 = 168 >= 160, so a full fold: the drop of O2 and O4 and
  reflections R1 R2 (all covering E13 <= E20) apply.
- C3 at F = E28: M = E20 (C2). Drops covered through M (O2, O4) apply, the drop of O5 (covers E21)
  does not; O1 O3 O5 O6 O7 = 35 + 33 + 38 + 26 + 25 = 157 < 160: normal; reflections covered
  through M are R1 R2 (R3 covers E21).
"""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
from flows.cli.main import app

SID = "8f3a2c1e-5b7d-4e9a-a1c3-0d2e4f6a8b9c"
E = {n: f"{n:08x}" for n in range(1, 40)}
POOL_MAX = "160"


def mid(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def obs(content: str, ts: str, relevance: str, sources: list[int], tokens: int) -> dict:
    return {"id": mid(content), "content": content, "timestamp": ts, "relevance": relevance,
            "sourceEntryIds": [E[n] for n in sources], "tokenCount": tokens}


def refl(content: str, supporting: list[dict], tokens: int) -> dict:
    return {"id": mid(content), "content": content, "supportingObservationIds": [s["id"] for s in supporting],
            "tokenCount": tokens}


O1 = obs("User is building Acme Dashboard on Next.js 15 with Supabase auth and wants small, reviewable PRs.",
         "2026-01-15 14:01", "critical", [3], 35)
O2 = obs("package.json pins next 15.0.3, react 19.0.0, @supabase/ssr 0.5.1 and @supabase/supabase-js 2.46.1.",
         "2026-01-15 14:03", "low", [5, 6], 34)
O3 = obs("User decided to switch the public API from REST to GraphQL because mobile clients over-fetch.",
         "2026-01-15 14:05", "high", [7], 33)
O4 = obs("User chose Apollo Server 4 over GraphQL Yoga for the GraphQL endpoint.",
         "2026-01-15 14:08", "high", [10, 11], 28)
O5 = obs("Rate limiting added in middleware.ts: 100 requests per minute per API key, 429 with Retry-After when "
         "exceeded.", "2026-01-15 14:11", "medium", [12, 13], 38)
O6 = obs("Rate limiter tests added in middleware.test.ts; all 12 pass.", "2026-01-15 14:17", "medium", [18, 19], 26)
O7 = obs("CI set up on GitHub Actions in .github/workflows/ci.yml.", "2026-01-15 14:19", "medium", [20, 21], 25)
O8 = obs("Deployed to staging at staging.acme.dev; smoke tests pass.", "2026-01-15 14:25", "high", [26, 27], 25)
R1 = refl("Acme Dashboard's public API is GraphQL served by Apollo Server 4.", [O3, O4], 17)
R2 = refl("User wants small, reviewable PRs.", [O1], 9)
R3 = refl("Every change ships with tests and runs in GitHub Actions CI.", [O6, O7], 15)

C1 = {"type": "om.folded", "version": 1, "fullFold": False, "observations": [O1, O2, O3], "reflections": []}
C2 = {"type": "om.folded", "version": 1, "fullFold": True, "observations": [O1, O3, O5], "reflections": [R1, R2]}
C3 = {"type": "om.folded", "version": 1, "fullFold": False, "observations": [O1, O3, O5, O6, O7],
      "reflections": [R1, R2]}


def extension_summary(details: dict) -> str:
    """Roughly what the extension's hook renders (its own preamble; not compared with ours)."""
    parts = ["The conversation history before this point was compacted into observational memory."]
    if details["reflections"]:
        parts.append("## Reflections\n" + "\n".join(f"[{r['id']}] {r['content']}" for r in details["reflections"]))
    if details["observations"]:
        parts.append("## Observations\n" + "\n".join(
            f"[{o['id']}] {o['timestamp']} [{o['relevance']}] {o['content']}" for o in details["observations"]))
    return "\n\n".join(parts)


def extension_session() -> SessionBuilder:
    sb = SessionBuilder(SID, start="2026-01-15T14:00:00", cwd="/home/dev/acme-dashboard")

    def record(kind: str, data: dict) -> str:
        return sb.custom(kind, data)

    def compaction(first_kept: int, details: dict, tokens_before: int) -> str:
        return sb.compaction(extension_summary(details), E[first_kept], tokens_before=tokens_before,
                             details=details, from_hook=True)

    sb.model_change("anthropic", "claude-sonnet-4-5")  # E1
    sb.thinking_level("medium")  # E2
    sb.user("We're building Acme Dashboard (Next.js 15, Supabase auth). Keep PRs small and reviewable, please.")  # E3
    sb.assistant("Let me look at the project first.", tool_calls=[("toolu_01", "read", {"path": "package.json"})])  # E4
    sb.tool_result("toolu_01", "read", '{\n  "name": "acme-dashboard",\n  "dependencies": {\n    "next": "15.0.3",\n'
                   '    "react": "19.0.0",\n    "@supabase/ssr": "0.5.1",\n    "@supabase/supabase-js": "2.46.1"\n  }\n}')  # E5
    sb.assistant("The project is on Next.js 15.0.3 with @supabase/ssr 0.5.1.")  # E6
    sb.user("Switch the public API from REST to GraphQL; the mobile clients over-fetch.")  # E7
    sb.assistant("I'll add a GraphQL endpoint. Apollo Server or GraphQL Yoga?")  # E8
    record("om.observations.recorded", {"observations": [O1, O2, O3], "coversUpToId": E[8]})  # E9
    sb.user("Apollo Server 4, not Yoga.")  # E10
    sb.assistant("Going with Apollo Server 4.")  # E11
    sb.user("Now add rate limiting: 100 requests per minute per API key.")  # E12
    sb.assistant("Added rate limiting in middleware.ts; over the limit it answers 429 with Retry-After.")  # E13
    compaction(12, C1, 41_200)  # E14
    record("om.observations.recorded", {"observations": [O4, O5], "coversUpToId": E[13]})  # E15
    record("om.reflections.recorded", {"reflections": [R1, R2], "coversUpToId": E[13]})  # E16
    record("om.observations.dropped", {"observationIds": [O2["id"], O4["id"]], "coversUpToId": E[13]})  # E17
    sb.user("Write tests for the rate limiter.")  # E18
    sb.assistant("Added middleware.test.ts; all 12 tests pass.")  # E19
    sb.user("Great. Next, set up CI on GitHub Actions.")  # E20
    sb.assistant("Added .github/workflows/ci.yml running lint, typecheck and tests.")  # E21
    compaction(20, C2, 45_800)  # E22
    record("om.observations.recorded", {"observations": [O6, O7], "coversUpToId": E[21]})  # E23
    record("om.reflections.recorded", {"reflections": [R3], "coversUpToId": E[21]})  # E24
    record("om.observations.dropped", {"observationIds": [O5["id"]], "coversUpToId": E[21]})  # E25
    sb.user("Deploy to staging.")  # E26: 5 tokens
    sb.assistant("Deployed to staging.acme.dev; smoke tests pass.")  # E27: 12
    sb.user("Thanks. What's next on the list?")  # E28: 8
    sb.assistant("Next up: the GraphQL schema for invoices.")  # E29: 11
    compaction(28, C3, 47_300)  # E30
    record("om.observations.recorded", {"observations": [O8], "coversUpToId": E[29]})  # E31
    sb.user("Start on the invoices schema.")  # E32: 8 (the current leaf)
    return sb


@pytest.fixture(scope="module")
def om(tmp_path_factory):
    """Run `om --db DB ...` in process; the session is ingested once through the CLI."""
    tmp = tmp_path_factory.mktemp("interop")
    db = tmp / "om.duckdb"
    path = extension_session().write(tmp / "2026-01-15T14-00-00-000Z_8f3a2c1e.jsonl")
    runner = CliRunner()

    def run(*args: str, code: int = 0):
        result = runner.invoke(app, ["--db", str(db), *args], env={"COLUMNS": "200"})
        assert result.exit_code == code, (args, result.output, result.exception)
        return result

    def run_json(*args: str):
        return json.loads(run(*args, "--json").stdout)

    report = run_json("ingest", str(path))
    assert report["ledger"] == {"records": 8, "folded_compactions": 3, "invalid": 0, "ignored_types": 0}
    run.json = run_json  # type: ignore[attr-defined]
    return run


def lists(details: dict) -> dict:
    return {"observations": details["observations"], "reflections": details["reflections"]}


# ---------------------------------------------------------------- import


def test_the_compactions_import_as_the_extension_wrote_them(om):
    rows = om.json("sql", "SELECT compaction_id, origin, first_kept_entry_id, full_fold FROM compactions "
                          "ORDER BY compaction_id")
    assert rows == [
        {"compaction_id": E[14], "origin": "imported", "first_kept_entry_id": E[12], "full_fold": False},
        {"compaction_id": E[22], "origin": "imported", "first_kept_entry_id": E[20], "full_fold": True},
        {"compaction_id": E[30], "origin": "imported", "first_kept_entry_id": E[28], "full_fold": False},
    ]
    rows = om.json("sql", "SELECT ledger_id, kind, covers_up_to_id, anchor_entry_id, origin FROM ledger "
                          "ORDER BY ledger_id")
    assert [(r["ledger_id"], r["covers_up_to_id"], r["anchor_entry_id"], r["origin"]) for r in rows] == [
        (E[9], E[8], E[9], "imported"), (E[15], E[13], E[15], "imported"), (E[16], E[13], E[16], "imported"),
        (E[17], E[13], E[17], "imported"), (E[23], E[21], E[23], "imported"), (E[24], E[21], E[24], "imported"),
        (E[25], E[21], E[25], "imported"), (E[31], E[29], E[31], "imported")]


# ---------------------------------------------------------------- om view


def test_view_shows_exactly_the_latest_folded_lists(om):
    assert om.json("view", SID) == lists(C3)


@pytest.mark.parametrize("leaf,expected", [
    (E[13], {"observations": [], "reflections": []}),  # before any compaction
    (E[14], lists(C1)),
    (E[21], lists(C1)),  # an interior entry: memory as of that point
    (E[22], lists(C2)),
    (E[29], lists(C2)),
    (E[30], lists(C3)),
])
def test_view_at_an_interior_leaf(om, leaf, expected):
    assert om.json("view", SID, "--leaf", leaf) == expected


def test_view_text_is_the_rendered_summary(om):
    text = om("view", SID).stdout
    assert text == om.json("compact", SID, "--first-kept", E[28], "--pool-max", POOL_MAX)["summary"] + "\n"
    assert text.endswith(
        "## Reflections\n"
        f"[{R1['id']}] Acme Dashboard's public API is GraphQL served by Apollo Server 4.\n"
        f"[{R2['id']}] User wants small, reviewable PRs.\n"
        "\n"
        "## Observations\n"
        f"[{O1['id']}] 2026-01-15 14:01 [critical] User is building Acme Dashboard on Next.js 15 with Supabase auth "
        "and wants small, reviewable PRs.\n"
        f"[{O3['id']}] 2026-01-15 14:05 [high] User decided to switch the public API from REST to GraphQL because "
        "mobile clients over-fetch.\n"
        f"[{O5['id']}] 2026-01-15 14:11 [medium] Rate limiting added in middleware.ts: 100 requests per minute per "
        "API key, 429 with Retry-After when exceeded.\n"
        f"[{O6['id']}] 2026-01-15 14:17 [medium] Rate limiter tests added in middleware.test.ts; all 12 pass.\n"
        f"[{O7['id']}] 2026-01-15 14:19 [medium] CI set up on GitHub Actions in .github/workflows/ci.yml.\n")
    assert O1["id"] == "695f1216a077" and R1["id"] == "db5f3b2f5d4d"
    # nothing visible yet: the text form shows full memory instead, labelled (--json keeps to visible)
    assert om.json("view", SID, "--leaf", E[13]) == {"observations": [], "reflections": []}
    shown = om("view", SID, "--leaf", E[13])
    assert shown.stdout == om("view", SID, "--leaf", E[13], "--full").stdout != ""
    assert "showing full memory" in shown.stderr


def test_view_full_is_the_ledger_folded_at_the_tip(om):
    assert om.json("view", SID, "--full") == {"observations": [O1, O3, O6, O7, O8], "reflections": [R1, R2, R3]}
    text = om("view", SID, "--full").stdout
    _, _, sections = text.partition("\n\n## ")
    assert "## " + sections == (
        "## Reflections\n"
        "[db5f3b2f5d4d] Acme Dashboard's public API is GraphQL served by Apollo Server 4.\n"
        "[d7b243fb87fb] User wants small, reviewable PRs.\n"
        "[1aeced2c17e6] Every change ships with tests and runs in GitHub Actions CI.\n"
        "\n"
        "## Observations\n"
        "[695f1216a077] 2026-01-15 14:01 [critical] User is building Acme Dashboard on Next.js 15 with Supabase auth "
        "and wants small, reviewable PRs.\n"
        "[421d4b9c193b] 2026-01-15 14:05 [high] User decided to switch the public API from REST to GraphQL because "
        "mobile clients over-fetch.\n"
        "[b4293530c958] 2026-01-15 14:17 [medium] Rate limiter tests added in middleware.test.ts; all 12 pass.\n"
        "[852672de39c2] 2026-01-15 14:19 [medium] CI set up on GitHub Actions in .github/workflows/ci.yml.\n"
        "[c7e8902b78ef] 2026-01-15 14:25 [high] Deployed to staging at staging.acme.dev; smoke tests pass.\n")
    # full memory as of an interior entry: only what was on the branch (and covered) by then
    assert om.json("view", SID, "--full", "--leaf", E[21]) == {"observations": [O1, O3, O5], "reflections": [R1, R2]}


# ---------------------------------------------------------------- om compact


@pytest.mark.parametrize("first_kept,leaf,details", [
    (E[12], E[13], C1),
    (E[20], E[21], C2),
    (E[28], E[29], C3),
    (E[28], None, C3),  # at the current leaf: later records do not reach F, and M is still C2's E20
])
def test_compact_at_first_kept_reproduces_the_extensions_compaction(om, first_kept, leaf, details):
    args = ["compact", SID, "--first-kept", first_kept, "--pool-max", POOL_MAX]
    if leaf is not None:
        args += ["--leaf", leaf]
    got = om.json(*args)
    assert got["full_fold"] is details["fullFold"]
    assert got["observations"] == [x["id"] for x in details["observations"]]
    assert got["reflections"] == [x["id"] for x in details["reflections"]]
    assert got["details"] == details
    assert got["summary"].endswith(
        f"[{details['observations'][-1]['id']}] {details['observations'][-1]['timestamp']} "
        f"[{details['observations'][-1]['relevance']}] {details['observations'][-1]['content']}")
    assert set(got) == {"world", "full_fold", "observations", "reflections", "summary", "details",
                        # the summary budget's decision (SPEC §13)
                        "declined", "summary_tokens", "summary_max_tokens", "left_out"}
    assert got["world"] == "file"


def test_compact_with_the_default_pool_does_not_fold_at_c2(om):
    got = om.json("compact", SID, "--first-kept", E[20], "--leaf", E[21])  # pool 20000: 168 is far below
    assert got["full_fold"] is False
    assert got["observations"] == [O1["id"], O2["id"], O3["id"], O4["id"], O5["id"]]
    assert got["reflections"] == []


def test_compact_rejects_a_first_kept_entry_off_the_branch(om):
    result = om("compact", SID, "--first-kept", E[30], "--leaf", E[29], code=1)
    assert "not on the branch" in str(result.exception) + result.output


# ---------------------------------------------------------------- om status


def test_status_json(om):
    s = om.json("status", SID)
    assert set(s) >= {"session_id", "tip", "observations", "reflections", "drift", "clocks", "pools", "last_errors"}
    assert (s["session_id"], s["tip"]) == (SID, E[32])
    assert s["observations"] == {"recorded": 8, "active": 5, "dropped": 3, "visible": 5}
    assert s["reflections"] == {"recorded": 3, "active": 3, "dropped": 0, "visible": 2}
    assert s["drift"] == {"observations_only_in_full": [O8["id"]], "reflections_only_in_full": [R3["id"]],
                          "visible_no_longer_active": [O5["id"]]}
    clocks = {name: (c["tokens_pi"], c["threshold"], c["due"], c["watermark_entry_id"]) for name, c in s["clocks"].items()}
    assert clocks == {
        "observer": (8, 10_000, False, E[29]),  # E32
        "reflector": (44, 20_000, False, E[21]),  # E26 E27 E28 E29 E32
        "dropper": (44, None, None, E[21]),
        "compaction": (27, 81_000, False, E[30]),  # from C3's first kept entry E28: E28 E29 E32
    }
    p = s["pools"]
    assert (p["active_tokens"], p["visible_tokens"]) == (35 + 33 + 26 + 25 + 25, 157)
    assert (p["max_tokens"], p["target_tokens"], p["active_over_target"]) == (20_000, 10_000, False)
    assert (p["active_pressure"], p["visible_pressure"]) == pytest.approx((144 / 20_000, 157 / 20_000), abs=1e-4)
    assert s["last_errors"] == []


def test_status_at_an_interior_leaf(om):
    s = om.json("status", SID, "--leaf", E[21])
    assert s["tip"] == E[21]
    assert s["observations"] == {"recorded": 5, "active": 3, "dropped": 2, "visible": 3}
    assert s["reflections"] == {"recorded": 2, "active": 2, "dropped": 0, "visible": 0}
    assert s["drift"] == {"observations_only_in_full": [O5["id"]], "reflections_only_in_full": [R1["id"], R2["id"]],
                          "visible_no_longer_active": [O2["id"]]}


# ---------------------------------------------------------------- om recall


def test_recall_json_of_a_dropped_observation(om):
    got = om.json("recall", O5["id"])  # no --session: every session is searched
    assert {"status", "kind", "collision", "partial", "observations", "reflections",
            "missing_supporting_observation_ids"} <= set(got)
    assert (got["status"], got["kind"], got["collision"], got["partial"]) == ("found", "observation", False, False)
    assert got["session_ids"] == [SID]
    [o] = got["observations"]
    assert {k: o[k] for k in ("id", "status", "source_entry_ids", "missing_source_entry_ids", "non_source_entry_ids")} == {
        "id": O5["id"], "status": "dropped", "source_entry_ids": [E[12], E[13]], "missing_source_entry_ids": [],
        "non_source_entry_ids": []}
    assert [(x["entry_id"], x["text"]) for x in o["sources"]] == [
        (E[12], "Now add rate limiting: 100 requests per minute per API key."),
        (E[13], "Added rate limiting in middleware.ts; over the limit it answers 429 with Retry-After.")]
    assert got["reflections"] == [] and got["missing_supporting_observation_ids"] == []


def test_recall_json_of_a_reflection(om):
    got = om.json("recall", R1["id"], "--session", SID)
    assert (got["status"], got["kind"], got["collision"], got["partial"]) == ("found", "reflection", False, False)
    assert [{k: r[k] for k in ("id", "content", "supporting_observation_ids")} for r in got["reflections"]] == [
        {"id": R1["id"], "content": R1["content"], "supporting_observation_ids": [O3["id"], O4["id"]]}]
    assert [(o["id"], o["status"], [s["entry_id"] for s in o["sources"]]) for o in got["observations"]] == [
        (O3["id"], "active", [E[7]]), (O4["id"], "dropped", [E[10], E[11]])]
    # before the reflection was recorded
    before = om("recall", R1["id"], "--session", SID, "--leaf", E[15], "--json", code=1)  # an unknown id: exit 1
    assert json.loads(before.stdout)["status"] == "not_found"
