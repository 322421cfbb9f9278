#!/usr/bin/env python3
"""CPU of a whole `om run`: the command's process and every process it started (Prefect's local
API, helpers), per stage and per model call, on a fresh database each run.

Two workloads (both run by default):

* ``offline``: archives made from the two real sample sessions (../shared/sessions), each copied
  ``--copies`` times under new session ids, replayed with ``--model offline`` at default settings.
  Reported: CPU milliseconds per stage run (``stages`` rows of the run), everything included
  (ingest, orchestrator, replay, commits).
* ``instant``: ``--sessions`` generated sessions (tests/builders.SessionBuilder) with low thresholds
  and a model that answers at once (the scripted fake model, tests/fake_brains.py, in a process of
  its own, so its CPU is not om's). Reported: CPU milliseconds per model call (``llm_calls`` rows).

Also reported per stage or model call: how much the database of the Prefect API the run recorded
into grew in the run (its SQLite's pages in use): the server `om run` keeps between runs
(flows.kept_server, its PREFECT_HOME in the run's home), or with ``--server`` a real `prefect server
start` (task runs recorded, as om serve's). The kept server's first run's figure includes the empty
database's schema. The runs of a workload share one kept server, as a user's successive runs do: the
first run starts it (its wall time and CPU include the start), later ones find it warm. Its CPU is
the run's too: the kept server is no child the run waits for, so its process's CPU growth (its
threads and any children) is read around each run and added (``server_cpu_seconds``).

Each workload runs ``--runs`` times (median and every run printed). The CPU is the
``RUSAGE_CHILDREN`` difference around the `om run` subprocess: its own and its waited-for
descendants' user + system time. The machine may be shared: compare figures measured side by
side (``--python``/``--pythonpath`` run another checkout's code with the same workloads).

Usage (from the repository root):

    .venv/bin/python bench/perf/run_cpu.py
    .venv/bin/python bench/perf/run_cpu.py --workload offline --copies 2 --runs 3
    .venv/bin/python bench/perf/run_cpu.py --pythonpath /tmp/om-base --json   # another checkout's code
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

THRESHOLDS = {"OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300", "OM_COMPACT_AFTER_TOKENS": "700",
              "OM_KEEP_RECENT_TOKENS": "200", "OM_OBSERVER_CHUNK_MAX_TOKENS": "400",
              "OM_OBSERVATIONS_POOL_MAX_TOKENS": "40", "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20",
              "OM_CLOCK_BASIS": "source"}


def kept_home(home: Path) -> Path:
    """The PREFECT_HOME of the server `om run` keeps for a run whose HOME is ``home`` (``run_env``
    leaves out PREFECT_HOME and XDG_DATA_HOME): its database is ``prefect.db`` there."""
    return home / ".local" / "share" / "om" / "prefect"


def run_env(home: Path, pythonpath: str | None, env_extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OM_", "PREFECT_API_URL", "PREFECT_HOME", "XDG_DATA_HOME"))}
    env.update({"HOME": str(home), "OPENAI_API_KEY": "not-needed", **env_extra})
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def kept_server_cpu(home: Path) -> float:
    """CPU seconds the kept server of ``home`` has used so far (its process, its threads and the children
    it waited for); 0 when none runs."""
    import psutil

    try:
        pid = int((kept_home(home) / "om-server.pid").read_text().strip())
        times = psutil.Process(pid).cpu_times()
    except (OSError, ValueError, psutil.Error):
        return 0.0
    return times.user + times.system + times.children_user + times.children_system


def om_run(python: str, pythonpath: str | None, db: Path, target: Path, model: list[str], env_extra: dict[str, str],
           home: Path, prefect_db: Path | None = None) -> dict[str, Any]:
    """``prefect_db``: the Prefect database the run records into (default: the kept server's, in ``home``)."""
    kept = prefect_db is None
    prefect_db = prefect_db or kept_home(home) / "prefect.db"
    env = run_env(home, pythonpath, env_extra)
    prefect_before = prefect_db_bytes(prefect_db)
    server_before = kept_server_cpu(home) if kept else 0.0
    before, t0 = harness.children_cpu(), time.perf_counter()
    done = subprocess.run([python, "-m", "flows.cli", "--db", str(db), "run", str(target), "--json", *model],
                          env=env, cwd=home, capture_output=True, text=True)
    wall, own = time.perf_counter() - t0, harness.children_cpu() - before
    server_cpu = kept_server_cpu(home) - server_before if kept else 0.0
    cpu = own + server_cpu
    if done.returncode != 0:
        raise SystemExit(f"om run failed ({done.returncode}): {done.stderr[-2000:]}")
    run_id = json.loads(done.stdout)["run_id"]
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        stages = con.execute("SELECT count(*) FROM stages WHERE run_id = ?", [run_id]).fetchone()[0]
        calls = con.execute("SELECT count(*) FROM llm_calls WHERE run_id = ?", [run_id]).fetchone()[0]
        records = con.execute("SELECT count(*) FROM ledger WHERE run_id = ?", [run_id]).fetchone()[0]
    finally:
        con.close()
    return {"cpu_seconds": cpu, "wall_seconds": wall, "server_cpu_seconds": server_cpu, "stages": stages,
            "model_calls": calls, "records": records, "prefect_db": str(prefect_db),
            "prefect_db_bytes": prefect_db_bytes(prefect_db) - prefect_before}


def prefect_db_bytes(path: Path) -> int:
    """What a Prefect API's database (its SQLite) holds now: its pages in use, not
    the file's size (SQLite grows a file in steps and reuses freed pages without shrinking it)."""
    import sqlite3

    if not path.is_file():
        return 0
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        pages, free, size = (con.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                                "page_size"))
        return (pages - free) * size
    finally:
        con.close()


def workload(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    home = work / f"{name}-home"
    home.mkdir(parents=True, exist_ok=True)
    proc, server, prefect_db = None, None, None
    if args.server:  # a real `prefect server start` (as om serve's), its database apart from the runs' home
        from flows.server import start_server

        server = start_server(home=work / f"{name}-prefect-server", log=work / f"{name}-prefect-server.log")
        prefect_db = work / f"{name}-prefect-server" / "prefect.db"
    if name == "offline":
        target, model, env_extra, per = harness.copy_archive(work / "archive", args.copies), ["--model", "offline"], {}, "stages"
    else:
        proc, base_url = harness.fake_model_process()
        target = harness.generated_sessions(work / "generated", args.sessions)
        model, env_extra, per = ["--model", "openai/fake-model", "--api-base", base_url], dict(THRESHOLDS), "model_calls"
    if server is not None:
        env_extra = {**env_extra, **server.client_env}  # its API and its credential
    runs = []
    try:
        for i in range(args.runs):
            db = work / f"{name}-{i}.duckdb"
            r = om_run(args.python, args.pythonpath, db, target, model, env_extra, home, prefect_db)
            r["cpu_ms_per"] = 1000 * r["cpu_seconds"] / r[per] if r[per] else None
            r["prefect_kb_per"] = r["prefect_db_bytes"] / 1024 / r[per] if r[per] else None
            runs.append(r)
            print(f"  {name} run {i + 1}: {r['cpu_seconds']:.1f} CPU-s (kept server {r['server_cpu_seconds']:.1f}), "
                  f"{r[per]} {per}, "
                  f"{r['cpu_ms_per']:.1f} ms per {per[:-1].replace('_', ' ')}, Prefect's database "
                  f"+{r['prefect_db_bytes'] / 1024:.0f} KB ({r['prefect_kb_per']:.1f} KB per {per[:-1].replace('_', ' ')}) "
                  f"(wall {r['wall_seconds']:.1f} s)", file=sys.stderr, flush=True)
            db.unlink()
    finally:
        if proc is not None:
            harness.stop_process(proc)
        if server is not None:
            server.stop()
        else:  # the server the runs kept: it would otherwise stop only after its idle time
            subprocess.run([args.python, "-m", "flows.cli", "server", "stop"], cwd=home, capture_output=True,
                           env=run_env(home, args.pythonpath, {}))
    warm = runs[1:] or runs  # the kept server's first run starts it
    return {"per": per, "runs": runs, "median_cpu_ms_per": statistics.median(r["cpu_ms_per"] for r in runs),
            "median_prefect_kb_per": statistics.median(r["prefect_kb_per"] for r in runs),
            "median_warm_wall_seconds": statistics.median(r["wall_seconds"] for r in warm),
            "median_warm_cpu_seconds": statistics.median(r["cpu_seconds"] for r in warm)}


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--workload", choices=["offline", "instant", "both"], default="both")
    parser.add_argument("--copies", type=int, default=2, help="copies of each real session (offline)")
    parser.add_argument("--sessions", type=int, default=24, help="generated sessions (instant)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs om")
    parser.add_argument("--pythonpath", default=None, help="run the om code of another checkout")
    parser.add_argument("--server", action="store_true",
                        help="record into a real `prefect server start` (task runs recorded, as om serve's) "
                             "instead of the server om run keeps")
    args = parser.parse_args(argv)
    if args.workload in ("offline", "both") and not harness.SHARED_SESSIONS.is_dir():
        parser.error(f"{harness.SHARED_SESSIONS} is absent: the offline workload needs the real sample sessions")
    out = {}
    with harness.work_dir("om-bench-run-cpu-") as work:
        for name in (["offline", "instant"] if args.workload == "both" else [args.workload]):
            out[name] = workload(name, args, work)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for name, result in out.items():
            unit = "stage" if result["per"] == "stages" else "model call"
            print(f"{name}: median {result['median_cpu_ms_per']:.1f} CPU-ms per {unit} over {len(result['runs'])} "
                  f"run(s) (om run's process and its children, everything included); Prefect's database grew "
                  f"{result['median_prefect_kb_per']:.1f} KB per {unit}; runs after the first: median wall "
                  f"{result['median_warm_wall_seconds']:.1f} s, {result['median_warm_cpu_seconds']:.1f} CPU-s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
