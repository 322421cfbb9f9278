"""Property tests: the SQL fold/projections agree with the plain-Python oracle (tests/oracle.py).

Each example is a random session tree holding random ledger entries written the way the extension
writes them (duplicates, drops of unknown ids, dangling and cross-branch watermarks, invalid and
V2-shaped records, folded compactions with and without full fold), plus pipeline records and
simulated compactions appended through the library. The session goes through the real ingest;
every leaf (and some interior tips) is checked at many boundaries.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
from pathlib import Path

import duckdb
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from conftest import workspace
from om_core.store import db as dbmod
from om_core.memory import views as memory
from om_core.settings import Settings
from om_core.ingest import ingest
from om_core.ledger.records import (
    ObservationsDropped,
    ObservationsRecorded,
    ReflectionsRecorded,
    append_record,
    parse_folded,
    store_simulated_compaction,
)
from om_core.recall.evidence import recall_in_session
from oracle import DROP, OBS, REFL, OCompaction, OEntry, ORecord, World, valid_folded, valid_record

# Shrinking a failure here can take many minutes; set OM_PROPERTY_SHRINK=1 when debugging one.
PHASES = [p for p in Phase if p is not Phase.shrink or os.environ.get("OM_PROPERTY_SHRINK")]
CONTENTS = ["user wants duckdb", "tests run offline", "fold view added", "ci is green", "retry on 429",
            "never commit secrets", "prefers small modules"]
REFL_CONTENTS = ["project uses duckdb", "offline tests only", "small modules please", "secrets stay local"]
RELEVANCE = ["low", "medium", "high", "critical"]
_counter = itertools.count()


def mid(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ---------------------------------------------------------------- generators


@st.composite
def observation(draw, ids):
    content = draw(st.sampled_from(CONTENTS))
    return {"id": mid(content), "content": content, "timestamp": f"2026-01-15 14:{draw(st.integers(0, 59)):02d}",
            "relevance": draw(st.sampled_from(RELEVANCE)),
            "sourceEntryIds": draw(st.lists(st.sampled_from(ids + ["ghost001"]), min_size=1, max_size=3)),
            "tokenCount": draw(st.one_of(st.integers(0, 40), st.floats(0, 40, allow_nan=False)))}


@st.composite
def reflection(draw):
    content = draw(st.sampled_from(REFL_CONTENTS))
    return {"id": mid(content), "content": content,
            "supportingObservationIds": draw(st.lists(st.sampled_from([mid(c) for c in CONTENTS] + ["0" * 12]),
                                                      min_size=1, max_size=3)),
            "tokenCount": draw(st.integers(0, 30))}


def corrupt(draw, kind, data):
    """Make one item (or field) of a record invalid, as SPEC §2 describes."""
    choice = draw(st.sampled_from(["relevance", "empty", "id", "tokens", "covers", "multiline"]))
    data = json.loads(json.dumps(data))
    if choice == "covers":
        data["coversUpToId"] = ""
    elif kind == OBS:
        item = data["observations"][0]
        if choice == "relevance":
            item["relevance"] = "urgent"
        elif choice == "empty":
            data["observations"] = []
        elif choice == "id":
            item["id"] = "XYZ"
        else:
            item["tokenCount"] = -1
    elif kind == REFL:
        item = data["reflections"][0]
        if choice == "multiline":
            item["content"] = "two\nlines"
        elif choice == "empty":
            data["reflections"] = []
        elif choice == "id":
            item["id"] = item["id"][:11]
        else:
            item["tokenCount"] = -2 if choice == "tokens" else "3"  # Infinity is not JSON at all
    else:
        data["observationIds"] = [] if choice != "id" else [""]
    return data


@st.composite
def record_data(draw, kind, ids):
    covers = draw(st.sampled_from(ids + ["ghost999"]))
    if kind == OBS:
        data = {"observations": draw(st.lists(observation(ids), min_size=1, max_size=3)), "coversUpToId": covers}
    elif kind == REFL:
        data = {"reflections": draw(st.lists(reflection(), min_size=1, max_size=2)), "coversUpToId": covers}
    else:
        pool = [mid(c) for c in CONTENTS] + ["feedfacecafe"]
        data = {"observationIds": draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3)), "coversUpToId": covers}
    if draw(st.integers(0, 9)) == 0:
        data = corrupt(draw, kind, data)
    return data


@st.composite
def folded_details(draw, ids):
    details = {"type": "om.folded", "version": 1, "fullFold": draw(st.booleans()),
               "observations": draw(st.lists(observation(ids), max_size=3, unique_by=lambda o: o["id"])),
               "reflections": draw(st.lists(reflection(), max_size=2, unique_by=lambda r: r["id"]))}
    variant = draw(st.integers(0, 9))
    if variant == 0:
        details["version"] = 2  # not V3 folded details: ignored
    elif variant == 1 and details["observations"]:
        details["observations"][0]["relevance"] = "urgent"  # one bad item invalidates the details
    return details


@st.composite
def scenario(draw):
    n = draw(st.integers(3, 24))
    ids = [f"{i + 1:08x}" for i in range(n)]
    kinds = draw(st.lists(st.sampled_from(["user", "assistant", "assistant", "tool", "custom_message",
                                           "branch_summary", "thinking", "system", "ledger", "ledger", "ledger",
                                           "compaction"]), min_size=n, max_size=n))
    entries = []
    for i, kind in enumerate(kinds):
        if i == 0:
            parent = None
        else:
            shape = draw(st.integers(0, 19))
            parent = None if shape == 0 else ids[i - 1] if shape < 16 else ids[draw(st.integers(0, i - 1))]
        spec = {"kind": kind, "parent": parent}
        if kind == "ledger":
            lk = draw(st.sampled_from([OBS, OBS, REFL, DROP, "om.observations", "om.memory.v2"]))
            spec["custom_type"] = lk
            spec["data"] = draw(record_data(lk if lk in (OBS, REFL, DROP) else OBS, ids))
        elif kind == "compaction":
            spec["first_kept"] = draw(st.sampled_from(ids + [None]))
            spec["details"] = draw(st.one_of(st.none(), folded_details(ids),
                                             st.just({"type": "om.memory", "version": 2})))
        entries.append(spec)
    pipeline = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from([OBS, REFL, DROP]))
        data = draw(record_data(kind, ids))
        if valid_record(kind, data):
            pipeline.append({"kind": kind, "data": data, "anchor": draw(st.sampled_from(ids))})
    simulated = []
    for _ in range(draw(st.integers(0, 2))):
        details = draw(st.one_of(st.none(), folded_details(ids)))
        simulated.append({"anchor": draw(st.sampled_from(ids)), "first_kept": draw(st.sampled_from(ids)),
                          "details": details if details is None or valid_folded(details) else None})
    pools = draw(st.lists(st.sampled_from([0, 15, 40, 1_000_000]), min_size=1, max_size=2, unique=True))
    return {"ids": ids, "entries": entries, "pipeline": pipeline, "simulated": simulated, "pools": pools,
            "seed": draw(st.integers(0, 10**6))}


# ---------------------------------------------------------------- building the session


def write_session(path: Path, session_id: str, sc: dict) -> None:
    lines = [json.dumps({"type": "session", "version": 3, "id": session_id, "timestamp": "2026-01-15T14:00:00.000Z",
                         "cwd": "/w"})]
    for i, (entry_id, spec) in enumerate(zip(sc["ids"], sc["entries"])):
        base = {"id": entry_id, "parentId": spec["parent"], "timestamp": f"2026-01-15T14:{i % 60:02d}:00.000Z"}
        k = spec["kind"]
        if k == "user":
            e = {"type": "message", **base, "message": {"role": "user", "content": [{"type": "text", "text": "hello " * (i + 1)}]}}
        elif k == "assistant":
            e = {"type": "message", **base, "message": {"role": "assistant", "content": [{"type": "text", "text": "ok " * (i + 2)}],
                                                         "stopReason": "stop"}}
        elif k == "tool":
            e = {"type": "message", **base, "message": {"role": "toolResult", "toolCallId": "c", "toolName": "read",
                                                         "content": [{"type": "text", "text": "x" * (4 * i + 1)}], "isError": False}}
        elif k == "system":
            e = {"type": "message", **base, "message": {"role": "system", "content": "sys", "sections": {}}}
        elif k == "custom_message":
            e = {"type": "custom_message", **base, "customType": "note", "content": "note text", "display": True}
        elif k == "branch_summary":
            e = {"type": "branch_summary", **base, "fromId": "root", "summary": "went elsewhere"}
        elif k == "thinking":
            e = {"type": "thinking_level_change", **base, "thinkingLevel": "high"}
        elif k == "ledger":
            e = {"type": "custom", **base, "customType": spec["custom_type"], "data": spec["data"]}
        else:
            e = {"type": "compaction", **base, "summary": "s", "firstKeptEntryId": spec["first_kept"],
                 "tokensBefore": 1000, "fromHook": spec["details"] is not None}
            if spec["details"] is not None:
                e["details"] = spec["details"]
        lines.append(json.dumps(e))
    path.write_text("\n".join(lines) + "\n")


MODELS = {OBS: ObservationsRecorded, REFL: ReflectionsRecorded, DROP: ObservationsDropped}


def build(con: duckdb.DuckDBPyConnection, tmp: Path, sc: dict) -> tuple[str, World]:
    session_id = f"prop-{next(_counter):06d}-{sc['seed']}"
    path = tmp / f"{session_id}.jsonl"
    write_session(path, session_id, sc)
    report = ingest(workspace(con), [path])
    assert report.files[0].status == "new", report.files[0]
    tokens = dict(con.execute("SELECT entry_id, coalesce(tokens_pi, 0) FROM entries WHERE session_id = ?",
                              [session_id]).fetchall())
    sources = dict(con.execute("SELECT entry_id, is_source FROM entries WHERE session_id = ?", [session_id]).fetchall())
    world = World(entries={i: OEntry(i, spec["parent"], sources[i], tokens[i], spec["kind"])
                           for i, spec in zip(sc["ids"], sc["entries"])})
    for seq, (entry_id, spec) in enumerate(zip(sc["ids"], sc["entries"])):
        if spec["kind"] == "ledger":
            world.records.append(ORecord(entry_id, spec["custom_type"], entry_id, "imported", seq, spec["data"]))
        elif spec["kind"] == "compaction":
            folded = valid_folded(spec["details"])
            world.compactions.append(OCompaction(entry_id, entry_id, "imported" if folded else "pi", seq,
                                                 spec["first_kept"], spec["details"] if folded else None))
    with dbmod.transaction(con):
        for k, p in enumerate(sc["pipeline"]):
            ledger_id = append_record(con, session_id, p["kind"], MODELS[p["kind"]].model_validate(p["data"]),
                                      anchor_entry_id=p["anchor"], stage_key=f"k{k}")
            world.records.append(ORecord(ledger_id, p["kind"], p["anchor"], "pipeline", 10_000 + k, p["data"]))
        for k, s in enumerate(sc["simulated"]):
            details = parse_folded(s["details"]) if s["details"] else None
            cid = store_simulated_compaction(con, session_id, anchor_entry_id=s["anchor"],
                                             first_kept_entry_id=s["first_kept"], details=details,
                                             summary="x" if details else None, seed=f"sim{k}")
            world.compactions.append(OCompaction(cid, s["anchor"], "simulated", 20_000 + k, s["first_kept"],
                                                 s["details"]))
    return session_id, world


# ---------------------------------------------------------------- comparison


def wire(items) -> list[dict]:
    return [json.loads(i.model_dump_json()) for i in items]


def norm(items: list[dict]) -> list[dict]:
    """Compare numbers as numbers (a stored 3 and 3.0 are the same tokenCount)."""
    return [json.loads(json.dumps(i), parse_float=float, parse_int=float) for i in items]


def check_tip(con, session_id: str, world: World, tip: str, sc: dict, rng) -> None:
    """Every rule at one tip; boundaries, F values and recall ids are sampled to keep CI fast."""
    path = world.branch(tip)
    # plain fold through the tip (what workers read)
    obs, refl = world.plain_fold(tip)
    got = memory.active_memory(memory.ledger_rows(con, session_id, tip))
    assert norm(wire(got.observations)) == norm(obs)
    assert norm(wire(got.reflections)) == norm(refl)
    # full projection at several boundaries (always the tip: full memory)
    for boundary in {tip, rng.choice(path)}:
        obs, refl = world.full_projection(tip, boundary)
        got = memory.full_memory(con, session_id, tip, boundary)
        assert norm(wire(got.observations)) == norm(obs), boundary
        assert norm(wire(got.reflections)) == norm(refl), boundary
    # visible projection (the file's folds), the replayed view (simulated ones too), and their drift
    for replayed, view in ((False, memory.visible_memory), (True, memory.replayed_memory)):
        obs, refl = world.visible(tip, replayed)
        got = view(con, session_id, tip)
        assert norm(wire(got.observations)) == norm(obs), replayed
        assert norm(wire(got.reflections)) == norm(refl), replayed
        d = memory.drift(con, session_id, tip, replayed)
        assert (d.observations_only_in_full, d.reflections_only_in_full, d.visible_no_longer_active) == world.drift(tip, replayed)
    # compaction projection at sampled F and pool limits, in the file's world and the replayed one
    for first_kept in rng.sample(path, 1):
        pool = rng.choice(sc["pools"])
        for replayed in (False, True):
            full_fold, obs, refl = world.compaction_projection(tip, first_kept, pool, replayed)
            got = memory.compaction_projection(con, session_id, tip, first_kept, pool, replayed=replayed)
            assert got.fullFold == full_fold, (first_kept, pool, replayed)
            assert norm(wire(got.memory.observations)) == norm(obs), (first_kept, pool, replayed)
            assert norm(wire(got.memory.reflections)) == norm(refl), (first_kept, pool, replayed)
            assert (got.summary is None) == (not obs and not refl)
    # clocks and coverage tiers
    clocks = {name: c.tokens_pi for name, c in memory.clocks(con, session_id, tip, Settings()).items()}
    assert clocks == world.clocks(tip)
    assert [(c.observation.id, c.coverage) for c in memory.coverage(con, session_id, tip)] == world.coverage(tip)
    # recall
    candidates = [mid(c) for c in CONTENTS] + [mid(c) for c in REFL_CONTENTS] + ["nothex"]
    for memory_id in rng.sample(candidates, 1):
        expected = world.recall(tip, memory_id)
        got = recall_in_session(con, session_id, tip, memory_id)
        assert got.status == expected["status"], memory_id
        if got.status == "found":
            assert got.kind == expected["kind"]
            assert got.collision == expected["collision"]
            assert got.partial == expected["partial"]
            assert [o.status for o in got.observations if o.matched] == expected["observation_statuses"]
            assert got.missing_supporting_observation_ids == expected["missing_support"]


@pytest.fixture(scope="module")
def prop_db(tmp_path_factory):
    """One database for every example (each example is its own session in it). One DuckDB thread: a
    query here is a few milliseconds of planning over a few dozen rows, and a second thread only adds
    scheduling (about 15% of the test's CPU, measured)."""
    path = tmp_path_factory.mktemp("prop") / "prop.duckdb"
    con = dbmod.connect(path)
    con.execute("SET threads = 1")
    yield con, path.parent
    con.close()


# Tips checked per example: every rule is checked at each, and a check is about a dozen fold queries
# (a few ms of DuckDB planning each: 95% of the test's time). Checking every leaf of a wide tree made
# one example cost a second of CPU, 300 examples 10 minutes under load. The newest entry (the tip a
# run reads), one other leaf and one interior tip, drawn from the example's seed, keep every rule
# checked on every example, on side branches and interior tips alike across the 300 examples CI draws.
OTHER_LEAVES_PER_EXAMPLE = 1


# Example count from the profile in conftest.py (50 by default), at most FOLD_EXAMPLES in CI, drawn by
# SHARDS tests of a part each, each from its own random seed: the shards let pytest-xdist spread them
# over both cores. An example is ~0.6 CPU-s of DuckDB planning of the production fold macros: CI's 300
# were ~190 CPU-s, a quarter of the suite's ten minutes on two cores; 150 keep every rule checked on
# every example (the tips above) at half of that.
SHARDS = 6
FOLD_EXAMPLES = 150
EXAMPLES_PER_SHARD = -(-min(settings.default.max_examples, FOLD_EXAMPLES) // SHARDS)


@pytest.mark.parametrize("shard", range(SHARDS))
@settings(phases=PHASES, max_examples=EXAMPLES_PER_SHARD)
@given(sc=scenario())
def test_sql_matches_oracle(prop_db, sc, shard):
    con, tmp = prop_db
    session_id, world = build(con, tmp, sc)
    rng = random.Random(sc["seed"])
    leaves = world.leaves()
    interior = [i for i in sc["ids"] if i not in leaves]
    newest = sc["ids"][-1]
    others = [leaf for leaf in leaves if leaf != newest]
    tips = [newest] + rng.sample(others, min(OTHER_LEAVES_PER_EXAMPLE, len(others))) + \
        rng.sample(interior, min(1, len(interior)))
    for tip in tips:
        check_tip(con, session_id, world, tip, sc, rng)
