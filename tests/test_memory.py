"""Fold, projections, compaction, drift, clocks, coverage and rendering (SPEC §3-§5, §7, §8):
one small readable session per rule, with the expected values written out.

Entry ids come from the builder in order: the n-th entry of a session is ``f"{n:08x}"``, written
``E[n]`` below. Observation and reflection ids are the SHA-256 rule applied to the content, so a
list of contents is the readable form of a list of ids.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
from conftest import workspace
from om_core.store import db as dbmod
from om_core.memory import views as memory
from om_core.settings import Settings
from flows.cli.main import app
from om_core.ingest import ingest
from om_core.ledger.records import (
    ObservationsDropped,
    ObservationsRecorded,
    ReflectionsRecorded,
    append_record,
    parse_folded,
    store_simulated_compaction,
)

OBS = "om.observations.recorded"
REFL = "om.reflections.recorded"
DROP = "om.observations.dropped"
E = {n: f"{n:08x}" for n in range(1, 40)}
_sessions = itertools.count(1)


def mid(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def o(content: str, ts: str = "2026-01-15 14:30", rel: str = "medium", src: tuple = ("00000001",), tok=10) -> dict:
    return {"id": mid(content), "content": content, "timestamp": ts, "relevance": rel, "sourceEntryIds": list(src),
            "tokenCount": tok}


def r(content: str, supports: list[str], tok=5) -> dict:
    return {"id": mid(content), "content": content, "supportingObservationIds": [mid(s) for s in supports],
            "tokenCount": tok}


def observed(sb: SessionBuilder, covers: str, *items: dict) -> str:
    return sb.custom(OBS, {"observations": list(items), "coversUpToId": covers})


def reflected(sb: SessionBuilder, covers: str, *items: dict) -> str:
    return sb.custom(REFL, {"reflections": list(items), "coversUpToId": covers})


def dropped(sb: SessionBuilder, covers: str, *contents: str) -> str:
    return sb.custom(DROP, {"observationIds": [mid(c) for c in contents], "coversUpToId": covers})


def folded(sb: SessionBuilder, first_kept: str | None, full_fold: bool, observations: list[dict],
           reflections: list[dict]) -> str:
    details = {"type": "om.folded", "version": 1, "fullFold": full_fold, "observations": observations,
               "reflections": reflections}
    return sb.compaction("rendered by the extension", first_kept, details=details, from_hook=True)


def new_session() -> SessionBuilder:
    return SessionBuilder(f"{next(_sessions):08x}-3e30-4000-8000-00000000000b")


def contents(items) -> list[str]:
    return [i.content for i in items]


_TMP: Path | None = None


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    """One database for the module; every test ingests its own session (own session id)."""
    global _TMP
    path = tmp_path_factory.mktemp("memory") / "om.duckdb"
    _TMP = path.parent
    c = dbmod.connect(path)
    yield c
    c.close()


def load(con, sb: SessionBuilder) -> str:
    assert _TMP is not None
    report = ingest(workspace(con), [sb.write(_TMP / f"{sb.session_id}.jsonl")])
    assert report.files[0].status == "new", report.files[0]
    return sb.session_id


# ---------------------------------------------------------------- fold (SPEC §3)


def test_first_valid_record_of_an_id_wins(con):
    sb = new_session()
    sb.user("I like tabs.")  # E1
    sb.assistant("Noted.")  # E2
    observed(sb, E[2], o("tabs", "2026-01-15 13:59", "low", tok=1),  # E3: invalid record (bad second item)
             o("bad", rel="urgent"))
    observed(sb, E[2], o("tabs", "2026-01-15 14:05", "high", tok=7))  # E4: first valid version
    observed(sb, E[2], o("tabs", "2026-01-15 14:09", "low", tok=3), o("spaces"))  # E5
    reflected(sb, E[5], r("prefers tabs", ["tabs"], tok=4))  # E6
    reflected(sb, E[5], r("prefers tabs", ["spaces"], tok=9))  # E7: same id, ignored
    sid = load(con, sb)
    m = memory.active_memory(memory.ledger_rows(con, sid, E[7]))
    assert [(x.content, x.timestamp, x.relevance, x.tokenCount) for x in m.observations] == [
        ("tabs", "2026-01-15 14:05", "high", 7), ("spaces", "2026-01-15 14:30", "medium", 10)]
    assert [(x.content, x.supportingObservationIds, x.tokenCount) for x in m.reflections] == [
        ("prefers tabs", [mid("tabs")], 4)]


def test_later_duplicates_are_ignored_and_order_is_first_seen(con):
    sb = new_session()
    sb.user("go")  # E1
    observed(sb, E[1], o("a"), o("b"))  # E2
    observed(sb, E[1], o("c"), o("b", rel="critical"), o("a", rel="low"))  # E3
    observed(sb, E[1], o("d"), o("c", rel="high"))  # E4
    sid = load(con, sb)
    m = memory.active_memory(memory.ledger_rows(con, sid, E[4]))
    assert [(x.content, x.relevance) for x in m.observations] == [
        ("a", "medium"), ("b", "medium"), ("c", "medium"), ("d", "medium")]


def test_a_drop_of_an_id_not_yet_seen_tombstones_a_later_observation(con):
    sb = new_session()
    sb.user("go")  # E1
    dropped(sb, E[1], "alpha")  # E2: alpha not recorded yet
    observed(sb, E[1], o("alpha"), o("beta"))  # E3
    sb.assistant("ok")  # E4
    sid = load(con, sb)
    assert contents(memory.active_memory(memory.ledger_rows(con, sid, E[4])).observations) == ["beta"]
    assert contents(memory.full_memory(con, sid, E[4]).observations) == ["beta"]
    assert [(c.observation.content, c.coverage) for c in memory.coverage(con, sid, E[4])] == [("beta", "none")]


# ---------------------------------------------------------------- projections (SPEC §4)


def test_plain_fold_by_position_and_projection_by_watermark_differ(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    sb.user("three")  # E3
    observed(sb, E[3], o("alpha"))  # E4: covers E3
    sb.assistant("four")  # E5
    sid = load(con, sb)
    # through E3: the record sits after E3 (plain fold: nothing) but covers E3 (projection: alpha)
    assert memory.active_memory(memory.ledger_rows(con, sid, E[3])).empty
    assert contents(memory.full_memory(con, sid, E[5], E[3]).observations) == ["alpha"]
    # through E2: neither
    assert memory.full_memory(con, sid, E[5], E[2]).empty
    assert memory.active_memory(memory.ledger_rows(con, sid, E[2])).empty


def test_positions_not_id_strings_decide_coverage(con):
    """Ids that sort backwards: comparisons must use branch positions (SPEC §1)."""
    sb = new_session()
    sb.append({"type": "message", "message": {"role": "user", "content": "first"}}, "ffff0001")
    sb.append({"type": "message", "message": {"role": "user", "content": "second"}}, "aaaa0002")
    sb.append({"type": "custom", "customType": OBS,
               "data": {"observations": [o("alpha")], "coversUpToId": "ffff0001"}}, "cccc0003")
    sb.append({"type": "message", "message": {"role": "user", "content": "third"}}, "0000ff04")
    sid = load(con, sb)
    assert contents(memory.full_memory(con, sid, "0000ff04", "aaaa0002").observations) == ["alpha"]
    assert contents(memory.full_memory(con, sid, "0000ff04", "ffff0001").observations) == ["alpha"]
    assert memory.clocks(con, sid, "0000ff04", Settings())["observer"].watermark_entry_id == "ffff0001"


def test_dangling_watermark_never_enters_a_projection(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, "ghost123", o("alpha"))  # E3: watermark not in the session at all
    observed(sb, E[2], o("beta"))  # E4
    reflected(sb, "ghost456", r("rule", ["beta"]))  # E5
    dropped(sb, "ghost789", "beta")  # E6
    sb.user("three")  # E7
    sid = load(con, sb)
    plain = memory.active_memory(memory.ledger_rows(con, sid, E[7]))  # the plain fold sees every record on the branch
    assert (contents(plain.observations), contents(plain.reflections)) == (["alpha"], ["rule"])
    full = memory.full_memory(con, sid, E[7])
    assert (contents(full.observations), contents(full.reflections)) == (["beta"], [])
    for pool in (1, 20_000):  # full fold and normal: neither lets a dangling record in
        c = memory.compaction_projection(con, sid, E[7], E[7], pool)
        assert (c.fullFold, c.observationIds, c.reflectionIds) == (pool == 1, [mid("beta")], [])
    assert memory.clocks(con, sid, E[7], Settings())["observer"].watermark_entry_id == E[2]
    assert memory.clocks(con, sid, E[7], Settings())["reflector"].watermark_entry_id is None


def test_watermark_on_another_branch_is_dangling(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    sb.user("left")  # E3 (left branch)
    sb.go(E[2])
    sb.user("right")  # E4
    observed(sb, E[3], o("alpha"))  # E5: covers the left branch's E3
    observed(sb, E[4], o("beta"))  # E6
    sb.assistant("ok")  # E7
    sid = load(con, sb)
    assert contents(memory.active_memory(memory.ledger_rows(con, sid, E[7])).observations) == ["alpha", "beta"]
    assert contents(memory.full_memory(con, sid, E[7]).observations) == ["beta"]
    assert memory.compaction_projection(con, sid, E[7], E[7], 20_000).observationIds == [mid("beta")]
    assert memory.active_memory(memory.ledger_rows(con, sid, E[3])).empty  # the records are not on the left branch
    assert memory.full_memory(con, sid, E[3]).empty


def test_full_projection_at_an_early_boundary_takes_a_later_record_that_covers_it(con):
    """SPEC §4: first-valid-wins applies among the covered records only."""
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    sb.user("three")  # E3
    sb.assistant("four")  # E4
    observed(sb, E[4], o("alpha", "2026-01-15 14:03", "low"))  # E5: covers E4
    sb.user("five")  # E6
    observed(sb, E[2], o("alpha", "2026-01-15 14:01", "high"), o("beta"))  # E7: later, covers E2
    sb.assistant("six")  # E8
    sid = load(con, sb)

    def versions(boundary):
        return [(x.content, x.timestamp, x.relevance)
                for x in memory.full_memory(con, sid, E[8], boundary).observations]

    assert versions(E[1]) == []
    assert versions(E[2]) == [("alpha", "2026-01-15 14:01", "high"), ("beta", "2026-01-15 14:30", "medium")]
    assert versions(E[3]) == [("alpha", "2026-01-15 14:01", "high"), ("beta", "2026-01-15 14:30", "medium")]
    assert versions(E[4]) == [("alpha", "2026-01-15 14:03", "low"), ("beta", "2026-01-15 14:30", "medium")]
    assert versions(E[8]) == [("alpha", "2026-01-15 14:03", "low"), ("beta", "2026-01-15 14:30", "medium")]


def test_visible_memory_is_the_latest_folded_compactions_lists(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"), o("beta"))  # E3
    c1_obs = [o("alpha")]
    folded(sb, E[2], False, c1_obs, [])  # E4
    sb.user("three")  # E5
    observed(sb, E[5], o("gamma"))  # E6
    # stored lists are shown as they are, even an item the ledger never recorded, in their order
    c2_obs, c2_refl = [o("gamma"), o("delta", rel="critical"), o("beta")], [r("rule", ["gamma"])]
    folded(sb, E[5], True, c2_obs, c2_refl)  # E7
    sb.compaction("Pi's own summary", E[5])  # E8: not folded
    sb.compaction("broken", E[5], details={"type": "om.folded", "version": 1, "fullFold": True,
                                           "observations": [o("x", rel="urgent")], "reflections": []},
                  from_hook=True)  # E9: invalid details
    sb.user("four")  # E10
    sb.go(E[5])
    sb.user("side")  # E11: a branch that never saw E7
    sid = load(con, sb)
    assert memory.visible_memory(con, sid, E[10]).wire() == {"observations": c2_obs, "reflections": c2_refl}
    assert memory.visible_memory(con, sid, E[6]).wire() == {"observations": c1_obs, "reflections": []}
    assert memory.visible_memory(con, sid, E[11]).wire() == {"observations": c1_obs, "reflections": []}
    assert memory.visible_memory(con, sid, E[3]).empty


# ---------------------------------------------------------------- compaction projection (SPEC §4)


def _pool_session(con) -> str:
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha", tok=12), o("beta", tok=8))  # E3
    reflected(sb, E[2], r("rule", ["alpha"]))  # E4
    dropped(sb, E[2], "alpha")  # E5
    sb.user("three")  # E6 = F
    sb.assistant("four")  # E7
    return load(con, sb)


def test_compaction_below_the_pool_limit_is_normal(con):
    sid = _pool_session(con)
    c = memory.compaction_projection(con, sid, E[7], E[6], 21)
    # no full-fold compaction yet (no M): observations covered through F, no reflections, no drops
    assert (c.fullFold, c.observationIds, c.reflectionIds) == (False, [mid("alpha"), mid("beta")], [])
    assert c.normalObservationTokens == 20
    assert c.details() == {"type": "om.folded", "version": 1, "fullFold": False,
                           "observations": [o("alpha", tok=12), o("beta", tok=8)], "reflections": []}


@pytest.mark.parametrize("pool", [20, 19, 1])
def test_compaction_at_or_over_the_pool_limit_is_a_full_fold(con, pool):
    sid = _pool_session(con)
    c = memory.compaction_projection(con, sid, E[7], E[6], pool)  # 20 >= 20: exactly at P is a full fold
    assert (c.fullFold, c.observationIds, c.reflectionIds) == (True, [mid("beta")], [mid("rule")])
    assert c.details() == {"type": "om.folded", "version": 1, "fullFold": True,
                           "observations": [o("beta", tok=8)], "reflections": [r("rule", ["alpha"])]}


def test_compaction_uses_the_last_full_fold_boundary_for_reflections_and_drops(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"), o("beta"))  # E3
    reflected(sb, E[2], r("rule one", ["alpha"]))  # E4
    dropped(sb, E[2], "alpha")  # E5
    sb.user("three")  # E6
    sb.assistant("four")  # E7
    folded(sb, E[6], True, [o("beta")], [r("rule one", ["alpha"])])  # E8: full fold, M = E6
    observed(sb, E[7], o("gamma"))  # E9
    reflected(sb, E[7], r("rule two", ["gamma"]))  # E10: covers E7, after M
    dropped(sb, E[7], "beta")  # E11: covers E7, after M
    sb.user("five")  # E12
    sb.assistant("six")  # E13
    folded(sb, E[12], False, [o("beta"), o("gamma")], [r("rule one", ["alpha"])])  # E14: not a full fold
    folded(sb, "ghost999", True, [o("gamma")], [])  # E15: full fold, but its F is not on the branch
    sb.user("seven")  # E16 = F
    sb.assistant("eight")  # E17
    sid = load(con, sb)

    normal = memory.compaction_projection(con, sid, E[17], E[16], 21)
    assert normal.fullFold is False
    assert normal.observationIds == [mid("beta"), mid("gamma")]  # alpha's drop covers E2 <= M; beta's does not
    assert normal.reflectionIds == [mid("rule one")]  # covers E2 <= M; "rule two" covers E7 > M

    full = memory.compaction_projection(con, sid, E[17], E[16], 20)  # beta + gamma = 20 >= 20
    assert full.fullFold is True
    assert full.observationIds == [mid("gamma")]
    assert full.reflectionIds == [mid("rule one"), mid("rule two")]

    # before E8 there is no M: no reflections and no drops in a normal projection
    early = memory.compaction_projection(con, sid, E[7], E[6], 1000)
    assert (early.fullFold, early.observationIds, early.reflectionIds) == (False, [mid("alpha"), mid("beta")], [])


def test_empty_projection_renders_nothing(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[4], o("alpha"))  # E3: covers E4, after F = E2
    sb.user("three")  # E4
    sid = load(con, sb)
    c = memory.compaction_projection(con, sid, E[4], E[2], 20_000)
    assert (c.fullFold, c.observationIds, c.reflectionIds, c.summary) == (False, [], [], None)
    assert memory.full_memory(con, sid, E[4], E[2]).summary() is None


def test_om_compact_json_gives_null_summary_for_an_empty_projection(db_path, tmp_path):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    ingest(workspace(db_path), [sb.write(tmp_path / "s.jsonl")])
    runner = CliRunner()
    result = runner.invoke(app, ["--db", str(db_path), "compact", sb.session_id, "--first-kept", E[2], "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["summary"] is None
    assert (data["full_fold"], data["observations"], data["reflections"]) == (False, [], [])
    result = runner.invoke(app, ["--db", str(db_path), "compact", sb.session_id, "--first-kept", E[2]])
    assert result.exit_code == 0 and result.stdout == ""  # nothing rendered; the note goes to stderr
    result = runner.invoke(app, ["--db", str(db_path), "view", sb.session_id])
    assert result.exit_code == 0 and result.stdout == ""


def test_simulated_compactions_count_like_the_extensions(con):
    """Compactions this project stores (anchored like pipeline records) are the replayed view, set M
    in the replayed world only, and move the compaction clock, but are never visible (the file does not hold them); a native
    fallback (nothing rendered) moves the clock only."""
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"), o("beta"))  # E3
    reflected(sb, E[2], r("rule", ["alpha"]))  # E4
    dropped(sb, E[2], "alpha")  # E5
    sb.user("three")  # E6
    sb.assistant("four")  # E7
    sb.user("x" * 40)  # E8: 10 tokens
    sb.assistant("y" * 40)  # E9: 10 tokens
    sid = load(con, sb)
    details = {"type": "om.folded", "version": 1, "fullFold": True, "observations": [o("beta")],
               "reflections": [r("rule", ["alpha"])]}
    with dbmod.transaction(con):
        store_simulated_compaction(con, sid, anchor_entry_id=E[7], first_kept_entry_id=E[6],
                                   details=parse_folded(details), summary="memory", seed="sim-1")
    assert memory.replayed_memory(con, sid, E[9]).wire() == lists(details)
    assert memory.visible_memory(con, sid, E[9]).empty  # the agent never saw a simulated compaction
    assert memory.replayed_memory(con, sid, E[6]).empty  # anchored after E7: not there yet
    c = memory.compaction_projection(con, sid, E[9], E[8], 20_000, replayed=True)  # M = E6
    assert (c.fullFold, c.observationIds, c.reflectionIds, c.world) == (False, [mid("beta")], [mid("rule")], "replayed")
    # the file's world has no full fold (the file does not hold the simulated one): no M, so the
    # reflection and the drop stay out, as the extension folding this file would leave them
    c = memory.compaction_projection(con, sid, E[9], E[8], 20_000)
    assert (c.fullFold, c.observationIds, c.reflectionIds, c.world) == (False, [mid("alpha"), mid("beta")], [], "file")
    assert memory.clocks(con, sid, E[9], Settings())["compaction"].tokens_pi == 2 + 1 + 10 + 10  # from E6: "three" 2, "four" 1

    with dbmod.transaction(con):
        store_simulated_compaction(con, sid, anchor_entry_id=E[9], first_kept_entry_id=E[8], details=None,
                                   summary=None, note="native fallback", seed="sim-2")
    assert memory.replayed_memory(con, sid, E[9]).wire() == lists(details)  # a fallback folds nothing
    assert memory.clocks(con, sid, E[9], Settings())["compaction"].tokens_pi == 20  # from E8
    assert con.execute("SELECT origin, first_kept_entry_id, folded, full_fold FROM compactions "
                       "WHERE session_id = ? ORDER BY first_kept_entry_id", [sid]).fetchall() == [
        ("simulated", E[6], True, True), ("simulated", E[8], False, None)]


def lists(details: dict) -> dict:
    return {"observations": details["observations"], "reflections": details["reflections"]}


def test_visible_counts_only_the_files_compactions_and_replayed_adds_simulated_ones(con):
    """SPEC §4: visible memory is the latest om.folded compaction the session file holds; the replay's
    simulated compactions are the replayed view, newest first (a simulated one after an entry counts
    as newer than a compaction entry at the same place), with its own drift."""
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"), o("beta"))  # E3
    file_lists = {"observations": [o("alpha")], "reflections": []}
    folded(sb, E[2], False, file_lists["observations"], [])  # E4: the extension's fold, in the file
    sb.user("three")  # E5
    sb.assistant("four")  # E6
    sid = load(con, sb)
    early = {"type": "om.folded", "version": 1, "fullFold": False, "observations": [o("beta")], "reflections": []}
    late = {"type": "om.folded", "version": 1, "fullFold": False, "observations": [o("alpha"), o("beta")],
            "reflections": []}
    with dbmod.transaction(con):
        store_simulated_compaction(con, sid, anchor_entry_id=E[2], first_kept_entry_id=E[1],
                                   details=parse_folded(early), summary="memory", seed="early")
        late_id = store_simulated_compaction(con, sid, anchor_entry_id=E[6], first_kept_entry_id=E[5],
                                             details=parse_folded(late), summary="memory", seed="late")
    # before the file's fold only a simulated one exists: nothing visible, the replayed view has it
    assert memory.visible_memory(con, sid, E[3]).empty
    assert memory.replayed_memory(con, sid, E[3]).wire() == lists(early)
    # at E5 the file's fold is the newest of both
    assert memory.visible_memory(con, sid, E[5]).wire() == file_lists
    assert memory.replayed_memory(con, sid, E[5]).wire() == file_lists
    # at the tip a simulated fold is newer: visible stays the file's, replayed is the simulated one
    assert memory.visible_memory(con, sid, E[6]).wire() == file_lists
    assert memory.replayed_memory(con, sid, E[6]).wire() == lists(late)
    d, dr = memory.drift(con, sid, E[6]), memory.drift(con, sid, E[6], replayed=True)
    assert (d.observations_only_in_full, d.total) == ([mid("beta")], 1)
    assert dr.total == 0
    visible_ref, replayed_ref, simulated = memory.latest_folds(con, sid, E[6])
    assert (visible_ref.compaction_id, visible_ref.origin, visible_ref.first_kept_entry_id) == (E[4], "imported", E[2])
    assert (replayed_ref.compaction_id, replayed_ref.origin, simulated) == (late_id, "simulated", 2)
    s = memory.memory_status(con, sid, E[6], Settings())
    assert (s.observations["visible"], s.visible_compaction.compaction_id) == (1, E[4])
    assert (s.replayed.observations, s.replayed.compaction.compaction_id, s.replayed.simulated_compactions) == (
        2, late_id, 2)
    assert s.drift == d and s.replayed.drift == dr
    assert memory.latest_folds(con, sid, E[1]) == (None, None, 0)


# ---------------------------------------------------------------- drift (SPEC §4)


def test_drift_lists_the_three_differences(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"), o("beta"))  # E3
    reflected(sb, E[2], r("rule one", ["alpha"]))  # E4
    folded(sb, E[2], True, [o("alpha"), o("epsilon"), o("beta")], [r("rule one", ["alpha"])])  # E5
    sb.user("three")  # E6
    observed(sb, E[6], o("gamma"))  # E7
    reflected(sb, E[6], r("rule two", ["gamma"]))  # E8
    dropped(sb, E[6], "alpha")  # E9
    observed(sb, "ghost123", o("delta"))  # E10: dangling, so not in full memory either
    sb.assistant("four")  # E11
    sid = load(con, sb)
    d = memory.drift(con, sid, E[11])
    assert d.observations_only_in_full == [mid("gamma")]
    assert d.reflections_only_in_full == [mid("rule two")]
    assert d.visible_no_longer_active == [mid("alpha"), mid("epsilon")]
    # before the compaction nothing is visible: all of full memory is drift
    d = memory.drift(con, sid, E[4])
    assert (d.observations_only_in_full, d.reflections_only_in_full, d.visible_no_longer_active) == (
        [mid("alpha"), mid("beta")], [mid("rule one")], [])


# ---------------------------------------------------------------- clocks (SPEC §7)


def test_the_four_clocks(con):
    sb = new_session()
    sb.user("x" * 40)  # E1: 10 tokens (Pi's estimate: ceil(chars / 4))
    sb.assistant("y" * 80)  # E2: 20
    observed(sb, E[2], o("alpha"))  # E3
    sb.user("z" * 120)  # E4: 30
    reflected(sb, E[1], r("rule", ["alpha"]))  # E5
    sb.assistant("w" * 160)  # E6: 40
    dropped(sb, "ghost123", "alpha")  # E7: dangling, so the dropper counts from the start
    observed(sb, E[1], o("beta"))  # E8: a later record with an earlier watermark
    folded(sb, E[6], False, [o("alpha")], [])  # E9: first kept E6
    sb.user("v" * 200)  # E10: 50
    sb.custom_message("note", "n" * 16)  # E11: 4 (a source entry)
    sb.system("s" * 400)  # E12: the system prompt is not a source entry
    sb.compaction("Pi's own", "ghost999")  # E13: first kept entry unknown
    sb.user("u" * 8)  # E14: 2
    sid = load(con, sb)

    def clocks(tip):
        return {name: (c.tokens_pi, c.watermark_entry_id) for name, c in memory.clocks(con, sid, tip, Settings()).items()}

    assert clocks(E[8]) == {"observer": (70, E[2]), "reflector": (90, E[1]), "dropper": (100, None),
                            "compaction": (100, None)}  # no compaction yet: from the start
    assert clocks(E[12]) == {"observer": (124, E[2]), "reflector": (144, E[1]), "dropper": (154, None),
                             "compaction": (94, E[9])}  # from E9's first kept entry E6, inclusive
    assert clocks(E[14])["compaction"] == (2, E[13])  # after the compaction entry itself
    c = memory.clocks(con, sid, E[14], Settings())["observer"]
    assert (c.tokens_pi, c.threshold, c.reached) == (126, 10_000, False)


# ---------------------------------------------------------------- coverage tiers (SPEC §8)


def test_coverage_tiers(con):
    sb = new_session()
    sb.user("one")  # E1
    observed(sb, E[1], o("alpha"), o("beta"), o("gamma"), o("delta"))  # E2
    reflected(sb, E[1], r("rule one", ["alpha", "beta"]), r("rule two", ["alpha", "delta", "alpha"]))  # E3
    reflected(sb, E[1], r("rule one", ["gamma"]))  # E4: duplicate id, ignored
    dropped(sb, E[1], "delta")  # E5
    sid = load(con, sb)
    assert [(c.observation.content, c.citingReflections, c.coverage) for c in memory.coverage(con, sid, E[5])] == [
        ("alpha", 2, "strong"), ("beta", 1, "partial"), ("gamma", 0, "none")]


# ---------------------------------------------------------------- branch order of pipeline records (SPEC §2)


def test_pipeline_records_sort_after_the_imported_record_at_their_anchor_in_append_order(con):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha", "2026-01-15 14:01"))  # E3 (imported)
    sb.user("three")  # E4
    sid = load(con, sb)
    with dbmod.transaction(con):
        for anchor, items in ((E[3], [o("alpha", "2026-01-15 14:09"), o("beta", "2026-01-15 14:20")]),
                              (E[3], [o("beta", "2026-01-15 14:30"), o("gamma")]),
                              (E[1], [o("delta")])):
            append_record(con, sid, OBS, ObservationsRecorded.model_validate(
                {"observations": items, "coversUpToId": E[1]}), anchor_entry_id=anchor)
        append_record(con, sid, REFL, ReflectionsRecorded.model_validate(
            {"reflections": [r("rule", ["beta"])], "coversUpToId": E[1]}), anchor_entry_id=E[4])
        append_record(con, sid, DROP, ObservationsDropped.model_validate(
            {"observationIds": [mid("gamma")], "coversUpToId": E[1]}), anchor_entry_id=E[4])
    m = memory.active_memory(memory.ledger_rows(con, sid, E[4]))
    assert [(x.content, x.timestamp) for x in m.observations] == [
        ("delta", "2026-01-15 14:30"), ("alpha", "2026-01-15 14:01"), ("beta", "2026-01-15 14:20")]
    assert contents(m.reflections) == ["rule"]
    assert [(x.content, x.timestamp) for x in memory.full_memory(con, sid, E[4]).observations] == [
        ("delta", "2026-01-15 14:30"), ("alpha", "2026-01-15 14:01"), ("beta", "2026-01-15 14:20")]
    # as of E3 the records anchored at E4 are not there yet: gamma is still active
    assert contents(memory.active_memory(memory.ledger_rows(con, sid, E[3])).observations) == ["delta", "alpha", "beta", "gamma"]


# ---------------------------------------------------------------- rendering (SPEC §5)


def _preamble_and_sections(summary: str) -> tuple[str, str]:
    head, sep, tail = summary.partition("\n\n## ")
    assert sep, summary
    return head, "## " + tail


def test_summary_lines_sections_and_preamble(con):
    sb = new_session()
    sb.user("one")  # E1
    observed(sb, E[1], o("User chose DuckDB.", "2026-01-15 14:30", "high"),
             o("CI is green.", "2026-01-16 09:05", "critical"))  # E2
    reflected(sb, E[1], r("Project stores memory in DuckDB.", ["User chose DuckDB."]))  # E3
    sb.assistant("two")  # E4
    sid = load(con, sb)
    c = memory.compaction_projection(con, sid, E[4], E[4], 1)  # full fold: both kinds
    preamble, sections = _preamble_and_sections(c.summary)
    assert sections == (
        "## Reflections\n"
        "[bd60b17a24f0] Project stores memory in DuckDB.\n"
        "\n"
        "## Observations\n"
        "[1a0f456b8572] 2026-01-15 14:30 [high] User chose DuckDB.\n"
        "[33a964240978] 2026-01-16 09:05 [critical] CI is green.")
    text = preamble.lower()
    for phrase in ("reflection", "observation", "recall", "newer", "not redo"):
        assert phrase in text, phrase
    assert "##" not in preamble and len(preamble) > 200
    # the same memory seen as full memory renders the same text
    assert memory.full_memory(con, sid, E[4]).summary() == c.summary


def test_an_empty_section_is_left_out(con):
    sb = new_session()
    sb.user("one")  # E1
    folded(sb, E[1], False, [], [r("Only a reflection.", ["gone"])])  # E2
    sb.assistant("two")  # E3
    folded(sb, E[3], False, [o("Only an observation.", "2026-01-15 14:30", "low")], [])  # E4
    sid = load(con, sb)
    only_reflections = memory.visible_memory(con, sid, E[3]).summary()
    assert _preamble_and_sections(only_reflections)[1] == "## Reflections\n[5a1ea1b0cec1] Only a reflection."
    only_observations = memory.visible_memory(con, sid, E[4]).summary()
    assert _preamble_and_sections(only_observations)[1] == (
        "## Observations\n[1209a8571865] 2026-01-15 14:30 [low] Only an observation.")
    assert memory.visible_memory(con, sid, E[1]).summary() is None
