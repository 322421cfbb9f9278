#!/usr/bin/env python3
"""Readers during a run: does an analyst's `om sql` (and `om sessions`, `om status`) answer while
`om run` works on the same database, and how fast, against the same reads on an idle database?

Only the run's flow process writes the database, in one short transaction per finished session
(one writer, many workers), and it holds the file only while it reads a payload or commits. So a
reader should get the file between those moments.

What it does:
1. Generates ``--sessions`` small sessions (tests/builders.SessionBuilder) and ingests them.
2. Idle: ``--reads`` reads with the library's read path (``catalog.run_sql``: open read-only, query,
   close) and a few `om sql` commands as a user types them (a new process each).
3. During a run: starts `om run` on those sessions in another process (the fake model answers every
   call after ``--delay`` seconds), and repeats the same reads until the run ends.
4. Reports the success rate and median/p95 latency of each, idle and during the run.

Usage (from the repository root):

    .venv/bin/python bench/perf/readers.py
    .venv/bin/python bench/perf/readers.py --sessions 24 --reads 200 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from builders import SessionBuilder  # noqa: E402
from fake_brains import ScriptedWorkers  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from om_core.store.catalog import run_sql  # noqa: E402
from om_core.errors import OmError  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

QUERY = "SELECT kind, count(*) FROM ledger GROUP BY ALL"
SETTINGS_ENV = {"OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300", "OM_COMPACT_AFTER_TOKENS": "700",
                "OM_KEEP_RECENT_TOKENS": "200", "OM_OBSERVER_CHUNK_MAX_TOKENS": "400",
                "OM_OBSERVATIONS_POOL_MAX_TOKENS": "40", "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20"}


def make_sessions(folder: Path, count: int) -> list[Path]:
    paths = []
    for n in range(count):
        b = SessionBuilder(session_id=f"{n:08x}-rrrr-bbbb-cccc-dddddddddddd", start=f"2026-03-{1 + n % 28:02d}T09:00:00")
        b.work_turns(6 + n % 6, f"topic{n}")
        paths.append(b.write(folder / f"s{n:03d}.jsonl"))
    return paths


def library_read(db: Path) -> tuple[bool, float, str | None]:
    t0 = time.perf_counter()
    try:
        run_sql(Workspace.open(db, settings=Settings()), QUERY)
        return True, time.perf_counter() - t0, None
    except OmError as exc:
        return False, time.perf_counter() - t0, str(exc)


def command_read(db: Path, env: dict[str, str]) -> tuple[bool, float, str | None]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), "sql", QUERY, "--csv"],
                          capture_output=True, text=True, env=env, timeout=120)
    ok = done.returncode == 0
    return ok, time.perf_counter() - t0, None if ok else done.stderr.strip()[:200]


def summary(samples: list[tuple[bool, float, str | None]]) -> dict[str, Any]:
    times = sorted(t for ok, t, _ in samples if ok)
    errors = [e for ok, _, e in samples if not ok]
    p95 = times[min(len(times) - 1, int(0.95 * len(times)))] if times else None
    return {"reads": len(samples), "ok": len(times), "success_rate": len(times) / len(samples) if samples else None,
            "p50_ms": 1000 * statistics.median(times) if times else None, "p95_ms": 1000 * p95 if p95 else None,
            "errors": errors[:3]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--reads", type=int, default=100, help="library reads when idle")
    parser.add_argument("--commands", type=int, default=8, help="`om sql` commands when idle")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds before the fake model answers")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with harness.work_dir("om-bench-readers-") as work:
        return read_during_run(args, work)


def read_during_run(args: argparse.Namespace, work: Path) -> int:
    paths = make_sessions(work / "sessions", args.sessions)
    db = work / "om.duckdb"
    ingest(Workspace.open(db, settings=Settings()), paths)
    env = {**os.environ, **SETTINGS_ENV, "PYTHONPATH": str(harness.REPO)}
    idle_library = [library_read(db) for _ in range(args.reads)]
    idle_command = [command_read(db, env) for _ in range(args.commands)]
    during_library: list = []
    during_command: list = []
    with FakeOpenAI(responder=ScriptedWorkers(delay=args.delay)) as server:
        run = subprocess.Popen([sys.executable, "-m", "flows.cli", "--db", str(db), "run", str(work / "sessions"),
                                "--model", "openai/fake-model", "--api-base", server.base_url, "--json"],
                               env={**env, "OPENAI_API_KEY": "not-needed"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        started = time.perf_counter()
        # the run's first seconds start Prefect: wait until the replays are under way
        while run.poll() is None and not server.requests:
            time.sleep(0.05)
        replay_started = time.perf_counter()
        i = 0
        while run.poll() is None:
            during_library.append(library_read(db))
            i += 1
            if i % 10 == 0:
                during_command.append(command_read(db, env))
        out, err = run.communicate()
        wall = time.perf_counter() - started
    result = {
        "sessions": args.sessions, "run_seconds": wall, "reading_seconds": time.perf_counter() - replay_started,
        "run_exit": run.returncode, "model_calls": len(server.requests),
        "idle": {"library": summary(idle_library), "om_sql": summary(idle_command)},
        "during_run": {"library": summary(during_library), "om_sql": summary(during_command)},
    }
    if run.returncode != 0:
        result["run_error"] = err.strip().splitlines()[-1:] if err.strip() else out[-300:]
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.sessions} sessions; `om run` took {wall:.1f} s ({result['model_calls']} model calls, exit "
          f"{run.returncode}); reads ran for its last {result['reading_seconds']:.1f} s")
    print(f"{'':<24} {'reads':>6} {'ok':>6} {'success':>8} {'p50 ms':>8} {'p95 ms':>8}")
    for phase in ("idle", "during_run"):
        for kind in ("library", "om_sql"):
            s = result[phase][kind]
            p50 = f"{s['p50_ms']:.1f}" if s["p50_ms"] is not None else "n/a"
            p95 = f"{s['p95_ms']:.1f}" if s["p95_ms"] is not None else "n/a"
            rate = f"{s['success_rate']:.1%}" if s["success_rate"] is not None else "n/a"
            print(f"{phase + ' ' + kind:<24} {s['reads']:>6} {s['ok']:>6} {rate:>8} {p50:>8} {p95:>8}")
            for e in s["errors"]:
                print(f"    error: {e}")
    if "run_error" in result:
        print(f"run error: {result['run_error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
