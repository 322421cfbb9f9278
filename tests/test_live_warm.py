"""A warm endpoint answers what the om command answers: after appends, after `om forget`, on a new branch
and after Pi rewrites the file, its compaction is byte for byte `om compact FILE --gap-safe
--first-kept F --leaf LEAF --json`'s (the endpoint keeps the file open between answers and updates the
search index after its reply; none of that may change an answer). And `om live compact`, which a
live Pi waits for when no endpoint runs, loads neither litellm nor Prefect nor the other command groups.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from om_cli import run_om
from test_extension_interop import E, O8, SID, extension_session

from conftest import workspace
from flows.endpoint import HOLD_SECONDS, LiveEndpoint, ask, running_endpoint
from om_core.settings import Settings


class Warm:
    """An endpoint kept running over one session file that the test writes as Pi would."""

    def __init__(self, tmp_path, endpoint: LiveEndpoint) -> None:
        self.tmp, self.endpoint = tmp_path, endpoint
        self.path = tmp_path / "live.jsonl"
        self.db = endpoint.db_path
        self.env = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "XDG_STATE_HOME": str(tmp_path / "state")}

    def write(self, lines: list[str]) -> None:
        self.path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def let_go(self) -> None:
        """The endpoint's file closed (its hold and any after-reply work done), so a command opens it."""
        import time

        deadline = time.monotonic() + 30 + HOLD_SECONDS
        while True:
            self.endpoint.db.close()
            if not self.endpoint.db.is_open:
                return
            assert time.monotonic() < deadline, "the endpoint kept the file"
            time.sleep(0.05)

    def om(self, *args: str) -> str:
        self.let_go()
        done = run_om(["--db", str(self.db), *args], cwd=self.tmp, env=self.env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def both(self, leaf: str, first_kept: str) -> tuple[bytes, bytes, dict]:
        """The endpoint's compaction and the command's, as the bytes of the same JSON object."""
        answer = ask(running_endpoint(self.db), "compact", {"session_file": str(self.path), "leaf": leaf,
                                                            "first_kept_entry_id": first_kept, "tokens_before": 1000})
        command = json.loads(self.om("compact", str(self.path), "--gap-safe", "--first-kept", first_kept,
                                     "--leaf", leaf, "--json"))
        mine = {"compaction": answer["compaction"], "declined": answer["declined_reason"]}
        theirs = {"compaction": None if command["summary"] is None else {
            "summary": command["summary"], "firstKeptEntryId": command["gap_free"]["first_kept_entry_id"],
            "tokensBefore": 1000, "details": command["details"]}, "declined": command["gap_free"]["declined"]}
        return (json.dumps(mine, ensure_ascii=False).encode(), json.dumps(theirs, ensure_ascii=False).encode(),
                answer)


@pytest.fixture
def warm(tmp_path):
    with LiveEndpoint(workspace(tmp_path / "om.duckdb", Settings()), wait_seconds=5.0, sessions=[tmp_path]) as ep:
        yield Warm(tmp_path, ep)


def test_answers_equal_the_command_after_appends_forget_branch_and_rewrite(warm):
    sb = extension_session()
    lines = sb.lines()
    warm.write(lines[:29])  # up to E28
    mine, theirs, answer = warm.both(E[28], E[26])
    assert mine == theirs and answer["entries_added"] == 28

    warm.write(lines)  # appended: up to E32
    mine, theirs, answer = warm.both(E[32], E[32])
    assert mine == theirs and answer["entries_added"] == 4 and answer["compaction"] is not None
    assert O8["id"] in answer["compaction"]["summary"] or O8["id"] in json.dumps(answer["compaction"]["details"])

    for n in range(3):  # a few turns appended, one answer after each
        sb.assistant(f"Invoice schema step {n}: the table invoices_{n} has an amount and a due date.")
        sb.user(f"Good, go on with part {n + 1} of the invoices schema.")
        warm.write(sb.lines())
        mine, theirs, answer = warm.both(sb.leaf, sb.leaf)
        assert mine == theirs and answer["entries_added"] == 2

    warm.om("forget", O8["id"], "--session", SID, "--reason", "wrong")  # a drop record in the ledger
    before = answer
    mine, theirs, answer = warm.both(sb.leaf, sb.leaf)
    assert mine == theirs and answer != before
    assert O8["id"] not in json.dumps(answer["compaction"]["details"])

    sb.go(E[27])  # /tree: a new branch from E27
    sb.user("Instead, first write the release notes for staging.")
    branch_leaf = sb.leaf
    warm.write(sb.lines())
    mine, theirs, answer = warm.both(branch_leaf, branch_leaf)
    assert mine == theirs and answer["entries_added"] == 1

    # Pi rewrites the file: the same session, its newest branch's last message edited and one more turn
    rewritten = [json.loads(line) for line in sb.lines()]
    rewritten[-1]["message"]["content"] = [{"type": "text", "text": "Instead, first write the changelog."}]
    sb.entries[-1] = rewritten[-1]
    sb.assistant("Wrote CHANGELOG.md for the staging release.")
    warm.write(sb.lines())
    mine, theirs, answer = warm.both(sb.leaf, branch_leaf)
    assert mine == theirs
    edited = warm.om("sql", "SELECT count(*) FROM om_internal.entries WHERE raw LIKE '%the changelog%'", "--json")
    assert json.loads(edited) == [{"count_star()": 1}], edited  # the endpoint read the rewritten file


def test_the_endpoint_keeps_each_session_between_answers(warm):
    """Between answers the endpoint keeps the session's branch (read again only from its old tip), the
    file as ingested (not read again while unchanged) and its answers (the same question, nothing
    changed: the same answer); another process writing the database drops all of it."""
    sb = extension_session()
    lines = sb.lines()
    warm.write(lines[:29])  # up to E28
    request = {"session_file": str(warm.path), "leaf": E[28], "first_kept_entry_id": E[26], "tokens_before": 1000}
    first = ask(running_endpoint(warm.db), "compact", request)
    kept = warm.endpoint.live.session(warm.path.resolve(), warm.endpoint.db.changed_by_others)
    assert kept.session_id == SID and kept.branch is not None and kept.branch.tip == E[28]
    read = kept.branch.entries[:]
    again = ask(running_endpoint(warm.db), "compact", request)
    assert first["entries_added"] == 28 and again == {**first, "entries_added": 0}
    assert kept.answers and kept.branch.entries == read

    warm.write(lines)  # appended: up to E32; the branch grows from E28 on
    mine, theirs, answer = warm.both(E[32], E[32])
    assert mine == theirs and answer["entries_added"] == 4
    assert kept.branch.tip == E[32] and kept.branch.entries[:len(read)] == read and len(kept.branch.entries) == 32

    changes = warm.endpoint.db.changed_by_others
    warm.om("forget", O8["id"], "--session", SID, "--reason", "wrong")  # another process writes the database
    mine, theirs, answer = warm.both(E[32], E[32])  # the file unchanged, the same question: not the kept answer
    assert mine == theirs and O8["id"] not in json.dumps(answer["compaction"]["details"])
    assert warm.endpoint.db.changed_by_others > changes


def test_the_kept_sessions_are_bounded_and_dropped_when_the_database_changed(tmp_path):
    from om_core.usecases.live_sessions import KEPT_SESSIONS, LiveSessions

    sessions = LiveSessions()
    first = sessions.session(tmp_path / "first.jsonl", 0)
    first.session_id = SID
    assert sessions.session(tmp_path / "first.jsonl", 0) is first and first.session_id == SID
    sessions.session(tmp_path / "first.jsonl", 1)  # another process wrote the database meanwhile
    assert first.session_id is None
    for n in range(KEPT_SESSIONS):
        sessions.session(tmp_path / f"s{n}.jsonl", 1)
    assert sessions.session(tmp_path / "first.jsonl", 1) is not first  # the least recently asked went


PROBE = """
import sys
sys.argv = ["om", *sys.argv[1:]]
from flows.cli.launch import main
try:
    main()
except SystemExit as exc:
    code = exc.code
loaded = [m for m in ("litellm", "prefect", "dask", "flows.cli.main", "flows.cli.run", "flows.cli.serve",
                      "flows.cli.catalog", "flows.cli.memory", "flows.cli.eval") if m in sys.modules]
print("EXIT=%s LOADED=%s" % (code, ",".join(loaded)), file=sys.stderr)
"""


def test_om_live_compact_loads_only_what_it_uses(tmp_path):
    path = extension_session().write(tmp_path / "live.jsonl")
    db = tmp_path / "om.duckdb"
    workspace(db, Settings())  # the database exists (a live question never creates one)
    run_om(["--db", str(db), "ingest", str(path)], cwd=tmp_path)
    done = subprocess.run([sys.executable, "-c", PROBE, "--db", str(db), "live", "compact", str(path), "--leaf", E[32],
                           "--first-kept", E[32], "--json"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
                                             "XDG_STATE_HOME": str(tmp_path / "state"),
                                             "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert "EXIT=0 LOADED=\n" in done.stderr, done.stderr[-3000:]
    assert json.loads(done.stdout)["compaction"]["firstKeptEntryId"]
    # the whole app for the other commands, through the same entry point
    listed = subprocess.run([sys.executable, "-c", PROBE, "--help"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "COLUMNS": "200"})
    assert "live" in listed.stdout and "compact" in listed.stdout and "flows.cli.main" in listed.stderr


def test_om_live_compact_hands_the_request_to_the_endpoint_serving_the_session(tmp_path):
    """With an endpoint serving the session's folder, `om live compact` is its answer (the same JSON as
    the command's own, which it gives when no endpoint answers: none runs, or --config names settings
    the endpoint does not have)."""
    import os

    path = extension_session().write(tmp_path / "live.jsonl")
    db = tmp_path / "om.duckdb"
    workspace(db, Settings())
    run_om(["--db", str(db), "ingest", str(path)], cwd=tmp_path)
    args = ["--db", str(db), "live", "compact", str(path), "--leaf", E[32], "--first-kept", E[32], "--json"]
    env = {"HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}  # where the endpoint below announces itself
    here = run_om(args, cwd=tmp_path, env={**env, "XDG_STATE_HOME": str(tmp_path / "nowhere")})
    assert here.returncode == 0, here.stderr
    lines: list[str] = []
    with LiveEndpoint(workspace(db, Settings()), wait_seconds=5.0, sessions=[tmp_path],
                      on_answer=lines.append) as endpoint:
        handed = run_om(args, cwd=tmp_path, env=env)
        assert handed.returncode == 0, handed.stderr
        assert [line for line in lines if line.startswith("compact ")], lines  # the endpoint answered it
        mine, theirs = json.loads(handed.stdout), json.loads(here.stdout)
        assert mine["compaction"] == theirs["compaction"] and mine["compaction"] is not None
        (tmp_path / "om.toml").write_text("")
        for asked in (["--config", str(tmp_path / "om.toml"), *args], [*args, "--no-endpoint"]):  # the extension's
            lines.clear()
            endpoint.db.close()
            done = run_om(asked, cwd=tmp_path, env=env)
            assert done.returncode == 0, done.stderr
            assert not [line for line in lines if line.startswith("compact ")], lines  # answered by the command
            assert json.loads(done.stdout)["compaction"] == theirs["compaction"]


def test_a_record_appended_to_the_file_drops_the_kept_fold(warm):
    """The folds at a cut are kept between answers while the branch grows by messages (the same rows at
    the same F), and read again once the file's ledger grew: a record Pi's extension appended. (No
    command runs between the answers: another process writing the database drops all that is kept.)"""
    sb = extension_session()
    sb.entries, sb.leaf = sb.entries[:29], E[29]  # up to E29, before the third compaction
    warm.write(sb.lines())

    def compact(leaf: str) -> dict:
        return ask(running_endpoint(warm.db), "compact", {"session_file": str(warm.path), "leaf": leaf,
                                                          "first_kept_entry_id": E[29], "tokens_before": 1000})

    first = compact(E[29])
    kept = warm.endpoint.live.session(warm.path.resolve(), warm.endpoint.db.changed_by_others)
    folds = dict(kept.branch.folds)
    assert folds and first["compaction"] is not None and O8["id"] not in json.dumps(first["compaction"])

    sb.user("Thanks. Anything else before the invoices?")  # a message: the folds stay
    warm.write(sb.lines())
    answer = compact(sb.leaf)
    assert answer["compaction"] == first["compaction"] and answer["entries_added"] == 1
    assert all(kept.branch.folds.get(key) is rows for key, rows in folds.items())

    sb.custom("om.observations.recorded", {"observations": [O8], "coversUpToId": E[29]})  # the file's ledger grew
    sb.user("Start on the invoices schema.")
    warm.write(sb.lines())
    answer = compact(sb.leaf)
    assert O8["id"] in json.dumps(answer["compaction"])
    mine, theirs, again = warm.both(sb.leaf, E[29])
    assert mine == theirs and again["compaction"] == answer["compaction"]
