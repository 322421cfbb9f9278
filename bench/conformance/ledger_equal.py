#!/usr/bin/env python3
"""Is the ledger a change leaves the same as before? `om run` on the same sessions with two checkouts'
code, and a digest of everything the runs appended, compared table by table.

A cost cut must leave what om writes unchanged. Each profile runs `om run` on a fresh database:

* ``real-defaults``: the two real sample sessions (../shared/sessions), ``--model offline``, defaults;
* ``real-low``: the same at low thresholds (many stages, drops, compactions);
* ``real-scripted``: the same at low thresholds, with the scripted fake model (tests/fake_brains.py,
  in a process of its own) answering over HTTP: prompts, tool calls and checks included;
* ``generated-scripted``: ``--sessions`` generated sessions (tests/builders.py), the scripted model.

The scripted model of each run is that checkout's tests/fake_brains.py (the same answers; it checks
each request's system prompt against its own checkout's).

Refusals (receipt lines "N. rejected: …") are listed too: with ``--against``, those only this tree's
checks gave are printed, so a ledger that differs where a new check refuses an answer can be told
from one that differs for no reason. The digest covers the records, their items, the compactions and their items, the stage runs and the
model calls' requests and responses, without what differs between any two runs (run ids, times,
latencies, random row ids, the fake model's random tool call ids); the order of records and
compactions within a session is kept (their append order), the order between sessions (which replay
committed first) is not.

With ``--against``, each table's rows are compared one by one too (rows compared, identical, only in
one tree, with examples), and each session's first ledger record that differs is named with its
stage and the refusals only one tree gave in that stage: a difference that starts where a check
refuses an answer is explained by it; one that starts where no refusal differs is not.

Usage (from the repository root):

    .venv/bin/python bench/conformance/ledger_equal.py --against /tmp/om-base      # this tree against another checkout
    .venv/bin/python bench/conformance/ledger_equal.py --profiles real-low --json   # the digests only
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections import Counter
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402
from bench.perf.run_cpu import THRESHOLDS, om_run  # noqa: E402

PROFILES = ("real-defaults", "real-low", "real-scripted", "generated-scripted")

# What each table's digest reads: columns that are the same in any two runs of the same work.
DIGESTS = {
    "ledger": """SELECT session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, origin, stage, stage_key,
                        row_number() OVER (PARTITION BY session_id ORDER BY append_seq) AS seq_in_session
                 FROM om_internal.ledger""",
    "observations": """SELECT session_id, ledger_id, item_index, obs_id, content, ts, relevance, source_entry_ids,
                              token_count, ts_repaired_from FROM om_internal.observations""",
    "reflections": "SELECT * FROM om_internal.reflections",
    "drops": "SELECT * FROM om_internal.drops",
    "compactions": """SELECT * EXCLUDE (append_seq, created_at, run_id),
                             row_number() OVER (PARTITION BY session_id ORDER BY append_seq) AS seq_in_session
                      FROM om_internal.compactions""",
    "compaction_items": "SELECT * FROM om_internal.compaction_items",
    "stages": """SELECT session_id, stage, stage_key, tip_entry_id, chunk_first_id, chunk_last_id, model, outcome,
                        records, items, rejected, error_kind, error, receipts FROM om_internal.stages""",
    "llm_calls": """SELECT c.session_id, c.stage, c.model, c.turn, c.input_tokens, c.output_tokens, c.cached_tokens,
                           c.status, c.error_kind, c.attempt, s.stage_key,
                           -- the fake model names its tool calls at random (tests/fake_openai.py)
                           regexp_replace(t.request, 'call_[0-9a-f]{12}', 'call_', 'g') AS request,
                           regexp_replace(t.response, 'call_[0-9a-f]{12}', 'call_', 'g') AS response
                    FROM om_internal.llm_calls c
                    LEFT JOIN om_internal.stages s ON s.stage_run_id = c.stage_run_id
                    LEFT JOIN om_internal.llm_call_texts t ON t.call_id = c.call_id""",
    "stage_results": "SELECT session_id, stage_key, stage, result FROM om_internal.stage_results",
}


REFUSAL = re.compile(r"^\d+\. rejected: ")


EXAMPLES = 3  # differing rows shown per table
EXAMPLE_CHARS = 400


def digest(db: Path) -> dict[str, Any]:
    """Each table's row count and digest; under ``_rows`` the rows themselves (as text) and under
    ``_stages`` each session's ledger records in order with the stage key that appended each."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        out: dict[str, Any] = {"_rows": {}}
        for name, sql in DIGESTS.items():
            rows = con.execute(f"SELECT * FROM ({sql}) ORDER BY ALL").fetchall()
            h = hashlib.sha256()
            for row in rows:
                h.update(repr(row).encode())
            out[name] = {"rows": len(rows), "sha256": h.hexdigest()[:16]}
            out["_rows"][name] = [repr(row) for row in rows]
        ledger = con.execute(f"SELECT session_id, seq_in_session, ledger_id, kind, stage, stage_key "
                             f"FROM ({DIGESTS['ledger']}) ORDER BY session_id, seq_in_session").fetchall()
        # what the first differing record was made of: its stage's chunk and its items, by tree
        out["_stage_of"] = {f"{sid} {key}": [first, last, items, rejected] for sid, key, first, last, items, rejected
                            in con.execute("SELECT session_id, stage_key, chunk_first_id, chunk_last_id, items, "
                                           "rejected FROM om_internal.stages ORDER BY ALL").fetchall()}
        out["_items_of"] = {}
        for ledger_id, content in con.execute("SELECT ledger_id, content FROM om_internal.observations UNION ALL "
                                              "SELECT ledger_id, content FROM om_internal.reflections "
                                              "ORDER BY ALL").fetchall():
            out["_items_of"].setdefault(ledger_id, []).append(content[:EXAMPLE_CHARS])
        # a record's id comes from its stage's input: its items tell whether the output differs too
        out["_ledger"] = {}
        for sid, _, ledger_id, kind, stage, stage_key in ledger:
            out["_ledger"].setdefault(sid, []).append(
                (ledger_id, kind, stage, stage_key, tuple(out["_items_of"].get(ledger_id, []))))
        receipts_by_key = con.execute("SELECT session_id, stage_key, receipts FROM om_internal.stages "
                                      "WHERE receipts IS NOT NULL ORDER BY ALL").fetchall()
        out["_refusals_by_stage"] = {}
        for sid, key, text in receipts_by_key:
            out["_refusals_by_stage"].setdefault(f"{sid} {key}", []).extend(
                line.split(". ", 1)[1] for line in text.splitlines() if REFUSAL.match(line))
        # every refusal a check gave (a receipt line "N. rejected: …"), to tell a ledger that differs
        # because a check refuses an answer from one that differs for no reason
        receipts = con.execute("SELECT session_id, stage, receipts FROM om_internal.stages WHERE receipts IS NOT NULL "
                               "ORDER BY ALL").fetchall()
        out["refusals"] = sorted(f"{stage}: {line.split('. ', 1)[1]}" for _, stage, text in receipts
                                 for line in text.splitlines() if REFUSAL.match(line))
        return out
    finally:
        con.close()


def run_profile(profile: str, pythonpath: str | None, work: Path, sessions: int) -> dict[str, dict[str, Any]]:
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    proc, model, env = None, ["--model", "offline"], {} if profile == "real-defaults" else dict(THRESHOLDS)
    if profile.startswith("real"):
        target = work / "archive"
        if not target.exists():
            harness.copy_archive(target, 1)
    else:
        target = work / "generated"
        if not target.exists():
            harness.generated_sessions(target, sessions)
    if profile.endswith("scripted"):
        # each checkout's own scripted model: the same answers, checked against that checkout's prompts
        proc, base_url = harness.fake_model_process(repo=Path(pythonpath or harness.REPO))
        model = ["--model", "openai/fake-model", "--api-base", base_url]
    db = work / f"{profile}-{abs(hash(pythonpath))}.duckdb"
    try:
        om_run(sys.executable, pythonpath, db, target, model, env, home)
        return digest(db)
    finally:
        if proc is not None:
            harness.stop_process(proc)
        db.unlink(missing_ok=True)


def compare(here: dict[str, Any], there: dict[str, Any]) -> dict[str, Any]:
    """Row by row, table by table; and where each session's ledger first differs, with the refusals
    only one tree gave in the stage that appended it (``explained`` when there are some)."""
    tables = {}
    for name in DIGESTS:
        mine, theirs = Counter(here["_rows"][name]), Counter(there["_rows"][name])
        only_here, only_there = list((mine - theirs).elements()), list((theirs - mine).elements())
        tables[name] = {"compared": max(sum(mine.values()), sum(theirs.values())),
                        "identical": sum((mine & theirs).values()), "only_here": len(only_here),
                        "only_there": len(only_there),
                        "examples_here": [r[:EXAMPLE_CHARS] for r in only_here[:EXAMPLES]],
                        "examples_there": [r[:EXAMPLE_CHARS] for r in only_there[:EXAMPLES]]}
    starts = []
    for sid in sorted(set(here["_ledger"]) | set(there["_ledger"])):
        mine, theirs = here["_ledger"].get(sid, []), there["_ledger"].get(sid, [])
        at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        if at == len(mine) == len(theirs):
            continue
        where = mine[at] if at < len(mine) else theirs[at]
        key = f"{sid} {where[3]}"
        new = sorted((Counter(here["_refusals_by_stage"].get(key, []))
                      - Counter(there["_refusals_by_stage"].get(key, []))).elements())
        gone = sorted((Counter(there["_refusals_by_stage"].get(key, []))
                       - Counter(here["_refusals_by_stage"].get(key, []))).elements())
        theirs_there = theirs[at] if at < len(theirs) else None
        starts.append({"session": sid, "record": at + 1, "records_here": len(mine), "records_there": len(theirs),
                       "kind": where[1], "stage": where[2], "stage_key": where[3],
                       "chunk_here": here["_stage_of"].get(key),
                       "chunk_there": theirs_there and there["_stage_of"].get(f"{sid} {theirs_there[3]}"),
                       "items_here": here["_items_of"].get(where[0], []) if at < len(mine) else [],
                       "items_there": there["_items_of"].get(theirs_there[0], []) if theirs_there else [],
                       "refused_here_only": new, "refused_there_only": gone, "explained": bool(new or gone)})
    return {"tables": tables, "first_differences": starts}


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--against", default=None, help="another checkout: its code runs the same profiles")
    parser.add_argument("--profiles", nargs="+", choices=PROFILES, default=list(PROFILES))
    parser.add_argument("--sessions", type=int, default=12, help="generated sessions (generated-scripted)")
    args = parser.parse_args(argv)
    if any(p.startswith("real") for p in args.profiles) and not harness.SHARED_SESSIONS.is_dir():
        parser.error(f"{harness.SHARED_SESSIONS} is absent: the real profiles need the real sample sessions")
    work = Path(tempfile.mkdtemp(prefix="om-bench-ledger-equal-"))
    out: dict[str, Any] = {}
    differ = False
    try:
        for profile in args.profiles:
            here = run_profile(profile, str(harness.REPO), work, args.sessions)
            out[profile] = {"here": {k: v for k, v in here.items() if not k.startswith("_")}}
            if args.against:
                there = run_profile(profile, str(Path(args.against).resolve()), work, args.sessions)
                out[profile]["against"] = {k: v for k, v in there.items() if not k.startswith("_")}
                out[profile].update(compare(here, there))
                out[profile]["differ"] = [t for t in DIGESTS if here[t] != there[t]]
                out[profile]["new_refusals"] = sorted((Counter(here["refusals"]) - Counter(there["refusals"])).elements())
                differ = differ or bool(out[profile]["differ"])
            if not args.json:
                rows = ", ".join(f"{t} {here[t]['rows']}" for t in DIGESTS)
                verdict = "" if not args.against else (
                    "  identical" if not out[profile]["differ"] else f"  DIFFER: {', '.join(out[profile]['differ'])}")
                print(f"{profile}: {rows}{verdict}", flush=True)
                for line in out[profile].get("new_refusals", [])[:5]:
                    print(f"    refused here only: {line[:200]}")
                if out[profile].get("new_refusals"):
                    print(f"    ({len(out[profile]['new_refusals'])} refusals here only)")
                for name, t in out[profile].get("tables", {}).items():
                    if t["only_here"] or t["only_there"]:
                        print(f"    {name}: {t['compared']} compared, {t['identical']} identical, "
                              f"{t['only_here']} here only, {t['only_there']} there only")
                for start in out[profile].get("first_differences", []):
                    why = (start["refused_here_only"] or start["refused_there_only"] or ["NO REFUSAL DIFFERS"])[0]
                    print(f"    {start['session']} differs from record {start['record']} ({start['kind']}, "
                          f"{start['stage_key']}): {why[:160]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
