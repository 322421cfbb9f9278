"""Property test: the SQL project fold agrees with the plain-Python oracle (tests/project_oracle.py) on
random project ledgers: repeated ids within and across records, retirements of ids seen, unseen and
retired twice, records of origin user (om forget --project), and session memory ids a user forgot in
the project's sessions (and one forgotten in a session of another project, which must not count)."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from om_core.store import db as dbmod
from om_core.ledger.records import OBSERVATIONS_DROPPED, LedgerRows, ObservationsDropped
from om_core.memory.project_memory import ProjectReflection, Retirement, append_project_records, project_fold
from project_oracle import PRecord, PReflection, project_fold as oracle_fold

CONTENTS = ["uses duckdb", "never force-push", "tests run offline", "poetry not pip", "ci on 2 cores"]
SUPPORT = [hashlib.sha256(f"s{i}".encode()).hexdigest()[:12] for i in range(6)]
PROJECT, OTHER = "github.com/acme/app", "/src/other"


def mid(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


reflection = st.builds(lambda c, s, t: PReflection(mid(c), c, s, t), st.sampled_from(CONTENTS),
                       st.lists(st.sampled_from(SUPPORT), min_size=1, max_size=3), st.integers(1, 30))
record = st.one_of(
    st.builds(lambda rs: PRecord("recorded", reflections=rs), st.lists(reflection, min_size=1, max_size=3)),
    st.builds(lambda xs: PRecord("retired", retirements=xs),
              st.lists(st.tuples(st.sampled_from([mid(c) for c in CONTENTS] + ["0" * 12]),
                                 st.sampled_from(["superseded", "outdated", "user said so"])), min_size=1, max_size=2)))


# at most 150 examples in CI (its profile says 300): each is a fold in DuckDB, ~0.1 CPU-s of planning
@settings(max_examples=min(settings.default.max_examples, 150))
@given(records=st.lists(record, max_size=8), origins=st.lists(st.sampled_from(["pipeline", "user"]), min_size=8,
                                                               max_size=8),
       forgotten=st.sets(st.sampled_from(SUPPORT), max_size=3), elsewhere=st.sampled_from(SUPPORT))
def test_the_project_fold_equals_the_oracle(records, origins, forgotten, elsewhere):
    con = dbmod.memory_database({"threads": 1})
    try:
        for sid, project in (("s-a", PROJECT), ("s-other", OTHER)):
            con.execute("INSERT INTO om_internal.sessions (session_id, file_path, version, entry_count, source_count, "
                        "leaf_count, header, leaf_id) VALUES (?, ?, 3, 1, 1, 1, '{}', 'e1')", [sid, f"/{sid}.jsonl"])
            con.execute("INSERT INTO om_internal.project_sessions (session_id, cwd, project_id, how) "
                        "VALUES (?, '/x', ?, 'path')", [sid, project])
        rows = LedgerRows()
        for n, obs_id in enumerate(sorted(forgotten)):
            rows.add_record("s-a", f"f{n}", OBSERVATIONS_DROPPED,
                            ObservationsDropped(observationIds=[obs_id], coversUpToId="e1", reason="no"),
                            anchor="e1", origin="user", created_at=None, run_id=None, stage="forget")
        rows.add_record("s-other", "g0", OBSERVATIONS_DROPPED,  # another project's forget: not this one's
                        ObservationsDropped(observationIds=[elsewhere], coversUpToId="e1"),
                        anchor="e1", origin="user", created_at=None, run_id=None, stage="forget")
        rows.add_record("s-a", "p0", OBSERVATIONS_DROPPED,  # the dropper's drop: no forget
                        ObservationsDropped(observationIds=[SUPPORT[-1]], coversUpToId="e1"),
                        anchor="e1", origin="pipeline", created_at=None, run_id=None)
        rows.write(con)
        for n, (rec, origin) in enumerate(zip(records, origins)):
            append_project_records(
                con, PROJECT, covers_up_to_seq=n, origin=origin, stage_key=f"k{n}",
                reflections=[ProjectReflection(id=r.id, content=r.content, supportingIds=r.supporting_ids,
                                               tokenCount=r.token_count) for r in rec.reflections],
                retirements=[Retirement(id=i, reason=why) for i, why in rec.retirements])
        got = [{"fold_order": f.reflection and i, "id": f.reflection.id, "content": f.reflection.content,
                "supporting_ids": f.reflection.supportingIds, "retired_reason": f.retired_reason, "retired": f.retired}
               for i, f in enumerate(project_fold(con, PROJECT), start=1)]
        want = [{k: v for k, v in row.items() if k != "retired_at"} for row in oracle_fold(records, forgotten)]
        assert got == want
        current = con.execute("SELECT id FROM project_memory(?) ORDER BY fold_order", [PROJECT]).fetchall()
        assert [r[0] for r in current] == [w["id"] for w in want if not w["retired"]]
    finally:
        con.close()
