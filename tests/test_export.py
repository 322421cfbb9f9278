"""Export to Pi: records in the extension's wire format, on the right branch, re-linked as Pi would
have appended them; ingesting the exported file gives the same memory."""

from __future__ import annotations

import json

import pytest
from builders import SessionBuilder
from typer.testing import CliRunner

from om_core import db as dbmod
from om_core.cli import app
from om_core.ingest import ingest
from om_core.replay import replay_in_process
from om_core.session import parse_lines
from om_core.settings import Settings
from om_core.tree import build_forest
from om_core.workspace import Workspace
from om_core.workers.stages import ModelConfig, make_brain

SETTINGS = Settings(observeAfterTokens=120, reflectAfterTokens=250, compactAfterTokens=600, keepRecentTokens=150,
                    observationsPoolMaxTokens=400, observationsPoolTargetTokens=200)


def branched_session(tmp_path, version: int | None = 3):
    b = SessionBuilder(version=version)
    for i in range(5):
        b.user(f"Please build part {i}; it must stay offline and use DuckDB. " * 4)
        b.assistant(f"Built part {i} and the tests pass. " * 4, tool_calls=[(f"c{i}", "edit", {"path": f"p{i}.py"})])
        b.tool_result(f"c{i}", "edit", "ok " * 30)
    if version is not None:
        fork = b.entries[5]["id"]
        b.go(fork)
        b.branch_summary("Explored another design and came back.")
        for i in range(3):
            b.user(f"Different direction {i}: never call the network. " * 4)
            b.assistant(f"Done with direction {i}. " * 4)
    return b.write(tmp_path / "session.jsonl")


def run(cli_args: list[str]) -> str:
    result = CliRunner().invoke(app, cli_args)
    assert result.exit_code == 0, result.output
    return result.stdout


def replayed_db(tmp_path, path):
    db_path = tmp_path / "om.duckdb"
    session_id = ingest(db_path, [path]).files[0].session_id
    con = dbmod.connect(db_path)
    try:
        brain = make_brain(ModelConfig(model="offline"), SETTINGS)
        replay_in_process(Workspace.on_connection(con, SETTINGS), session_id, brain)
    finally:
        con.close()
    return db_path, session_id


@pytest.mark.parametrize("version", [3, None], ids=["v3", "v1"])
def test_round_trip_gives_identical_memory(tmp_path, version):
    path = branched_session(tmp_path, version)
    db_path, session_id = replayed_db(tmp_path, path)
    out = tmp_path / "exported.jsonl"
    report = json.loads(run(["--db", str(db_path), "export", session_id, "--out", str(out), "--json"]))
    assert report["records"] > 3
    fresh = tmp_path / "fresh.duckdb"
    imported = ingest(fresh, [out]).files[0]
    assert imported.ledger["records"] == report["records"] and imported.ledger["invalid"] == 0
    with dbmod.reading(db_path) as con:
        leaves = [r[0] for r in con.execute("SELECT DISTINCT leaf_id FROM branch_entries WHERE session_id = ?",
                                            [session_id]).fetchall()]
        points = [r[0] for r in con.execute("SELECT entry_id FROM entries WHERE session_id = ? AND role = 'user'",
                                            [session_id]).fetchall()]
    for leaf in leaves:
        # records anchored at the leaf became entries after it: the exported branch ends at the last one
        with dbmod.reading(fresh) as con:
            fresh_leaf = con.execute("SELECT min(leaf_id) FROM branch_entries WHERE session_id = ? AND entry_id = ?",
                                     [session_id, leaf]).fetchall()[0][0]
        full_a = run(["--db", str(db_path), "view", session_id, "--leaf", leaf, "--full", "--json"])
        full_b = run(["--db", str(fresh), "view", session_id, "--leaf", fresh_leaf, "--full", "--json"])
        assert json.loads(full_a) == json.loads(full_b)
        assert json.loads(full_a)["observations"], "nothing was observed"
        for first_kept in points[-3:]:
            args = ["compact", session_id, "--first-kept", first_kept, "--json"]
            a = CliRunner().invoke(app, ["--db", str(db_path), *args, "--leaf", leaf])
            b = CliRunner().invoke(app, ["--db", str(fresh), *args, "--leaf", fresh_leaf])
            assert a.exit_code == b.exit_code
            if a.exit_code == 0:
                assert json.loads(a.stdout) == json.loads(b.stdout)


def test_records_are_linked_as_if_appended_live(tmp_path):
    path = branched_session(tmp_path)
    db_path, session_id = replayed_db(tmp_path, path)
    out = tmp_path / "exported.jsonl"
    run(["--db", str(db_path), "export", session_id, "--out", str(out)])
    lines = out.read_bytes().split(b"\n")
    header, entries, rejected = parse_lines([line for line in lines if line])
    assert header.version == 3 and rejected == []
    original = {e.entry_id: e for e in parse_lines(path.read_bytes().split(b"\n")[:-1])[1]}
    records = [e for e in entries if e.entry_type == "custom"]
    assert records and all(r.custom_type.startswith("om.") for r in records)
    by_id = {e.entry_id: e for e in entries}
    for r in records:
        parent = by_id[r.parent_id]
        assert parent.entry_id in original or parent.entry_type == "custom"  # right after its anchor
        assert list(r.obj["data"]) [-1] == "coversUpToId"
    # every original entry keeps its id, and its parent is its original parent or a record chain after it
    for e in entries:
        if e.entry_id in original and original[e.entry_id].parent_id is not None:
            node = by_id[e.parent_id]
            while node.entry_type == "custom" and node.entry_id not in original:
                node = by_id[node.parent_id]
            assert node.entry_id == original[e.entry_id].parent_id
    forest = build_forest((e.entry_id, e.parent_id, e.line_no) for e in entries)
    assert len(forest.leaves()) == 2  # still the same two branches
    # the file itself is untouched, and refusing to overwrite it is enforced
    result = CliRunner().invoke(app, ["--db", str(db_path), "export", session_id, "--out", str(path)])
    assert result.exit_code != 0


# ------------------------------------------------------------------ the drain respects Pi's cut point (SPEC §9)

DRAIN_SETTINGS = Settings(observeAfterTokens=1_000_000, reflectAfterTokens=1_000_000, compactAfterTokens=1_000_000,
                          keepRecentTokens=400)


def finished_sample(tmp_path):
    b = SessionBuilder("d7a1c0de-0000-4000-8000-000000000003")
    b.system("You are Pi, a coding agent.")
    b.user("We must never call the network from the tests; always use DuckDB for storage.")
    b.work_turns(8, "ledger")
    return b, b.write(tmp_path / "finished.jsonl")


def test_the_drain_ends_its_chunks_before_pis_cut_point_and_the_next_compaction_holds_them(tmp_path):
    """After the replay and an export of a finished sample, compacting the exported file at Pi's cut
    point renders a summary holding every drained observation of the history before the cut."""
    b, path = finished_sample(tmp_path)
    db_path = tmp_path / "om.duckdb"
    session_id = ingest(db_path, [path]).files[0].session_id
    con = dbmod.connect(db_path)
    try:
        brain = make_brain(ModelConfig(model="offline"), DRAIN_SETTINGS)
        (report,) = replay_in_process(Workspace.on_connection(con, DRAIN_SETTINGS), session_id, brain)
    finally:
        con.close()
    assert report.drained and report.stages.get("observer:recorded", 0) >= 2
    out = tmp_path / "exported.jsonl"
    run(["--db", str(db_path), "export", session_id, "--out", str(out)])
    fresh = tmp_path / "fresh.duckdb"
    ingest(fresh, [out])
    cut = json.loads(run(["--db", str(fresh), "cutpoint", session_id, "--keep-recent", "400", "--json"]))
    original = json.loads(run(["--db", str(db_path), "cutpoint", session_id, "--keep-recent", "400", "--json"]))
    assert cut["firstKeptEntryId"] == original["firstKeptEntryId"]  # the records after the tip change nothing
    first_kept = cut["firstKeptEntryId"]
    position = {e["id"]: i for i, e in enumerate(b.entries)}
    f = position[first_kept]
    with dbmod.reading(fresh) as con:
        records = con.execute(
            "SELECT r.covers_up_to_id, list(o.obs_id ORDER BY o.item_index), list(o.source_entry_ids) "
            "FROM ledger_records r JOIN ledger_observations o ON o.session_id = r.session_id AND o.ledger_id = r.ledger_id "
            "WHERE r.session_id = ? GROUP BY r.ledger_id, r.covers_up_to_id, r.append_seq ORDER BY r.append_seq",
            [session_id]).fetchall()
    before = [ids for covers, ids, _ in records if position[covers] < f]
    after = [ids for covers, ids, _ in records if position[covers] >= f]
    assert before and after  # a chunk for the history before F, and the kept tail as a chunk of its own
    last_source_before_f = max(p for p, e in enumerate(b.entries[:f]) if e["type"] == "message"
                               and e["message"]["role"] != "system")
    assert any(position[covers] == last_source_before_f for covers, _, _ in records)  # ends exactly before F
    for covers, _, sources in records:  # no chunk crosses F
        flat = [position[s] for group in sources for s in group]
        assert all(p < f for p in flat) or all(p >= f for p in flat), (covers, flat)
    compacted = json.loads(run(["--db", str(fresh), "compact", session_id, "--first-kept", first_kept, "--json"]))
    drained_before = [i for ids in before for i in ids]
    assert compacted["observations"] == drained_before
    for observation_id in drained_before:
        assert f"[{observation_id}]" in compacted["summary"]
