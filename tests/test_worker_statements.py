"""What the workers see and may say: who said it, changes of state, the context across a chunk's
edge, the dropper's rows and guard, and what is new to the reflector. Scripted models answer through
litellm's real HTTP path (tests/fake_openai.py): a careless one's flaws are refused (with another
turn) or repaired, a careful one's answers are accepted.

Entry ids are the builder's: the n-th entry is ``f"{n:08x}"``, stamped 2026-01-15 14:00 + n minutes.
"""

from __future__ import annotations

import hashlib

import pytest

from builders import SessionBuilder
from conftest import workspace
from fake_openai import FakeOpenAI, text, tool_call
from om_core.ingest import ingest
from om_core.ledger.records import RECORD_MODELS, append_record
from om_core.memory.views import active_memory, ledger_rows
from om_core.model.client import RetryPolicy
from om_core.replay.stage_runner import observe_now, reflect_now
from om_core.settings import Settings
from om_core.store import db as dbmod
from om_core.store.catalog import resolve_tip
from om_core.store.workspace import Workspace
from om_core.workers.checks import attributes_to_user
from om_core.workers.near_duplicates import NearDuplicates
from om_core.workers.run_config import ModelConfig

SID = "0b5e1111-0000-4000-8000-000000000042"
OBS, REFL = "om.observations.recorded", "om.reflections.recorded"
E = {n: f"{n:08x}" for n in range(1, 40)}

pytestmark = pytest.mark.usefixtures("isolated_home")


def mid(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()[:12]


def config(server: FakeOpenAI) -> ModelConfig:
    return ModelConfig(model="openai/fake-model", api_base=server.base_url,
                       retry=RetryPolicy(attempts=1, base_seconds=0.001, max_seconds=0.002))


def append(db, kind: str, payload: dict, anchor: str) -> str:
    with dbmod.writing(db) as con, dbmod.transaction(con):
        return append_record(con, SID, kind, RECORD_MODELS[kind].model_validate(payload), anchor_entry_id=anchor)


def obs(content: str, src: list[str], ts: str = "2026-01-15 14:02", rel: str = "medium", tokens: float = 10) -> dict:
    return {"id": mid(content), "content": content, "timestamp": ts, "relevance": rel, "sourceEntryIds": src,
            "tokenCount": tokens}


def item(content: str, src: list[str], ts: str = "2026-01-15 14:03", rel: str = "high") -> dict:
    return {"timestamp": ts, "content": content, "relevance": rel, "sourceEntryIds": src}


def prompt(server: FakeOpenAI, i: int = 0) -> str:
    [user] = [m for m in server.requests[i]["messages"] if m["role"] == "user"]
    return user["content"] if isinstance(user["content"], str) else "".join(p["text"] for p in user["content"])


def receipts(server: FakeOpenAI, i: int) -> list[str]:
    return [m["content"] for m in server.requests[i]["messages"] if m["role"] == "tool"]


def active(db) -> list:
    with dbmod.reading(db) as con:
        return active_memory(ledger_rows(con, SID, resolve_tip(con, SID, None))).observations


def edge_session(tmp_path, db) -> str:
    """The agent's proposal ends the observed part (E1-E2, observed); the user's "no" opens the next
    chunk (E3), the agent acts on it (E4-E6). Returns the observed note on the proposal."""
    b = SessionBuilder(SID)
    b.user("Where should new messages wait before they are sent?")                          # E1 14:01
    b.assistant("I propose a chat container: messages wait in the chat list until sent.")     # E2 14:02
    b.user("No, we want a pending container, not the chat list.")                           # E3 14:03
    b.assistant("Switching to a pending container.",
                tool_calls=[("call_1", "bash", {"command": "npm run check"})])               # E4 14:04
    b.tool_result("call_1", "bash", "12 checks, 1 failed: pending.test.ts")                  # E5 14:05
    b.assistant("All checks pass now.")                                                      # E6 14:06
    ingest(workspace(db), [b.write(tmp_path / "session.jsonl")])
    proposal = obs("Agent proposed a chat container: messages wait in the chat list until sent.", [E[2]])
    append(db, OBS, {"observations": [proposal], "coversUpToId": E[2]}, E[2])
    return proposal["id"]


# ------------------------------------------------------------------ the rules by hand


@pytest.mark.parametrize("content, user", [
    ("User decided on a pending container.", True),
    ("The user's goal is a working outbox.", True),
    ("user asked whether the API is read-only", True),
    ("Agent proposed a pending container.", False),
    ("Waiting on the user to pick a design.", False),
    ("Username field renamed to login.", False),  # the word must be "user", not a longer one
])
def test_the_fixed_grammar_of_a_note_attributed_to_the_user(content, user):
    assert attributes_to_user(content) is user


@pytest.mark.parametrize("earlier, later, verdict", [
    ("npm run check passes after the fix to the pending queue; committed.",
     "npm run check fails after the fix to the pending queue; committed.", "changed"),          # pass/fail
    ("Messages wait in the chat container until the send succeeds and the list refreshes.",
     "Messages wait in the pending container until the send succeeds and the list refreshes.", "changed"),
    ("The issue about the flaky upload test of the billing service is open.",
     "The issue about the flaky upload test of the billing service is closed.", "changed"),     # open/closed
    ("User asked for 3 retries on the upload step of the main branch.",
     "User asked for 5 retries on the upload step of the main branch.", "changed"),             # a number
    ("The orders service runs on PostgreSQL 15 in production and staging.",
     "The orders service runs on PostgreSQL 16 in production and staging.", "changed"),         # a version
    ("Two tests of the upload module fail on the main branch after the merge.",
     "Three tests of the upload module fail on the main branch after the merge.", "changed"),   # a count word
    ("The config sets max_retries for the upload client of the billing service.",
     "The config sets min_retries for the upload client of the billing service.", "changed"),   # an identifier
    ("Step 1 of the migration plan copies the orders table into the archive.",
     "Step 2 of the migration plan copies the orders table into the archive.", None),           # another step
    ("The deploy script lives in scripts/deploy.sh and needs the staging profile.",
     "The deploy script lives in scripts/release.sh and needs the staging profile.", None),     # another file
    ("User said the migration must run before the release of the new billing service.",
     "User said the migration must not run before the release of the new billing service.", "changed"),  # negation
    ("User asked to run the unit tests before every commit to main.",
     "User asked to run all the unit tests before every commit to main.", "duplicate"),        # a word added
    ("User wants the orders service.", "User wants the billing service.", None),                # too different
    ("Work happened between entries 00000004 and 0000000a of the session.",
     "Work happened between entries 0000000b and 00000011 of the session.", None),  # other entries: ids of digits alone
    ("User said: I asked for a pasta recipe with mushrooms. (note q00.1)",
     "User said: I asked for a pasta recipe with mushrooms. (note q00.2)", None),  # another labelled note
])
def test_a_near_copy_that_changes_a_state_is_no_duplicate(earlier, later, verdict):
    found = NearDuplicates([("a" * 12, earlier, ())]).match(later)
    assert (None if found is None else "changed" if found.changed else "duplicate") == verdict


# ------------------------------------------------------------------ a careless model, refused or repaired


def test_a_user_decision_citing_only_the_agent_is_refused_and_rewritten_as_the_agents(server, tmp_path, db_path):
    edge_session(tmp_path, db_path)
    careless = item("User decided that all checks pass with the pending container.", [E[6]])
    repaired = item("Agent claimed all checks pass with the pending container; the last run showed 1 failed.",
                    [E[6], E[5]], ts="2026-01-15 14:06", rel="medium")
    server.add(tool_call("record_observations", {"observations": [careless]}),
               tool_call("record_observations", {"observations": [repaired]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    [first] = receipts(server, 1)
    assert first.splitlines()[1] == (
        "1. rejected: the note says what the user said, asked, decided or required, but cites no message of the "
        "user's: cite the user's own message, or write what the agent proposed or claimed as \"Agent proposed …\" "
        "/ \"Agent claimed …\"")
    assert (outcome.outcome, outcome.items, outcome.rejected, outcome.turns) == ("recorded", 1, 1, 2)
    assert [o.content for o in active(db_path)][-1] == repaired["content"]


def test_a_state_change_answered_as_a_duplicate_is_refused_until_it_names_the_note(server, tmp_path, db_path):
    edge_session(tmp_path, db_path)
    passes = obs("npm run check passes with the pending container; committed.", [E[2]])
    append(db_path, OBS, {"observations": [passes], "coversUpToId": E[2]}, E[2])
    careless = item("npm run check fails with the pending container; committed.", [E[5]], rel="high")
    fixed = item(f"npm run check fails with the pending container (supersedes [{passes['id']}]): "
                 "pending.test.ts.", [E[5]], ts="2026-01-15 14:05", rel="high")
    server.add(tool_call("record_observations", {"observations": [careless]}),
               tool_call("record_observations", {"observations": [fixed]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    [first] = receipts(server, 1)
    # not "duplicate …, skipped" (a clean receipt, no new turn): refused, the earlier line quoted
    assert first.splitlines()[1] == (
        f"1. rejected: nearly the same as [{passes['id']}] \"{passes['content']}\" but with a changed state: if it "
        f"replaces that note, name it with (supersedes [{passes['id']}]); if it is another fact, reword it to say so")
    assert (outcome.items, outcome.rejected, outcome.duplicates, outcome.turns) == (1, 1, 0, 2)
    assert active(db_path)[-1].content == fixed["content"]


def test_an_exact_or_plain_near_duplicate_is_still_skipped_without_a_new_turn(server, tmp_path, db_path):
    proposal = edge_session(tmp_path, db_path)
    same = item("Agent proposed a chat container: messages wait in the chat list until they are sent.", [E[2]])
    server.add(tool_call("record_observations", {"observations": [same]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert outcome.receipts[0].splitlines()[1] == f"1. duplicate [{mid(same['content'])}]: nearly the same as " \
                                                  f"[{proposal}], skipped"
    assert (outcome.turns, outcome.rejected) == (1, 0)


# ------------------------------------------------------------------ a careful model, accepted


def test_a_careful_models_notes_cite_the_context_and_keep_the_agents_proposal_its_own(server, tmp_path, db_path):
    proposal = edge_session(tmp_path, db_path)
    careful = [
        # the user's "no" opens the chunk; the proposal it rejects ended the previous one
        item(f"User rejected the chat container (supersedes [{proposal}]): new messages wait in a pending "
             "container, not the chat list.", [E[3], E[2]], rel="critical"),
        item("Agent claimed all checks pass, but the last npm run check showed 1 failed: pending.test.ts.",
             [E[5], E[6]], ts="2026-01-15 14:05"),
    ]
    server.add(tool_call("record_observations", {"observations": careful}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert (outcome.outcome, outcome.items, outcome.rejected, outcome.turns) == ("recorded", 2, 0, 1)
    sent = prompt(server)
    context = sent.split("## Context (before this chunk, already observed)\n", 1)[1].split("\n\n## New entries")[0]
    assert f"[{E[1]} User 14:01]" in context and f"[{E[2]} Assistant 14:02] I propose a chat container" in context
    assert f"## New entries ({E[3]} to {E[6]})" in sent
    assert [o.sourceEntryIds for o in active(db_path)[-2:]] == [[E[3], E[2]], [E[5], E[6]]]
    # the watermark is the chunk's last entry, as before: the context is no part of the chunk
    with dbmod.reading(db_path) as con:
        [(covers,)] = con.execute("SELECT covers_up_to_id FROM ledger WHERE session_id = ? ORDER BY append_seq DESC "
                                  "LIMIT 1", [SID]).fetchall()
    assert covers == E[6]


def test_an_entry_before_the_context_is_still_refused(server, tmp_path, db_path):
    b = SessionBuilder(SID)
    for n in range(1, 9):
        (b.user if n % 2 else b.assistant)(f"Message {n}.")
    ingest(workspace(db_path), [b.write(tmp_path / "session.jsonl")])
    append(db_path, OBS, {"observations": [obs("Agent said hello.", [E[2]])], "coversUpToId": E[5]}, E[5])
    server.add(tool_call("record_observations", {"observations": [item("User said message one.", [E[1]]),
                                                                  item("User said message three.", [E[3]])]}),
               text("done"))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    lines = outcome.receipts[0].splitlines()
    assert lines[1] == f"1. rejected: sourceEntryIds {E[1]} are not entries of this chunk or its context"
    assert lines[2] == f"2. recorded [{mid('User said message three.')}]"  # E3-E5: the three before E6


# ------------------------------------------------------------------ the reflector's and the dropper's view


def test_the_reflector_is_told_which_notes_are_new_and_the_dropper_guards_only_the_users_words(
        server, tmp_path, db_path):
    b = SessionBuilder(SID)
    for n in range(1, 7):
        (b.user if n % 2 else b.assistant)(f"Message {n}.")
    ingest(workspace(db_path), [b.write(tmp_path / "session.jsonl")])
    said = obs("User forbids force-pushes to main.", [E[1]], rel="critical", tokens=30)
    claimed = obs("Agent refactored the upload module.", [E[2]], rel="critical", tokens=30)
    old = obs("Agent listed the branches.", [E[2]], rel="low", tokens=30)
    append(db_path, OBS, {"observations": [old], "coversUpToId": E[2]}, E[2])
    reflection = {"id": mid("Reflection one."), "content": "Reflection one.", "supportingObservationIds": [old["id"]],
                  "tokenCount": 5}
    append(db_path, REFL, {"reflections": [reflection], "coversUpToId": E[2]}, E[2])
    append(db_path, OBS, {"observations": [said, claimed], "coversUpToId": E[4]}, E[4])
    server.add(tool_call("record_reflections", {"reflections": [
                   {"content": "Force-pushes to main are forbidden.", "supportingObservationIds": [old["id"]]}]}),
               tool_call("drop_observations", {"ids": [said["id"], claimed["id"]], "reason": "over target"}))
    settings = Settings(observationsPoolMaxTokens=100, observationsPoolTargetTokens=40)
    reflector, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    assert prompt(server, 0).endswith(f"## New since the last reflections\n{said['id']}, {claimed['id']}")
    sent = prompt(server, 1)
    assert "90 tokens; target 40 tokens, so 50 tokens to shed." in sent
    assert f"{old['id']} 4 low 30 strong {reflection['id']},{mid('Force-pushes to main are forbidden.')}" in sent
    assert f"{said['id']} 4 critical 30 none -" in sent
    assert f"Guard: never dropped, as critical notes of the user's own words that no reflection cites: {said['id']}." \
        in sent
    lines = dropper.receipts[0].splitlines()
    # the user's own critical constraint is kept; the agent's work marked critical pins nothing
    assert lines[1] == f"kept [{said['id']}]: a critical observation no reflection cites is never dropped"
    assert lines[2] == f"proposed [{claimed['id']}]"
    assert {o.id for o in active(db_path)} == {said["id"], old["id"]}


def test_the_guard_keeps_the_users_critical_notes_newest_first_within_its_bound(server, tmp_path, db_path):
    b = SessionBuilder(SID)
    for n in range(1, 7):
        (b.user if n % 2 else b.assistant)(f"Message {n}.")
    ingest(workspace(db_path), [b.write(tmp_path / "session.jsonl")])
    # an observer that marks every note critical: four of the user's words, one of the agent's
    made = [obs(f"User stated rule {n} of the release.", [E[1]], f"2026-01-15 14:0{n}", "critical", 30)
            for n in range(1, 5)] + [obs("Agent ran the linter.", [E[2]], "2026-01-15 14:05", "critical", 30)]
    append(db_path, OBS, {"observations": made, "coversUpToId": E[4]}, E[4])
    server.add(tool_call("record_reflections", {"reflections": [
                   {"content": "Releases follow the user's rules.", "supportingObservationIds": [made[0]["id"]]}]}),
               tool_call("drop_observations", {"ids": [m["id"] for m in made], "reason": "over target"}))
    settings = Settings(observationsPoolMaxTokens=200, observationsPoolTargetTokens=120)
    _, dropper = reflect_now(Workspace.open(db_path, settings=settings), SID, None, config(server))
    # the bound: half the target (60 tokens), newest first: rules 4 and 3; rule 2 and the agent's
    # note go by the safety order; rule 1 is cited by a reflection, so no guard applies to it
    lines = dropper.receipts[0].splitlines()
    assert [line.split(" [")[0] for line in lines[1:6]] == ["proposed", "proposed", "kept", "kept", "proposed"]
    assert f"cites: {made[2]['id']}, {made[3]['id']}." in prompt(server, 1)


def test_a_state_change_may_name_a_note_recorded_earlier_in_the_same_answer(server, tmp_path, db_path):
    edge_session(tmp_path, db_path)
    fails = item("WP4 added the prompting methods; npm run check fails because the interface sits in the class.",
                 [E[5]], ts="2026-01-15 14:05", rel="medium")
    passes = item("WP4 added the prompting methods; npm run check passes because the interface sits in the class.",
                  [E[6]], ts="2026-01-15 14:06", rel="medium")
    fixed = item(f"npm run check passes now (supersedes [{mid(fails['content'])}]).", [E[6]], ts="2026-01-15 14:06",
                 rel="medium")
    server.add(tool_call("record_observations", {"observations": [fails, passes]}),
               tool_call("record_observations", {"observations": [fixed]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert receipts(server, 1)[0].splitlines()[2].startswith(f"2. rejected: nearly the same as [{mid(fails['content'])}]")
    assert (outcome.items, outcome.rejected, outcome.turns) == (2, 1, 2)
    assert [o.content for o in active(db_path)][-2:] == [fails["content"], fixed["content"]]


def test_the_offline_baseline_names_the_note_whose_state_it_changes(monkeypatch):
    from types import SimpleNamespace

    from om_core.ledger.records import Observation
    from om_core.workers import offline
    from om_core.workers.checks import ObservationCheck

    earlier = Observation.model_validate(obs("Assistant modified src/upload.py (edited 2 times)", [E[1]]))
    later = item("Assistant modified src/upload.py (edited 5 times)", [E[2]], ts="2026-01-15 14:02", rel="medium")
    monkeypatch.setattr(offline, "observe_entries", lambda chunk: [later])
    check = ObservationCheck(chunk_times={E[2]: "2026-01-15 14:02"}, known_ids={earlier.id}, active=[earlier],
                             memory_ids={earlier.id}, user_ids=frozenset())
    loop = offline.OfflineBrain(redact_secrets=False).observe(SimpleNamespace(chunk=[]), check)
    assert loop.receipts[0].splitlines()[1].startswith(f"1. rejected: nearly the same as [{earlier.id}]")
    assert [o.content for o in check.accepted] == [f"{later['content']} (supersedes [{earlier.id}])"]


def test_ids_are_told_by_the_citations_not_by_their_look():
    # an entry id that reads as a word: by its look a plain word (a repeat); cited, what the note is about
    earlier = "Entry facade shows the login flow works and the unit tests pass."
    later = "Entry decade shows the login flow works and the unit tests pass."
    by_shape = NearDuplicates([("a" * 12, earlier, ())]).match(later)
    assert by_shape is not None and not by_shape.changed
    assert NearDuplicates([("a" * 12, earlier, ["facade"])], ids={"facade", "decade"}).match(later, ["decade"]) is None
    # a number that looks like an id: by its look another entry; no one cites it, so a changed count
    earlier = "The nightly import loaded 12345678 rows into the orders table today."
    later = "The nightly import loaded 12345679 rows into the orders table today."
    assert NearDuplicates([("a" * 12, earlier, ())]).match(later) is None
    found = NearDuplicates([("a" * 12, earlier, [E[1]])], ids={E[1], E[2]}).match(later, [E[2]])
    assert found is not None and found.changed
    # a cited id of digits alone is still an id
    earlier, later = (f"Work happened between entries {E[4]} and {E[10]} of the session.",
                      f"Work happened between entries {E[11]} and {E[17]} of the session.")
    assert NearDuplicates([("a" * 12, earlier, [E[4], E[10]])], ids=set(E.values())).match(later, [E[11]]) is None


def test_the_observer_check_knows_the_chunks_entry_ids():
    from om_core.ledger.records import Observation
    from om_core.workers.checks import ObservationCheck

    earlier = Observation.model_validate(obs("Entry facade shows the login flow works and the unit tests pass.",
                                             ["facade"]))
    rows = Observation.model_validate(obs("The nightly import loaded 12345678 rows into the orders table today.",
                                          ["facade"]))
    check = ObservationCheck(chunk_times={"decade": "2026-01-15 14:02"}, known_ids={earlier.id, rows.id},
                             active=[earlier, rows], memory_ids={earlier.id, rows.id}, user_ids=frozenset())
    receipt = check.submit({"observations": [
        item("Entry decade shows the login flow works and the unit tests pass.", ["decade"]),
        item("The nightly import loaded 12345679 rows into the orders table today.", ["decade"])]}).splitlines()
    assert receipt[1].startswith("1. recorded [")  # another entry: another fact
    assert receipt[2].startswith(f"2. rejected: nearly the same as [{rows.id}]")  # another count: a change


def test_a_change_of_a_state_changed_before_names_the_newest_and_is_kept(monkeypatch):
    from types import SimpleNamespace

    from om_core.ledger.records import Observation
    from om_core.workers import offline
    from om_core.workers.checks import ObservationCheck

    first = Observation.model_validate(obs("Assistant modified src/upload.py (edited 5 times)", [E[1]]))
    newer = Observation.model_validate(obs(f"Assistant modified src/upload.py (edited 2 times) (supersedes [{first.id}])",
                                           [E[2]]))
    later = item("Assistant modified src/upload.py (edited 3 times)", [E[3]], ts="2026-01-15 14:02", rel="medium")
    monkeypatch.setattr(offline, "observe_entries", lambda chunk: [later])
    known = {first.id, newer.id}
    check = ObservationCheck(chunk_times={E[3]: "2026-01-15 14:02"}, known_ids=known, active=[first, newer],
                             memory_ids=known, user_ids=frozenset())
    loop = offline.OfflineBrain(redact_secrets=False).observe(SimpleNamespace(chunk=[]), check)
    # the receipt quotes the newest state, and the note naming it is compared without its clause
    assert loop.receipts[0].splitlines()[1].startswith(f"1. rejected: nearly the same as [{newer.id}]")
    assert loop.receipts[1].splitlines()[1].startswith("1. recorded [")
    assert [o.content for o in check.accepted] == [f"{later['content']} (supersedes [{newer.id}])"]
