"""Project memory, search and forget, on sessions built in code in two git repositories
whose folders have the same name (``.../alpha/app`` and ``.../beta/app``).

Repository A has a remote and two sessions (one started in a subfolder); repository B has no remote
and one session. Their session memory is appended through the library (as a replay appends it), so
each test knows exactly which ids belong where.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from builders import SessionBuilder
from conftest import workspace
from fake_openai import FakeOpenAI, Reply, text, tool_call
from om_core.store import db as dbmod
from om_core.ingest import ingest
from om_core.ledger.records import (
    OBSERVATIONS_RECORDED,
    REFLECTIONS_RECORDED,
    Observation,
    ObservationsRecorded,
    Reflection,
    ReflectionsRecorded,
    append_record,
    memory_id,
)
from om_core.settings import Settings
from om_core.workers.run_config import ModelConfig, make_brain

SETTINGS = Settings(projectReflectAfterTokens=1)
A1, A2, B1 = ("aaaa0001-0000-4000-8000-000000000001", "aaaa0002-0000-4000-8000-000000000002",
              "bbbb0001-0000-4000-8000-000000000001")
REMOTE_A = "https://deploy:s3cr3t-token@github.com/acme/app.git"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _session(path: Path, session_id: str, cwd: Path, user_text: str, answer: str) -> list[str]:
    b = SessionBuilder(session_id=session_id, cwd=str(cwd))
    ids = [b.user(user_text), b.assistant(answer)]
    path.write_text("\n".join(json.dumps(e) for e in [b.header, *b.entries]) + "\n")
    return ids


def _observation(content: str, sources: list[str], relevance: str = "critical") -> Observation:
    return Observation(id=memory_id(content), content=content, timestamp="2026-01-15 14:01", relevance=relevance,
                       sourceEntryIds=sources, tokenCount=len(content) // 4 + 6)


def _record(con, session_id: str, anchor: str, observations: list[Observation], reflections: list[tuple[str, list[str]]]):
    append_record(con, session_id, OBSERVATIONS_RECORDED,
                  ObservationsRecorded(observations=observations, coversUpToId=anchor), anchor_entry_id=anchor)
    if reflections:
        append_record(con, session_id, REFLECTIONS_RECORDED, ReflectionsRecorded(reflections=[
            Reflection(id=memory_id(c), content=c, supportingObservationIds=s, tokenCount=len(c) // 4)
            for c, s in reflections], coversUpToId=anchor), anchor_entry_id=anchor)


@pytest.fixture
def two_repos(tmp_path: Path):
    """Two repositories named app, their three sessions ingested, their memory appended."""
    repo_a, repo_b = tmp_path / "alpha" / "app", tmp_path / "beta" / "app"
    for repo in (repo_a, repo_b):
        (repo / "src").mkdir(parents=True)
        _git(repo, "init", "-q")
    _git(repo_a, "remote", "add", "origin", REMOTE_A)
    files = tmp_path / "sessions"
    files.mkdir()
    entries = {
        A1: _session(files / "a1.jsonl", A1, repo_a, "Never force-push to main; the CI needs ERR_UPLOAD_4417 fixed.",
                     "Fixed ERR_UPLOAD_4417 in src/upload.py: the retry now backs off."),
        A2: _session(files / "a2.jsonl", A2, repo_a / "src", "Remember: never force-push to main.",
                     "Understood; I will push to a branch. The upload log's err 4417 lines: upload err 4417, err."),
        B1: _session(files / "b1.jsonl", B1, repo_b, "This project uses poetry, not pip; run poetry install.",
                     "Ran poetry install; 12 packages installed."),
    }
    db = tmp_path / "om.duckdb"
    ws = workspace(db, SETTINGS)
    ingest(ws, [files])
    memory = {
        A1: ([_observation("User forbids force-pushes to main", [entries[A1][0]]),
              _observation("ERR_UPLOAD_4417 fixed in src/upload.py with a backing-off retry", [entries[A1][1]], "high")],
             [("Never force-push to main: the user forbids it", ["obs"])]),
        A2: ([_observation("User forbids force-pushing to main", [entries[A2][0]])], []),
        B1: ([_observation("The project uses poetry, not pip", [entries[B1][0]])],
             [("Dependencies are managed with poetry (poetry install), not pip", ["obs"])]),
    }
    ids: dict[str, list[str]] = {}
    con = dbmod.connect(db)
    try:
        for sid, (observations, reflections) in memory.items():
            reflections = [(c, [observations[0].id]) for c, _ in reflections]
            _record(con, sid, entries[sid][-1], observations, reflections)
            ids[sid] = [o.id for o in observations] + [memory_id(c) for c, _ in reflections]
    finally:
        con.close()
    return {"db": db, "ws": ws, "entries": entries, "ids": ids, "repo_a": repo_a, "repo_b": repo_b, "files": files}


def _rows(db: Path, sql: str, params=None):
    con = dbmod.connect(db, read_only=True)
    try:
        return con.execute(sql, params or []).fetchall()
    finally:
        con.close()


# ---------------------------------------------------------------- projects


def test_projects_are_the_repositories_kept_apart_by_their_roots_and_remotes(two_repos):
    db, repo_b = two_repos["db"], two_repos["repo_b"]
    rows = dict(_rows(db, "SELECT session_id, project_id FROM project_sessions"))
    assert rows[A1] == rows[A2] == "github.com/acme/app"  # the remote, its credentials left out
    assert rows[B1] == str(repo_b.resolve())  # no remote: the work tree's root
    projects = _rows(db, "SELECT project_id, name, sessions FROM projects ORDER BY project_id")
    assert [(p[1], p[2]) for p in projects] == [("app", 1), ("app", 2)]  # the same folder name, two projects
    assert "s3cr3t" not in json.dumps(_rows(db, "SELECT * FROM om_internal.project_sessions"), default=str)


def test_the_projects_setting_overrides_and_a_gone_folder_keeps_what_was_found(two_repos, tmp_path):
    import shutil

    ws = workspace(two_repos["db"], Settings(projects={str(two_repos["repo_b"]): "team/b-app"}))
    shutil.rmtree(two_repos["repo_a"])  # the facts were read at the first ingest
    ingest(ws, [two_repos["files"]])
    rows = dict(_rows(two_repos["db"], "SELECT session_id, project_id FROM project_sessions"))
    assert rows[B1] == "team/b-app" and rows[A1] == "github.com/acme/app"


# ---------------------------------------------------------------- the project stage


def _offline_brain():
    return make_brain(ModelConfig(model="offline"), SETTINGS)


def test_the_offline_project_stage_keeps_projects_apart_and_cites_only_their_sessions(two_repos):
    from om_core.memory.project_memory import show_project
    from om_core.project.stage import run_due_projects

    ws, ids = two_repos["ws"], two_repos["ids"]
    outcomes = run_due_projects(ws, _offline_brain(), run_id="r1")
    assert {o.project_id for o in outcomes} == {"github.com/acme/app", str(two_repos["repo_b"].resolve())}
    a = show_project(ws, "github.com/acme/app")
    b = show_project(ws, str(two_repos["repo_b"]))
    a_ids, b_ids = set(ids[A1]) | set(ids[A2]), set(ids[B1])
    assert a.reflections and b.reflections
    assert all(set(r.supportingIds) <= a_ids for r in a.reflections)
    assert all(set(r.supportingIds) <= b_ids for r in b.reflections)
    # the near-duplicate rule of both A sessions is one project reflection resting on both
    force = [r for r in a.reflections if "force-push" in r.content.lower() and "2 sessions" in r.content]
    assert force and {ids[A1][0], ids[A2][0]} <= set(force[0].supportingIds)
    assert not any("poetry" in r.content for r in a.reflections)
    # nothing new: nothing is due, and a second run appends nothing
    assert run_due_projects(ws, _offline_brain(), run_id="r2") == []


def test_recall_of_a_project_reflection_reaches_the_source_entries_across_sessions(two_repos):
    from om_core.memory.project_memory import show_project
    from om_core.project.stage import run_due_projects
    from om_core.recall.evidence import recall

    ws, entries = two_repos["ws"], two_repos["entries"]
    run_due_projects(ws, _offline_brain())
    force = next(r for r in show_project(ws, "github.com/acme/app").reflections if "2 sessions" in r.content)
    result = recall(ws, force.id)
    assert result.status == "found" and result.kind == "project_reflection"
    (project,) = result.projects
    assert project.project_id == "github.com/acme/app"
    sources = {(g.session_id, s.entry_id): s for g in project.sessions for o in g.observations for s in o.sources}
    assert (A1, entries[A1][0]) in sources and (A2, entries[A2][0]) in sources
    assert {g.session_id for g in project.sessions} == {A1, A2}
    assert sources[(A1, entries[A1][0])].text.startswith("Never force-push to main")
    assert sources[(A2, entries[A2][0])].text == "Remember: never force-push to main."


def test_a_new_session_supersedes_a_project_reflection_and_the_fold_retires_it(two_repos, tmp_path):
    from om_core.memory.project_memory import project_fold
    from om_core.project.stage import run_due_projects

    ws = two_repos["ws"]
    run_due_projects(ws, _offline_brain())
    a3 = "aaaa0003-0000-4000-8000-000000000003"
    path = two_repos["files"] / "a3.jsonl"
    entry = _session(path, a3, two_repos["repo_a"], "Again: never force-push to main.", "Noted.")
    ingest(ws, [path])
    con = dbmod.connect(two_repos["db"])
    try:
        _record(con, a3, entry[-1], [_observation("User forbids force pushes to main", [entry[0]])], [])
    finally:
        con.close()
    run_due_projects(ws, _offline_brain())
    with ws.read() as con:
        folded = project_fold(con, "github.com/acme/app")
    (now,) = [f for f in folded if "(in 3 sessions)" in f.reflection.content]
    (before,) = [f for f in folded if "(in 2 sessions)" in f.reflection.content]
    assert not now.retired and f"(supersedes [{before.reflection.id}])" in now.reflection.content
    assert before.retired and before.retired_reason == f"superseded by [{now.reflection.id}]"
    assert set(before.reflection.supportingIds) < set(now.reflection.supportingIds)


def test_a_fake_model_runs_the_project_stage_through_litellm_and_its_checks(two_repos):
    from om_core.memory.project_memory import show_project
    from om_core.project.stage import PROJECT_SYSTEM, run_project_stages

    ws, ids = two_repos["ws"], two_repos["ids"]
    good = {"content": "Pushes go to branches: the user forbids force-pushes to main", "supportingIds": [ids[A1][0], ids[A2][0]]}
    with FakeOpenAI([tool_call("record_project_reflections", {"reflections": [
                        {**good, "supportingIds": [ids[A1][0], ids[B1][0]]}]}),  # cites repository B: refused
                     tool_call("record_project_reflections", {"reflections": [good]})]) as server:
        brain = make_brain(ModelConfig(model="openai/fake-model", api_base=server.base_url, api_key="k"), SETTINGS)
        (outcome,) = run_project_stages(ws, "github.com/acme/app", brain, run_id="r-model")
        first, second = server.requests
    assert outcome.outcome == "recorded" and outcome.rejected == 1 and len(outcome.calls) == 2
    assert first["messages"][0]["content"] == PROJECT_SYSTEM
    assert [t["function"]["name"] for t in first["tools"]] == ["record_project_reflections"]
    sent = json.dumps(first)
    assert ids[A1][0] in sent and ids[A2][0] in sent and ids[B1][0] not in sent  # B's memory never shown
    assert "not session memory ids of this input" in second["messages"][-1]["content"]
    (reflection,) = show_project(ws, "github.com/acme/app").reflections
    assert reflection.content == good["content"] and set(reflection.supportingIds) == set(good["supportingIds"])
    calls = _rows(two_repos["db"], "SELECT stage, session_id, status FROM llm_calls")
    assert calls == [("project", None, "ok")] * 2


def test_a_model_failure_records_nothing_and_moves_no_watermark(two_repos):
    from fake_openai import http_error
    from om_core.project.stage import run_project_stages

    ws = two_repos["ws"]
    with FakeOpenAI([http_error(401, "bad key")]) as server:
        brain = make_brain(ModelConfig(model="openai/fake-model", api_base=server.base_url, api_key="k"), SETTINGS)
        (outcome,) = run_project_stages(ws, "github.com/acme/app", brain)
    assert outcome.outcome == "failed"
    assert _rows(two_repos["db"], "SELECT count(*) FROM project_ledger") == [(0,)]
    assert _rows(two_repos["db"], "SELECT new_tokens > 0 FROM project_growth WHERE project_id = 'github.com/acme/app'") == [(True,)]


def test_a_deliberate_empty_result_waits_for_more_input(two_repos):
    from om_core.project.stage import run_project_stages

    ws = two_repos["ws"]
    with FakeOpenAI([text("Nothing here outlives its session.")]) as server:
        brain = make_brain(ModelConfig(model="openai/fake-model", api_base=server.base_url, api_key="k"), SETTINGS)
        (outcome,) = run_project_stages(ws, "github.com/acme/app", brain)
        assert run_project_stages(ws, "github.com/acme/app", brain) == []  # not asked again
        assert len(server.requests) == 1
    assert outcome.outcome == "empty"


# ---------------------------------------------------------------- search


def test_search_ranks_an_exact_identifier_first_with_its_memory_id_and_source(two_repos):
    from om_core.recall.search import search

    ws, entries, ids = two_repos["ws"], two_repos["entries"], two_repos["ids"]
    result = search(ws, "ERR_UPLOAD_4417")
    exact = ["ERR_UPLOAD_4417" in h.text for h in result.hits]
    assert exact[0] and exact == sorted(exact, reverse=True)  # every exact hit above the word-alike one
    assert not exact[-1] and result.hits[-1].session_id == A2  # its words, all of them, but not the identifier
    obs = next(h for h in result.hits if h.kind == "observation")
    assert obs.memory_id == ids[A1][1] and obs.source_entry_ids == [entries[A1][1]] and obs.session_id == A1
    entry_hit = next(h for h in result.hits if h.kind == "entry" and h.entry_id == entries[A1][1])
    assert entry_hit.memory_ids == [ids[A1][1]] and entry_hit.source_entry_ids == [entries[A1][1]]
    assert result.unindexed == 0
    # scoped: project B knows nothing of it; a session scope keeps to its session
    assert search(ws, "ERR_UPLOAD_4417", project=str(two_repos["repo_b"])).hits == []
    assert {h.session_id for h in search(ws, "force-push main", session=A2).hits} == {A2}
    assert search(ws, "force-push", project="github.com/acme/app").hits


def test_search_has_an_analyst_macro(two_repos):
    rows = _rows(two_repos["db"], "SELECT kind, memory_id FROM search_memory('poetry', NULL, NULL) ORDER BY rank")
    assert rows and rows[0][0] in ("observation", "reflection", "entry")


# ---------------------------------------------------------------- forget


def test_a_forgotten_id_leaves_every_fold_and_compaction(two_repos):
    from om_core.memory import views as memory
    from om_core.usecases.forget import forget
    from om_core.recall.search import search

    ws, ids, entries = two_repos["ws"], two_repos["ids"], two_repos["entries"]
    forgotten = ids[A1][1]
    first_kept = entries[A1][-1]
    with ws.read() as con:
        before = memory.compaction_projection(con, A1, first_kept, first_kept, 1)
    assert forgotten in before.observationIds
    result = forget(ws, forgotten[:8], "it names a customer's system")
    assert [(f.scope, f.scope_id) for f in result.recorded] == [("session", A1)]
    with ws.read() as con:
        leaf = con.execute("SELECT leaf_id FROM sessions WHERE session_id = ?", [A1]).fetchone()[0]
        assert forgotten not in {r["id"] for r in memory.ledger_rows(con, A1, leaf)}
        assert forgotten not in {o.id for o in memory.full_memory(con, A1, leaf).observations}
        for pool in (1, 10_000):
            after = memory.compaction_projection(con, A1, leaf, first_kept, pool)
            assert forgotten not in after.observationIds and forgotten not in (after.summary or "")
        clocks = memory.clocks(con, A1, leaf, SETTINGS)
    assert clocks["dropper"].watermark_entry_id is None  # a forget is no dropper's watermark
    assert all(h.memory_id != forgotten for h in search(ws, "ERR_UPLOAD_4417").hits)
    reason = _rows(two_repos["db"], "SELECT origin, reason FROM drops")
    assert reason == [("user", "it names a customer's system")]
    # the source entries stay; recall still shows the evidence, marked forgotten
    from om_core.recall.evidence import recall

    (obs,) = [o for o in recall(ws, forgotten).observations if o.id == forgotten]
    assert obs.status == "forgotten" and obs.sources
    assert forget(ws, forgotten, "again").already  # idempotent: nothing appended twice


def test_forget_honours_the_stored_compactions_and_om_export_compact(two_repos, tmp_path):
    from om_core.memory import views as memory
    from om_core.usecases.export import export_session
    from om_core.usecases.forget import forget
    from om_core.ledger.records import FoldedDetails, store_simulated_compaction

    ws, ids, entries = two_repos["ws"], two_repos["ids"], two_repos["entries"]
    with ws.read() as con:
        result = memory.compaction_projection(con, A1, entries[A1][-1], entries[A1][-1], 1)
    con = dbmod.connect(two_repos["db"])
    try:
        store_simulated_compaction(con, A1, anchor_entry_id=entries[A1][-1], first_kept_entry_id=entries[A1][-1],
                                   details=FoldedDetails.model_validate(result.details()), summary=result.summary)
    finally:
        con.close()
    forget(ws, ids[A1][0], "wrong")
    view = memory.view(ws, A1, replayed=True)
    assert ids[A1][0] not in {o.id for o in view.memory.observations} and view.memory.observations
    out = tmp_path / "export.jsonl"
    report = export_session(workspace(two_repos["db"], Settings(keepRecentTokens=1)), A1, out, compact=True)
    assert report.compaction is not None
    compaction = json.loads(out.read_text().splitlines()[-1])
    assert compaction["type"] == "compaction" and ids[A1][1] in compaction["summary"]
    assert ids[A1][0] not in compaction["summary"]
    assert ids[A1][0] not in {o["id"] for o in compaction["details"]["observations"]}


def test_forget_of_a_project_reflection_retires_it_in_the_project_ledger(two_repos):
    from om_core.usecases.forget import forget
    from om_core.memory.project_memory import show_project
    from om_core.project.stage import run_due_projects

    ws = two_repos["ws"]
    run_due_projects(ws, _offline_brain())
    project = show_project(ws, "github.com/acme/app")
    victim = project.reflections[0]
    result = forget(ws, victim.id, "outdated", project=True)
    assert [(f.scope, f.kind) for f in result.recorded] == [("project", "project_reflection")]
    after = show_project(ws, "github.com/acme/app")
    assert victim.id not in {r.id for r in after.reflections}
    assert [(f.reflection.id, f.retired_reason) for f in after.retired] == [(victim.id, "outdated")]
    assert _rows(two_repos["db"], "SELECT origin, reason FROM project_retirements") == [("user", "outdated")]


# ---------------------------------------------------------------- using project memory


def test_project_memory_joins_a_first_compaction_only_when_asked(two_repos, tmp_path):
    from om_core.memory.compaction import compact
    from om_core.usecases.export import export_session
    from om_core.memory.project_memory import PROJECT_SECTION, show_project
    from om_core.project.stage import run_due_projects

    ws, entries = two_repos["ws"], two_repos["entries"]
    run_due_projects(ws, _offline_brain())
    ids = [r.id for r in show_project(ws, "github.com/acme/app").reflections]
    plain = compact(ws, A2, entries[A2][-1])
    on = Settings(projectReflectAfterTokens=1, projectMemoryInCompaction=True, keepRecentTokens=1)
    joined = compact(workspace(two_repos["db"], on), A2, entries[A2][-1])
    assert PROJECT_SECTION not in plain.summary  # off by default: the compaction as it was
    assert joined.summary.replace(plain.summary.split("\n\n## ", 1)[0], "", 1).lstrip().startswith(PROJECT_SECTION)
    assert all(f"[{i}]" in joined.summary for i in ids) and joined.details() == plain.details()
    assert joined.summary.endswith(plain.summary.split("\n\n## ", 1)[1])  # the session's memory unchanged
    b_memory = show_project(ws, str(two_repos["repo_b"])).reflections
    assert not any(f"[{r.id}]" in joined.summary for r in b_memory)  # only its own project's
    out = tmp_path / "a2.jsonl"
    export_session(workspace(two_repos["db"], on), A2, out, compact=True)
    assert PROJECT_SECTION in json.loads(out.read_text().splitlines()[-1])["summary"]
    # a session whose file holds a compaction on its branch already: its next one is not its first
    a4 = "aaaa0004-0000-4000-8000-000000000004"
    b = SessionBuilder(session_id=a4, cwd=str(two_repos["repo_a"]))
    first = b.user("Never force-push to main, please.")
    b.assistant("Understood.")
    b.compaction("Pi's own summary", first)
    kept = b.user("Now add a test for the retry.")
    b.assistant("Added tests/test_upload.py.")
    path = two_repos["files"] / "a4.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in [b.header, *b.entries]) + "\n")
    ingest(ws, [path])
    con = dbmod.connect(two_repos["db"])
    try:
        _record(con, a4, kept, [_observation("User asked for a test of the retry", [kept])], [])
    finally:
        con.close()
    again = compact(workspace(two_repos["db"], on), a4, kept)
    assert again.summary is not None and PROJECT_SECTION not in again.summary


def test_the_recall_tool_of_a_live_pi_resolves_a_project_reflection(two_repos):
    from om_core.memory.project_memory import show_project
    from om_core.project.stage import run_due_projects
    from om_core.recall.evidence import recall
    from om_core.recall.tool import tool_result

    ws, entries = two_repos["ws"], two_repos["entries"]
    run_due_projects(ws, _offline_brain())
    force = next(r for r in show_project(ws, "github.com/acme/app").reflections if "2 sessions" in r.content)
    answer = tool_result(ws, A2, entries[A2][-1], recall(ws, force.id, A2))
    said = answer["content"][0]["text"]
    assert f"[{force.id}]" in said and "Never force-push to main; the CI needs" in said  # A1's entry, from A2
    assert answer["details"]["projects"][0]["project_id"] == "github.com/acme/app"
    assert recall(ws, force.id, B1).status == "not_found"  # another project's session does not reach it


def test_the_commands(two_repos):
    from typer.testing import CliRunner

    from flows.cli.main import app

    db, ids = str(two_repos["db"]), two_repos["ids"]
    runner = CliRunner()

    def om(*args):
        result = runner.invoke(app, ["--db", db, *args])
        assert result.exit_code == 0, result.output
        return result.output

    listed = json.loads(om("project", "--list", "--json"))
    assert {p["project_id"] for p in listed} == {"github.com/acme/app", str(two_repos["repo_b"].resolve())}
    om("project", "github.com/acme/app", "--reflect")
    shown = json.loads(om("project", str(two_repos["repo_a"] / "src"), "--json"))  # a folder inside the repository
    assert shown["project_id"] == "github.com/acme/app" and shown["reflections"]
    hits = json.loads(om("search", "ERR_UPLOAD_4417", "--json"))["hits"]
    assert "ERR_UPLOAD_4417" in hits[0]["text"]
    forgot = json.loads(om("forget", ids[B1][0], "--reason", "a test", "--json"))
    assert forgot["recorded"][0]["scope_id"] == B1
    assert runner.invoke(app, ["--db", db, "search", "zzzunknownzzz"]).exit_code == 1
    assert runner.invoke(app, ["--db", db, "forget", "0123456789ab", "--reason", "x"]).exit_code == 1
