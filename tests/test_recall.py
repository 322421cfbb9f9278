"""Recall (SPEC §6): the evidence behind one memory id, from the branch's whole ledger history.

One session (plus a second one for the all-sessions search) holds every case; the comment on each
entry says what it is there for. Entry ids are the builder's: the n-th entry is ``f"{n:08x}"``.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from typer.testing import CliRunner

from builders import SessionBuilder
from flows.cli.main import app
from conftest import workspace
from om_core.ingest import ingest
from om_core.recall.evidence import recall

OBS = "om.observations.recorded"
REFL = "om.reflections.recorded"
DROP = "om.observations.dropped"
E = {n: f"{n:08x}" for n in range(1, 20)}
S1 = "00000001-7ec4-4000-8000-0000000000c1"
S2 = "00000002-7ec4-4000-8000-0000000000c2"
USER_TEXT = ("Please use DuckDB for the ledger.\tIt is the one store every analyst here can query with plain SQL, "
             "so the ledger stays there.\nNot SQLite — it must be `duckdb>=1.1` :thumbs_up: [bold]x[/].\n"
             "  (indented, trailing space) ")


def mid(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def o(content: str, src: list[str], ts: str = "2026-01-15 14:30", rel: str = "medium") -> dict:
    return {"id": mid(content), "content": content, "timestamp": ts, "relevance": rel, "sourceEntryIds": src,
            "tokenCount": 10}


def r(content: str, supports: list[str]) -> dict:
    return {"id": mid(content), "content": content, "supportingObservationIds": supports, "tokenCount": 5}


A, B, C, D, X, Y = ("User chose DuckDB for the ledger.", "The ledger must not use SQLite.", "Tests must run offline.",
                    "Assistant agreed to DuckDB.", "Tests run offline.", "A note with a dangling watermark.")
R = "Storage is DuckDB; tests are offline."
NEVER = "An observation nobody recorded."


def session_one() -> SessionBuilder:
    sb = SessionBuilder(S1)
    sb.user(USER_TEXT)  # E1
    sb.assistant("DuckDB it is.")  # E2
    sb.user("A side question.")  # E3: on a side branch only
    sb.go(E[2])
    sb.thinking_level("high")  # E4: not a source entry
    sb.custom(OBS, {"observations": [o(A, [E[1], E[2]], "2026-01-15 14:01", "high"),
                                     o(B, [E[1], "ghost001", E[4], E[5]]),  # E5 is this record itself
                                     o(D, [E[2]])],
                    "coversUpToId": E[2]})  # E5
    sb.user("Also keep the tests offline.")  # E6
    sb.custom(OBS, {"observations": [o(A, [E[6]], "2026-01-15 14:06", "low"), o(C, [E[6], E[3]])],
                    "coversUpToId": E[6]})  # E7: A again (collision); C cites the side branch's E3
    sb.custom(REFL, {"reflections": [r(R, [mid(A), mid(C), mid(NEVER)])], "coversUpToId": E[6]})  # E8
    sb.custom(DROP, {"observationIds": [mid(B)], "coversUpToId": E[6]})  # E9
    sb.custom(OBS, {"observations": [o(X, [E[6]])], "coversUpToId": E[6]})  # E10
    sb.custom(REFL, {"reflections": [r(X, [mid(C)])], "coversUpToId": E[6]})  # E11: same id as an observation
    sb.assistant("Noted.")  # E12
    sb.custom(OBS, {"observations": [o(Y, [E[12]])], "coversUpToId": "ghost999"})  # E13: dangling watermark
    sb.custom(OBS, {"observations": [o(A, [E[12]], rel="urgent")], "coversUpToId": E[12]})  # E14: invalid
    return sb


def session_two() -> SessionBuilder:
    sb = SessionBuilder(S2)
    sb.user("We use DuckDB here too.")  # E1
    sb.custom(OBS, {"observations": [o(A, [E[1]], "2026-02-01 10:00"), o("Only in session two.", [E[1]]),
                                     o(D, [E[1]], "2026-02-01 10:00")],  # D once here, once in session one
                    "coversUpToId": E[1]})  # E2
    return sb


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recall")
    path = tmp / "om.duckdb"
    report = ingest(workspace(path), [session_one().write(tmp / "one.jsonl"), session_two().write(tmp / "two.jsonl")])
    assert [f.ledger["records"] for f in report.files] == [7, 1]
    return path


def brief(result) -> tuple:
    return result.status, result.kind, result.collision, result.partial


def evidence(obs) -> tuple:
    return (obs.id, obs.status, obs.matched, obs.source_entry_ids, obs.missing_source_entry_ids, obs.non_source_entry_ids,
            [(s.entry_id, s.text) for s in obs.sources])


# ---------------------------------------------------------------- status


@pytest.mark.parametrize("bad", ["XYZ", "ABCDEF012345", "0123456789abc", "0123456789ag", "",
                                 "0123456789ab\n", " 0123456789ab"])
def test_anything_but_12_lowercase_hex_is_an_invalid_id(db, bad):
    result = recall(workspace(db), bad, S1)
    assert brief(result) == ("invalid_id", None, False, False)
    assert (result.observations, result.reflections) == ([], [])
    assert "12" in result.message
    assert brief(recall(workspace(db), bad)) == ("invalid_id", None, False, False)


def test_what_is_no_id_on_the_command_line_is_a_query(db):
    # the command line takes an id, a hex prefix of one, or a query (SPEC §13); recall() itself, the
    # tool's id, still answers invalid_id for anything but 12 lowercase hex (above)
    result = CliRunner().invoke(app, ["--db", str(db), "recall", "NOT-AN-ID", "--json"])
    assert result.exit_code in (0, 1) and "status" not in json.loads(result.stdout)
    assert json.loads(result.stdout)["query"] == "NOT-AN-ID"


def test_a_unique_prefix_stands_for_its_id_as_a_session_prefix_does(db):
    from om_core.errors import AmbiguousMemoryId

    ids = [mid(text) for text in (A, B, C, D, X, Y, R)]
    unique = next(i[:k] for i in ids for k in range(4, 12) if sum(j.startswith(i[:k]) for j in ids) == 1)
    whole = next(i for i in ids if i.startswith(unique))
    for session in (S1, None):
        found = recall(workspace(db), unique, session)
        assert found.status == "found" and found.id == whole
        assert found.model_dump(exclude={"id"}) == recall(workspace(db), whole, session).model_dump(exclude={"id"})
    nowhere = next(p for p in ("fffff", "eeeee", "ddddd") if not any(i.startswith(p) for i in ids))
    missing = recall(workspace(db), nowhere)
    assert missing.status == "not_found" and f"no observation or reflection id starts with {nowhere}" in missing.message
    shared = next(i[:1] for i in ids if sum(j.startswith(i[:1]) for j in ids) > 1)
    with pytest.raises(AmbiguousMemoryId, match="starts several memory ids"):
        recall(workspace(db), shared)
    result = CliRunner().invoke(app, ["--db", str(db), "recall", unique, "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["id"] == whole


def test_an_unknown_id_is_not_found(db):
    result = recall(workspace(db), "0123456789ab", S1)
    assert brief(result) == ("not_found", None, False, False)
    assert (result.observations, result.reflections, result.missing_supporting_observation_ids) == ([], [], [])
    assert brief(recall(workspace(db), "0123456789ab")) == ("not_found", None, False, False)


# ---------------------------------------------------------------- observations


def test_an_observation_with_its_exact_source_text(db):
    result = recall(workspace(db), mid(D), S1)
    assert brief(result) == ("found", "observation", False, False)
    assert [evidence(x) for x in result.observations] == [
        (mid(D), "active", True, [E[2]], [], [], [(E[2], "DuckDB it is.")])]
    assert result.reflections == []
    assert result.session_ids == [S1]


def test_the_command_prints_source_text_exactly(db):
    # long lines, a tab, markup-like and emoji-like text and trailing spaces all come out as recorded
    result = CliRunner().invoke(app, ["--db", str(db), "recall", mid(A), "--session", S1])
    assert result.exit_code == 0, result.output
    assert "\n" + USER_TEXT + "\n" in result.stdout
    assert f"[{mid(A)}] 2026-01-15 14:01 [high] {A}\n" in result.stdout


def test_an_id_recorded_twice_is_a_collision_listing_both(db):
    result = recall(workspace(db), mid(A), S1)
    assert brief(result) == ("found", "observation", True, False)
    assert [evidence(x) for x in result.observations] == [
        (mid(A), "active", True, [E[1], E[2]], [], [], [(E[1], USER_TEXT), (E[2], "DuckDB it is.")]),
        (mid(A), "active", True, [E[6]], [], [], [(E[6], "Also keep the tests offline.")]),
    ]
    assert [(x.ts, x.relevance, x.ledger_id) for x in result.observations] == [
        ("2026-01-15 14:01", "high", E[5]), ("2026-01-15 14:06", "low", E[7])]


def test_a_dropped_observation_with_missing_and_non_source_ids_reported_apart(db):
    result = recall(workspace(db), mid(B), S1)
    assert brief(result) == ("found", "observation", False, True)
    assert [evidence(x) for x in result.observations] == [
        (mid(B), "dropped", True, [E[1], "ghost001", E[4], E[5]], ["ghost001"], [E[4], E[5]], [(E[1], USER_TEXT)])]


def test_a_source_on_another_branch_is_missing(db):
    result = recall(workspace(db), mid(C), S1)
    assert brief(result) == ("found", "observation", False, True)
    assert [evidence(x) for x in result.observations] == [
        (mid(C), "active", True, [E[6], E[3]], [E[3]], [], [(E[6], "Also keep the tests offline.")])]


def test_recall_ignores_watermarks_but_not_validity(db):
    assert brief(recall(workspace(db), mid(Y), S1)) == ("found", "observation", False, False)  # dangling watermark
    a = recall(workspace(db), mid(A), S1)  # E14 is an invalid record naming A: not a third match
    assert len(a.observations) == 2


# ---------------------------------------------------------------- reflections and mixed


def test_a_reflection_with_supporting_observations_at_their_first_occurrence(db):
    result = recall(workspace(db), mid(R), S1)
    assert brief(result) == ("found", "reflection", False, True)
    assert [(x.id, x.content, x.supporting_observation_ids, x.ledger_id) for x in result.reflections] == [
        (mid(R), R, [mid(A), mid(C), mid(NEVER)], E[8])]
    assert [evidence(x) for x in result.observations] == [
        (mid(A), "active", False, [E[1], E[2]], [], [], [(E[1], USER_TEXT), (E[2], "DuckDB it is.")]),
        (mid(C), "active", False, [E[6], E[3]], [E[3]], [], [(E[6], "Also keep the tests offline.")]),
    ]
    assert [x.ledger_id for x in result.observations] == [E[5], E[7]]  # A's first record, not E7
    assert result.missing_supporting_observation_ids == [mid(NEVER)]


def test_an_id_that_is_both_kinds_is_mixed(db):
    result = recall(workspace(db), mid(X), S1)
    assert brief(result) == ("found", "mixed", True, True)  # partial: the supporting C cites E3
    assert [(x.id, x.matched) for x in result.observations] == [(mid(X), True), (mid(C), False)]
    assert [x.id for x in result.reflections] == [mid(X)]
    assert result.missing_supporting_observation_ids == []


# ---------------------------------------------------------------- the branch, and all sessions


def test_recall_searches_only_the_branch_to_the_leaf(db):
    early = recall(workspace(db), mid(A), S1, leaf=E[5])
    assert brief(early) == ("found", "observation", False, False)
    assert recall(workspace(db), mid(B), S1, leaf=E[8]).observations[0].status == "active"  # the drop is at E9
    assert recall(workspace(db), mid(B), S1, leaf=E[9]).observations[0].status == "dropped"
    assert recall(workspace(db), mid(C), S1, leaf=E[5]).status == "not_found"
    assert recall(workspace(db), mid(A), S1, leaf=E[3]).status == "not_found"  # the side branch has no records


def test_without_a_session_every_session_is_searched_and_named(db):
    only_two = recall(workspace(db), mid("Only in session two."))
    assert brief(only_two) == ("found", "observation", False, False)
    assert only_two.session_ids == [S2]
    assert [(x.session_id, x.sources[0].text) for x in only_two.observations] == [(S2, "We use DuckDB here too.")]

    both = recall(workspace(db), mid(A))
    assert brief(both) == ("found", "observation", True, False)  # session one recorded A twice
    assert both.session_ids == [S1, S2]
    assert [(x.session_id, x.ledger_id, x.source_entry_ids) for x in both.observations] == [
        (S1, E[5], [E[1], E[2]]), (S1, E[7], [E[6]]), (S2, E[2], [E[1]])]
    # grouped by session, each branch judged on its own
    assert [(g.session_id, g.tip, g.kind, g.collision, g.partial, [x.ledger_id for x in g.observations])
            for g in both.sessions] == [(S1, E[14], "observation", True, False, [E[5], E[7]]),
                                        (S2, E[2], "observation", False, False, [E[2]])]


def test_the_same_content_in_two_sessions_is_no_collision(db):
    # D is recorded once in each session: the same text hashes to the same id, which is not a collision
    got = recall(workspace(db), mid(D))
    assert brief(got) == ("found", "observation", False, False)
    assert got.session_ids == [S1, S2]
    assert [(g.session_id, g.collision, [(x.session_id, x.sources[0].text) for x in g.observations])
            for g in got.sessions] == [(S1, False, [(S1, "DuckDB it is.")]),
                                       (S2, False, [(S2, "We use DuckDB here too.")])]
    # one session asked for: one group, the same verdict
    one = recall(workspace(db), mid(D), S2)
    assert brief(one) == ("found", "observation", False, False)
    assert [(g.session_id, g.tip) for g in one.sessions] == [(S2, E[2])]
    # the JSON groups them too, and the command prints each session under its own heading
    data = json.loads(CliRunner().invoke(app, ["--db", str(db), "recall", mid(D), "--json"]).stdout)
    assert [(g["session_id"], g["collision"], [x["ledger_id"] for x in g["observations"]])
            for g in data["sessions"]] == [(S1, False, [E[5]]), (S2, False, [E[2]])]
    assert data["collision"] is False
    text = CliRunner().invoke(app, ["--db", str(db), "recall", mid(D)]).stdout
    assert f"session {S1} at {E[14]}: observation\n" in text and f"session {S2} at {E[2]}: observation\n" in text
    assert text.index(S1 + " at") < text.index("DuckDB it is.") < text.index(S2 + " at") < text.index("We use DuckDB")


def test_a_migrated_hook_message_is_labelled_as_pi_reads_it(tmp_path):
    # v2: Pi renames role hookMessage to custom on load; the raw line keeps the old name
    sb = SessionBuilder("00000003-7ec4-4000-8000-0000000000c3", version=2)
    sb.user("Start.")  # E1
    hook = sb.message({"role": "hookMessage", "customType": "todo", "content": "Remember the todo list.",
                       "display": True})  # E2
    sb.custom(OBS, {"observations": [o("A todo list is kept.", [hook])], "coversUpToId": hook})  # E3
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [sb.write(tmp_path / "v2.jsonl")])
    result = recall(workspace(db), mid("A todo list is kept."), sb.session_id)
    assert [(s.entry_id, s.role, s.text) for s in result.observations[0].sources] == [
        (hook, "Extension message (todo)", "Remember the todo list.")]


def test_the_eval_reader_s_recall_tool_prints_a_reflection_with_its_supporting_ids(db):
    """The LongMemEval reader's recall (om_core.eval.reader) reads the recalled reflection's supporting
    ids as recall gives them (it read the extension's camelCase name and failed on every reflection)."""
    from om_core.eval.reader import recall_tool

    ws = workspace(db)
    with ws.read() as con:
        leaf = con.execute("SELECT leaf_id FROM sessions WHERE session_id = ?", [S1]).fetchone()[0]
    text = recall_tool(ws, S1, leaf)(mid(R))
    assert text.splitlines()[0] == f"Reflection [{mid(R)}]: {R} (supported by {mid(A)}, {mid(C)}, {mid(NEVER)})"
    assert f"Observation [{mid(A)}]" in text


# ------------------------------------------------------------------ secrets stay out

KEY = "sk-proj-" + "Q7x2Lm9Vr4Tb8Nc1Zp6Wd3Hs5Kf0Jg2Ye7Ua4Io9Pq1Rt"
PASSWORD = "Tr0ub4dor&3-horse-battery"
SECRET_S = "00000003-7ec4-4000-8000-0000000000c3"


def secret_session() -> SessionBuilder:
    sb = SessionBuilder(SECRET_S)
    sb.user(f"Deploy with OPENAI_API_KEY={KEY} please.")  # E1
    sb.bash("cat .env", f"DB_PASSWORD={PASSWORD}\nREGION=eu")  # E2
    sb.custom(OBS, {"observations": [o(f"User deploys with the key {KEY}.", [E[1], E[2]])],
                    "coversUpToId": E[2]})  # E3
    sb.custom(REFL, {"reflections": [r(f"The deploy password is {PASSWORD}.", [mid(f"User deploys with the key {KEY}.")])],
                     "coversUpToId": E[2]})  # E4
    return sb


def test_recall_keeps_secrets_out_of_the_tool_and_of_om_recall_unless_raw(tmp_path):
    """The recall tool's whole result (content and details: the model reads it), `om live recall`, `om
    recall` and its --json carry no secret of the evidence, redacted by the summaries' rules;
    `om recall --raw` prints the stored text."""
    import os
    import subprocess
    import sys

    from om_core.usecases.live import RecallRequest, recall_live

    path = secret_session().write(tmp_path / "secret.jsonl")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [path])
    obs, refl = mid(f"User deploys with the key {KEY}."), mid(f"The deploy password is {PASSWORD}.")

    def om(*args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OM_")}
        done = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    for memory_id in (obs, refl):
        tool = json.dumps(recall_live(workspace(db), RecallRequest(session_file=str(path), id=memory_id)))
        shown = {"tool": tool, "om live recall": om("live", "recall", memory_id, "--file", str(path), "--json"),
                 "om recall": om("recall", memory_id), "om recall --json": om("recall", memory_id, "--json")}
        for where, text in shown.items():
            assert KEY not in text and PASSWORD not in text, where
            assert "[REDACTED:" in text, where
        raw = om("recall", memory_id, "--raw")
        assert KEY in raw and PASSWORD in raw
    assert "REGION=eu" in om("recall", obs)  # the rest of the evidence is there
