"""Recall by query (SPEC §13, "The agent's tools and commands"): keyword ranking (BM25) of memory and
transcript, the session's branch before its project, exact identifiers first, and, with
recallEmbeddings on and the embeddings extra installed, semantic similarity fused in (RRF).

Entry ids are the builder's: the n-th entry is ``f"{n:08x}"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builders import SessionBuilder
from conftest import workspace
from om_core.ingest import ingest
from om_core.recall.query import is_query, recall_query
from om_core.settings import Settings

OBS = "om.observations.recorded"
E = {n: f"{n:08x}" for n in range(1, 20)}
S1 = "00000001-7ec4-4000-8000-0000000000d1"  # the session asking
S2 = "00000002-7ec4-4000-8000-0000000000d2"  # another session of the same project
S3 = "00000003-7ec4-4000-8000-0000000000d3"  # a session of another project
APP, OTHER = "/home/dev/app", "/home/dev/other"

RETRY = "The uploader in src/upload_client.py retries failed chunk uploads three times with exponential backoff."
RETRY_TOO = "Upload retries: retries of uploads are retried; upload retries retry uploads again and again."
THEME = "User prefers dark themes in the editor."
LEDGER = "The ledger is stored in DuckDB, not SQLite."
FRIDAY = "Deploys go to the staging cluster every Friday afternoon."
OFFLINE = "Tests must run offline without network access."
SIDE = "Upload retries are discussed on a side branch only."


def mid(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def o(content: str, src: list[str]) -> dict:
    return {"id": mid(content), "content": content, "timestamp": "2026-01-15 14:30", "relevance": "medium",
            "sourceEntryIds": src, "tokenCount": 10}


def session_one() -> SessionBuilder:
    sb = SessionBuilder(S1, cwd=APP)
    sb.user("Why do the uploads fail sometimes? Look at src/upload_client.py")  # E1
    sb.assistant("The client retries each chunk three times, then gives up.")  # E2
    sb.user("Another question on a side branch.")  # E3: side branch
    sb.custom(OBS, {"observations": [o(SIDE, [E[3]])], "coversUpToId": E[3]})  # E4: side branch
    sb.go(E[2])
    sb.custom(OBS, {"observations": [o(RETRY, [E[1], E[2]]), o(THEME, [E[1]])], "coversUpToId": E[2]})  # E5
    sb.user("Thanks, keep going.")  # E6
    return sb


def session_two() -> SessionBuilder:
    sb = SessionBuilder(S2, cwd=APP)
    sb.user("Upload retries again: upload retries keep failing, retries retries.")  # E1
    sb.custom(OBS, {"observations": [o(RETRY_TOO, [E[1]]), o(LEDGER, [E[1]])], "coversUpToId": E[1]})  # E2
    return sb


def session_three() -> SessionBuilder:
    sb = SessionBuilder(S3, cwd=OTHER)
    sb.user("Upload retries in the other project; retries of uploads.")  # E1
    sb.custom(OBS, {"observations": [o(FRIDAY, [E[1]]), o(OFFLINE, [E[1]])], "coversUpToId": E[1]})  # E2
    return sb


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recall_query")
    path = tmp / "om.duckdb"
    ingest(workspace(path), [session_one().write(tmp / "one.jsonl"), session_two().write(tmp / "two.jsonl"),
                             session_three().write(tmp / "three.jsonl")])
    return path


def keys(result) -> list[tuple]:
    return [(h.where, h.session_id, h.memory_id or h.entry_id) for h in result.hits]


def test_ids_and_hex_prefixes_are_no_queries():
    assert not is_query("0123456789ab") and not is_query("3f9a0c")
    assert is_query("upload retries") and is_query("src/upload_client.py") and is_query("not-an-id")


def test_the_session_s_branch_comes_before_its_project_and_other_projects_stay_out(db):
    result = recall_query(workspace(db), "upload retries", S1)
    assert result.mode == "keyword" and result.embeddings == "recallEmbeddings is off"
    wheres = [h.where for h in result.hits]
    assert wheres == sorted(wheres, key=lambda w: w != "branch") and wheres[0] == "branch"
    assert {h.session_id for h in result.hits if h.where == "branch"} == {S1}
    # the other session of the project is reached (it matches better, it still comes after)
    assert (mid(RETRY_TOO) in [h.memory_id for h in result.hits if h.where == "project" and h.session_id == S2])
    assert S3 not in {h.session_id for h in result.hits}  # another project
    assert mid(SIDE) not in [h.memory_id for h in result.hits]  # off the branch: another conversation
    # each hit names what to recall next: a memory id, or an entry id with the memory citing it
    entry = next(h for h in result.hits if h.entry_id == E[1] and h.session_id == S1)
    assert set(entry.memory_ids) == {mid(RETRY), mid(THEME)} and entry.memory_id is None
    assert [h.rank for h in result.hits] == list(range(1, len(result.hits) + 1))


def test_without_a_session_every_project_is_searched(db):
    result = recall_query(workspace(db), "upload retries")
    assert {h.where for h in result.hits} == {"everywhere"}
    assert {S1, S2, S3} <= {h.session_id for h in result.hits}


def test_an_exact_identifier_ranks_first(db):
    # the word "retries" is far denser in other documents; the path is in two documents of S1
    result = recall_query(workspace(db), "retries src/upload_client.py", S1)
    first = result.hits[:2]
    assert all(h.exact_identifier for h in first)
    assert {h.memory_id or h.entry_id for h in first} == {mid(RETRY), E[1]}
    assert not any(h.exact_identifier for h in result.hits[2:])
    # across every project too
    assert recall_query(workspace(db), "retries src/upload_client.py").hits[0].exact_identifier


def test_the_recall_tool_text_names_the_ids_to_recall(db):
    from om_core.recall.query import tool_result

    got = tool_result(recall_query(workspace(db), "upload retries", S1))
    text = got["content"][0]["text"]
    assert f"[{mid(RETRY)}] observation (this session)" in text and f"session {S2}" in text
    assert got["details"]["status"] == "ok" and got["details"]["hits"][0]["where"] == "branch"
    nothing = tool_result(recall_query(workspace(db), "zebra quokka", S1))
    assert nothing["details"]["status"] == "not_found" and "No memory" in nothing["content"][0]["text"]


def test_om_recall_query_json(db, tmp_path):
    from om_cli import run_om

    result = run_om(["--db", str(db), "recall", "upload retries", "--session", S1, "--json"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["query"] == "upload retries" and data["session_id"] == S1 and data["mode"] == "keyword"
    assert data["hits"][0]["where"] == "branch" and data["hits"][0]["session_id"] == S1
    plain = run_om(["--db", str(db), "recall", "upload retries", "--session", S1], cwd=tmp_path)
    assert plain.returncode == 0 and mid(RETRY) in plain.stdout
    none = run_om(["--db", str(db), "recall", "zebra quokka", "--json"], cwd=tmp_path)
    assert none.returncode == 1 and json.loads(none.stdout)["hits"] == []


# ---------------------------------------------------------------- by meaning (the embeddings extra)

PARAPHRASE = "favourite colour palette"  # shares no word with THEME (nor with any other text here)


def extra_missing() -> str | None:
    from om_core.recall import vectors

    return vectors.unavailable() if vectors.embedder() is None else None


def test_a_paraphrase_sharing_no_word_is_found_only_with_embeddings(db):
    keyword = recall_query(workspace(db), PARAPHRASE, S1)
    assert keyword.hits == []  # no word in common: keyword ranking finds nothing
    why = extra_missing()
    if why is not None:
        off = recall_query(workspace(db), PARAPHRASE, S1, embeddings=True)
        assert off.mode == "keyword" and off.embeddings == why and off.hits == []
        pytest.skip(f"recall by meaning needs the embeddings extra: {why}")
    fused = recall_query(workspace(db, Settings(recallEmbeddings=True)), PARAPHRASE, S1)
    assert fused.mode == "fused" and fused.embeddings is None
    assert fused.hits[0].memory_id == mid(THEME) and fused.hits[0].keyword_rank is None
    assert fused.hits[0].semantic_rank is not None and fused.hits[0].similarity > 0


def test_with_embeddings_the_exact_identifier_and_the_branch_still_lead(db):
    if (why := extra_missing()) is not None:
        pytest.skip(f"recall by meaning needs the embeddings extra: {why}")
    ws = workspace(db, Settings(recallEmbeddings=True))
    result = recall_query(ws, "retries src/upload_client.py", S1)
    assert result.mode == "fused" and result.hits[0].exact_identifier
    wheres = [h.where for h in result.hits]
    assert wheres == sorted(wheres, key=lambda w: w != "branch")


def test_vectors_are_indexed_once_and_follow_the_documents(tmp_path):
    if (why := extra_missing()) is not None:
        pytest.skip(f"recall by meaning needs the embeddings extra: {why}")
    from om_core.store.db import reading

    path = tmp_path / "om.duckdb"
    ws = workspace(path, Settings(recallEmbeddings=True))
    file = session_one().write(tmp_path / "one.jsonl")
    ingest(ws, [file])  # the ingest, a writer, embeds what it indexed
    with reading(path) as con:
        (docs,) = con.execute("SELECT count(*) FROM search_documents").fetchone()
        (vecs, models) = con.execute("SELECT count(*), count(DISTINCT model) FROM search_vectors").fetchone()
    assert docs > 0 and (vecs, models) == (docs, 1)
    recall_query(ws, PARAPHRASE, S1)  # nothing left to embed: nothing written
    with reading(path) as con:
        assert con.execute("SELECT count(*) FROM search_vectors").fetchone()[0] == docs


def test_the_extra_is_optional_and_downloads_nothing():
    """With no network at all, the model loads from the installed wheel or is reported absent."""
    code = ("import socket\n"
            "def refuse(*a, **k): raise OSError('no network in this test')\n"
            "socket.socket.connect = refuse\n"
            "from om_core.recall import vectors\n"
            "m = vectors.embedder()\n"
            "print('absent' if m is None else len(m.embed(['x'])[0]), vectors.unavailable())\n")
    env = {**os.environ, "HOME": "/nonexistent", "HF_HUB_OFFLINE": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert out.returncode == 0, out.stderr
    if extra_missing() is None:
        assert out.stdout.split()[0] == "256"
    else:
        assert out.stdout.startswith("absent")


# ---------------------------------------------------------------- the live recall (endpoint, om live recall)


def test_the_live_recall_answers_a_query_through_the_endpoint_and_the_command(tmp_path):
    from test_extension_interop import O1, extension_session

    from flows.endpoint import LiveEndpoint, ask, running_endpoint
    from om_core.usecases.live import RecallRequest, recall_live
    from om_cli import run_om

    path = extension_session().write(tmp_path / "live.jsonl")
    ws = workspace(tmp_path / "om.duckdb")
    lines: list[str] = []
    with LiveEndpoint(ws, wait_seconds=1.0, sessions=[tmp_path], on_answer=lines.append):
        got = ask(running_endpoint(ws.path), "recall", {"session_file": str(path), "query": "Supabase auth"})
    assert got["details"]["status"] == "ok" and O1["id"] in [h["memory_id"] for h in got["details"]["hits"]]
    assert f"[{O1['id']}] observation (this session)" in got["content"][0]["text"]
    assert lines[-1].startswith("recall by query: ok") and "Supabase" not in lines[-1]  # the words stay out of logs
    assert got == recall_live(ws, RecallRequest(session_file=str(path), query="Supabase auth"))
    with pytest.raises(ValueError, match="either an id or a non-empty query"):
        RecallRequest(session_file=str(path), id=O1["id"], query="both")
    out = run_om(["--db", str(tmp_path / "om.duckdb"), "live", "recall", "--query", "Supabase auth", "--file",
                  str(path), "--json"], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == got
