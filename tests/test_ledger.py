"""The ledger's records (SPEC §2), one rule per test: validation, ignored types, ids, branch-locality.

Every invalid shape is written the way it would sit in a session file (a `custom` entry, or the
details of a compaction), ingested on its own, and must be ignored (no record, nothing in memory)
and counted: `invalid` or `ignored_types` in the file's ingest report, one row in `ledger_rejects`.
"""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest

from builders import SessionBuilder
from conftest import workspace
from om_core.store import db as dbmod
from om_core.memory import views as memory
from om_core.settings import Settings
from om_core.ingest import ingest
from om_core.ledger.records import ObservationsRecorded, append_record, memory_id

OBS = "om.observations.recorded"
REFL = "om.reflections.recorded"
DROP = "om.observations.dropped"

# A valid observation and reflection (ids are the first 12 hex of SHA-256 of the content).
TABS = "User prefers tabs over spaces."
TABS_ID = "098e1f1f2928"
GOOD_OBS = {"id": TABS_ID, "content": TABS, "timestamp": "2026-01-15 14:01", "relevance": "high",
            "sourceEntryIds": ["00000001"], "tokenCount": 12}
GQL = "User decided to switch from REST to GraphQL for the public API; motivation was reducing over-fetching on mobile clients."
GQL_ID = "2ce2fee9bc8d"
GOOD_REFL = {"id": GQL_ID, "content": GQL, "supportingObservationIds": [TABS_ID], "tokenCount": 25}
INFINITY = "__INFINITY__"  # replaced by 1e999 in the file text: JSON.parse reads it as Infinity
HUGE = "__HUGE__"  # replaced by a 401-digit integer: finite text, but Infinity as a JS number

_sessions = itertools.count(1)


def new_session() -> SessionBuilder:
    return SessionBuilder(f"{next(_sessions):08x}-1ed9-4000-8000-00000000000a")


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    """One database for the module; every test ingests its own session (own session id)."""
    global _TMP
    path = tmp_path_factory.mktemp("ledger") / "om.duckdb"
    _TMP = path.parent
    c = dbmod.connect(path)
    yield c
    c.close()


_TMP: Path | None = None


def load(con, sb: SessionBuilder):
    assert _TMP is not None
    path: Path = _TMP / f"{sb.session_id}.jsonl"
    text = sb.text().replace(f'"{INFINITY}"', "1e999").replace(f'"{HUGE}"', "1" + "0" * 400)
    path.write_text(text, encoding="utf-8")
    report = ingest(workspace(con), [path])
    assert report.files[0].status == "new", report.files[0]
    return report.files[0]


def rejects(con, sid: str) -> list[tuple]:
    return con.execute("SELECT entry_id, kind FROM ledger_rejects WHERE session_id = ? ORDER BY entry_id",
                       [sid]).fetchall()


def ledger_rows(con, sid: str) -> list[tuple]:
    return con.execute("SELECT ledger_id, kind, covers_up_to_id, anchor_entry_id, origin FROM ledger "
                       "WHERE session_id = ? ORDER BY append_seq", [sid]).fetchall()


def with_obs(**changes) -> dict:
    item = {**GOOD_OBS, **changes}
    return {"observations": [{k: v for k, v in item.items() if v is not MISSING}], "coversUpToId": "00000001"}


def with_refl(**changes) -> dict:
    item = {**GOOD_REFL, **changes}
    return {"reflections": [{k: v for k, v in item.items() if v is not MISSING}], "coversUpToId": "00000001"}


def without(data: dict, key: str) -> dict:
    data = copy.deepcopy(data)
    del data[key]
    return data


MISSING = object()
OK_OBS_RECORD = with_obs()
OK_REFL_RECORD = with_refl()
OK_DROP_RECORD = {"observationIds": [TABS_ID], "coversUpToId": "00000001"}

INVALID = [
    # om.observations.recorded: the list
    ("obs: empty observations list", OBS, {"observations": [], "coversUpToId": "00000001"}),
    ("obs: observations missing", OBS, {"coversUpToId": "00000001"}),
    ("obs: observations not a list", OBS, {"observations": GOOD_OBS, "coversUpToId": "00000001"}),
    # ids
    ("obs: id uppercase hex", OBS, with_obs(id="098E1F1F2928")),
    ("obs: id of 11 hex", OBS, with_obs(id="098e1f1f292")),
    ("obs: id of 13 hex", OBS, with_obs(id="098e1f1f2928c")),
    ("obs: id not hex", OBS, with_obs(id="098e1f1f292g")),
    ("obs: id with a trailing newline", OBS, with_obs(id=TABS_ID + "\n")),
    ("obs: id missing", OBS, with_obs(id=MISSING)),
    ("obs: id not a string", OBS, with_obs(id=98112)),
    # content, timestamp, relevance
    ("obs: content empty", OBS, with_obs(content="")),
    ("obs: content not a string", OBS, with_obs(content=42)),
    ("obs: content missing", OBS, with_obs(content=MISSING)),
    ("obs: timestamp empty", OBS, with_obs(timestamp="")),
    ("obs: timestamp missing", OBS, with_obs(timestamp=MISSING)),
    ("obs: relevance unknown", OBS, with_obs(relevance="urgent")),
    ("obs: relevance capitalised", OBS, with_obs(relevance="High")),
    ("obs: relevance missing", OBS, with_obs(relevance=MISSING)),
    # source ids
    ("obs: sourceEntryIds empty", OBS, with_obs(sourceEntryIds=[])),
    ("obs: sourceEntryIds holds an empty id", OBS, with_obs(sourceEntryIds=["00000001", ""])),
    ("obs: sourceEntryIds not a list", OBS, with_obs(sourceEntryIds="00000001")),
    ("obs: sourceEntryIds missing", OBS, with_obs(sourceEntryIds=MISSING)),
    # token counts
    ("obs: tokenCount negative", OBS, with_obs(tokenCount=-1)),
    ("obs: tokenCount negative fraction", OBS, with_obs(tokenCount=-0.5)),
    ("obs: tokenCount a string", OBS, with_obs(tokenCount="12")),
    ("obs: tokenCount null (NaN through JSON)", OBS, with_obs(tokenCount=None)),
    ("obs: tokenCount boolean", OBS, with_obs(tokenCount=True)),
    ("obs: tokenCount infinite", OBS, with_obs(tokenCount=INFINITY)),
    ("obs: tokenCount beyond a double", OBS, with_obs(tokenCount=HUGE)),
    ("obs: tokenCount missing", OBS, with_obs(tokenCount=MISSING)),
    # watermark
    ("obs: coversUpToId empty", OBS, {**OK_OBS_RECORD, "coversUpToId": ""}),
    ("obs: coversUpToId missing", OBS, without(OK_OBS_RECORD, "coversUpToId")),
    ("obs: coversUpToId not a string", OBS, {**OK_OBS_RECORD, "coversUpToId": 1}),
    # one bad item invalidates the whole record
    ("obs: one bad item after a good one", OBS,
     {"observations": [GOOD_OBS, {**GOOD_OBS, "id": "aaaaaaaaaaaa", "relevance": "urgent"}], "coversUpToId": "00000001"}),
    ("obs: data not an object", OBS, [GOOD_OBS]),
    ("obs: data null", OBS, None),
    # om.reflections.recorded
    ("refl: empty reflections list", REFL, {"reflections": [], "coversUpToId": "00000001"}),
    ("refl: reflections missing", REFL, {"coversUpToId": "00000001"}),
    ("refl: content on two lines", REFL, with_refl(content="Prefers tabs.\nAlso spaces in YAML.")),
    ("refl: content with a carriage return", REFL, with_refl(content="Prefers tabs.\rAlso spaces.")),
    ("refl: content empty", REFL, with_refl(content="")),
    ("refl: supportingObservationIds empty", REFL, with_refl(supportingObservationIds=[])),
    ("refl: supportingObservationIds missing", REFL, with_refl(supportingObservationIds=MISSING)),
    ("refl: id not 12 hex", REFL, with_refl(id="2ce2fee9bc8")),
    ("refl: id with a trailing newline", REFL, with_refl(id=GQL_ID + "\n")),
    ("refl: tokenCount negative", REFL, with_refl(tokenCount=-3)),
    ("refl: tokenCount missing", REFL, with_refl(tokenCount=MISSING)),
    ("refl: coversUpToId empty", REFL, {**OK_REFL_RECORD, "coversUpToId": ""}),
    ("refl: one bad item after a good one", REFL,
     {"reflections": [GOOD_REFL, {**GOOD_REFL, "id": "bbbbbbbbbbbb", "content": "two\nlines"}],
      "coversUpToId": "00000001"}),
    # om.observations.dropped
    ("drop: empty observationIds", DROP, {"observationIds": [], "coversUpToId": "00000001"}),
    ("drop: observationIds missing", DROP, {"coversUpToId": "00000001"}),
    ("drop: an empty id", DROP, {"observationIds": [TABS_ID, ""], "coversUpToId": "00000001"}),
    ("drop: a number as id", DROP, {"observationIds": [12], "coversUpToId": "00000001"}),
    ("drop: coversUpToId missing", DROP, without(OK_DROP_RECORD, "coversUpToId")),
    ("drop: coversUpToId empty", DROP, {**OK_DROP_RECORD, "coversUpToId": ""}),
]


@pytest.mark.parametrize("kind,data", [pytest.param(k, d, id=name) for name, k, d in INVALID])
def test_invalid_record_is_ignored_and_counted(con, kind, data):
    sb = new_session()
    sb.user("I prefer tabs over spaces.")  # 00000001
    bad = sb.custom(kind, data)  # 00000002
    sb.assistant("Noted.")  # 00000003
    report = load(con, sb)
    assert report.ledger == {"records": 0, "folded_compactions": 0, "invalid": 1, "ignored_types": 0}
    assert report.entries_added == 3  # never fatal: the entry itself is still ingested
    assert rejects(con, sb.session_id) == [(bad, kind)]
    assert ledger_rows(con, sb.session_id) == []
    full = memory.full_memory(con, sb.session_id, "00000003")
    assert (full.observations, full.reflections) == ([], [])
    assert memory.active_memory(memory.ledger_rows(con, sb.session_id, "00000003")).empty


def test_the_same_record_when_valid_is_imported(con):
    """Control for the cases above: the unmodified records are valid and imported."""
    sb = new_session()
    sb.user("I prefer tabs over spaces.")  # 00000001
    sb.custom(OBS, OK_OBS_RECORD)  # 00000002
    sb.custom(REFL, OK_REFL_RECORD)  # 00000003
    sb.custom(DROP, OK_DROP_RECORD)  # 00000004
    report = load(con, sb)
    assert report.ledger == {"records": 3, "folded_compactions": 0, "invalid": 0, "ignored_types": 0}
    assert rejects(con, sb.session_id) == []
    assert ledger_rows(con, sb.session_id) == [
        ("00000002", OBS, "00000001", "00000002", "imported"),
        ("00000003", REFL, "00000001", "00000003", "imported"),
        ("00000004", DROP, "00000001", "00000004", "imported"),
    ]


def test_an_invalid_watermark_does_not_move_a_clock(con):
    sb = new_session()
    sb.user("x" * 40)  # 10 tokens
    sb.assistant("y" * 80)  # 20 tokens
    sb.custom(OBS, {**OK_OBS_RECORD, "observations": [{**GOOD_OBS, "relevance": "urgent"}],
                    "coversUpToId": "00000002"})
    sb.user("z" * 12)  # 3 tokens
    load(con, sb)
    clocks = memory.clocks(con, sb.session_id, "00000004", Settings())
    assert clocks["observer"].tokens_pi == 33
    assert clocks["observer"].watermark_entry_id is None


# ---------------------------------------------------------------- valid edge cases


def _observations(con, sid: str, tip: str) -> list[dict]:
    return memory.active_memory(memory.ledger_rows(con, sid, tip)).wire()["observations"]


@pytest.mark.parametrize("tokens", [0, 2.5, 0.001, 123456789])
def test_zero_and_fractional_token_counts_are_valid(con, tokens):
    sb = new_session()
    sb.user("I prefer tabs over spaces.")
    sb.custom(OBS, with_obs(tokenCount=tokens))
    report = load(con, sb)
    assert report.ledger == {"records": 1, "folded_compactions": 0, "invalid": 0, "ignored_types": 0}
    [o] = _observations(con, sb.session_id, "00000002")
    assert o["tokenCount"] == tokens
    assert type(o["tokenCount"]) is type(tokens)  # 0 stays 0, not 0.0; 2.5 stays 2.5


def test_observation_content_may_span_lines_and_drop_ids_need_only_be_strings(con):
    sb = new_session()
    sb.user("Remember both.")
    sb.custom(OBS, with_obs(id="0123456789ab", content="Line one\nline two"))
    sb.custom(DROP, {"observationIds": ["not-a-memory-id", "x"], "coversUpToId": "00000001"})
    report = load(con, sb)
    assert report.ledger == {"records": 2, "folded_compactions": 0, "invalid": 0, "ignored_types": 0}
    assert [o["content"] for o in _observations(con, sb.session_id, "00000003")] == ["Line one\nline two"]
    assert con.execute("SELECT obs_id FROM drops WHERE session_id = ? ORDER BY item_index",
                       [sb.session_id]).fetchall() == [("not-a-memory-id",), ("x",)]


def test_valid_record_keeps_every_field_as_written(con):
    sb = new_session()
    sb.user("I prefer tabs over spaces.")
    sb.custom(OBS, OK_OBS_RECORD)
    load(con, sb)
    assert _observations(con, sb.session_id, "00000002") == [GOOD_OBS]
    row = con.execute("SELECT ledger_id, obs_id, content, ts, relevance, source_entry_ids, token_count "
                      "FROM observations WHERE session_id = ?", [sb.session_id]).fetchall()
    assert row == [("00000002", TABS_ID, TABS, "2026-01-15 14:01", "high", ["00000001"], 12.0)]


# ---------------------------------------------------------------- V2 and unknown om.* types


def test_v2_and_unknown_om_types_are_ignored_and_counted(con):
    sb = new_session()
    sb.user("hello")  # 00000001
    sb.custom("om.observations", {"observations": [GOOD_OBS], "coversUpToId": "00000001"})  # 00000002 (V2-like)
    sb.custom("om.memory", {"version": 2, "observations": "2026-01-15 [high] tabs"})  # 00000003
    sb.custom("om.observation.recorded", OK_OBS_RECORD)  # 00000004 (not a V3 name)
    sb.custom("acme.todo", {"items": ["write tests"]})  # 00000005: not ours, not counted
    sb.assistant("hi")  # 00000006
    report = load(con, sb)
    assert report.ledger == {"records": 0, "folded_compactions": 0, "invalid": 0, "ignored_types": 3}
    assert rejects(con, sb.session_id) == [("00000002", "om.observations"), ("00000003", "om.memory"),
                                           ("00000004", "om.observation.recorded")]
    assert ledger_rows(con, sb.session_id) == []
    assert memory.active_memory(memory.ledger_rows(con, sb.session_id, "00000006")).empty


FOLDED_OK = {"type": "om.folded", "version": 1, "fullFold": False, "observations": [GOOD_OBS],
             "reflections": [GOOD_REFL]}


@pytest.mark.parametrize("details,counted", [
    pytest.param({"type": "om.memory", "version": 2, "observations": "- tabs"}, "ignored_types", id="V2 details"),
    pytest.param({**FOLDED_OK, "version": 2}, "invalid", id="om.folded version 2"),
    pytest.param({**FOLDED_OK, "version": True}, "invalid", id="om.folded version true (not === 1)"),
    pytest.param({**FOLDED_OK, "version": "1"}, "invalid", id="om.folded version the string 1"),
    pytest.param({**FOLDED_OK, "fullFold": "false"}, "invalid", id="fullFold a string"),
    pytest.param(without(FOLDED_OK, "reflections"), "invalid", id="reflections missing"),
    pytest.param({**FOLDED_OK, "observations": [GOOD_OBS, {**GOOD_OBS, "relevance": "urgent"}]}, "invalid",
                 id="one bad observation"),
    pytest.param({**FOLDED_OK, "reflections": [{**GOOD_REFL, "content": "a\nb"}]}, "invalid",
                 id="one two-line reflection"),
    pytest.param({**FOLDED_OK, "observations": [{**GOOD_OBS, "id": TABS_ID + "\n"}]}, "invalid",
                 id="an observation id with a trailing newline"),
])
def test_invalid_folded_details_are_ignored_and_counted(con, details, counted):
    sb = new_session()
    sb.user("I prefer tabs over spaces.")  # 00000001
    sb.assistant("Noted.")  # 00000002
    c = sb.compaction("memory", "00000002", details=details, from_hook=True)  # 00000003
    sb.user("next")  # 00000004
    report = load(con, sb)
    expected = {"records": 0, "folded_compactions": 0, "invalid": 0, "ignored_types": 0}
    expected[counted] = 1
    assert report.ledger == expected
    assert rejects(con, sb.session_id) == [(c, details["type"])]
    assert memory.visible_memory(con, sb.session_id, "00000004").empty
    assert con.execute("SELECT compaction_id, folded, full_fold FROM compactions WHERE session_id = ?",
                       [sb.session_id]).fetchall() == [(c, False, None)]


def test_pi_native_compactions_are_not_ledger_material(con):
    sb = new_session()
    sb.user("hello")
    sb.assistant("hi")
    sb.compaction("Pi's own summary", "00000002")  # no details
    sb.compaction("Another extension's summary", "00000002", details={"type": "acme.summary"})
    sb.compaction("folded", "00000002", details=FOLDED_OK, from_hook=True)  # 00000005
    report = load(con, sb)
    assert report.ledger == {"records": 0, "folded_compactions": 1, "invalid": 0, "ignored_types": 0}
    assert rejects(con, sb.session_id) == []
    assert con.execute("SELECT compaction_id, origin, full_fold FROM compactions WHERE session_id = ? "
                       "ORDER BY compaction_id", [sb.session_id]).fetchall() == [
        ("00000003", "pi", None), ("00000004", "pi", None), ("00000005", "imported", False)]


# ---------------------------------------------------------------- ids


def test_memory_id_is_the_first_12_hex_of_sha256_of_the_utf8_content():
    assert memory_id(TABS) == "098e1f1f2928"
    assert memory_id(GQL) == "2ce2fee9bc8d"
    assert memory_id("café ☕ naïve") == "839e751a1b72"  # UTF-8, not Latin-1 or UTF-16
    assert memory_id(TABS) == memory_id("User prefers tabs over spaces.")  # same text, same id
    assert memory_id(TABS + " ") != memory_id(TABS)


# ---------------------------------------------------------------- branch-local records


def test_records_are_branch_local(con):
    sb = new_session()
    root = sb.user("Which branch?")  # 00000001
    sb.assistant("Left.")  # 00000002
    left_rec = sb.custom(OBS, with_obs())  # 00000003: only on the left branch
    left_tip = sb.assistant("Still left.")  # 00000004
    sb.go(root)
    sb.assistant("Right.")  # 00000005
    right_rec = sb.custom(OBS, {"observations": [{**GOOD_OBS, "id": GQL_ID, "content": GQL}],
                                "coversUpToId": "00000005"})  # 00000006
    right_tip = sb.user("And now?")  # 00000007
    load(con, sb)
    sid = sb.session_id
    assert [o.id for o in memory.active_memory(memory.ledger_rows(con, sid, left_tip)).observations] == [TABS_ID]
    assert [o.id for o in memory.active_memory(memory.ledger_rows(con, sid, right_tip)).observations] == [GQL_ID]
    assert memory.active_memory(memory.ledger_rows(con, sid, root)).empty
    assert [o.id for o in memory.full_memory(con, sid, right_tip).observations] == [GQL_ID]
    # an imported record is itself an entry: its anchor and ledger id are its own entry id
    assert [(r[0], r[3]) for r in ledger_rows(con, sid)] == [(left_rec, left_rec), (right_rec, right_rec)]

    # a pipeline record is anchored to the entry after which it was appended
    with dbmod.transaction(con):
        pid = append_record(con, sid, OBS, ObservationsRecorded.model_validate(
            {"observations": [{**GOOD_OBS, "id": "0123456789ab", "content": "pipeline note"}],
             "coversUpToId": "00000002"}), anchor_entry_id="00000002", stage_key="branch-local-test")
    assert len(pid) == 8 and pid not in {f"{i:08x}" for i in range(1, 8)}
    assert ledger_rows(con, sid)[-1] == (pid, OBS, "00000002", "00000002", "pipeline")
    assert [o.id for o in memory.active_memory(memory.ledger_rows(con, sid, left_tip)).observations] == ["0123456789ab", TABS_ID]
    assert [o.id for o in memory.active_memory(memory.ledger_rows(con, sid, right_tip)).observations] == [GQL_ID]


# ---------------------------------------------------------------- incremental import


def test_records_appended_to_a_file_later_are_imported_once(con):
    sb = new_session()
    sb.user("I prefer tabs over spaces.")  # 00000001
    sb.custom(OBS, OK_OBS_RECORD)  # 00000002
    first = load(con, sb)
    assert first.ledger["records"] == 1
    sb.custom(REFL, OK_REFL_RECORD)  # 00000003
    sb.custom(DROP, {**OK_DROP_RECORD, "coversUpToId": ""})  # 00000004: invalid
    sb.assistant("Noted.")  # 00000005
    path = _TMP / f"{sb.session_id}.jsonl"
    with path.open("a", encoding="utf-8") as f:
        f.write("\n".join(sb.lines()[-3:]) + "\n")
    report = ingest(workspace(con), [path]).files[0]
    assert report.status == "appended"
    assert report.ledger == {"records": 1, "folded_compactions": 0, "invalid": 1, "ignored_types": 0}
    assert [row[0] for row in ledger_rows(con, sb.session_id)] == ["00000002", "00000003"]
    assert rejects(con, sb.session_id) == [("00000004", DROP)]
    assert ingest(workspace(con), [path]).files[0].status == "unchanged"
    assert [row[0] for row in ledger_rows(con, sb.session_id)] == ["00000002", "00000003"]
    assert rejects(con, sb.session_id) == [("00000004", DROP)]
