"""Supersession retires: a reflection that names a current one as "(supersedes [id])" retires it in the
same stage, with an ``om.reflections.dropped`` record (``replacedBy`` the new reflection, kind
"superseded") appended after the reflections record. A scripted model answers through litellm's real
HTTP path (tests/fake_openai.py): a careless replacement that leaves the old reflection active is
refused with another turn and repaired; a careful one is accepted at once; an id that names no
reflection is refused; one already dropped is accepted and retires nothing."""

from __future__ import annotations

import json

import pytest

from builders import SessionBuilder
from conftest import workspace
from fake_openai import tool_call
from om_core.ingest import ingest
from om_core.memory.views import active_memory, ledger_rows
from om_core.usecases.export import export_session
from om_core.replay.stage_runner import reflect_now
from om_core.settings import Settings
from om_core.store import db as dbmod
from om_core.store.catalog import resolve_tip
from om_core.store.workspace import Workspace
from om_core.workers.checks import superseded_ids
from test_worker_statements import E, OBS, REFL, SID, append, config, mid, obs, receipts

RDROP = "om.reflections.dropped"
pytestmark = pytest.mark.usefixtures("isolated_home")

KEEP = "The old upload code is kept beside the new client until the release is out."
REMOVE = "The old upload code is removed beside the new client until the release is out."


def session(tmp_path, db, dropped: bool = False) -> tuple[dict, dict]:
    """Two observations; a reflection ("keep the old code") on the first; with ``dropped``, that
    reflection is dropped already. Returns the observations."""
    b = SessionBuilder(SID)
    for n in range(1, 7):
        (b.user if n % 2 else b.assistant)(f"Message {n}.")
    ingest(workspace(db), [b.write(tmp_path / "session.jsonl")])
    keep = obs("User asked to keep the old upload code until the release.", [E[1]], rel="high")
    remove = obs("User asked to remove the old remaining upload files now.", [E[3]], ts="2026-01-15 14:04", rel="high")
    append(db, OBS, {"observations": [keep], "coversUpToId": E[2]}, E[2])
    append(db, REFL, {"reflections": [{"id": mid(KEEP), "content": KEEP, "supportingObservationIds": [keep["id"]],
                                       "tokenCount": 20}], "coversUpToId": E[2]}, E[2])
    if dropped:
        append(db, RDROP, {"reflectionIds": [mid(KEEP)], "coversUpToId": E[2]}, E[2])
    append(db, OBS, {"observations": [remove], "coversUpToId": E[4]}, E[4])
    return keep, remove


def current(db) -> list[str]:
    with dbmod.reading(db) as con:
        return [r.content for r in active_memory(ledger_rows(con, SID, resolve_tip(con, SID, None))).reflections]


def drops(db) -> list[tuple]:
    with dbmod.reading(db) as con:
        return con.execute("SELECT d.refl_id, d.replaced_by, d.kind, l.stage FROM reflection_drops d JOIN "
                           "om_internal.ledger l USING (session_id, ledger_id) ORDER BY l.append_seq").fetchall()


def reflect(server, db) -> list:
    return reflect_now(Workspace.open(db, settings=Settings()), SID, None, config(server))


@pytest.mark.parametrize("content, ids", [
    ("Remove the old code (supersedes [0123456789ab]).", ["0123456789ab"]),
    ("Remove it (supersedes [0123456789ab], [ba9876543210]).", ["0123456789ab", "ba9876543210"]),
    ("Remove it (Supersedes [0123456789ab] and [ba9876543210])", ["0123456789ab", "ba9876543210"]),
    ("As [0123456789ab] says, remove the old code.", []),  # a reference is no replacement
])
def test_the_superseded_ids_a_note_names(content, ids):
    assert superseded_ids(content) == ids


def test_a_replacement_that_leaves_the_old_reflection_active_is_refused_then_retires_it(server, tmp_path, db_path):
    _, remove = session(tmp_path, db_path)
    server.add(tool_call("record_reflections", {"reflections": [
                   {"content": REMOVE, "supportingObservationIds": [remove["id"]]}]}),
               tool_call("record_reflections", {"reflections": [
                   {"content": f"{REMOVE} (supersedes [{mid(KEEP)}])", "supportingObservationIds": [remove["id"]]}]}))
    reflector = reflect(server, db_path)[0]
    # the careless answer: a near copy with a changed state, the old line quoted, another turn
    assert receipts(server, 1)[0].splitlines()[1] == (
        f"1. rejected: nearly the same as reflection [{mid(KEEP)}] \"{KEEP}\" but with a changed state: if it "
        f"replaces that reflection, name it with (supersedes [{mid(KEEP)}]); if it is another conclusion, reword "
        "it to say so")
    new = f"{REMOVE} (supersedes [{mid(KEEP)}])"
    assert reflector.receipts[-1].splitlines()[1] == f"1. recorded [{mid(new)}], retiring [{mid(KEEP)}]"
    assert (reflector.items, reflector.rejected, reflector.turns) == (1, 1, 2)
    assert current(db_path) == [new]
    assert drops(db_path) == [(mid(KEEP), json.dumps(mid(new)), json.dumps("superseded"), "reflector")]


def test_a_careful_replacement_is_accepted_at_once_and_written_to_the_session_file(server, tmp_path, db_path):
    _, remove = session(tmp_path, db_path)
    new = f"Remove the old remaining upload files now (supersedes [{mid(KEEP)}])."
    server.add(tool_call("record_reflections", {"reflections": [
        {"content": new, "supportingObservationIds": [remove["id"]]}]}))
    reflector = reflect(server, db_path)[0]
    assert len(server.requests) == 1 and (reflector.items, reflector.rejected) == (1, 0)
    assert current(db_path) == [new]
    export_session(workspace(db_path), SID, tmp_path / "out.jsonl")
    written = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()[1:]]
    kinds = [x.get("customType") for x in written if x.get("customType", "").startswith("om.")]
    assert kinds[-2:] == [REFL, RDROP]  # the retirement follows the reflection that retires it
    assert written[-1]["data"] == {"reflectionIds": [mid(KEEP)], "replacedBy": mid(new), "kind": "superseded",
                                   "coversUpToId": E[4]}


def test_naming_no_reflection_is_refused_with_another_turn(server, tmp_path, db_path):
    keep, remove = session(tmp_path, db_path)
    wrong = f"Remove the old remaining upload files now (supersedes [{keep['id']}])."  # an observation's id
    right = f"Remove the old remaining upload files now (supersedes [{mid(KEEP)}])."
    server.add(tool_call("record_reflections", {"reflections": [
                   {"content": wrong, "supportingObservationIds": [remove["id"]]}]}),
               tool_call("record_reflections", {"reflections": [
                   {"content": right, "supportingObservationIds": [remove["id"]]}]}))
    reflector = reflect(server, db_path)[0]
    assert receipts(server, 1)[0].splitlines()[1].startswith(
        f"1. rejected: (supersedes [{keep['id']}]) names no reflection")
    assert (reflector.items, reflector.rejected, reflector.turns) == (1, 1, 2)
    assert current(db_path) == [right] and [d[0] for d in drops(db_path)] == [mid(KEEP)]


def test_naming_a_reflection_dropped_already_is_accepted_and_retires_nothing(server, tmp_path, db_path):
    _, remove = session(tmp_path, db_path, dropped=True)
    new = f"Remove the old remaining upload files now (supersedes [{mid(KEEP)}])."
    server.add(tool_call("record_reflections", {"reflections": [
        {"content": new, "supportingObservationIds": [remove["id"]]}]}))
    reflector = reflect(server, db_path)[0]
    assert reflector.receipts[0].splitlines()[1] == (
        f"1. recorded [{mid(new)}]; [{mid(KEEP)}] already dropped, nothing to retire")
    assert len(server.requests) == 1 and current(db_path) == [new]
    assert drops(db_path) == [(mid(KEEP), None, None, None)]  # only the earlier drop
