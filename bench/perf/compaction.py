"""Benchmark: the compaction projection as a query, against a plain in-memory fold.

Builds a database with one 10,000-entry branch holding 3,000 observations, 300 reflections and
1,000 drops (written the way the TypeScript extension writes them), then grows the rest of the
database with 100,000 and then 1,000,000 entries of other sessions. At each size it reports p50
and p95 (CPU milliseconds: the process's own, every thread, or the subprocess's) of:
  * the compaction projection through om_core on a warm connection;
  * the `om compact` command in a new process;
  * a plain in-memory fold of the same branch in Python (parsed records, no database).

Usage: python bench/perf/compaction.py [--runs N] [--cli-runs N] [--json] [--keep DIR]
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402
from bench.harness import children_cpu, pct  # noqa: E402
from om_core.store import db as dbmod  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.memory.views import compaction_projection  # noqa: E402

SESSION = "bench-main-0000-0000-000000000000"
WORDS = ("duckdb fold projection ledger observer reflector dropper watermark compaction branch session "
         "prefect retry tiktoken token budget pool recall source entry user assistant tool result error "
         "fixed tests offline schema migration view macro cache prompt summary drift").split()


def mid(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def main_branch(rng: random.Random) -> tuple[list[dict], dict]:
    """The 10,000-entry branch: conversation entries interleaved with ledger entries."""
    entries: list[dict] = []
    ids: list[str] = []

    def add(entry: dict) -> str:
        entry_id = f"{len(entries) + 1:08x}"
        entry.update({"id": entry_id, "parentId": ids[-1] if ids else None,
                      "timestamp": f"2026-02-01T{(len(entries) // 3600) % 24:02d}:{(len(entries) // 60) % 60:02d}:{len(entries) % 60:02d}.000Z"})
        entries.append(entry)
        ids.append(entry_id)
        return entry_id

    observations: list[dict] = []
    reflections: list[dict] = []
    obs_records, refl_records, drop_records = 300, 30, 100
    ledger_total = obs_records + refl_records + drop_records
    conversation = 10_000 - ledger_total
    every = conversation // ledger_total
    plan = ["obs"] * obs_records + ["refl"] * refl_records + ["drop"] * drop_records
    rng.shuffle(plan)
    obs_left = list(range(obs_records))
    conv_since = []
    for i in range(conversation):
        role = ("user", "assistant", "toolResult")[i % 3]
        text = sentence(rng, 12)
        if role == "user":
            msg = {"role": "user", "content": [{"type": "text", "text": text}]}
        elif role == "assistant":
            msg = {"role": "assistant", "content": [{"type": "text", "text": text}], "stopReason": "stop"}
        else:
            msg = {"role": "toolResult", "toolCallId": "c", "toolName": "read", "content": [{"type": "text", "text": text}],
                   "isError": False}
        conv_since.append(add({"type": "message", "message": msg}))
        if (i + 1) % every == 0 and plan:
            kind = plan.pop(0)
            if kind in ("refl", "drop") and len(observations) < 20:
                plan.append(kind)  # reflections and drops need observations first: later
                continue
            covers = conv_since[-1]
            if kind == "obs" and obs_left:
                obs_left.pop()
                batch = []
                for _ in range(10):
                    content = f"{sentence(rng, 14)} #{len(observations)}"
                    line = f"[{mid(content)}] 2026-02-01 10:00 [medium] {content}"
                    o = {"id": mid(content), "content": content, "timestamp": "2026-02-01 10:00",
                         "relevance": rng.choice(["low", "medium", "high", "critical"]),
                         "sourceEntryIds": rng.sample(conv_since[-30:], 2), "tokenCount": math.ceil(len(line) / 4)}
                    batch.append(o)
                    observations.append(o)
                add({"type": "custom", "customType": "om.observations.recorded",
                     "data": {"observations": batch, "coversUpToId": covers}})
            elif kind == "refl":
                batch = []
                for _ in range(10):
                    content = f"{sentence(rng, 10)} (rule {len(reflections)})"
                    r = {"id": mid(content), "content": content,
                         "supportingObservationIds": [o["id"] for o in rng.sample(observations, 2)],
                         "tokenCount": math.ceil(len(content) / 4)}
                    batch.append(r)
                    reflections.append(r)
                add({"type": "custom", "customType": "om.reflections.recorded",
                     "data": {"reflections": batch, "coversUpToId": covers}})
            elif kind == "drop":
                add({"type": "custom", "customType": "om.observations.dropped",
                     "data": {"observationIds": [o["id"] for o in rng.sample(observations, 10)], "coversUpToId": covers}})
    while len(entries) < 10_000:
        add({"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": sentence(rng, 8)}]}})
    stats = {"entries": len(entries), "observations": len(observations), "reflections": len(reflections),
             "drop_ids": sum(len(e["data"]["observationIds"]) for e in entries if e.get("customType") == "om.observations.dropped")}
    return entries, stats


def write_session(path: Path, session_id: str, entries: list[dict]) -> None:
    with open(path, "w") as f:
        f.write(json.dumps({"type": "session", "version": 3, "id": session_id, "timestamp": "2026-02-01T00:00:00.000Z",
                            "cwd": "/bench"}) + "\n")
        for e in entries:
            f.write(json.dumps(e) + "\n")


def filler_sessions(directory: Path, total_entries: int, rng: random.Random, start: int) -> None:
    """Other sessions: 2,000 entries each, short messages (the database grows; the branch does not)."""
    per = 2_000
    for s in range(total_entries // per):
        sid = f"bench-fill-{start + s:06d}"
        lines = [json.dumps({"type": "session", "version": 3, "id": sid, "timestamp": "2026-02-01T00:00:00.000Z"})]
        prev = None
        for i in range(per):
            eid = f"{i + 1:08x}"
            lines.append(json.dumps({"type": "message", "id": eid, "parentId": prev, "timestamp": "2026-02-01T00:00:00.000Z",
                                     "message": {"role": "user" if i % 2 == 0 else "assistant",
                                                 "content": [{"type": "text", "text": sentence(rng, 6)}]}}))
            prev = eid
        (directory / f"{sid}.jsonl").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- the in-memory reference fold


def memory_fold(entries: list[dict], first_kept: str, pool_max: float) -> tuple[bool, list[str], list[str]]:
    """The same compaction projection over parsed entries in memory (the branch is the whole list)."""
    pos = {e["id"]: i for i, e in enumerate(entries)}
    f = pos[first_kept]
    records = [e for e in entries if e["type"] == "custom" and e.get("customType", "").startswith("om.")]

    def fold(obs_b: int | None, refl_b: int | None, drop_b: int | None):
        seen_o: dict[str, dict] = {}
        seen_r: dict[str, dict] = {}
        tomb: set[str] = set()
        for r in records:
            wm = pos.get(r["data"]["coversUpToId"])
            if wm is None:
                continue
            kind = r["customType"]
            if kind == "om.observations.recorded" and obs_b is not None and wm <= obs_b:
                for o in r["data"]["observations"]:
                    seen_o.setdefault(o["id"], o)
            elif kind == "om.reflections.recorded" and refl_b is not None and wm <= refl_b:
                for x in r["data"]["reflections"]:
                    seen_r.setdefault(x["id"], x)
            elif kind == "om.observations.dropped" and drop_b is not None and wm <= drop_b:
                tomb.update(r["data"]["observationIds"])
        return [o for i, o in seen_o.items() if i not in tomb], list(seen_r.values())

    obs, refl = fold(f, None, None)  # no full-fold compaction on this branch yet: M is absent
    full = sum(o["tokenCount"] for o in obs) >= pool_max
    if full:
        obs, refl = fold(f, f, f)
    return full, [o["id"] for o in obs], [r["id"] for r in refl]


# ---------------------------------------------------------------- measuring


def measure(fn, runs: int, clock=time.process_time) -> dict[str, float]:
    """Milliseconds of ``clock`` per call: this process's CPU (every thread, DuckDB's included) by
    default; for a subprocess, its CPU (``children_cpu``)."""
    fn()  # warm
    times = []
    for _ in range(runs):
        t = clock()
        fn()
        times.append((clock() - t) * 1000)
    return {"p50_ms": round(pct(times, 0.5), 2), "p95_ms": round(pct(times, 0.95), 2), "mean_ms": round(statistics.mean(times), 2)}


def run(args) -> dict:
    with harness.work_dir("om-bench-compaction-", Path(args.keep) if args.keep else None) as work:
        return run_in(args, work)


def run_in(args, work: Path) -> dict:
    rng = random.Random(7)
    db_path = work / "bench.duckdb"
    if db_path.exists():
        db_path.unlink()
    entries, stats = main_branch(rng)
    main_file = work / "main.jsonl"
    write_session(main_file, SESSION, entries)
    t = time.perf_counter()
    ingest(Workspace.open(db_path, settings=Settings()), [main_file])
    print(f"main branch: {stats} (ingested in {time.perf_counter() - t:.1f} s)")
    tip = entries[-1]["id"]
    first_kept = entries[-200]["id"]
    pool = 20_000
    expected = memory_fold(entries, first_kept, pool)
    results = {"branch": stats, "sizes": []}
    om = str(Path(sys.executable).with_name("om"))
    done = 0
    for other in args.other_entries:
        if other > done:
            fill = work / f"fill-{other}"
            fill.mkdir(exist_ok=True)
            filler_sessions(fill, other - done, rng, done // 2000)
            t = time.perf_counter()
            ingest(Workspace.open(db_path, settings=Settings()), [fill])
            print(f"+{other - done:,} other entries ingested in {time.perf_counter() - t:.1f} s")
            done = other
        con = dbmod.connect(db_path, read_only=True)
        try:
            got = compaction_projection(con, SESSION, tip, first_kept, pool)
            assert (got.fullFold, [o.id for o in got.memory.observations], [r.id for r in got.memory.reflections]) == expected
            warm = measure(lambda: compaction_projection(con, SESSION, tip, first_kept, pool), args.runs)
        finally:
            con.close()
        cli = measure(lambda: subprocess.run([om, "--db", str(db_path), "compact", SESSION, "--first-kept", first_kept,
                                              "--leaf", tip, "--json"], check=True, capture_output=True), args.cli_runs,
                      clock=children_cpu)
        mem = measure(lambda: memory_fold(entries, first_kept, pool), args.runs)
        row = {"other_entries": other, "warm": warm, "cli": cli, "in_memory": mem,
               "warm_over_memory": round(warm["p50_ms"] / mem["p50_ms"], 2),
               "full_fold": expected[0], "observations": len(expected[1]), "reflections": len(expected[2])}
        results["sizes"].append(row)
        print(f"other entries {other:>9,} (CPU): warm p50 {warm['p50_ms']:6.2f} ms p95 {warm['p95_ms']:6.2f} ms | "
              f"om compact p50 {cli['p50_ms']:7.1f} ms p95 {cli['p95_ms']:7.1f} ms | "
              f"in-memory p50 {mem['p50_ms']:6.2f} ms | warm/in-memory {row['warm_over_memory']}x")
    return results


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], json_flag=False)
    parser.add_argument("--runs", type=int, default=60, help="warm and in-memory repetitions per size")
    parser.add_argument("--cli-runs", type=int, default=10, help="`om compact` process runs per size")
    parser.add_argument("--other-entries", type=lambda v: [int(x) for x in v.split(",")],
                        default=[0, 100_000, 1_000_000], help="sizes of the rest of the database (comma-separated)")
    parser.add_argument("--keep", help="work in this directory and keep it")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = parser.parse_args()
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
