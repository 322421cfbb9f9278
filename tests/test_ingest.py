"""Ingest of Pi session files into DuckDB: lossless, idempotent, incremental,
rewrite detection, bad input, duplicate sessions, and the real sample sessions."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from builders import SessionBuilder, incompressible_sessions
from conftest import SHARED_SESSIONS, shared_session, workspace
from legacy_db import legacy_copy
from om_core.store import db as dbmod
from om_core.ingest import ingest

SID = "0a0b0c0d-1111-2222-3333-444444444444"
TS = "2026-01-15T14:0{}:00.000Z"


# ------------------------------------------------------------------ helpers


def q(db: Path, sql: str, params: list | dict | None = None) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


def snapshot(db: Path, *, volatile: bool = True) -> dict[str, list[tuple]]:
    """Full contents of the session tables (``volatile=False`` leaves out run ids and timestamps)."""
    if volatile:
        sqls = {t: f"SELECT * FROM {t} ORDER BY ALL"
                for t in ("sessions", "entries", "branch_entries", "quarantine", "ingest_notes")}
    else:
        sqls = {
            "sessions": "SELECT * EXCLUDE (run_id, ingested_at) FROM sessions ORDER BY ALL",
            "entries": "SELECT * EXCLUDE (run_id) FROM entries ORDER BY ALL",
            "branch_entries": "SELECT * FROM branch_entries ORDER BY ALL",
            "quarantine": "SELECT * EXCLUDE (run_id, quarantined_at) FROM quarantine ORDER BY ALL",
            "ingest_notes": "SELECT * EXCLUDE (run_id) FROM ingest_notes ORDER BY ALL",
        }
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(s).fetchall() for t, s in sqls.items()}
    finally:
        con.close()


def header(sid: str = SID, **extra) -> bytes:
    obj = {"type": "session", "version": 3, "id": sid, "timestamp": TS.format(0), "cwd": "/p", **extra}
    return json.dumps(obj, separators=(",", ":")).encode()


def msg(entry_id: str, parent: str | None, text: str = "hi", role: str = "user", minute: int = 1) -> bytes:
    obj = {"type": "message", "id": entry_id, "parentId": parent, "timestamp": TS.format(minute % 10),
           "message": {"role": role, "content": [{"type": "text", "text": text}]}}
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def write_lines(path: Path, lines: list[bytes], *, trailing_newline: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    return path


def entries_of(db: Path, sid: str = SID) -> list[tuple]:
    return q(db, "SELECT entry_id, line_no, raw FROM entries WHERE session_id = ? ORDER BY line_no", [sid])


def quarantine_of(db: Path) -> list[tuple]:
    return q(db, "SELECT file_path, line_no, reason, raw FROM quarantine ORDER BY file_path, line_no")


def branch_of(db: Path, sid: str, leaf: str) -> list[str]:
    return [r[0] for r in q(db, "SELECT entry_id FROM branch_entries WHERE session_id = ? AND leaf_id = ? "
                                "ORDER BY position", [sid, leaf])]


def only(report):
    assert len(report.files) == 1, report
    return report.files[0]


def bump_mtime(path: Path, seconds: int = 10) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


def sample_session(session_id: str = "11111111-2222-3333-4444-555555555555") -> SessionBuilder:
    """Two branches, a compaction, a custom_message, a custom entry and a label."""
    b = SessionBuilder(session_id)
    b.model_change()
    u1 = b.user("Fix the bug in parser.py")
    b.assistant(thinking="look first", tool_calls=[("call_1", "read", {"path": "parser.py"})])
    b.tool_result("call_1", "read", "def parse(): ...")
    a1 = b.assistant("Found it.")
    b.user("and tests?")
    b.assistant("Added.")
    b.go(a1)
    b.branch_summary("Tried adding tests, abandoned")
    b.custom_message("note", "remember the style guide")
    b.custom("ext.state", {"n": 1})
    b.compaction("summary so far", first_kept=u1)
    b.user("continue")
    last = b.assistant("done")
    b.label(last, "checkpoint")
    return b


# ------------------------------------------------------------------ 1. lossless


def test_raw_lines_and_physical_line_numbers_are_kept(tmp_path, db_path):
    lines = [
        header(),
        b"",
        # odd spacing, an escaped and a raw non-ASCII character, trailing blanks: all must survive
        b'{ "type" : "message", "id":"e1", "parentId":null, "timestamp":"2026-01-15T14:01:00.000Z", '
        b'"message":{"role":"user","content":"h\\u00e9llo \xf0\x9f\x98\x80"} }   ',
        b"   ",
        b'{"type":"message","id":"e2","parentId":"e1","timestamp":"2026-01-15T14:02:00.000Z",'
        b'"message":{"role":"assistant","content":[{"type":"text","text":"ok"}],"stopReason":"stop"}}',
        b"not json \xff\xfe at all",
        b'{"type":"label","id":"e3","parentId":"e2","timestamp":"2026-01-15T14:03:00.000Z","targetId":"e1","label":"x"}',
    ]
    path = write_lines(tmp_path / "s.jsonl", lines)
    report = ingest(workspace(db_path), [path])
    f = only(report)
    assert f.status == "new"
    assert (f.entries_added, f.lines_quarantined) == (3, 1)
    assert f.bytes_read == path.stat().st_size
    assert entries_of(db_path) == [
        ("e1", 3, lines[2].decode()),
        ("e2", 5, lines[4].decode()),
        ("e3", 7, lines[6].decode()),
    ]
    # Pi's parsed-entry index skips blank and unparsable lines (header = 0)
    assert q(db_path, "SELECT entry_id, entry_index FROM entries ORDER BY line_no") == [("e1", 1), ("e2", 2), ("e3", 3)]
    assert quarantine_of(db_path) == [(str(path.resolve()), 6, "invalid_json", b"not json \xff\xfe at all")]


def test_header_line_kept_verbatim(tmp_path, db_path):
    """Lossless ("the raw JSON of every line is kept"): the header line too, with the legacy
    fields Pi keeps but never reads (pi-sessions.md 1.2: provider, modelId, thinkingLevel, branchedFrom)."""
    head = (b'{"type":"session","id":"' + SID.encode() + b'","timestamp":"2026-01-15T14:00:00.000Z",'
            b'"cwd":"/p","provider":"anthropic","modelId":"claude-opus-4-5","thinkingLevel":"off",'
            b'"branchedFrom":"/old/file.jsonl"}')
    path = write_lines(tmp_path / "v1.jsonl", [head, b'{"type":"message","timestamp":"2026-01-15T14:01:00.000Z",'
                                                     b'"message":{"role":"user","content":"hi"}}'])
    ingest(workspace(db_path), [path])
    (stored,) = q(db_path, "SELECT header FROM sessions WHERE session_id = ?", [SID])[0]
    assert json.loads(stored) == json.loads(head)
    assert stored == head.decode()


def test_every_line_of_a_built_session_round_trips(tmp_path, db_path):
    b = sample_session()
    path = b.write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [path])
    got = q(db_path, "SELECT line_no, raw FROM entries ORDER BY line_no")
    assert got == [(n, line) for n, line in enumerate(b.lines(), start=1) if n > 1]


# ------------------------------------------------------------------ 2. idempotent


def test_second_ingest_changes_nothing(tmp_path, db_path):
    b = sample_session()
    lines = [line.encode() for line in b.lines()]
    lines.insert(5, b"{oops")  # one quarantined line, so that table is not trivially empty
    path = write_lines(tmp_path / "s.jsonl", lines)
    first = only(ingest(workspace(db_path), [path]))
    assert first.status == "new" and first.lines_quarantined == 1
    before = snapshot(db_path)
    assert len(before["entries"]) == len(b.entries)

    second = only(ingest(workspace(db_path), [path]))
    assert second.status == "unchanged"
    assert (second.entries_added, second.lines_quarantined, second.bytes_read) == (0, 0, 0)
    assert snapshot(db_path) == before

    bump_mtime(path)  # touched, same bytes
    third = only(ingest(workspace(db_path), [path]))
    assert third.status == "unchanged"
    assert (third.entries_added, third.bytes_read) == (0, 0)
    assert snapshot(db_path) == before


# ------------------------------------------------------------------ 3. incremental


def _append(path: Path, new_lines: list[str]) -> bytes:
    data = ("\n".join(new_lines) + "\n").encode()
    with open(path, "ab") as f:
        f.write(data)
    return data


def test_appended_lines_only_are_read(tmp_path, db_path):
    b = SessionBuilder(SID)
    u1 = b.user("first")
    b.assistant("one")
    b.user("second")
    old_leaf = b.assistant("two")
    path = b.write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [path])
    n_old = len(b.lines())

    b.user("third")
    b.assistant("three")
    b.go(u1)  # a second branch from the first user message
    b.assistant("other answer")
    new_leaf = b.user("go on")
    data = _append(path, b.lines()[n_old:])

    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "appended"
    assert f.bytes_read == len(data)
    assert f.entries_added == 4
    assert f.lines_quarantined == 0
    assert q(db_path, "SELECT leaf_id, entry_count, leaf_count FROM sessions") == [(new_leaf, 8, 2)]
    assert entries_of(db_path) == [(e["id"], n, line) for n, (e, line) in
                                   enumerate(zip(b.entries, b.lines()[1:]), start=2)]
    ids = [e["id"] for e in b.entries]
    assert branch_of(db_path, SID, new_leaf) == [ids[0], ids[6], ids[7]]
    assert branch_of(db_path, SID, ids[5]) == ids[:6]
    assert branch_of(db_path, SID, old_leaf) == []  # no longer a leaf
    assert q(db_path, "SELECT DISTINCT leaf_id FROM branch_entries ORDER BY 1") == sorted([(ids[5],), (new_leaf,)])

    # the incremental result equals a from-scratch ingest of the whole file
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)


def _v1_compaction(b: SessionBuilder, first_kept_index: int) -> None:
    b.append({"type": "compaction", "summary": "earlier work", "firstKeptEntryIndex": first_kept_index,
              "tokensBefore": 1234})


def test_appended_v1_entries_chain_to_previous_last_entry(tmp_path, db_path):
    b = SessionBuilder(SID, version=None)
    b.user("first")
    b.assistant("one")
    b.user("second")
    b.assistant("two")
    path = b.write(tmp_path / "v1.jsonl")
    ingest(workspace(db_path), [path])
    (last_id,) = q(db_path, "SELECT entry_id FROM entries ORDER BY line_no DESC LIMIT 1")[0]
    n_old = len(b.lines())

    b.user("third")
    _v1_compaction(b, 3)  # header = index 0, so index 3 is line 4: the "second" user message
    b.user("after compaction")
    b.assistant("fine")
    data = _append(path, b.lines()[n_old:])

    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "appended"
    assert f.bytes_read == len(data)
    assert f.entries_added == 4

    got = q(db_path, "SELECT entry_id, parent_id, line_no, entry_index, entry_type, first_kept_entry_id "
                     "FROM entries ORDER BY line_no")
    assert [r[2] for r in got] == list(range(2, 10))
    assert [r[3] for r in got] == list(range(1, 9))
    assert all(re.fullmatch(r"[0-9a-f]{8}", r[0]) for r in got)
    assert len({r[0] for r in got}) == 8
    assert got[0][1] is None
    assert [r[1] for r in got[1:]] == [r[0] for r in got[:-1]]  # a linear chain in file order
    assert got[4][1] == last_id  # first appended entry hangs under the previous last entry
    assert got[5][4] == "compaction" and got[5][5] == got[2][0]  # index 3 -> line 4
    leaf = got[-1][0]
    assert q(db_path, "SELECT leaf_id FROM sessions") == [(leaf,)]
    assert branch_of(db_path, SID, leaf) == [r[0] for r in got]

    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)
    # deterministic ids: a second fresh database mints the same ids
    fresh2 = tmp_path / "fresh2.duckdb"
    ingest(workspace(fresh2), [path])
    assert snapshot(fresh2, volatile=False)["entries"] == snapshot(fresh, volatile=False)["entries"]


# ------------------------------------------------------------------ 4. rewrite


def pi_migrate_v1(lines: list[str], new_ids: list[str]) -> list[str]:
    """What Pi writes after migrating a v1 file to v3 (pi-sessions.md 1.5): ids, parent chain, version 3,
    firstKeptEntryIndex -> firstKeptEntryId, then JSON.stringify of every entry plus a trailing newline."""
    objs = [json.loads(line) for line in lines]
    objs[0]["version"] = 3
    prev = None
    for i, (obj, new_id) in enumerate(zip(objs[1:], new_ids), start=1):
        obj["id"] = new_id
        obj["parentId"] = prev
        prev = new_id
        if obj["type"] == "compaction" and "firstKeptEntryIndex" in obj:
            target = obj.pop("firstKeptEntryIndex")
            if 1 <= target < i:
                obj["firstKeptEntryId"] = objs[target]["id"]
    return [json.dumps(o, separators=(",", ":"), ensure_ascii=False) for o in objs]


def test_v1_file_rewritten_as_v3_by_pi(tmp_path, db_path):
    b = SessionBuilder(SID, version=None)
    b.user("first")
    b.assistant("one")
    b.user("second")
    b.assistant("two")
    _v1_compaction(b, 3)
    b.user("third")
    b.assistant("three")
    path = b.write(tmp_path / "s.jsonl")
    assert only(ingest(workspace(db_path), [path])).status == "new"
    old_ids = {r[0] for r in q(db_path, "SELECT entry_id FROM entries")}

    new_ids = ["a1b2c3d4", "b2c3d4e5", "c3d4e5f6", "d4e5f6a7", "e5f6a7b8", "f6a7b8c9", "0718293a"]
    migrated = pi_migrate_v1(b.lines(), new_ids)
    path.write_text("\n".join(migrated) + "\n")
    bump_mtime(path)

    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "rewritten"
    assert f.entries_added == 7
    got = q(db_path, "SELECT entry_id, parent_id, line_no, raw, first_kept_entry_id FROM entries ORDER BY line_no")
    assert [r[0] for r in got] == new_ids
    assert [r[1] for r in got] == [None] + new_ids[:-1]
    assert [r[2] for r in got] == list(range(2, 9))
    assert [r[3] for r in got] == migrated[1:]
    assert got[4][4] == new_ids[2]
    assert not old_ids & {r[0] for r in got}
    assert q(db_path, "SELECT count(*), count(DISTINCT entry_id) FROM entries") == [(7, 7)]
    assert q(db_path, "SELECT session_id, version, leaf_id, entry_count FROM sessions") == [(SID, 3, new_ids[-1], 7)]
    assert q(db_path, "SELECT DISTINCT leaf_id FROM branch_entries") == [(new_ids[-1],)]
    assert branch_of(db_path, SID, new_ids[-1]) == new_ids
    assert q(db_path, "SELECT count(*) FROM quarantine") == [(0,)]
    # Pi's new ids replace every minted one: Pi's migration, followed (its note is the file's history);
    # no loss (tests/test_migration.py: the memory records on them are re-anchored)
    assert f.replaced == []
    [done] = f.followed
    assert (done.how, done.entries, done.ids_changed, done.records) == ("migrated", 7, 7, 0)
    assert q(db_path, "SELECT kind, detail FROM ingest_notes") == [("migrated", done.describe())]
    mapped = q(db_path, "SELECT old_id, new_id FROM entry_id_map")
    assert {o for o, _ in mapped} == old_ids and sorted(n for _, n in mapped) == sorted(new_ids)

    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    with dbmod.writing(db_path) as con:
        con.execute("DELETE FROM om_internal.ingest_notes WHERE kind = 'migrated'")
        con.execute("DELETE FROM om_internal.entry_id_map")
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)


@pytest.mark.parametrize("same_length", [False, True])
def test_edited_middle_line_is_a_rewrite(tmp_path, db_path, same_length):
    b = SessionBuilder(SID)
    b.user("first question")
    b.assistant("first answer")
    b.user("second question")
    b.assistant("second answer")
    path = b.write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [path])

    lines = b.lines()
    edited = lines[2].replace("first answer", "FIRST ANSWER" if same_length else "a much longer first answer")
    assert edited != lines[2]
    lines[2] = edited
    path.write_text("\n".join(lines) + "\n")
    bump_mtime(path)

    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "rewritten"
    assert f.entries_added == 4
    assert entries_of(db_path) == [(e["id"], n, line) for n, (e, line) in
                                   enumerate(zip(b.entries, lines[1:]), start=2)]
    assert q(db_path, "SELECT count(*) FROM branch_entries") == [(4,)]
    assert q(db_path, "SELECT entry_count FROM sessions") == [(4,)]


def test_rewritten_with_another_session_forgets_the_old_one(tmp_path, db_path):
    path = sample_session("aaaaaaaa-0000-0000-0000-000000000001").write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [path])
    other = SessionBuilder("bbbbbbbb-0000-0000-0000-000000000002")
    other.user("hello")
    leaf = other.assistant("hi")
    other.write(path)
    bump_mtime(path)
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "rewritten"
    assert q(db_path, "SELECT session_id, leaf_id, entry_count FROM sessions") == [(other.session_id, leaf, 2)]
    assert q(db_path, "SELECT DISTINCT session_id FROM entries") == [(other.session_id,)]
    assert q(db_path, "SELECT DISTINCT session_id FROM branch_entries") == [(other.session_id,)]


def test_shrunk_file_is_a_rewrite(tmp_path, db_path):
    b = SessionBuilder(SID)
    b.user("q")
    keep = b.assistant("a")
    path = b.write(tmp_path / "s.jsonl")
    b.user("more")
    b.assistant("more answer")
    b.write(path)
    ingest(workspace(db_path), [path])
    write_lines(path, [line.encode() for line in b.lines()[:3]])
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "rewritten"
    assert q(db_path, "SELECT leaf_id, entry_count FROM sessions") == [(keep, 2)]
    assert q(db_path, "SELECT count(*) FROM branch_entries") == [(2,)]


# ------------------------------------------------------------------ 5. bad input


def test_line_that_is_not_json(tmp_path, db_path):
    lines = [header(), msg("e1", None), b'{"type":"message","id":"e2",', msg("e3", "e1", "after"), b"[1, 2"]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "new"
    assert (f.entries_added, f.lines_quarantined) == (2, 2)
    assert entries_of(db_path) == [("e1", 2, lines[1].decode()), ("e3", 4, lines[3].decode())]
    key = str(path.resolve())
    assert quarantine_of(db_path) == [(key, 3, "invalid_json", lines[2]), (key, 5, "invalid_json", lines[4])]
    assert q(db_path, "SELECT leaf_id FROM sessions") == [("e3",)]


def test_truncated_last_line_is_read_again_once_complete(tmp_path, db_path):
    full = msg("e3", "e2", "the line Pi is still writing")
    head, tail = full[:25], full[25:]
    lines = [header(), msg("e1", None), msg("e2", "e1", "answer", role="assistant"), head]
    path = write_lines(tmp_path / "s.jsonl", lines, trailing_newline=False)
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "new"
    assert (f.entries_added, f.lines_quarantined) == (2, 1)
    assert f.bytes_read == path.stat().st_size - len(head)
    assert entries_of(db_path) == [("e1", 2, lines[1].decode()), ("e2", 3, lines[2].decode())]
    assert quarantine_of(db_path) == [(str(path.resolve()), 4, "truncated_last_line", head)]
    assert q(db_path, "SELECT leaf_id FROM sessions") == [("e2",)]

    # unchanged file: nothing happens, the provisional row stays
    assert only(ingest(workspace(db_path), [path])).status == "unchanged"
    assert len(quarantine_of(db_path)) == 1

    with open(path, "ab") as fh:
        fh.write(tail + b"\n")
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "appended"
    assert (f.entries_added, f.lines_quarantined) == (1, 0)
    assert f.bytes_read == len(full) + 1
    assert entries_of(db_path)[-1] == ("e3", 4, full.decode())
    assert quarantine_of(db_path) == []
    assert q(db_path, "SELECT leaf_id, entry_count FROM sessions") == [("e3", 3)]
    assert branch_of(db_path, SID, "e3") == ["e1", "e2", "e3"]


def test_file_without_valid_header(tmp_path, db_path):
    bad_lines = [msg("e1", None), msg("e2", "e1"), header()]  # the header must be the first parsed object
    bad = write_lines(tmp_path / "a_bad.jsonl", bad_lines)
    no_id = write_lines(tmp_path / "b_noid.jsonl", [b'{"type":"session","version":3,"cwd":"/p"}', msg("x1", None)])
    good_builder = SessionBuilder("cccccccc-0000-0000-0000-000000000003")
    good_builder.user("hello")
    good_builder.assistant("hi")
    good = good_builder.write(tmp_path / "c_good.jsonl")

    report = ingest(workspace(db_path), [bad, no_id, good])
    by_path = {Path(f.path).name: f for f in report.files}
    assert by_path["a_bad.jsonl"].status == "no_header"
    assert by_path["a_bad.jsonl"].lines_quarantined == 3
    assert by_path["a_bad.jsonl"].entries_added == 0
    assert by_path["b_noid.jsonl"].status == "no_header"
    assert by_path["c_good.jsonl"].status == "new"
    assert by_path["c_good.jsonl"].entries_added == 2

    key_bad, key_noid = str(bad.resolve()), str(no_id.resolve())
    assert quarantine_of(db_path) == sorted(
        [(key_bad, n, "no_session_header", line) for n, line in enumerate(bad_lines, start=1)]
        + [(key_noid, 1, "no_session_header", b'{"type":"session","version":3,"cwd":"/p"}'),
           (key_noid, 2, "no_session_header", msg("x1", None))]
    )
    assert q(db_path, "SELECT session_id FROM sessions") == [(good_builder.session_id,)]
    assert q(db_path, "SELECT DISTINCT session_id FROM entries") == [(good_builder.session_id,)]


def test_header_after_unparsable_lines_is_valid(tmp_path, db_path):
    """Pi requires the first *successfully parsed* object to be the header: junk before it is skipped."""
    lines = [b"garbage", b"", header(), msg("e1", None)]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "new"
    assert entries_of(db_path) == [("e1", 4, lines[3].decode())]
    assert quarantine_of(db_path) == [(str(path.resolve()), 1, "invalid_json", b"garbage")]


def test_no_header_file_later_overwritten_by_pi(tmp_path, db_path):
    """Pi overwrites a header-less file with a fresh session: the old quarantine rows go away."""
    path = write_lines(tmp_path / "s.jsonl", [msg("e1", None), msg("e2", "e1")])
    assert only(ingest(workspace(db_path), [path])).status == "no_header"
    assert len(quarantine_of(db_path)) == 2
    write_lines(path, [header(), msg("n1", None), msg("n2", "n1", role="assistant")])
    bump_mtime(path)
    f = only(ingest(workspace(db_path), [path]))
    assert f.status in ("new", "rewritten")
    assert f.entries_added == 2
    assert quarantine_of(db_path) == []
    assert q(db_path, "SELECT session_id, entry_count FROM sessions") == [(SID, 2)]


def test_unknown_entry_types_are_kept_raw(tmp_path, db_path):
    lines = [
        header(),
        msg("e1", None),
        b'{"type":"future_thing","id":"e2","parentId":"e1","timestamp":"2026-01-15T14:02:00.000Z","payload":{"x":[1,2]}}',
        b'{"id":"e3","parentId":"e2","timestamp":"2026-01-15T14:03:00.000Z"}',  # no type at all
        msg("e4", "e3", "strange role", role="oracle"),
        msg("e5", "e4", "a user message"),
    ]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert (f.entries_added, f.lines_quarantined) == (5, 0)
    got = q(db_path, "SELECT entry_id, line_no, entry_type, role, is_source, tokens_pi IS NULL, tokens IS NULL, raw "
                     "FROM entries ORDER BY line_no")
    assert got == [
        ("e1", 2, "message", "user", True, False, False, lines[1].decode()),
        ("e2", 3, "future_thing", None, False, True, True, lines[2].decode()),
        ("e3", 4, None, None, False, True, True, lines[3].decode()),
        ("e4", 5, "message", "oracle", False, True, True, lines[4].decode()),
        ("e5", 6, "message", "user", True, False, False, lines[5].decode()),
    ]
    assert quarantine_of(db_path) == []
    assert branch_of(db_path, SID, "e5") == ["e1", "e2", "e3", "e4", "e5"]


def test_duplicate_ids_keep_the_later_entry(tmp_path, db_path):
    lines = [
        header(),
        msg("r", None, "root"),
        msg("dup", "r", "first version", role="assistant"),
        msg("dup", "r", "second version", role="assistant"),
        msg("c", "dup", "child"),
    ]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert f.lines_quarantined == 1
    assert entries_of(db_path) == [("r", 2, lines[1].decode()), ("dup", 4, lines[3].decode()),
                                   ("c", 5, lines[4].decode())]
    assert quarantine_of(db_path) == [(str(path.resolve()), 3, "duplicate_id", lines[2])]
    assert q(db_path, "SELECT leaf_id, entry_count FROM sessions") == [("c", 3)]
    assert branch_of(db_path, SID, "c") == ["r", "dup", "c"]
    assert q(db_path, "SELECT count(*) FROM branch_entries") == [(3,)]


def test_duplicate_id_arriving_in_an_append(tmp_path, db_path):
    lines = [header(), msg("r", None), msg("a", "r", role="assistant")]
    path = write_lines(tmp_path / "s.jsonl", lines)
    ingest(workspace(db_path), [path])
    again = msg("a", "r", "the same id again", role="assistant")
    with open(path, "ab") as fh:
        fh.write(again + b"\n")
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "appended"
    assert entries_of(db_path) == [("r", 2, lines[1].decode()), ("a", 4, again.decode())]
    assert quarantine_of(db_path) == [(str(path.resolve()), 3, "duplicate_id", lines[2])]
    assert q(db_path, "SELECT leaf_id, entry_count FROM sessions") == [("a", 2)]


def test_current_branch_when_the_last_entry_has_children(tmp_path, db_path):
    """Duplicate ids can make the last entry in file order (Pi's current leaf) a parent of an earlier line:
    the current branch is still the path to it (pi-sessions.md 1.6)."""
    lines = [header(), msg("r", None), msg("d", "r", "old", role="assistant"), msg("c", "d"),
             msg("d", "r", "new", role="assistant")]
    path = write_lines(tmp_path / "s.jsonl", lines)
    ingest(workspace(db_path), [path])
    assert q(db_path, "SELECT leaf_id FROM sessions") == [("d",)]
    assert q(db_path, "SELECT position, entry_id FROM branch(?, ?) ORDER BY position", [SID, "d"]) == [(0, "r"), (1, "d")]
    assert q(db_path, "SELECT position, entry_id FROM current_branches ORDER BY position") == [(0, "r"), (1, "d")]


def test_parent_cycle_terminates_and_keeps_every_entry(tmp_path, db_path):
    lines = [
        header(),
        msg("a", None),
        msg("b", "c", "b points forward to c"),
        msg("c", "b", "c points back to b"),
        msg("s", "s", "its own parent"),
        msg("z", "a", "last"),
    ]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert (f.entries_added, f.lines_quarantined) == (5, 0)
    assert [r[0] for r in entries_of(db_path)] == ["a", "b", "c", "s", "z"]
    notes = q(db_path, "SELECT kind, entry_id, line_no FROM ingest_notes ORDER BY line_no")
    assert {n[0] for n in notes} == {"parent_cycle"}
    assert {n[1] for n in notes} == {"b", "s"}
    assert q(db_path, "SELECT entry_id FROM entries EXCEPT SELECT entry_id FROM branch_entries") == []
    # every leaf path starts at a root (position 0) and has consecutive positions
    for leaf, positions in q(db_path, "SELECT leaf_id, list(position ORDER BY position) FROM branch_entries "
                                      "GROUP BY leaf_id"):
        assert positions == list(range(len(positions))), leaf
    assert q(db_path, "SELECT leaf_id FROM sessions") == [("z",)]
    assert branch_of(db_path, SID, "z") == ["a", "z"]
    assert q(db_path, "SELECT count(*) FROM quarantine") == [(0,)]


def test_dangling_parent_becomes_a_root(tmp_path, db_path):
    lines = [header(), msg("a", None), msg("b", "a", role="assistant"), msg("o", "missing"), msg("p", "o", role="assistant")]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert (f.entries_added, f.lines_quarantined) == (4, 0)
    assert [r[0] for r in entries_of(db_path)] == ["a", "b", "o", "p"]
    assert q(db_path, "SELECT kind, entry_id, line_no FROM ingest_notes") == [("dangling_parent", "o", 4)]
    assert branch_of(db_path, SID, "p") == ["o", "p"]
    assert branch_of(db_path, SID, "b") == ["a", "b"]
    assert q(db_path, "SELECT leaf_id, leaf_count FROM sessions") == [("p", 2)]
    assert quarantine_of(db_path) == []


def test_invalid_utf8_is_read_with_replacement_characters(tmp_path, db_path):
    bad = (b'{"type":"message","id":"e2","parentId":"e1","timestamp":"2026-01-15T14:02:00.000Z",'
           b'"message":{"role":"user","content":[{"type":"text","text":"caf\xe9 \xff\xfe ok"}]}}')
    lines = [header(), msg("e1", None), bad, msg("e3", "e2", role="assistant")]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert (f.entries_added, f.lines_quarantined) == (3, 0)
    got = entries_of(db_path)
    assert got[1] == ("e2", 3, bad.decode("utf-8", errors="replace"))
    assert "caf\ufffd \ufffd\ufffd ok" in got[1][2]
    assert q(db_path, "SELECT is_source, tokens_pi FROM entries WHERE entry_id = 'e2'") == [(True, 3)]  # 10 chars
    assert branch_of(db_path, SID, "e3") == ["e1", "e2", "e3"]


def test_directory_with_good_and_bad_files(tmp_path, db_path):
    root = tmp_path / "sessions"
    g1 = SessionBuilder("dddddddd-0000-0000-0000-000000000001")
    g1.user("one")
    g1.assistant("1")
    g1.write(root / "--p--" / "2026_g1.jsonl")
    g2 = SessionBuilder("dddddddd-0000-0000-0000-000000000002")
    g2.user("two")
    g2.write(root / "deep" / "er" / "2026_g2.jsonl")
    write_lines(root / "--p--" / "nohead.jsonl", [msg("x", None)])
    write_lines(root / "garbage.jsonl", [b"\x00\x01\x02 binary", b"more junk"])
    (root / "empty.jsonl").write_bytes(b"")
    (root / "notes.txt").write_text(header().decode() + "\n")  # not *.jsonl: ignored

    report = ingest(workspace(db_path), [root])
    statuses = {Path(f.path).name: f.status for f in report.files}
    assert statuses == {"2026_g1.jsonl": "new", "2026_g2.jsonl": "new", "nohead.jsonl": "no_header",
                        "garbage.jsonl": "no_header", "empty.jsonl": "no_header"}
    # found by the walk, lines but no header: no session, skipped with one note each, no error
    skipped = {Path(f.path).name: f.notes for f in report.files if f.status == "no_header"}
    assert skipped["garbage.jsonl"] == ["not a Pi session file (no valid session header in 2 line(s)): skipped"]
    assert skipped["nohead.jsonl"] == ["not a Pi session file (no valid session header in 1 line(s)): skipped"]
    assert skipped["empty.jsonl"] == ["empty file: no session header yet"]  # it may still become a session
    assert [f for f in report.files if f.error] == [] and report.missing_paths == []
    assert report.entries_added == 3
    assert q(db_path, "SELECT session_id, entry_count FROM sessions ORDER BY 1") == [
        (g1.session_id, 2), (g2.session_id, 1)]
    assert q(db_path, "SELECT count(*) FROM quarantine") == [(0,)]  # foreign lines are not the sessions' to keep
    # and again: everything unchanged, the same notes
    again = ingest(workspace(db_path), [root])
    assert {f.status for f in again.files} == {"unchanged"}
    assert [f for f in again.files if f.error] == []
    assert {Path(f.path).name: f.notes for f in again.files if f.notes} == {
        "garbage.jsonl": skipped["garbage.jsonl"], "nohead.jsonl": skipped["nohead.jsonl"]}
    # named on the command line, such a file is an error, and its lines stay in quarantine
    named_path = shutil.copy(root / "garbage.jsonl", tmp_path / "named.jsonl")
    [named] = ingest(workspace(db_path), [named_path]).files
    assert named.error and "not a Pi session" in named.error and "\n" not in named.error
    assert q(db_path, "SELECT line_no, reason FROM quarantine ORDER BY ALL") == [(1, "invalid_json"),
                                                                             (2, "invalid_json")]
    ingest(workspace(db_path), [tmp_path])  # found by a walk later: they go
    assert q(db_path, "SELECT count(*) FROM quarantine") == [(0,)]


def test_exclude_globs_leave_out_what_the_walk_finds(tmp_path, db_path):
    root = tmp_path / "sessions"
    for n, where in enumerate(["keep/a.jsonl", "scratch/b.jsonl", "c.log.jsonl", "keep/d.log.jsonl"]):
        b = SessionBuilder(f"eeeeeeee-0000-0000-0000-00000000000{n}")
        b.user(where)
        b.write(root / where)
    names = lambda report: sorted(Path(f.path).relative_to(root).as_posix() for f in report.files)  # noqa: E731
    report = ingest(workspace(db_path), [root], exclude=["*.log.jsonl", "scratch/*"])
    assert names(report) == ["keep/a.jsonl"]
    # a file named on the command line is read whatever the globs say
    report = ingest(workspace(db_path), [root, root / "c.log.jsonl"], exclude=["*.log.jsonl", "scratch/*"])
    assert names(report) == ["c.log.jsonl", "keep/a.jsonl"]
    assert names(ingest(workspace(db_path), [root])) == ["c.log.jsonl", "keep/a.jsonl", "keep/d.log.jsonl",
                                                          "scratch/b.jsonl"]


def test_om_ingest_of_a_folder_with_a_stray_file_exits_0_with_one_note(tmp_path):
    root = tmp_path / "sessions"
    b = SessionBuilder(SID)
    b.user("hello")
    b.write(root / "s.jsonl")
    (root / "tool.log.jsonl").write_text('{"level": "info", "msg": "started"}\n{"level": "info", "msg": "done"}\n')
    db = tmp_path / "om.duckdb"
    for _ in range(2):  # and again, unchanged: a cron job does not fail forever
        done = _om(["--db", str(db), "ingest", str(root)], tmp_path)
        assert done.returncode == 0, done.stderr
        notes = [line for line in done.stderr.splitlines() if "tool.log.jsonl" in line]
        assert len(notes) == 1 and "note" in notes[0] and "not a Pi session file" in notes[0], done.stderr
    assert q(db, "SELECT count(*) FROM quarantine") == [(0,)]
    done = _om(["--db", str(db), "ingest", str(root), "--exclude", "*.log.jsonl"], tmp_path)
    assert done.returncode == 0 and "tool.log.jsonl" not in done.stderr, done.stderr
    done = _om(["--db", str(db), "ingest", str(root / "tool.log.jsonl")], tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("error: ") and "not a Pi session" in done.stderr


def test_a_run_plan_notes_a_stray_file_and_counts_no_error(tmp_path, db_path):
    from om_core.replay.plan import check_targets, ingest_targets, plan_run

    root = tmp_path / "sessions"
    b = SessionBuilder(SID)
    b.user("hello")
    b.write(root / "s.jsonl")
    (root / "tool.log.jsonl").write_text('{"level": "info"}\n')
    (root / "new.jsonl").write_text("")  # Pi created it and has not written its header yet
    ws = workspace(db_path)
    targets = check_targets(ws, [str(root)])
    plan = plan_run(ws, targets, ingest_targets(ws, targets), model="offline", drain=True)
    assert plan.errors == () and plan.session_ids == (SID,) and plan.due == (SID,)
    assert [n.split(": ", 1)[1] for n in sorted(plan.notes)] == [
        "empty file: no session header yet", "not a Pi session file (no valid session header in 1 line(s)): skipped"]
    plan = plan_run(ws, targets, ingest_targets(ws, targets, exclude=["tool.*"]), model="offline", drain=True)
    assert plan.errors == () and plan.notes == ()  # (the empty file is unchanged: nothing new to say)
    with pytest.raises(Exception):  # a value: nothing changes it after the plan
        plan.due = ()


def test_a_plan_has_no_side_effects_the_ingest_is_its_own_step(tmp_path, db_path):
    """``plan_run`` reads only. Given the checked targets without their ingest, a new
    file's session is not in the plan and nothing was written; after the ingest step it is."""
    from om_core.replay.plan import check_targets, ingest_targets, plan_run

    b = SessionBuilder(SID)
    b.user("hello")
    path = b.write(tmp_path / "s.jsonl")
    ws = workspace(db_path)
    ingest(ws, [])  # the database exists, empty
    targets = check_targets(ws, [str(path)])
    before = q(db_path, "SELECT count(*) FROM sessions")
    plan = plan_run(ws, targets, None, model="offline", drain=True)
    assert plan.session_ids == () and plan.due == ()
    assert q(db_path, "SELECT count(*) FROM sessions") == before == [(0,)]
    plan = plan_run(ws, targets, ingest_targets(ws, targets), model="offline", drain=True)
    assert plan.due == (SID,) and q(db_path, "SELECT count(*) FROM sessions") == [(1,)]


def test_missing_path_is_reported_and_others_ingested(tmp_path, db_path):
    b = SessionBuilder(SID)
    b.user("hi")
    good = b.write(tmp_path / "good.jsonl")
    missing = tmp_path / "nope.jsonl"
    missing_dir = tmp_path / "no_such_dir"
    report = ingest(workspace(db_path), [missing, good, missing_dir])
    assert report.missing_paths == [str(missing), str(missing_dir)]
    assert [(Path(f.path).name, f.status) for f in report.files] == [("good.jsonl", "new")]
    assert q(db_path, "SELECT session_id, entry_count FROM sessions") == [(SID, 1)]


# ------------------------------------------------------------------ 6. duplicate sessions


def test_copy_of_an_ingested_session_is_skipped(tmp_path, db_path):
    first = sample_session(SID).write(tmp_path / "a" / "s.jsonl")
    ingest(workspace(db_path), [first])
    before = snapshot(db_path)
    copy = tmp_path / "b" / "s.jsonl"
    copy.parent.mkdir()
    shutil.copy(first, copy)

    f = only(ingest(workspace(db_path), [copy]))
    assert f.status == "duplicate_session"
    assert f.entries_added == 0
    after = snapshot(db_path)
    for table in ("sessions", "entries", "branch_entries", "ingest_notes"):
        assert after[table] == before[table], table
    assert q(db_path, "SELECT file_path FROM sessions") == [(str(first.resolve()),)]


def test_moved_session_file_takes_over(tmp_path, db_path):
    first = sample_session(SID).write(tmp_path / "a" / "s.jsonl")
    ingest(workspace(db_path), [first])
    before = snapshot(db_path, volatile=False)
    moved = tmp_path / "b" / "s.jsonl"
    moved.parent.mkdir()
    first.rename(moved)

    f = only(ingest(workspace(db_path), [moved]))
    assert f.status == "new"
    assert q(db_path, "SELECT file_path FROM sessions") == [(str(moved.resolve()),)]
    after = snapshot(db_path, volatile=False)
    assert after["entries"] == before["entries"]
    assert after["branch_entries"] == before["branch_entries"]
    assert q(db_path, "SELECT file_path, status FROM om_internal.session_files") == [(str(moved.resolve()), "ingested")]


def test_copy_takes_over_once_the_original_is_deleted(tmp_path, db_path):
    first = sample_session(SID).write(tmp_path / "a" / "s.jsonl")
    copy = tmp_path / "b" / "s.jsonl"
    copy.parent.mkdir()
    shutil.copy(first, copy)
    report = ingest(workspace(db_path), [first, copy])
    assert [f.status for f in report.files] == ["new", "duplicate_session"]
    entries_before = snapshot(db_path, volatile=False)["entries"]

    first.unlink()  # the user kept the copy
    f = only(ingest(workspace(db_path), [copy]))
    assert f.status != "duplicate_session"
    assert q(db_path, "SELECT file_path FROM sessions") == [(str(copy.resolve()),)]
    assert snapshot(db_path, volatile=False)["entries"] == entries_before


# ------------------------------------------------------------------ 7. long files: chunked commits, interrupted ingests


def _rows_of_an_interrupted_ingest(db: Path, path: Path, line_nos: list[int]) -> None:
    """What an ingest that died after committing part of a file leaves: entries and quarantine rows after
    the offset recorded in session_files (the record only moves once the whole file is in)."""
    con = duckdb.connect(str(db))
    try:
        for n in line_nos:
            con.execute("INSERT INTO om_internal.entries (session_id, entry_id, parent_id, line_no, entry_index, entry_type, "
                        "is_source, raw, run_id) VALUES (?, ?, NULL, ?, ?, 'message', false, '{}', 'died')",
                        [SID, f"junk{n}", n, n - 1])
            con.execute("INSERT INTO om_internal.quarantine (file_path, session_id, line_no, reason, raw, run_id) "
                        "VALUES (?, ?, ?, 'invalid_json', ?, 'died')", [str(path.resolve()), SID, n, b"junk"])
    finally:
        con.close()


def _long_session() -> SessionBuilder:
    b = sample_session(SID)
    for i in range(40):
        b.user(f"question {i}")
        b.assistant(f"answer {i}")
    return b


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Batches of 5 entries, an INSERT and a COMMIT after every batch; returns the commits made
    inside files, as they grow."""
    from om_core.ingest import reader as reader_mod, writer as writer_mod

    monkeypatch.setattr(reader_mod, "BATCH_ENTRIES", 5)
    monkeypatch.setattr(writer_mod, "INSERT_BYTES", 1)
    monkeypatch.setattr(writer_mod, "COMMIT_BYTES", 1)
    commits: list[int] = []
    flush = writer_mod.BatchWriter.flush

    def counting_flush(self):
        flush(self)
        commits.append(self.commits)

    monkeypatch.setattr(writer_mod.BatchWriter, "flush", counting_flush)
    return commits


def test_rows_left_by_an_interrupted_append_are_replaced(tmp_path, db_path):
    b = SessionBuilder(SID)
    b.user("first")
    b.assistant("one")
    path = b.write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [path])
    n_old = len(b.lines())
    b.user("second")
    b.assistant("two")
    _append(path, b.lines()[n_old:])
    _rows_of_an_interrupted_ingest(db_path, path, [n_old + 1, n_old + 2, n_old + 3])

    f = only(ingest(workspace(db_path), [path]))
    assert (f.status, f.entries_added, f.lines_quarantined) == ("appended", 2, 0)
    assert entries_of(db_path) == [(e["id"], n, line) for n, (e, line) in
                                   enumerate(zip(b.entries, b.lines()[1:]), start=2)]
    assert quarantine_of(db_path) == []
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)


def test_rows_left_by_an_interrupted_first_ingest_are_replaced(tmp_path, db_path):
    path = sample_session(SID).write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [])  # the database exists; the file was never recorded in it
    _rows_of_an_interrupted_ingest(db_path, path, [2, 3, 4])

    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "new"
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)
    assert q(db_path, "SELECT count(*) FROM entries WHERE entry_id LIKE 'junk%'") == [(0,)]


def test_file_committed_in_chunks_equals_one_transaction(tmp_path, db_path, tiny_chunks):
    lines = [line.encode() for line in _long_session().lines()]
    lines.insert(7, b"{oops")
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert f.status == "new" and f.lines_quarantined == 1
    assert max(tiny_chunks) > 5  # committed part by part

    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)


def _fail_on_insert(monkeypatch, after: int) -> None:
    calls = []
    insert = dbmod.insert_arrow

    def failing(con, view_name, table, query_name, params=None):
        if query_name == "insert_entries":
            calls.append(1)
            if len(calls) > after:
                raise OSError("disk full")
        return insert(con, view_name, table, query_name, params)

    monkeypatch.setattr(dbmod, "insert_arrow", failing)


def test_failed_ingest_after_chunk_commits_leaves_nothing_behind(tmp_path, db_path, tiny_chunks, monkeypatch):
    path = _long_session().write(tmp_path / "s.jsonl")
    with monkeypatch.context() as m:
        _fail_on_insert(m, after=4)
        f = only(ingest(workspace(db_path), [path]))
    assert f.status == "error" and "disk full" in f.error
    assert max(tiny_chunks) >= 3  # part of the file had been committed when it failed
    for table in ("entries", "quarantine", "sessions", "branch_entries", "om_internal.session_files"):
        assert q(db_path, f"SELECT count(*) FROM {table}") == [(0,)], table

    assert only(ingest(workspace(db_path), [path])).status == "new"
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)


def test_failed_append_after_chunk_commits_keeps_the_earlier_state(tmp_path, db_path, tiny_chunks, monkeypatch):
    b = sample_session(SID)
    path = b.write(tmp_path / "s.jsonl")
    ingest(workspace(db_path), [path])
    before = snapshot(db_path, volatile=False)
    n_old = len(b.lines())
    for i in range(40):
        b.user(f"more {i}")
    _append(path, b.lines()[n_old:])
    with monkeypatch.context() as m:
        _fail_on_insert(m, after=4)
        assert only(ingest(workspace(db_path), [path])).status == "error"
    assert max(tiny_chunks) >= 3
    assert snapshot(db_path, volatile=False) == before

    f = only(ingest(workspace(db_path), [path]))
    assert (f.status, f.entries_added) == ("appended", 40)
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [path])
    assert snapshot(db_path, volatile=False) == snapshot(fresh, volatile=False)


def test_token_counts_match_tiktoken_for_each_entry(tmp_path, db_path, tiny_chunks):
    """Counts come from joined tokenizer calls (texts separated by <|endoftext|>); each entry's count
    must still be what encode_ordinary gives its text, whatever the text holds."""
    from om_core.pi.tokens import get_encoding

    texts = ["", " ", "plain words", "  leading and trailing  ", "\n\nnew\nlines\n", "<|endoftext|> inside",
             "a<|endofprompt|>b", "emoji 😀 and naïve", "x\ud800y lone surrogate", "'s 12345 ?!\n", "tab\tend\t"]
    b = SessionBuilder(SID)
    ids = []
    for i in range(3):  # several batches, so some are counted apart from the others
        for t in texts:
            ids.append(b.user(t + str(i) if i else t))
    # JSON escapes keep the lone surrogate intact through the file (as JSON.stringify would write it)
    lines = [b.lines()[0].encode()] + [json.dumps(e).encode() for e in b.entries]
    path = write_lines(tmp_path / "s.jsonl", lines)
    f = only(ingest(workspace(db_path), [path]))
    assert (f.status, f.entries_added) == ("new", len(ids))
    enc = get_encoding()
    got = dict(q(db_path, "SELECT entry_id, tokens FROM entries"))
    by_id = {e["id"]: e for e in b.entries}
    for entry_id in ids:
        text = by_id[entry_id]["message"]["content"]
        text = text if isinstance(text, str) else "".join(c.get("text", "") for c in text)
        assert got[entry_id] == len(enc.encode_ordinary(text)), (entry_id, text)


# ------------------------------------------------------------------ 9. the real sample sessions


@pytest.fixture(scope="module")
def real_db(tmp_path_factory) -> tuple[Path, Path, Path]:
    large = shared_session("large-session.jsonl")
    before = shared_session("before-compaction.jsonl")
    db = tmp_path_factory.mktemp("real") / "om.duckdb"
    report = ingest(workspace(db), [large, before])
    assert [f.status for f in report.files] == ["new", "new"]
    assert report.lines_quarantined == 0
    return db, large, before


LARGE_ID = "d703a1a9-1b7b-4fb1-b512-c9738b1fe617"
BEFORE_ID = "ffae836b-9420-4060-ac13-7745215f90ff"


@pytest.mark.real_sessions
def test_real_sessions_branches_and_sources(real_db):
    db, _, _ = real_db
    got = q(db, "SELECT s.session_id, s.version, s.entry_count, s.source_count, s.leaf_count, "
                "(SELECT count(*) FROM current_branches c WHERE c.session_id = s.session_id), "
                "(SELECT count(*) FILTER (WHERE e.is_source) FROM current_branches c JOIN entries e "
                "   ON e.session_id = c.session_id AND e.entry_id = c.entry_id WHERE c.session_id = s.session_id) "
                "FROM sessions s ORDER BY s.session_id")
    assert got == [(LARGE_ID, 1, 1018, 914, 1, 1018, 914), (BEFORE_ID, 1, 1002, 990, 1, 1002, 990)]
    for sid, n in ((LARGE_ID, 1018), (BEFORE_ID, 1002)):
        (leaf,) = q(db, "SELECT leaf_id FROM sessions WHERE session_id = ?", [sid])[0]
        assert q(db, "SELECT count(*), min(position), max(position) FROM branch(?, ?)", [sid, leaf]) == [(n, 0, n - 1)]
        # the leaf is the last line of the file
        assert q(db, "SELECT line_no FROM entries WHERE session_id = ? AND entry_id = ?", [sid, leaf]) == [(n + 1,)]


@pytest.mark.real_sessions
def test_real_sessions_compactions_resolve_to_lines(real_db):
    db, _, _ = real_db
    got = q(db, "SELECT c.line_no, k.line_no, k.entry_type, k.role FROM entries c "
                "JOIN entries k ON k.session_id = c.session_id AND k.entry_id = c.first_kept_entry_id "
                "WHERE c.entry_type = 'compaction' ORDER BY c.line_no")
    assert got == [(360, 294, "message", "user"), (629, 552, "message", "user")]
    assert q(db, "SELECT count(*) FROM entries WHERE entry_type = 'compaction' AND session_id = ?", [BEFORE_ID]) == [(2,)]


@pytest.mark.real_sessions
def test_real_sessions_are_lossless(real_db):
    db, large, before = real_db
    for sid, path in ((LARGE_ID, large), (BEFORE_ID, before)):
        file_lines = path.read_bytes().decode("utf-8").split("\n")
        stored = q(db, "SELECT line_no, raw FROM entries WHERE session_id = ? ORDER BY line_no", [sid])
        assert stored == [(n, file_lines[n - 1]) for n in range(2, len(stored) + 2)]
        assert file_lines[len(stored) + 1:] == [""]


# ------------------------------------------------------------------ write errors


def test_a_file_failing_with_batches_still_queued_does_not_stall_the_read_ahead(tmp_path, db_path, monkeypatch):
    """The read-ahead thread waits while its queued batches exceed the budget; a file that fails after
    the thread read it to the end must give its queued batches back, or both threads wait for ever."""
    import threading
    import time

    from om_core.ingest import file_ingest, read_ahead

    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", 1)
    paths = []
    for n in range(3):
        b = SessionBuilder(f"0a0b0c0d-1111-2222-3333-44444444444{n}")
        for i in range(20):
            (b.user if i % 2 == 0 else b.assistant)(f"line {i} of file {n}")
        paths.append(b.write(tmp_path / f"s{n}.jsonl"))
    claim = file_ingest.FileIngest._claim_session

    def failing_claim(self, session_id):
        if self.path.name == "s0.jsonl":
            deadline = time.monotonic() + 5
            while not self.reader.done and time.monotonic() < deadline:
                time.sleep(0.01)  # the read-ahead thread has queued the rest of the file
            raise ValueError("this file cannot be stored")
        return claim(self, session_id)

    monkeypatch.setattr(file_ingest.FileIngest, "_claim_session", failing_claim)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(report=ingest(workspace(db_path), paths)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the ingest waits for ever"
    statuses = [(Path(f.path).name, f.status) for f in result["report"].files]
    assert statuses == [("s0.jsonl", "error"), ("s1.jsonl", "new"), ("s2.jsonl", "new")]


def test_storage_errors_name_the_path_and_the_cause():
    from om_core.errors import storage_error

    wal = duckdb.TransactionException('TransactionContext Error: Failed to commit: Could not write file '
                                      '"/data/om.duckdb.wal": No space left on device')
    assert str(storage_error(wal)) == "cannot write /data/om.duckdb.wal: No space left on device"
    ro = OSError(30, "Read-only file system", "/data/om.duckdb")
    assert str(storage_error(ro)) == "cannot write /data/om.duckdb: Read-only file system"
    assert storage_error(OSError("disk full")) is None  # not a storage error DuckDB or the OS reports
    assert storage_error(ValueError("bad line")) is None


def _om(args: list[str], cwd: Path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("OM_")}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env={**env, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=120)  # the timeout: nothing waits for ever


def test_a_full_disk_ends_the_ingest_with_one_line_and_keeps_what_was_committed(tmp_path, small_fs):
    mount, remount = small_fs
    incompressible_sessions(tmp_path / "in")
    db = mount / "om.duckdb"
    for attempt in ("first", "retry on the still full disk"):
        done = _om(["--db", str(db), "ingest", str(tmp_path / "in")], tmp_path)
        assert done.returncode == 1, (attempt, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (attempt, done.stderr)
        assert str(mount) in lines[0] and "No space left on device" in lines[0], (attempt, lines)
        assert "Traceback" not in done.stderr
    # what was committed is readable and whole: every listed session has all its entries
    reference = tmp_path / "reference.duckdb"
    ingest(workspace(reference), [tmp_path / "in"])
    listed = _om(["--db", str(db), "sessions", "--json"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    expected = {r[0]: r[1] for r in q(reference, "SELECT session_id, entry_count FROM sessions")}
    got = {s["session_id"]: s["entry_count"] for s in json.loads(listed.stdout)}
    assert got and len(got) < len(expected)  # some files fitted, not all
    assert all(got[sid] == expected[sid] for sid in got)
    # with space again, the same command completes and the result is as if the disk had never filled
    remount("size=200m")
    done = _om(["--db", str(db), "ingest", str(tmp_path / "in")], tmp_path)
    assert done.returncode == 0, done.stderr
    shutil.copy(db, tmp_path / "copy.duckdb")
    if (mount / "om.duckdb.wal").exists():
        shutil.copy(mount / "om.duckdb.wal", tmp_path / "copy.duckdb.wal")
    assert snapshot(tmp_path / "copy.duckdb", volatile=False) == snapshot(reference, volatile=False)


def test_a_read_only_filesystem_is_one_line_and_reads_still_work(tmp_path, small_fs):
    mount, remount = small_fs
    first = SessionBuilder(SID)
    first.user("hello")
    db = mount / "om.duckdb"
    assert _om(["--db", str(db), "ingest", str(first.write(tmp_path / "a.jsonl"))], tmp_path).returncode == 0
    remount("ro")
    second = SessionBuilder("0a0b0c0d-1111-2222-3333-555555555555")
    second.user("more")
    done = _om(["--db", str(db), "ingest", str(second.write(tmp_path / "b.jsonl"))], tmp_path)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert str(mount) in line and "Read-only file system" in line
    listed = _om(["--db", str(db), "sessions", "--json"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [s["session_id"] for s in json.loads(listed.stdout)] == [SID]


# ------------------------------------------------------------------ lines JSON.parse reads


def lone(text: str) -> str:
    """``text`` with a lone surrogate: json.dumps writes it as the escape ``\\ud800`` (valid JSON)."""
    return text + "\ud800"


def test_lone_surrogates_in_ids_and_fields_keep_every_good_line(tmp_path, db_path):
    """Node's JSON.parse reads a lone surrogate escape; DuckDB cannot store one. The entry is kept
    with the surrogate written as its escape, the raw line as written, and every other line too."""
    b = SessionBuilder(SID)
    e1 = b.user("hello")
    e2 = b.assistant("hi")
    lines = b.lines()
    base = b.entries[-1]
    weird = [
        {**base, "id": lone("id-")},  # an id
        {**base, "id": "child", "parentId": lone("id-")},  # a parentId pointing at it
        {"type": "custom", "id": "c1", "parentId": "child", "timestamp": TS.format(3), "customType": lone("ext."),
         "data": {}},  # a customType
        {**base, "id": "r1", "parentId": "c1", "message": {**base["message"], "role": lone("assistant")}},  # a role
        {**base, "id": "t1", "parentId": "r1", "timestamp": lone("2026-")},  # a timestamp
        {**base, "id": "u1", "parentId": "t1", "message": {"role": "user", "content": lone("text "),
                                                           "timestamp": 1}},  # message text
        {**base, "id": "g1", "parentId": "u1"},  # a good line after them
    ]
    path = tmp_path / "s.jsonl"
    written = lines + [json.dumps(w) for w in weird]
    assert all("\\ud800" in line for line in written[3:-1])
    path.write_text("\n".join(written) + "\n", encoding="utf-8")
    report = ingest(workspace(db_path), [path])
    assert report.summary()["errors"] == []
    assert report.entries_added == 2 + len(weird) and report.lines_quarantined == 0
    rows = {r[0]: r[1:] for r in q(db_path, "SELECT entry_id, parent_id, custom_type, role, ts, raw, line_no "
                                            "FROM entries WHERE session_id = ?", [SID])}
    assert set(rows) == {e1, e2, "id-\\ud800", "child", "c1", "r1", "t1", "u1", "g1"}
    assert rows["child"][0] == "id-\\ud800"  # the escaped forms still link
    assert rows["c1"][1] == "ext.\\ud800" and rows["r1"][2] == "assistant\\ud800"
    assert rows["t1"][3] is None  # not a timestamp, to Pi either
    for line_no, line in enumerate(written, start=1):
        if line_no > 1:
            assert [r for r in rows.values() if r[5] == line_no][0][4] == line  # raw text as written
    # the branch runs through every entry to the last one
    leaf = q(db_path, "SELECT leaf_id FROM sessions WHERE session_id = ?", [SID])[0][0]
    assert leaf == "g1"
    branch = [r[0] for r in q(db_path, "SELECT entry_id FROM branch_detail(?, ?) ORDER BY position", [SID, leaf])]
    assert branch == [e1, "id-\\ud800", "child", "c1", "r1", "t1", "u1", "g1"]
    # Pi's estimate measures the text as parsed: "text " and one UTF-16 unit, not the 6-char escape
    assert q(db_path, "SELECT tokens_pi FROM entries WHERE entry_id = 'u1'") == [(math.ceil(6 / 4),)]


@pytest.mark.parametrize("field, value", [("id", lone("0a0b")), ("cwd", lone("/home/")), ("timestamp", lone("2026")),
                                          ("parentSession", lone("/s/"))])
def test_lone_surrogate_in_a_header_field_keeps_the_file(tmp_path, db_path, field, value):
    b = SessionBuilder(SID)
    b.user("hello")
    b.assistant("hi")
    lines = b.lines()
    header_obj = {**json.loads(lines[0]), field: value}
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join([json.dumps(header_obj)] + lines[1:]) + "\n", encoding="utf-8")
    report = ingest(workspace(db_path), [path])
    assert report.summary()["errors"] == [] and report.entries_added == 2
    sid = SID if field != "id" else value.replace("\ud800", "\\ud800")
    expected = {"id": ("session_id", sid), "cwd": ("cwd", "/home/\\ud800"), "timestamp": ("started_at", None),
                "parentSession": ("parent_session", "/s/\\ud800")}[field]
    assert q(db_path, f"SELECT session_id, {expected[0]}, header FROM sessions") == [
        (sid, expected[1], json.dumps(header_obj))]


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("depth", [1_000, 10_000])
def test_deep_nesting_is_read_as_deep_as_pi(tmp_path, db_path, depth):
    """JSON.parse reads 10,000 levels (Python's parser stops near 1,000): such an entry is kept, and
    Pi's estimate counts its tool-call arguments' JSON (2 characters a level)."""
    b = SessionBuilder(SID)
    b.user("hello")
    deep_call = b.assistant(None, tool_calls=[("c1", "f", {})])
    b.tool_result("c1", "f", "done")
    after = b.assistant("after")
    lines = b.lines()
    call_obj = json.loads(lines[2])
    call_obj["message"]["content"][0]["arguments"] = "__DEEP__"
    call_obj["details"] = "__DEEP__"
    lines[2] = json.dumps(call_obj).replace('"__DEEP__"', "[" * depth + "]" * depth)
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = ingest(workspace(db_path), [path])
    assert report.summary()["errors"] == [] and report.lines_quarantined == 0
    assert report.entries_added == 4
    assert q(db_path, "SELECT tokens_pi, raw FROM entries WHERE entry_id = ?", [deep_call]) == [
        (math.ceil((len("f") + 2 * depth) / 4), lines[2])]
    assert q(db_path, "SELECT leaf_id FROM sessions") == [(after,)]


def test_a_deeply_nested_entry_goes_through_the_workers_and_the_replay(tmp_path, db_path, server):
    """What reads the stored entry again (observer input, offline baseline, cut points) reads it
    as deep as the ingest did."""
    from fake_openai import text
    from om_core.model.client import RetryPolicy
    from om_core.replay.engine import replay_session
    from om_core.settings import Settings
    from om_core.replay.stage_runner import observe_now
    from om_core.workers.run_config import ModelConfig, make_brain
    from om_core.store.workspace import Workspace

    depth = 10_000
    b = SessionBuilder(SID)
    b.user("Please run the nested call.")
    b.assistant(None, tool_calls=[("c1", "f", {})])
    b.tool_result("c1", "f", "done")
    b.assistant("Done: the call returned.")
    lines = b.lines()
    call_obj = json.loads(lines[2])
    call_obj["message"]["content"][0]["arguments"] = "__DEEP__"
    lines[2] = json.dumps(call_obj).replace('"__DEEP__"', "[" * depth + "]" * depth)
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ingest(workspace(db_path), [path])
    server.add(text("nothing to record"))
    config = ModelConfig(model="openai/fake-model", api_base=server.base_url, retry=RetryPolicy(attempts=1))
    outcome = observe_now(Workspace.open(db_path, settings=Settings(observerToolMaxTokens=0)), SID, None, config)
    assert outcome.error is None
    assert "f(" + "[" * depth + "]" * depth + ")" in server.sent_text()  # shown whole: its tool parts are not cut
    settings = Settings(observeAfterTokens=10, reflectAfterTokens=20, compactAfterTokens=30, keepRecentTokens=10)
    con = dbmod.connect(db_path)
    try:
        replay_session(Workspace.on_connection(con, settings), SID, make_brain(ModelConfig(model="offline"), settings))
    finally:
        con.close()
    assert q(db_path, "SELECT count(*) FROM ledger WHERE origin = 'pipeline'")[0][0] >= 1


def test_nesting_deeper_than_the_limit_is_quarantined_in_one_line(tmp_path, db_path, monkeypatch):
    from om_core.pi import session as sessionmod

    monkeypatch.setattr(sessionmod, "DEEP_NESTING_LEVELS", 2_000)
    b = SessionBuilder(SID)
    b.user("hello")
    lines = b.lines()
    lines.append('{"type": "custom", "id": "x", "parentId": null, "data": ' + "[" * 9_000 + "]" * 9_000 + "}")
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = ingest(workspace(db_path), [path])
    assert report.entries_added == 1 and report.lines_quarantined == 1
    ((reason, detail),) = q(db_path, "SELECT reason, detail FROM quarantine")
    assert reason == "too_deep" and "\n" not in detail


def test_an_ingest_error_is_one_line(tmp_path, db_path, monkeypatch):
    from om_core.ingest import plan as planmod

    def broken(*args, **kwargs):
        raise ValueError("first line\n  second line\n    third line")

    monkeypatch.setattr(planmod, "plan_file", broken)
    b = SessionBuilder(SID)
    b.user("hello")
    report = ingest(workspace(db_path), [b.write(tmp_path / "s.jsonl")])
    (error,) = [f.error for f in report.files]
    assert error == "ValueError: first line second line third line"


# ------------------------------------------------------------------ migration 004


def test_a_database_migrated_from_003_has_the_tree_of_a_fresh_ingest(tmp_path, db_path):
    """A database built at migration 003 (branch_entries was a table, there was no entry_tree) with
    stored entries gets, when migrated forward, the entry_tree a fresh ingest of the same files stores:
    branches, a dangling parent, cycles, a duplicate id."""
    b = sample_session(SID)
    b.go(b.entries[1]["id"])
    b.user("a second branch")
    b.assistant("on it")
    branched = b.write(tmp_path / "branched.jsonl")
    odd_sid = "0a0b0c0d-1111-2222-3333-555555555555"
    odd = write_lines(tmp_path / "odd.jsonl", [
        header(odd_sid), msg("a", None), msg("b", "c", "forward"), msg("c", "b", "back"), msg("s", "s", "self"),
        msg("o", "missing"), msg("d", "a", "old"), msg("p", "o", role="assistant"), msg("d", "a", "new"),
        msg("x", "y", "three"), msg("y", "z", "in a"), msg("z", "x", "ring")])
    paths = [branched, odd]
    if (SHARED_SESSIONS / "large-session.jsonl").exists():
        paths.append(shared_session("large-session.jsonl"))
    ingest(workspace(db_path), paths)

    old = legacy_copy(db_path, tmp_path / "at003.duckdb", through=3)  # as om stored it at 003
    assert q(old, "SELECT max(version) FROM schema_migrations") == [(3,)]
    dbmod.connect(old).close()  # a writer migrates it forward

    tree = "SELECT * FROM entry_tree ORDER BY ALL"
    assert len(q(old, tree)) == len(q(db_path, "SELECT * FROM entries")) > 20
    assert q(old, tree) == q(db_path, tree)
    assert q(old, "SELECT * FROM branch_entries ORDER BY ALL") == q(db_path, "SELECT * FROM branch_entries ORDER BY ALL")
