"""Lines appended to a session file extend the stored entry tree instead of deriving it whole: after each
append the tree, its notes and the session row are those a fresh ingest of the same file stores, for an
append at the leaf, a new branch from the middle of the tree, a new root, a dangling parent, and an
append that resolves an old dangling parent (that one derives the tree whole again)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import SessionBuilder
from conftest import workspace
from om_core.ingest import ingest
import om_core.ingest.file_ingest as file_ingest

TABLES = {
    "tree": "SELECT entry_id, depth, pre, last, is_leaf FROM om_internal.entry_tree ORDER BY pre",
    "notes": "SELECT session_id, line_no, entry_id, kind, detail FROM om_internal.ingest_notes ORDER BY ALL",
    "session": "SELECT session_id, leaf_id, entry_count, source_count, leaf_count, tokens_pi, tokens "
               "FROM om_internal.sessions",
}


def stored(db) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {name: con.execute(sql).fetchall() for name, sql in TABLES.items()}
    finally:
        con.close()


@pytest.fixture
def whole_trees(monkeypatch):
    """The sessions whose tree an ingest derived whole (the append path not taken)."""
    derived: list[str] = []
    store_tree = file_ingest.store_tree

    def counted(con, session_id, forest):
        derived.append(session_id)
        return store_tree(con, session_id, forest)

    monkeypatch.setattr(file_ingest, "store_tree", counted)
    return derived


def test_an_append_extends_the_tree_as_a_fresh_ingest_derives_it(tmp_path, whole_trees):
    sb = SessionBuilder()
    ids = [sb.user("Set up the invoices table."), sb.assistant("Created invoices with an amount.")]
    for n in range(4):
        ids.append(sb.user(f"Step {n}: add column c{n}."))
        ids.append(sb.assistant(f"Added column c{n}."))
    live, fresh_dir = tmp_path / "live.jsonl", tmp_path / "fresh"
    fresh_dir.mkdir()
    sb.write(live)
    db = tmp_path / "live.duckdb"
    ws = workspace(db)
    ingest(ws, [live])
    assert whole_trees == [sb.session_id]

    def appended(expect_whole: bool = False) -> None:
        whole_trees.clear()
        sb.write(live)
        report = ingest(ws, [live]).files[0]
        assert report.status == "appended" and report.entries_added
        assert whole_trees == ([sb.session_id] if expect_whole else [])
        fresh = tmp_path / f"fresh-{len(sb.entries)}.duckdb"
        shutil.copy(live, fresh_dir / live.name)
        ingest(workspace(fresh), [fresh_dir / live.name])
        assert stored(db) == stored(fresh)

    sb.user("Now add an index on the due date.")  # at the leaf: the common live append
    appended()

    sb.assistant("Indexed due_date.")  # at the leaf, then a new branch from the middle, both at once
    sb.go(ids[3])
    sb.user("Instead, rename c0 to amount_cents.")
    sb.assistant("Renamed it.")
    appended()

    sb.go(ids[1])  # another branch, from further up: the intervals of both earlier branches move
    sb.user("Start over: a table for credit notes.")
    sb.go(None)  # a second root
    sb.user("Unrelated: what is the time zone of the server?")
    sb.go("feedface")  # a parent that is not in the file: a root, with its note
    dangling = sb.user("Where was I?")
    sb.assistant("You were on the invoices schema.")
    appended()
    assert any(row[3] == "dangling_parent" and row[2] == dangling for row in stored(db)["notes"])

    sb.go(dangling)  # the tree has a note now: derived whole from here on
    sb.assistant("Also the credit notes.")
    appended(expect_whole=True)


def test_an_append_that_resolves_a_dangling_parent_derives_the_tree_whole(tmp_path, whole_trees):
    sb = SessionBuilder()
    sb.user("First question.")
    sb.go("0badcafe")
    orphan = sb.user("A message whose parent comes later.")
    live = tmp_path / "live.jsonl"
    sb.write(live)
    db = tmp_path / "live.duckdb"
    ws = workspace(db)
    ingest(ws, [live])
    sb.go(None)
    sb.append({"type": "message", "message": {"role": "user", "content": "The parent at last.", "timestamp": sb.ms()}},
              entry_id="0badcafe")
    sb.write(live)
    whole_trees.clear()
    assert ingest(ws, [live]).files[0].status == "appended"
    assert whole_trees == [sb.session_id]
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    shutil.copy(live, fresh_dir / live.name)
    ingest(workspace(tmp_path / "fresh.duckdb"), [fresh_dir / live.name])
    assert stored(db) == stored(tmp_path / "fresh.duckdb")
    assert next(depth for entry_id, depth, *_ in stored(db)["tree"] if entry_id == orphan) == 1  # no longer a root


# Each example is a few ingests of a small file (~0.1 s of CPU each): at most this many examples, also in
# CI's profile, keep the property a few seconds of the suite.
APPEND_EXAMPLES = 30


@settings(max_examples=min(settings.default.max_examples, APPEND_EXAMPLES))
@given(rounds=st.lists(st.lists(st.integers(min_value=-1, max_value=40), min_size=1, max_size=6), min_size=1,
                       max_size=3))
def test_any_appends_extend_the_tree_as_a_fresh_ingest_derives_it(rounds):
    """Rounds of appended entries, each hanging from an entry drawn from those written so far (-1: a new
    root): after every round the stored tree, notes and session row equal a fresh ingest's."""
    sb = SessionBuilder()
    ids = [sb.user("Set up the invoices table."), sb.assistant("Created invoices with an amount.")]
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        live, fresh_dir = tmp / "live.jsonl", tmp / "fresh"
        fresh_dir.mkdir()
        sb.write(live)
        ws = workspace(tmp / "live.duckdb")
        ingest(ws, [live])
        for n, parents in enumerate(rounds):
            for k, drawn in enumerate(parents):
                sb.go(None if drawn < 0 else ids[drawn % len(ids)])
                ids.append(sb.user(f"Round {n}, entry {k}."))
            sb.write(live)
            assert ingest(ws, [live]).files[0].status == "appended"
            shutil.copy(live, fresh_dir / live.name)
            fresh = tmp / f"fresh-{n}.duckdb"
            ingest(workspace(fresh), [fresh_dir / live.name])
            assert stored(tmp / "live.duckdb") == stored(fresh)
