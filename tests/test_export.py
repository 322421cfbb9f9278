"""Export to Pi: records in the extension's wire format, on the right branch, re-linked as Pi would
have appended them; ingesting the exported file gives the same memory."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
from builders import SessionBuilder
from typer.testing import CliRunner

from conftest import replayed_offline, workspace
from om_core.store import db as dbmod
from flows.cli.main import app
from om_core.errors import InvalidArgument
from om_core.usecases.export import js_iso
from om_core.ingest import ingest
from om_core.replay.engine import replay_session
from om_core.pi.session import parse_lines
from om_core.settings import Settings
from om_core.pi.tree import build_forest
from om_core.store.workspace import Workspace
from om_core.workers.run_config import ModelConfig, make_brain

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


def replayed_db(tmp_path, path, settings=SETTINGS):
    """The file ingested and replayed in this process with the offline baseline."""
    return replayed_offline(tmp_path / "om.duckdb", path, settings)


@pytest.mark.parametrize("version", [3, None], ids=["v3", "v1"])
def test_round_trip_gives_identical_memory(tmp_path, version):
    path = branched_session(tmp_path, version)
    db_path, session_id = replayed_db(tmp_path, path)
    out = tmp_path / "exported.jsonl"
    report = json.loads(run(["--db", str(db_path), "export", session_id, "--out", str(out), "--json"]))
    assert report["records"] > 3
    fresh = tmp_path / "fresh.duckdb"
    imported = ingest(workspace(fresh), [out]).files[0]
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
    said = run(["--db", str(db_path), "export", session_id, "--out", str(out)])
    report = json.loads(run(["--db", str(db_path), "export", session_id, "--out", str(out), "--force", "--json"]))
    entries_word = "entry" if report["entries"] == 1 else "entries"
    relinked_word = "entry" if report["relinked"] == 1 else "entries"
    records_word = "ledger record" if report["records"] == 1 else "ledger records"
    assert (f"{report['entries']} {entries_word} and {report['records']} {records_word}; "
            f"{report['relinked']} {relinked_word} re-linked") in said
    assert "(ies)" not in said and "(s)" not in said
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
    session_id = ingest(workspace(db_path), [path]).files[0].session_id
    con = dbmod.connect(db_path)
    try:
        brain = make_brain(ModelConfig(model="offline"), DRAIN_SETTINGS)
        (report,) = replay_session(Workspace.on_connection(con, DRAIN_SETTINGS), session_id, brain).branches
    finally:
        con.close()
    assert report.drained and report.stages.get("observer:recorded", 0) >= 2
    out = tmp_path / "exported.jsonl"
    run(["--db", str(db_path), "export", session_id, "--out", str(out)])
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [out])
    cut = json.loads(run(["--db", str(fresh), "cutpoint", session_id, "--keep-recent", "400", "--json"]))
    original = json.loads(run(["--db", str(db_path), "cutpoint", session_id, "--keep-recent", "400", "--json"]))
    assert cut["first_kept_entry_id"] == original["first_kept_entry_id"]  # the records after the tip change nothing
    first_kept = cut["first_kept_entry_id"]
    position = {e["id"]: i for i, e in enumerate(b.entries)}
    f = position[first_kept]
    with dbmod.reading(fresh) as con:
        records = con.execute(
            "SELECT r.covers_up_to_id, list(o.obs_id ORDER BY o.item_index), list(o.source_entry_ids) "
            "FROM ledger r JOIN observations o ON o.session_id = r.session_id AND o.ledger_id = r.ledger_id "
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


# ---------------------------------------------------------------- what the exported file shows (SPEC §4)


OBS = "om.observations.recorded"


def extension_visible(path) -> dict:
    """What Pi's extension shows as visible memory for a session file, read from the file alone: the
    lists of the latest compaction on the current branch whose details are om.folded (version 1)."""
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    by_id = {e["id"]: e for e in entries}
    node = entries[-1]  # the leaf: the last entry in file order
    while node is not None:
        details = node.get("details")
        if node["type"] == "compaction" and isinstance(details, dict) and details.get("type") == "om.folded" \
                and details.get("version") == 1:
            return {"observations": details["observations"], "reflections": details["reflections"]}
        node = by_id.get(node.get("parentId"))
    return {"observations": [], "reflections": []}


def latest_simulated_lists(db_path, session_id: str) -> tuple[str, dict]:
    """The latest folded simulated compaction on the current branch and its lists, read from the
    analyst views (not through the projection macros)."""
    with dbmod.reading(db_path) as con:
        leaf = con.execute("SELECT leaf_id FROM sessions WHERE session_id = ?", [session_id]).fetchone()[0]
        cid = con.execute("SELECT c.compaction_id FROM compactions c JOIN branch(?, ?) b ON b.entry_id = "
                          "c.anchor_entry_id WHERE c.session_id = ? AND c.origin = 'simulated' AND c.folded "
                          "ORDER BY b.position DESC, c.append_seq DESC LIMIT 1",
                          [session_id, leaf, session_id]).fetchone()[0]
        rows = con.execute("SELECT item_kind, id, content, ts, relevance, source_entry_ids, "
                           "supporting_observation_ids, token_count FROM compaction_items "
                           "WHERE session_id = ? AND compaction_id = ? ORDER BY item_kind, item_index",
                           [session_id, cid]).fetchall()

    def number(x):
        return int(x) if float(x).is_integer() else x

    return cid, {
        "observations": [{"id": i, "content": c, "timestamp": t, "relevance": r, "sourceEntryIds": list(s),
                          "tokenCount": number(n)} for k, i, c, t, r, s, _, n in rows if k == "observation"],
        "reflections": [{"id": i, "content": c, "supportingObservationIds": list(p), "tokenCount": number(n)}
                        for k, i, c, _, _, _, p, n in rows if k == "reflection"]}


def view_json(db_path, session_id: str, *extra: str) -> dict:
    return json.loads(run(["--db", str(db_path), "view", session_id, "--json", *extra]))


def test_view_of_an_exported_file_is_what_the_extension_shows(tmp_path):
    sb = SessionBuilder("7e91c0de-0000-4000-8000-0000000000e1")
    sb.work_turns(3, "alpha")
    covers, kept = sb.entries[-1]["id"], sb.entries[-4]["id"]
    note = {"id": "4a1b9c0d2e3f", "content": "alpha is finished", "timestamp": "2026-01-15 14:30",
            "relevance": "high", "sourceEntryIds": [covers], "tokenCount": 8}
    sb.custom(OBS, {"observations": [note], "coversUpToId": covers})
    details = {"type": "om.folded", "version": 1, "fullFold": False, "observations": [note], "reflections": []}
    sb.compaction("rendered by the extension", kept, details=details, from_hook=True)
    sb.work_turns(8, "beta")
    archive = sb.write(tmp_path / "archive.jsonl")
    db_path, sid = replayed_db(tmp_path, archive)
    shown = extension_visible(archive)
    assert shown["observations"] == [note]

    # the archive: visible memory is the extension's own fold; the replay's later fold is the replayed view
    assert view_json(db_path, sid) == shown
    cid, simulated = latest_simulated_lists(db_path, sid)
    assert simulated["observations"] and simulated != shown
    assert view_json(db_path, sid, "--replayed") == simulated
    label = CliRunner().invoke(app, ["--db", str(db_path), "view", sid, "--replayed"])
    assert label.exit_code == 0 and f"simulated compaction {cid}" in label.stderr
    assert "not what the agent saw" in label.stderr

    # the exported file holds the extension's fold only (simulated ones are never exported)
    out = tmp_path / "exported.jsonl"
    run(["--db", str(db_path), "export", sid, "--out", str(out)])
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [out])
    assert extension_visible(out) == shown
    assert view_json(fresh, sid) == shown
    assert view_json(fresh, sid, "--replayed") == shown  # nothing simulated there


def test_with_no_folded_compaction_in_the_file_nothing_is_visible(tmp_path):
    sb = SessionBuilder("7e91c0de-0000-4000-8000-0000000000e2")
    sb.work_turns(10, "gamma")
    path = sb.write(tmp_path / "archive.jsonl")
    db_path, sid = replayed_db(tmp_path, path)
    cid, simulated = latest_simulated_lists(db_path, sid)
    assert simulated["observations"]
    empty = {"observations": [], "reflections": []}
    assert extension_visible(path) == empty
    assert view_json(db_path, sid) == empty  # the replay's compactions were never in the file
    full = view_json(db_path, sid, "--full")
    # the text form shows what exists instead of nothing: here the replayed view, labelled as such
    result = CliRunner().invoke(app, ["--db", str(db_path), "view", sid])
    replayed_text = CliRunner().invoke(app, ["--db", str(db_path), "view", sid, "--replayed"])
    assert result.exit_code == 0 and result.stdout == replayed_text.stdout != ""
    assert "no memory the agent saw" in result.stderr and "showing the replayed view" in result.stderr
    assert "what the extension would have shown, not what the agent saw" in result.stderr
    assert full["observations"]
    assert view_json(db_path, sid, "--replayed") == simulated

    # om status: visible counts 0, the replayed block says what the simulation shows, drift is against visible
    status = json.loads(run(["--db", str(db_path), "status", sid, "--json"]))
    assert status["observations"]["visible"] == 0 and status["reflections"]["visible"] == 0
    assert status["visible_compaction"] is None and status["pools"]["visible_tokens"] == 0
    assert status["drift"]["observations_only_in_full"] == [o["id"] for o in full["observations"]]
    replayed = status["replayed"]
    assert replayed["label"] == "replayed" and replayed["simulated_compactions"] >= 1
    assert replayed["compaction"]["compaction_id"] == cid and replayed["compaction"]["origin"] == "simulated"
    assert (replayed["observations"], replayed["reflections"]) == (len(simulated["observations"]),
                                                                   len(simulated["reflections"]))
    assert replayed["observation_tokens"] == sum(o["tokenCount"] for o in simulated["observations"])
    full_ids = {o["id"] for o in full["observations"]}
    assert replayed["drift"]["observations_only_in_full"] == [
        o["id"] for o in full["observations"] if o["id"] not in {s["id"] for s in simulated["observations"]}]
    assert replayed["drift"]["visible_no_longer_active"] == [
        o["id"] for o in simulated["observations"] if o["id"] not in full_ids]
    text = run(["--db", str(db_path), "status", sid])
    assert "visible: nothing" in text and "replayed (the replay's simulated compactions" in text

    # --full and --replayed together: a clear error
    both = CliRunner().invoke(app, ["--db", str(db_path), "view", sid, "--full", "--replayed"])
    assert isinstance(both.exception, InvalidArgument) and "--replayed" in str(both.exception)


# ---------------------------------------------------------------- record timestamps (SPEC §6)


def test_records_carry_the_time_they_were_made_never_before_their_parent(tmp_path):
    b = SessionBuilder()
    b.work_turns(4, "alpha")
    b.clock = datetime(2999, 1, 1, tzinfo=timezone.utc)  # entries from the future: a record must wait for them
    b.work_turns(4, "beta")
    path = b.write(tmp_path / "session.jsonl")
    before = datetime.now(timezone.utc).replace(microsecond=0)
    db_path, sid = replayed_db(tmp_path, path)
    with dbmod.reading(db_path) as con:
        made = dict(con.execute("SELECT ledger_id, created_at FROM ledger WHERE session_id = ? AND "
                                "origin = 'pipeline'", [sid]).fetchall())
    out = tmp_path / "exported.jsonl"
    run(["--db", str(db_path), "export", sid, "--out", str(out)])
    lines = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    by_id = {e["id"]: e for e in lines}
    records = [e for e in lines if e["type"] == "custom"]
    assert {e["id"] for e in records} == set(made)

    def at(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    own = waited = 0
    for e in records:
        parent = by_id[e["parentId"]]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", e["timestamp"])  # toISOString
        assert at(e["timestamp"]) >= at(parent["timestamp"])
        created = made[e["id"]].astimezone(timezone.utc)
        if at(parent["timestamp"]) < created.replace(microsecond=created.microsecond // 1000 * 1000):
            own += 1
            assert e["timestamp"] == js_iso(created)  # the time it was made
            assert before <= at(e["timestamp"]) <= datetime.now(timezone.utc)
        else:
            waited += 1
            assert e["timestamp"] == parent["timestamp"]  # never earlier than its parent
    assert own and waited


@pytest.mark.real_sessions
def test_real_session_exported_view_is_what_the_extension_shows(tmp_path, before_compaction, before_compaction_offline):
    """The shared session holds two of Pi's own compactions and no om.folded one: after a replay the
    simulated folds are the replayed view, the visible view is empty on the archive and on its export."""
    db_path, sid = before_compaction_offline
    empty = {"observations": [], "reflections": []}
    archived = [json.loads(line) for line in before_compaction.read_text(encoding="utf-8").splitlines()[1:]]
    compactions = [e for e in archived if e.get("type") == "compaction"]
    assert len(compactions) == 2 and not any(isinstance(e.get("details"), dict) for e in compactions)
    assert view_json(db_path, sid) == empty
    cid, simulated = latest_simulated_lists(db_path, sid)
    assert simulated["observations"]
    assert view_json(db_path, sid, "--replayed") == simulated
    status = json.loads(run(["--db", str(db_path), "status", sid, "--json"]))
    assert status["observations"]["visible"] == 0 and status["replayed"]["compaction"]["compaction_id"] == cid
    out = tmp_path / "exported.jsonl"
    run(["--db", str(db_path), "export", sid, "--out", str(out)])
    fresh = tmp_path / "fresh.duckdb"
    ingest(workspace(fresh), [out])
    assert view_json(fresh, sid) == extension_visible(out) == empty
    assert view_json(fresh, sid, "--full") == view_json(db_path, sid, "--full")
    # every exported record is stamped no earlier than its parent entry
    lines = {e["id"]: e for e in map(json.loads, out.read_text(encoding="utf-8").splitlines()[1:])}
    for e in lines.values():
        if e["type"] == "custom" and e["customType"].startswith("om."):
            assert e["timestamp"] >= lines[e["parentId"]]["timestamp"]

# ------------------------------------------------------------------ om export --compact


def test_export_compact_appends_a_compaction_pi_reads_and_it_is_the_visible_memory(tmp_path):
    b, path = finished_sample(tmp_path)
    db_path, session_id = replayed_db(tmp_path, path, DRAIN_SETTINGS)
    out = tmp_path / "compacted.jsonl"
    env = {"OM_KEEP_RECENT_TOKENS": "400"}
    result = CliRunner().invoke(app, ["--db", str(db_path), "export", session_id, "--out", str(out), "--compact",
                                      "--json"], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    written = report["compaction"]
    assert written is not None and report["compaction_skipped"] is None
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    entry = lines[-1]
    # Pi's compaction fields, as the extension writes them
    assert entry["type"] == "compaction" and entry["fromHook"] is True
    assert entry["parentId"] == lines[-2]["id"] and entry["id"] == written["id"]
    assert set(entry) >= {"id", "parentId", "timestamp", "summary", "firstKeptEntryId", "tokensBefore", "details"}
    assert entry["details"]["type"] == "om.folded" and entry["details"]["version"] == 1
    assert entry["systemMessage"]["role"] == "system"  # the branch's system prompt
    assert entry["timestamp"] >= lines[-2]["timestamp"]
    # F is Pi's cut point of the exported branch, tokensBefore Pi 1.6's estimate there
    without = tmp_path / "plain.jsonl"
    run(["--db", str(db_path), "export", session_id, "--out", str(without)])
    plain_db = tmp_path / "plain.duckdb"
    ingest(workspace(plain_db), [without])
    cut = json.loads(run(["--db", str(plain_db), "cutpoint", session_id, "--keep-recent", "400", "--json"]))
    assert (entry["firstKeptEntryId"], entry["tokensBefore"]) == (cut["first_kept_entry_id"], cut["tokens_before"])
    # re-ingested: its last compaction's summary and details equal om compact at that cut, and it is
    # the visible memory
    fresh = tmp_path / "fresh.duckdb"
    imported = ingest(workspace(fresh), [out]).files[0]
    assert imported.ledger["invalid"] == 0
    compacted = json.loads(run(["--db", str(fresh), "compact", session_id, "--first-kept", entry["firstKeptEntryId"],
                                "--leaf", entry["parentId"], "--json"]))
    assert compacted["summary"] == entry["summary"]
    assert compacted["details"] == entry["details"]
    assert compacted["observations"], "nothing folded"
    with dbmod.reading(fresh) as con:
        (last_id, summary, details), = con.execute(
            "SELECT entry_id, json_extract_string(raw, '$.summary'), json_extract(raw, '$.details') FROM entries "
            "WHERE session_id = ? AND entry_type = 'compaction' ORDER BY line_no DESC LIMIT 1", [session_id]).fetchall()
    assert last_id == entry["id"] and summary == entry["summary"] and json.loads(details) == entry["details"]
    visible = json.loads(run(["--db", str(fresh), "view", session_id, "--json"]))
    assert [o["id"] for o in visible["observations"]] == [o["id"] for o in entry["details"]["observations"]]
    assert visible["observations"]


def test_export_compact_where_pi_would_not_compact_writes_no_compaction(tmp_path):
    path = branched_session(tmp_path)
    db_path, session_id = replayed_db(tmp_path, path)
    out = tmp_path / "exported.jsonl"
    report = json.loads(run(["--db", str(db_path), "export", session_id, "--out", str(out), "--compact", "--json"]))
    # the whole branch fits in the default keepRecentTokens (20000): nothing to summarize
    assert report["compaction"] is None and "would not compact" in report["compaction_skipped"]
    assert json.loads(out.read_text().splitlines()[-1])["type"] != "compaction"


# ------------------------------------------------------------------ a target that cannot be written


@pytest.mark.parametrize("target", ["exported.jsonl", "new/dir/exported.jsonl"])
def test_export_to_a_read_only_filesystem_is_one_line(tmp_path, small_fs, target):
    """A real read-only mount: the write and its cleanup both fail, and the user sees one line."""
    import subprocess
    import sys

    mount, remount = small_fs
    path = branched_session(tmp_path)
    db_path, session_id = replayed_db(tmp_path, path)
    remount("ro")
    out = mount / target
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db_path), "export", session_id,
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: cannot write {out}: Read-only file system"]
    assert "Traceback" not in done.stderr and not out.exists()
