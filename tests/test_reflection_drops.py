"""Reflection drops (SPEC §13): the wire record om.reflections.dropped, folded like observation drops
(SPEC §3): a tombstoned reflection id leaves the active reflections, every projection and the workers'
memory, stays recallable (status dropped), is a duplicate for the reflector, round-trips through
om export and ingest, and is what om forget writes for a reflection."""

from __future__ import annotations

import json

import pytest

from conftest import workspace
from om_core.ingest import ingest
from om_core.usecases.forget import forget
from om_core.ledger.records import REFLECTIONS_DROPPED, ReflectionsDropped, append_record, parse_record
from om_core.memory import views as memory
from om_core.usecases.export import export_session
from om_core.recall.evidence import recall
from om_core.settings import Settings
from om_core.store import db as dbmod
from om_core.workers.stage_kinds import STAGES
from om_core.workers.inputs import reflector_input
from test_memory import E, mid, new_session, o, observed, r, reflected

RDROP = "om.reflections.dropped"


def session_with_reflection_drops(extra: dict | None = None):
    """Two reflections; the extension dropped the first (with the optional fields some versions add)."""
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"), o("beta"))  # E3
    reflected(sb, E[3], r("rule A", ["alpha"]), r("rule B", ["beta"]))  # E4
    sb.custom(RDROP, {"reflectionIds": [mid("rule A")], "coversUpToId": E[4], **(extra or {})})  # E5
    sb.user("three")  # E6
    sb.assistant("four")  # E7
    return sb


@pytest.mark.parametrize("extra", [{}, {"replacedBy": mid("rule B"), "kind": "superseded"},
                                   {"replacedBy": [mid("rule B")], "kind": {"why": "merged"}}])
def test_a_file_the_extension_wrote_folds_as_spec_3_says(tmp_path, extra):
    sb = session_with_reflection_drops(extra)
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [sb.write(tmp_path / "s.jsonl")])
    with dbmod.reading(db) as con:
        sid = sb.session_id
        assert [x.content for x in memory.full_memory(con, sid, E[7]).reflections] == ["rule B"]
        assert [x.content for x in memory.full_memory(con, sid, E[7], E[3]).reflections] == ["rule A", "rule B"]
        rows = {x["id"]: x["dropped"] for x in memory.ledger_rows(con, sid, E[7]) if x["item_kind"] == "reflection"}
        assert rows == {mid("rule A"): True, mid("rule B"): False}
        assert [x.content for x in memory.active_memory(memory.ledger_rows(con, sid, E[7])).reflections] == ["rule B"]
        # a full fold applies reflection drops like observation drops
        full = memory.compaction_projection(con, sid, E[7], E[6], 1)
        assert full.fullFold and full.reflectionIds == [mid("rule B")]
        view = con.execute("SELECT refl_id, replaced_by, kind, origin FROM reflection_drops").fetchall()
        assert view == [(mid("rule A"), None if "replacedBy" not in extra else json.dumps(extra["replacedBy"]),
                         None if "kind" not in extra else json.dumps(extra["kind"]), "imported")]
        status = memory.memory_status(con, sid, E[7], Settings())
        assert status.reflections["dropped"] == 1 and status.reflections["active"] == 1
        assert con.execute("SELECT count(*) FROM ledger_rejects").fetchone()[0] == 0
    result = recall(workspace(db), mid("rule A"), sid, E[7])
    assert result.status == "found" and [x.status for x in result.reflections] == ["dropped"]
    assert [x.status for x in recall(workspace(db), mid("rule B"), sid, E[7]).reflections] == ["active"]


def test_a_drop_record_names_ids_or_is_ignored():
    assert parse_record(RDROP, {"reflectionIds": ["0123456789ab"], "coversUpToId": "x"}) is not None
    assert parse_record(RDROP, {"reflectionIds": [], "coversUpToId": "x"}) is None
    assert parse_record(RDROP, {"reflectionIds": ["a"]}) is None


def test_a_tombstoned_reflection_is_a_duplicate_for_the_reflector(tmp_path):
    sb = session_with_reflection_drops()
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [sb.write(tmp_path / "s.jsonl")])
    with dbmod.reading(db) as con:
        inp = reflector_input(con, sb.session_id, E[7], Settings())
    assert [x.content for x in inp.reflections] == ["rule B"] and inp.dropped_reflection_ids == {mid("rule A")}
    check = STAGES["reflector"].check(inp, Settings())  # the reflector stage's own check
    item = {"content": "rule A", "supportingObservationIds": [mid("alpha")]}
    assert check._one(item) == f"duplicate [{mid('rule A')}]: this reflection already exists, skipped"
    assert check.accepted == [] and check.duplicates == 1
    assert check._one({"content": "rule C", "supportingObservationIds": [mid("alpha")]}).startswith("recorded")


def test_a_pipeline_reflection_drop_round_trips_through_export_and_import(tmp_path):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"), o("beta"))  # E3
    reflected(sb, E[3], r("rule A", ["alpha"]), r("rule B", ["beta"]))  # E4
    sb.user("three")  # E5
    sb.assistant("four")  # E6
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [sb.write(tmp_path / "s.jsonl")])
    sid = sb.session_id
    with dbmod.writing(db) as con, dbmod.transaction(con):
        append_record(con, sid, REFLECTIONS_DROPPED, ReflectionsDropped(
            reflectionIds=[mid("rule A")], coversUpToId=E[5], replacedBy=mid("rule B"), kind="superseded"),
            anchor_entry_id=E[5])
    export_session(workspace(db), sid, tmp_path / "out.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()[1:]]
    written = [x for x in lines if x.get("customType") == RDROP]
    assert [x["data"] for x in written] == [{"reflectionIds": [mid("rule A")], "replacedBy": mid("rule B"),
                                             "kind": "superseded", "coversUpToId": E[5]}]
    assert written[0]["parentId"] == E[5]
    again = tmp_path / "again.duckdb"
    ingest(workspace(again), [tmp_path / "out.jsonl"])
    with dbmod.reading(again) as con, dbmod.reading(db) as before:
        for c in (con, before):
            assert [x.content for x in memory.full_memory(c, sid, E[6]).reflections] == ["rule B"]
        assert con.execute("SELECT refl_id, replaced_by, kind, origin FROM reflection_drops").fetchall() == [
            (mid("rule A"), json.dumps(mid("rule B")), json.dumps("superseded"), "imported")]


def test_forgetting_a_reflection_writes_a_reflection_drop_of_origin_user(tmp_path):
    sb = new_session()
    sb.user("one")  # E1
    sb.assistant("two")  # E2
    observed(sb, E[2], o("alpha"))  # E3
    reflected(sb, E[3], r("rule A", ["alpha"]))  # E4
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [sb.write(tmp_path / "s.jsonl")])
    result = forget(workspace(db), mid("rule A"), "it was wrong")
    assert [f.kind for f in result.recorded] == ["reflection"]
    assert forget(workspace(db), mid("rule A"), "again").already
    with dbmod.reading(db) as con:
        assert con.execute("SELECT refl_id, origin, reason FROM reflection_drops").fetchall() == [
            (mid("rule A"), "user", "it was wrong")]
        assert memory.full_memory(con, sb.session_id, E[4]).reflections == []
        assert con.execute("SELECT count(*) FROM drops").fetchone()[0] == 0
    assert [x.status for x in recall(workspace(db), mid("rule A"), sb.session_id, E[4]).reflections] == ["forgotten"]
