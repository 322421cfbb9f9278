"""The session reader: header validation, v1/v2 migration in memory, source entries (pi-sessions.md §1,
SPEC §1), and the two real sample sessions (pi-sessions.md §3)."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

from builders import SessionBuilder
from om_core.pi.session import (
    ParsedEntry,
    SessionHeader,
    SessionParser,
    is_source_entry,
    mint_v1_id,
    parse_lines,
)
from om_core.pi.tree import build_forest
from om_core.pi.branch_entry import branch_entry
from om_core.pi.cutpoint import compaction_cut_point

SID = "d703a1a9-1b7b-4fb1-b512-c9738b1fe617"
HEX8 = re.compile(r"^[0-9a-f]{8}$")


def jl(*objs) -> list[bytes]:
    """JSON lines as Pi writes them (compact, raw Unicode)."""
    return [json.dumps(o, ensure_ascii=False, separators=(",", ":")).encode() for o in objs]


def header(session_id: str = SID, **extra) -> dict:
    return {"type": "session", "id": session_id, "timestamp": "2025-11-20T23:33:50.805Z", "cwd": "/w", **extra}


def user(text: str = "hi", ts: str = "2025-11-20T23:33:01.550Z") -> dict:
    """A v1 user message entry (no id, no parentId)."""
    return {"type": "message", "timestamp": ts, "message": {"role": "user", "content": [{"type": "text", "text": text}]}}


def reply(text: str = "ok") -> dict:
    return {"type": "message", "timestamp": "2025-11-20T23:33:02.000Z",
            "message": {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop"}}


def v1_compaction(first_kept_index) -> dict:
    return {"type": "compaction", "timestamp": "2025-11-20T23:40:00.000Z", "summary": "sum",
            "firstKeptEntryIndex": first_kept_index, "tokensBefore": 1000}


def reasons(rejected) -> list[tuple[int, str]]:
    return [(r.line_no, r.reason) for r in rejected]


# ------------------------------------------------------------------ v1: deterministic ids, linear chain


def test_v1_entries_get_8_hex_ids_linked_in_file_order():
    hdr, entries, rejected = parse_lines(jl(header(), user("a"), reply("b"), {"type": "thinking_level_change",
                                                                               "thinkingLevel": "high"}))
    assert hdr is not None and hdr.file_version == 1
    assert rejected == []
    assert [e.entry_index for e in entries] == [1, 2, 3]  # header is index 0
    assert all(HEX8.match(e.entry_id) for e in entries)
    assert len({e.entry_id for e in entries}) == 3
    assert entries[0].parent_id is None
    assert entries[1].parent_id == entries[0].entry_id
    assert entries[2].parent_id == entries[1].entry_id


def test_v1_ids_are_the_same_for_the_same_bytes():
    lines = jl(header(), user("a"), reply("b"), user("c"))
    ids_first = [e.entry_id for e in parse_lines(lines)[1]]
    ids_second = [e.entry_id for e in parse_lines(list(lines))[1]]
    assert ids_first == ids_second


def test_v1_ids_differ_between_session_ids():
    body = [user("a"), reply("b"), user("c")]
    ids_a = [e.entry_id for e in parse_lines(jl(header("aaaaaaaa-0000-0000-0000-000000000000"), *body))[1]]
    ids_b = [e.entry_id for e in parse_lines(jl(header("bbbbbbbb-0000-0000-0000-000000000000"), *body))[1]]
    assert set(ids_a).isdisjoint(ids_b)


def test_v1_existing_ids_and_parent_ids_are_overwritten():
    b = SessionBuilder(session_id=SID, version=None)  # v1 header (no version), entries written with ids
    first = b.user("a")
    b.assistant("b")
    hdr, entries, _ = parse_lines([line.encode() for line in b.lines()])
    assert hdr.version is None
    assert entries[0].entry_id != first  # "00000001" is replaced by a minted id
    assert entries[1].parent_id == entries[0].entry_id


def test_v1_chain_skips_blank_and_invalid_lines():
    lines = jl(header(), user("a")) + [b"", b"{not json", b"   "] + jl(reply("b"))
    _, entries, rejected = parse_lines(lines)
    assert reasons(rejected) == [(4, "invalid_json")]
    assert [e.line_no for e in entries] == [2, 6]  # physical line numbers, header = 1
    assert [e.entry_index for e in entries] == [1, 2]  # unparsable lines are not in Pi's entry list
    assert entries[1].parent_id == entries[0].entry_id


def test_mint_v1_id_is_deterministic_8_hex_and_avoids_taken_ids():
    first = mint_v1_id(SID, 5, set())
    assert HEX8.match(first)
    assert mint_v1_id(SID, 5, set()) == first
    second = mint_v1_id(SID, 5, {first})
    assert HEX8.match(second) and second != first
    assert mint_v1_id(SID, 6, set()) != first
    assert mint_v1_id("other-session", 5, set()) != first


def test_v1_parse_can_continue_from_saved_parser_state():
    lines = jl(header(), user("a"), reply("b"), user("c"), reply("d"), v1_compaction(3))
    _, whole, _ = parse_lines(lines)
    parser = SessionParser()
    resumed: list[ParsedEntry] = []
    for n, data in enumerate(lines[:3], start=1):
        result = parser.feed(n, data)
        if isinstance(result, ParsedEntry):
            resumed.append(result)
    continued = SessionParser(parser.state)  # e.g. Pi appended lines after the last ingest
    for n, data in enumerate(lines[3:], start=4):
        result = continued.feed(n, data)
        if isinstance(result, ParsedEntry):
            resumed.append(result)
    assert [(e.entry_id, e.parent_id, e.first_kept_entry_id) for e in resumed] == \
        [(e.entry_id, e.parent_id, e.first_kept_entry_id) for e in whole]


def test_feed_returns_header_then_entries_and_none_for_blank_lines():
    parser = SessionParser()
    assert isinstance(parser.feed(1, jl(header())[0]), SessionHeader)
    assert parser.feed(2, b"  \t ") is None
    assert isinstance(parser.feed(3, jl(user())[0]), ParsedEntry)


def test_crlf_lines_parse():
    lines = [line + b"\r" for line in jl(header(), user("a"))]
    hdr, entries, rejected = parse_lines(lines)
    assert hdr is not None and rejected == [] and len(entries) == 1


# ------------------------------------------------------------------ v1: firstKeptEntryIndex (header = index 0)

# Layout: line 1 header (index 0), line 2 user (1), line 3 assistant (2), line 4 compaction (3), line 5 user (4)


def _compaction_with_index(first_kept_index) -> tuple[list[ParsedEntry], ParsedEntry]:
    _, entries, rejected = parse_lines(jl(header(), user("a"), reply("b"), v1_compaction(first_kept_index),
                                          user("c")))
    assert rejected == []
    return entries, entries[2]


def test_first_kept_index_to_an_earlier_entry():
    entries, compaction = _compaction_with_index(2)  # index 2 = line 3, the assistant
    assert compaction.first_kept_entry_id == entries[1].entry_id


def test_first_kept_index_to_the_first_entry():
    entries, compaction = _compaction_with_index(1)  # index 1 = line 2, the first entry
    assert compaction.first_kept_entry_id == entries[0].entry_id


def test_first_kept_index_to_the_compaction_itself():
    entries, compaction = _compaction_with_index(3)  # the compaction already has its id when resolved
    assert compaction.first_kept_entry_id == compaction.entry_id


def test_first_kept_index_integral_float_resolves():
    entries, compaction = _compaction_with_index(2.0)  # JSON 2.0 is the number 2 in JS
    assert compaction.first_kept_entry_id == entries[1].entry_id


@pytest.mark.parametrize(
    "index",
    [
        4,  # a later entry: it has no id yet when the compaction is migrated
        0,  # the header
        99,  # out of range
        -1,  # entries[-1] is undefined in JS
        2.5,  # not an integer: entries[2.5] is undefined
        "2",  # not a number
        True,  # not a number
        None,  # not a number
    ],
    ids=["later", "header", "out-of-range", "negative", "fraction", "string", "bool", "null"],
)
def test_first_kept_index_unresolvable(index):
    _, compaction = _compaction_with_index(index)
    assert compaction.first_kept_entry_id is None


def test_first_kept_index_counts_parsed_objects_not_physical_lines():
    # line 1 header (0), line 2 garbage (not in Pi's list), line 3 user (1), line 4 assistant (2),
    # line 5 compaction with index 1 -> the user on line 3
    lines = jl(header()) + [b"{garbage"] + jl(user("a"), reply("b"), v1_compaction(1))
    _, entries, _ = parse_lines(lines)
    assert entries[2].first_kept_entry_id == entries[0].entry_id
    assert entries[0].line_no == 3


def test_first_kept_index_on_v3_compaction_is_ignored():
    b = SessionBuilder()
    b.user("a")
    b.append({"type": "compaction", "summary": "s", "firstKeptEntryIndex": 1, "tokensBefore": 1})
    _, entries, _ = parse_lines([line.encode() for line in b.lines()])
    assert entries[1].first_kept_entry_id is None  # v3: no migration, firstKeptEntryId is absent


def test_v3_compaction_first_kept_entry_id_is_taken_as_written():
    b = SessionBuilder()
    first = b.user("a")
    b.assistant("b")
    b.compaction("summary", first)
    _, entries, _ = parse_lines([line.encode() for line in b.lines()])
    assert entries[2].first_kept_entry_id == first
    assert entries[0].first_kept_entry_id is None  # only compactions carry it


# ------------------------------------------------------------------ hookMessage -> custom (v1 and v2 only)


def _hook_message(version: int | None) -> ParsedEntry:
    hook = {"role": "hookMessage", "customType": "ext", "display": True,
            "content": [{"type": "text", "text": "abcde"}, {"type": "image", "data": "x", "mimeType": "image/png"}]}
    if version is None:
        lines = jl(header(), {"type": "message", "timestamp": "2025-01-01T00:00:00.000Z", "message": hook})
    else:
        lines = jl(header(version=version), {"type": "message", "id": "a1", "parentId": None,
                                             "timestamp": "2025-01-01T00:00:00.000Z", "message": hook})
    _, entries, rejected = parse_lines(lines)
    assert rejected == []
    return entries[0]


@pytest.mark.parametrize("version", [None, 2], ids=["v1", "v2"])
def test_hook_message_becomes_custom_before_v3(version):
    entry = _hook_message(version)
    assert entry.role == "custom"
    assert entry.obj["message"]["role"] == "custom"  # the migrated object
    assert '"hookMessage"' in entry.raw  # the raw line is kept as written
    assert entry.is_source
    # custom role: "abcde" 5 + image 4800 = 4805 -> ceil(4805/4) = 1202
    assert entry.tokens_pi == 1202


def test_hook_message_stays_in_v3():
    entry = _hook_message(3)
    assert entry.role == "hookMessage"
    assert not entry.is_source
    assert entry.tokens_pi is None


def test_v2_keeps_ids_and_parents():
    lines = jl(header(version=2),
               {"type": "message", "id": "a1", "parentId": None, "timestamp": "t", "message": {"role": "user",
                                                                                               "content": "x"}},
               {"type": "message", "id": "b2", "parentId": "a1", "timestamp": "t", "message": {"role": "user",
                                                                                               "content": "y"}})
    _, entries, _ = parse_lines(lines)
    assert [(e.entry_id, e.parent_id) for e in entries] == [("a1", None), ("b2", "a1")]


def test_v3_ids_are_opaque_strings():
    lines = jl(header(version=3),
               {"type": "custom", "id": "1", "parentId": None, "customType": "x"},
               {"type": "custom", "id": "test-id-0", "parentId": "1", "customType": "x"},
               {"type": "custom", "id": "0f3c2a8e-5c4b-4f1e-9a5d-1b2c3d4e5f60", "parentId": "test-id-0",
                "customType": "x"})
    _, entries, _ = parse_lines(lines)
    assert [(e.entry_id, e.parent_id) for e in entries] == [
        ("1", None), ("test-id-0", "1"), ("0f3c2a8e-5c4b-4f1e-9a5d-1b2c3d4e5f60", "test-id-0")]


def test_v3_empty_parent_id_is_a_root():
    lines = jl(header(version=3), {"type": "custom", "id": "a", "parentId": "", "customType": "x"})
    assert parse_lines(lines)[1][0].parent_id is None


def test_header_version_3_written_as_float_is_v3():
    # JSON 3.0 is the number 3 in JS: `version >= 3`, so Pi runs no migration and keeps the ids.
    lines = jl(header(version=3.0), {"type": "custom", "id": "abc", "parentId": None, "customType": "x"})
    _, entries, _ = parse_lines(lines)
    assert entries[0].entry_id == "abc"


@pytest.mark.parametrize("version,ids_kept,hook_becomes_custom", [
    (2.5, True, True),  # not < 2, but < 3: only the v2 -> v3 step runs
    ("3", True, False),  # "3" >= 3 in JavaScript: no migration
    ("abc", True, False),  # NaN compares false both ways: no migration
    (True, False, True),  # true < 2: both steps, so fresh ids
    (None, False, True),  # `version ?? 1`
])
def test_header_version_compared_the_way_javascript_compares_it(version, ids_kept, hook_becomes_custom):
    lines = jl(header(version=version), {"type": "message", "id": "abc", "parentId": None,
                                         "message": {"role": "hookMessage", "content": "hook", "display": True}})
    _, entries, _ = parse_lines(lines)
    assert (entries[0].entry_id == "abc") is ids_kept
    assert entries[0].role == ("custom" if hook_becomes_custom else "hookMessage")


def test_a_byte_order_mark_before_the_header_is_trimmed_like_pi_trims_the_file():
    lines = jl(header(version=3), {"type": "custom", "id": "a", "parentId": None, "customType": "x"},
               {"type": "custom", "id": "b", "parentId": "a", "customType": "x"})
    lines = [b"", "\ufeff  ".encode() + lines[0], lines[1], "\ufeff".encode() + lines[2]]
    hdr, entries, rejected = parse_lines(lines)
    assert hdr is not None and hdr.id == SID
    assert [e.entry_id for e in entries] == ["a"]
    # only the file's start is trimmed: JSON.parse rejects a BOM later in the file
    assert reasons(rejected) == [(4, "invalid_json")]


# ------------------------------------------------------------------ header validation


def test_unparsable_lines_before_the_header_are_skipped():
    lines = [b"garbage", b"{\"type\":"] + jl(header(version=3),
                                             {"type": "custom", "id": "a", "parentId": None, "customType": "x"})
    hdr, entries, rejected = parse_lines(lines)
    assert hdr is not None and hdr.id == SID
    assert reasons(rejected) == [(1, "invalid_json"), (2, "invalid_json")]
    assert [e.entry_id for e in entries] == ["a"]


def test_first_parsed_object_not_a_header_rejects_the_whole_file():
    lines = [b"garbage"] + jl(user("a"), header(), user("b"))
    hdr, entries, rejected = parse_lines(lines)
    assert hdr is None
    assert entries == []
    assert reasons(rejected) == [(1, "invalid_json"), (2, "no_session_header"), (3, "no_session_header"),
                                 (4, "no_session_header")]


@pytest.mark.parametrize(
    "bad_header",
    [
        {"type": "session"},  # no id
        {"type": "session", "id": 42},  # id is not a string
        {"type": "session", "id": None},
        {"type": "Session", "id": SID},  # type must be exactly "session"
        {"id": SID},  # typeless
    ],
    ids=["no-id", "numeric-id", "null-id", "wrong-case-type", "typeless"],
)
def test_invalid_header_rejects_the_whole_file(bad_header):
    hdr, entries, rejected = parse_lines(jl(bad_header, user("a")))
    assert hdr is None and entries == []
    assert reasons(rejected) == [(1, "no_session_header"), (2, "no_session_header")]


def test_header_with_empty_string_id_is_kept_aside():
    # Pi checks only `typeof header.id === "string"` (pi-sessions.md §1.1), so it would load this
    # file. We deliberately do not: a session needs an id to be stored and addressed, so the whole
    # file is quarantined (nothing is lost) instead of being stored under an empty key.
    hdr, entries, rejected = parse_lines(jl({"type": "session", "id": ""}, user("a")))
    assert hdr is None and entries == []
    assert reasons(rejected) == [(1, "no_session_header"), (2, "no_session_header")]


def test_non_object_json_before_the_header_rejects_the_file():
    hdr, entries, rejected = parse_lines([b"[1, 2]"] + jl(header(), user("a")))
    assert hdr is None and entries == []
    assert reasons(rejected) == [(1, "not_an_object"), (2, "no_session_header"), (3, "no_session_header")]


@pytest.mark.parametrize("value", [b"42", b"\"text\"", b"[{\"type\": \"message\"}]", b"null", b"true"])
def test_non_object_json_after_the_header_is_not_an_object(value):
    _, entries, rejected = parse_lines(jl(header(version=3)) + [value])
    assert entries == []
    assert reasons(rejected) == [(2, "not_an_object")]


@pytest.mark.parametrize("line", [b'{"type":"custom","data":NaN}', b'{"type":"custom","data":Infinity}',
                                  b'{"type":"custom","data":-Infinity}'], ids=["NaN", "Infinity", "-Infinity"])
def test_non_json_number_literals_are_invalid_json(line):
    # JSON.parse rejects NaN/Infinity, so Pi skips the line (pi-sessions.md §1.1 step 3).
    _, entries, rejected = parse_lines(jl(header(version=3)) + [line])
    assert entries == []
    assert reasons(rejected) == [(2, "invalid_json")]


def test_v1_first_kept_index_infinity_line_is_skipped_not_fatal():
    # JSON.parse fails on Infinity: Pi skips the line; the reader must not crash on it either.
    lines = jl(header(), user("a")) + [b'{"type":"compaction","summary":"s","firstKeptEntryIndex":Infinity}'] \
        + jl(user("b"))
    _, entries, rejected = parse_lines(lines)
    assert reasons(rejected) == [(3, "invalid_json")]
    assert [e.line_no for e in entries] == [2, 4]


def test_deeply_nested_line_does_not_stop_the_reader():
    # JSON.parse accepts 100000 nested arrays, so Pi keeps this entry. Whatever the reader decides for the
    # line (an entry or a rejection), one line must not abort the whole file.
    deep = b'{"type":"custom","id":"deep","parentId":null,"data":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    lines = jl(header(version=3)) + [deep] + jl({"type": "custom", "id": "after", "parentId": None,
                                                 "customType": "x"})
    _, entries, rejected = parse_lines(lines)
    assert [e.entry_id for e in entries][-1] == "after"
    assert 2 in [e.line_no for e in entries] + [r.line_no for r in rejected]


@pytest.mark.parametrize("version", [2, 3])
def test_entry_without_id_is_missing_id(version):
    lines = jl(header(version=version), {"type": "custom", "parentId": None, "customType": "x"},
               {"type": "custom", "id": "", "parentId": None, "customType": "x"},
               {"type": "custom", "id": 7, "parentId": None, "customType": "x"})
    _, entries, rejected = parse_lines(lines)
    assert entries == []
    assert reasons(rejected) == [(2, "missing_id"), (3, "missing_id"), (4, "missing_id")]


def test_extra_session_line_is_rejected_in_v3():
    lines = jl(header(version=3), {"type": "custom", "id": "a", "parentId": None, "customType": "x"},
               header("other-session", version=3))
    hdr, entries, rejected = parse_lines(lines)
    assert hdr.id == SID  # the first header stays the header
    assert [e.entry_id for e in entries] == ["a"]
    assert reasons(rejected) == [(3, "extra_session_header")]


def test_extra_session_line_in_v1_keeps_the_chain_and_its_index():
    # indexes: header 0, user 1, extra session 2 (in Pi's list, no id), user 3, compaction 4
    lines = jl(header(), user("a"), header("other"), user("b"), v1_compaction(3))
    _, entries, rejected = parse_lines(lines)
    assert reasons(rejected) == [(3, "extra_session_header")]
    first, second, compaction = entries
    assert second.parent_id == first.entry_id  # the extra header does not break the chain
    assert second.entry_index == 3
    assert compaction.first_kept_entry_id == second.entry_id


def test_v1_first_kept_index_pointing_at_an_extra_session_line_is_unresolved():
    lines = jl(header(), user("a"), header("other"), user("b"), v1_compaction(2))
    _, entries, _ = parse_lines(lines)
    assert entries[-1].first_kept_entry_id is None  # Pi: target.type === "session" -> no id


def test_unknown_and_typeless_entries_are_kept():
    lines = jl(header(version=3),
               {"type": "future_thing", "id": "a", "parentId": None, "payload": 1},
               {"id": "b", "parentId": "a", "note": "no type"})
    _, entries, rejected = parse_lines(lines)
    assert rejected == []
    assert [(e.entry_id, e.parent_id) for e in entries] == [("a", None), ("b", "a")]
    assert entries[0].entry_type == "future_thing"
    assert not entries[0].is_source and not entries[1].is_source
    assert entries[0].tokens_pi is None and entries[1].tokens_pi is None


def test_typeless_v1_entry_is_kept_in_the_chain():
    _, entries, rejected = parse_lines(jl(header(), user("a"), {"note": "no type"}, user("b")))
    assert rejected == []
    assert len(entries) == 3
    assert entries[2].parent_id == entries[1].entry_id


# ------------------------------------------------------------------ source entries and their tokens


def _v3(build) -> dict[str, ParsedEntry]:
    b = SessionBuilder()
    ids = build(b)
    _, entries, rejected = parse_lines([line.encode() for line in b.lines()])
    assert rejected == []
    by_id = {e.entry_id: e for e in entries}
    return {name: by_id[entry_id] for name, entry_id in ids.items()}


def test_system_message_is_an_entry_but_not_a_source():
    e = _v3(lambda b: {"system": b.system("You are Pi, a coding agent.")})["system"]
    assert e.entry_type == "message" and e.role == "system"
    assert not e.is_source
    assert e.tokens_pi is None
    assert e.text_pieces is None


def test_conversation_messages_are_sources_with_pi_estimates():
    e = _v3(lambda b: {
        "user": b.user("hello world!"),  # 12 chars -> 3
        "assistant": b.assistant("ok", tool_calls=[("c1", "read", {"path": "a.py"})], thinking="plan"),
        "tool": b.tool_result("c1", "read", "abcd", images=1),  # 4 + 4800 = 4804 -> 1201
        "bash": b.bash("ls", "a.py\n"),  # 2 + 5 = 7 -> 2
    })
    # assistant: thinking "plan" 4 + text "ok" 2 + "read" 4 + {"path":"a.py"} (2+6+1+6 = 15) = 25 -> 7
    assert {k: (v.is_source, v.tokens_pi) for k, v in e.items()} == {
        "user": (True, 3), "assistant": (True, 7), "tool": (True, 1201), "bash": (True, 2)}
    assert e["user"].text_pieces == ["hello world!"]


def test_custom_message_and_branch_summary_are_sources():
    e = _v3(lambda b: {
        "cm": b.custom_message("ext", "abcde"),  # 5 -> 2
        "cm_image": b.custom_message("ext", [{"type": "text", "text": "abcd"},
                                             {"type": "image", "data": "x", "mimeType": "image/png"}]),
        "bs": b.branch_summary("x" * 10),  # 10 -> 3
    })
    assert (e["cm"].is_source, e["cm"].tokens_pi) == (True, 2)
    assert (e["cm_image"].is_source, e["cm_image"].tokens_pi) == (True, 1201)  # 4 + 4800 = 4804 -> 1201
    assert (e["bs"].is_source, e["bs"].tokens_pi) == (True, 3)
    assert e["cm"].custom_type == "ext"


def test_non_source_entries_have_no_tokens():
    def build(b: SessionBuilder) -> dict[str, str]:
        first = b.user("a")
        return {
            "compaction": b.compaction("a long summary text", first),
            "custom": b.custom("om.observations.recorded", {"observations": []}),
            "label": b.label(first, "bookmark"),
            "thinking": b.thinking_level("high"),
            "model": b.model_change(),
            "info": b.append({"type": "session_info", "name": "My session"}),
        }

    e = _v3(build)
    assert {k: (v.is_source, v.tokens_pi) for k, v in e.items()} == {k: (False, None) for k in e}
    assert e["custom"].custom_type == "om.observations.recorded"


def test_aborted_assistant_is_a_source_with_zero_tokens():
    e = _v3(lambda b: {"a": b.assistant(stop_reason="aborted", error="Request was aborted.")})["a"]
    assert e.is_source and e.tokens_pi == 0


def test_message_with_unknown_role_is_not_a_source():
    lines = jl(header(version=3), {"type": "message", "id": "a", "parentId": None,
                                   "message": {"role": "narrator", "content": "x"}},
               {"type": "message", "id": "b", "parentId": "a", "message": "not an object"})
    _, entries, _ = parse_lines(lines)
    assert [(e.role, e.is_source, e.tokens_pi) for e in entries] == [("narrator", False, None), (None, False, None)]


@pytest.mark.parametrize(
    ("entry_type", "role", "expected"),
    [
        ("message", "user", True),
        ("message", "assistant", True),
        ("message", "toolResult", True),
        ("message", "bashExecution", True),
        ("message", "custom", True),
        ("message", "system", False),
        ("message", "hookMessage", False),
        ("message", None, False),
        ("custom_message", None, True),
        ("branch_summary", None, True),
        ("compaction", None, False),
        ("custom", None, False),
        ("label", None, False),
        ("thinking_level_change", None, False),
        ("model_change", None, False),
        ("session_info", None, False),
        ("", None, False),
    ],
)
def test_is_source_entry(entry_type, role, expected):
    assert is_source_entry(entry_type, role) is expected


def test_timestamps_and_line_numbers():
    e = _v3(lambda b: {"u": b.user("a")})["u"]
    assert e.timestamp == "2026-01-15T14:01:00.000Z"  # builder start 14:00:00 + one 60 s step
    assert e.line_no == 2 and e.entry_index == 1


# ------------------------------------------------------------------ the real sample sessions


@lru_cache(maxsize=None)
def _load(path: Path):
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    hdr, entries, rejected = parse_lines(lines)
    forest = build_forest((e.entry_id, e.parent_id, e.line_no) for e in entries)
    by_id = {e.entry_id: e for e in entries}
    branch = [by_id[i] for i in forest.path(entries[-1].entry_id)]
    return hdr, entries, rejected, forest, branch


def _cut(branch, rules):
    return compaction_cut_point([branch_entry(e.entry_id, e.entry_type, e.role, e.tokens_pi, e.obj, e.first_kept_entry_id)
                                 for e in branch], rules=rules)


def _kept_message_tokens(branch, first_kept: int) -> int:
    return sum(e.tokens_pi or 0 for e in branch[first_kept:] if e.entry_type == "message")


@pytest.mark.real_sessions
def test_large_session_reads_as_one_linear_branch(large_session):
    hdr, entries, rejected, forest, branch = _load(large_session)
    assert hdr.id == SID and hdr.file_version == 1
    assert rejected == []
    assert len(entries) == 1018  # 1019 lines = header + 1018 entries
    assert forest.notes == []
    assert forest.leaves() == [entries[-1].entry_id]  # the leaf is the last entry in file order
    assert [e.entry_id for e in branch] == [e.entry_id for e in entries]
    assert len({e.entry_id for e in entries}) == 1018


@pytest.mark.real_sessions
def test_large_session_sources_and_tokens(large_session):
    _, entries, _, _, _ = _load(large_session)
    assert sum(e.is_source for e in entries) == 914  # 88 user + 453 assistant + 373 toolResult
    assert sum(e.tokens_pi or 0 for e in entries) == 124661  # Pi's chars/4 sum over the context


@pytest.mark.real_sessions
@pytest.mark.parametrize("rules", ["pi-1.6", "legacy"])
def test_large_session_cut_point(large_session, rules):
    *_, branch = _load(large_session)
    cut = _cut(branch, rules)
    assert (cut.firstKeptPosition, cut.turnStartPosition, cut.isSplitTurn) == (837, 834, True)
    assert cut.tokensBefore == 177657  # the last message's usage (no totalTokens: the four parts), 0 trailing
    assert cut.firstKeptEntryId == branch[837].entry_id
    assert branch[837].role == "assistant" and branch[834].role == "user"
    assert _kept_message_tokens(branch, 837) == 20330


@pytest.mark.real_sessions
def test_large_session_ids_are_reproducible(large_session):
    lines = large_session.read_bytes().split(b"\n")[:50]
    assert [e.entry_id for e in parse_lines(lines)[1]] == [e.entry_id for e in _load(large_session)[1][:49]]


@pytest.mark.real_sessions
def test_before_compaction_structure(before_compaction):
    hdr, entries, rejected, forest, branch = _load(before_compaction)
    assert hdr.id.startswith("ffae836b-") and hdr.file_version == 1
    assert rejected == []
    assert len(entries) == 1002
    assert len(branch) == 1002
    assert branch[-1].line_no == 1003 and branch[-1].entry_type == "thinking_level_change"


@pytest.mark.real_sessions
def test_before_compaction_first_kept_indexes_resolve(before_compaction):
    _, entries, _, _, _ = _load(before_compaction)
    by_line = {e.line_no: e for e in entries}
    compactions = [e for e in entries if e.entry_type == "compaction"]
    assert [c.line_no for c in compactions] == [360, 629]
    # firstKeptEntryIndex 293 -> line 294, 551 -> line 552 (header counted as index 0)
    assert by_line[360].first_kept_entry_id == by_line[294].entry_id
    assert by_line[629].first_kept_entry_id == by_line[552].entry_id
    assert by_line[294].role == "user" and by_line[552].role == "user"
    assert by_line[360].tokens_pi is None


@pytest.mark.real_sessions
@pytest.mark.parametrize("rules", ["pi-1.6", "legacy"])
def test_before_compaction_cut_point(before_compaction, rules):
    *_, branch = _load(before_compaction)
    cut = _cut(branch, rules)
    assert (cut.firstKeptPosition, cut.turnStartPosition, cut.isSplitTurn) == (946, 939, True)
    assert cut.tokensBefore == 180820  # usage 168018 of the last valid assistant + 12802 trailing
    assert _kept_message_tokens(branch, 946) == 19805


@pytest.mark.real_sessions
def test_before_compaction_find_bash_execution_estimate(before_compaction):
    _, entries, _, _, _ = _load(before_compaction)
    bash = next(e for e in entries if e.line_no == 1002)
    assert bash.role == "bashExecution"
    assert bash.obj["message"]["command"] == "find ."
    assert bash.tokens_pi == 12802
