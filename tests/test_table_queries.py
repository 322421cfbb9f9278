"""Table-driven SQL: the replay payload's statements that differ only by their table are one template
each (sql/queries/tables/), instantiated per table by an enum (om_core.replay.payload.ReplayTable).
Each instantiation does what the statement it replaced did (tests/sql/replay_payload_before.sql holds
those statements as they were): a write is the same statement, a read gives the same rows on a
database a replay wrote to."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder

from conftest import workspace
from om_core.ingest import ingest
from om_core.replay.engine import replay_session
from om_core.replay.payload import (PAYLOAD_TABLES, REPLAYED_TABLES, ReplayTable, commit_statement, payload_load,
                                    payload_read, replayed_read)
from om_core.settings import Settings
from om_core.store.sqlfiles import query, table_query
from om_core.store.workspace import Workspace
from om_core.workers.run_config import ModelConfig, make_brain

BEFORE = Path(__file__).parent / "sql" / "replay_payload_before.sql"
SETTINGS = Settings(observeAfterTokens=150, reflectAfterTokens=300, compactAfterTokens=700, keepRecentTokens=200,
                    observerChunkMaxTokens=400, observationsPoolMaxTokens=40, observationsPoolTargetTokens=20)
SID = "0000000a-aaaa-bbbb-cccc-dddddddddddd"
RUN = "00000000000000aa"


def before() -> dict[str, str]:
    text = BEFORE.read_text()
    marks = list(re.finditer(r"^--\s*name:\s*(\w+)\s*$", text, re.MULTILINE))
    return {m.group(1): text[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(text)].strip()
            for i, m in enumerate(marks)}


def statements() -> dict[str, str]:
    """The statement that now does each old statement's job, under the old name."""
    new = {f"payload_{t.value}": payload_read(t) for t in PAYLOAD_TABLES}
    new |= {f"load_{t.value}": payload_load(t) for t in PAYLOAD_TABLES}
    new |= {f"replayed_{t.value}": replayed_read(t) for t in REPLAYED_TABLES}
    new |= {f"commit_{t.value}": commit_statement(t) for t in REPLAYED_TABLES}
    return new


def same_text(a: str, b: str) -> bool:
    strip = lambda s: " ".join(line for line in s.splitlines() if not line.lstrip().startswith("--")).split()  # noqa: E731
    return strip(a) == strip(b)


def test_every_old_statement_has_its_instantiation_or_is_still_named():
    old, new = before(), statements()
    for name in old:
        if name not in new:  # a statement of a shape of its own: still a named query, unchanged
            assert same_text(query(name), old[name]), name
    assert set(new) <= set(old), set(new) - set(old)


def test_each_write_is_the_old_statement():
    old = before()
    for name, statement in statements().items():
        if name.startswith(("load_", "commit_")):
            assert same_text(statement, old[name]), (name, statement, old[name])


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """A database with one ingested session that one offline replay wrote to (records, compactions,
    stages), read-only for the comparisons."""
    tmp = tmp_path_factory.mktemp("replayed")
    b = SessionBuilder(session_id=SID, start="2026-03-01T09:00:00")
    b.work_turns(10, "alpha")
    path = b.write(tmp / "s.jsonl")
    db = tmp / "om.duckdb"
    ingest(workspace(db), [path])
    result = replay_session(Workspace.open(db, settings=SETTINGS), SID,
                            make_brain(ModelConfig(model="offline"), SETTINGS), run_id=RUN)
    assert result.error is None and not result.rows.empty
    con = duckdb.connect(str(db), read_only=True)
    yield con
    con.close()


def test_each_read_gives_the_old_statements_rows(replayed):
    old = before()
    tried = 0
    for name, statement in statements().items():
        if not name.startswith(("payload_", "replayed_")):
            continue
        params = {"session_id": SID} if name.startswith("payload_") else {"run_id": RUN}
        then = replayed.sql(old[name], params=params).fetchall()
        now = replayed.sql(statement, params=params).fetchall()
        assert sorted(map(repr, now)) == sorted(map(repr, then)), name
        tried += bool(then)
    assert tried >= 8  # the comparisons saw rows: sessions, entries, ledger, observations, compactions…


def test_a_template_takes_only_a_table_name():
    class NotATable(str):
        value = "ledger; DROP TABLE om_internal.ledger"

    with pytest.raises(ValueError):
        table_query("rows_of_session", NotATable())  # type: ignore[arg-type]
    assert "om_internal.ledger " in table_query("rows_of_session", ReplayTable.LEDGER)
