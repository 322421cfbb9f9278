#!/usr/bin/env python3
"""Scaling out: model calls per second of `om run --dask-address` with 1, 2 and 4 Dask worker
processes, at 1 s model latency.

What it does:

1. Starts a real `prefect server start` (a temporary PREFECT_HOME, a free port) that every process
   reports to, and the fake model (tests/fake_openai.py with ``ScriptedWorkers(delay=1.0)``: every
   call answered after 1 s), not timed.
2. For each worker count N: starts `dask scheduler` and `dask worker --nworkers N --nthreads T`
   (default T = 2: N × T sessions in flight), generates ``--sessions`` small sessions (one or two
   observer stages each), and runs `om run --dask-address … --no-drain` on them into a fresh database, with
   ``modelConcurrency`` high enough never to bind. Then stops the cluster.
3. Reports per N: model calls, calls per second over the span of model traffic (first request to
   last answer, so process start-up is left out), the wall time of `om run`, and the ideal (N × T
   calls per second); and the scaling ratio: calls per second at N workers ÷ at 1 worker (ideal: N).

Usage (from the repository root):

    .venv/bin/python bench/perf/scaling.py
    .venv/bin/python bench/perf/scaling.py --workers 1 2 4 --sessions 16 --json

bench/perf/pipeline.py runs this too (``--scaling``, on by default).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from flows.server import free_port, start_server, stop_process_group  # noqa: E402

LATENCY = 1.0
THRESHOLDS = {"OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300", "OM_COMPACT_AFTER_TOKENS": "700",
              "OM_KEEP_RECENT_TOKENS": "200", "OM_OBSERVER_CHUNK_MAX_TOKENS": "400",
              "OM_OBSERVATIONS_POOL_MAX_TOKENS": "40", "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20"}


def make_sessions(folder: Path, count: int) -> Path:
    from builders import SessionBuilder

    for n in range(count):
        b = SessionBuilder(session_id=f"5ca1e{n:03d}-aaaa-bbbb-cccc-dddddddddddd", start=f"2026-06-{1 + n % 28:02d}T09:00:00")
        b.work_turns(1 + n % 2, f"topic{n}")  # one observer stage or two: the calls, not chains, dominate
        b.write(folder / f"s{n:03d}.jsonl")
    return folder


class Traffic:
    """Arrival times of model requests (each is answered ``latency`` seconds later)."""

    def __init__(self, script, latency: float) -> None:
        self.script, self.latency = script, latency
        self.arrivals: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, body):
        with self.lock:
            self.arrivals.append(time.perf_counter())
        return self.script(body)

    def calls_per_second(self) -> float | None:
        if not self.arrivals:
            return None
        span = max(self.arrivals) + self.latency - min(self.arrivals)
        return len(self.arrivals) / span


def _cluster(workers: int, nthreads: int, env: dict[str, str], root: Path):
    from distributed import Client

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    logs = open(root / "cluster.log", "ab")  # noqa: SIM115 - closed with the cluster
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], cwd=root, env=env, stdout=logs, stderr=subprocess.STDOUT,
                              start_new_session=True)]
    procs.append(subprocess.Popen([sys.executable, "-m", "dask", "worker", address, "--nworkers", str(workers),
                                   "--nthreads", str(nthreads), "--no-dashboard", "--local-directory", str(root)],
                                  cwd=root, env=env, stdout=logs, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + 120
    with Client(address, timeout=120) as client:
        while len(client.scheduler_info()["workers"]) < workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(client.scheduler_info()['workers'])} of {workers} workers joined")
            time.sleep(0.3)
    return address, procs, logs


def measure(worker_counts: list[int], sessions: int = 16, nthreads: int = 2, latency: float = LATENCY,
            log=lambda *a: None, work: Path | None = None, model_limit: str = "prefect") -> dict[str, Any]:
    """Calls per second of `om run --dask-address` at each worker count, and the scaling ratios."""
    from fake_brains import ScriptedWorkers
    from fake_openai import FakeOpenAI

    own = work is None
    work = Path(tempfile.mkdtemp(prefix="om-bench-scaling-")) if own else work
    log("scaling: starting a Prefect server (not timed)…")
    server = start_server(home=work / "prefect-home", log=work / "prefect-server.log")
    rows: list[dict[str, Any]] = []
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
        env.update({"PYTHONPATH": str(harness.REPO), **server.client_env, "PREFECT_LOGGING_LEVEL": "WARNING",
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "OPENAI_API_KEY": "sk-fake", "OM_MODEL_CONCURRENCY": str(4 * max(worker_counts) * nthreads),
                    **THRESHOLDS})
        for n in worker_counts:
            root = work / f"workers-{n}"
            root.mkdir()
            traffic = Traffic(ScriptedWorkers(delay=latency), latency)
            log(f"scaling: {n} worker process(es) × {nthreads} threads…")
            address, procs, logs = _cluster(n, nthreads, env, root)
            try:
                with FakeOpenAI(responder=traffic) as fake:
                    run_env = {**env, "OM_MODEL": "openai/fake-model", "OM_API_BASE": fake.base_url,
                               "OM_RESULT_STORAGE": str(work / "results" / str(n))}
                    t0 = time.perf_counter()
                    result = subprocess.run(
                        [sys.executable, "-m", "flows.cli", "--db", str(root / "om.duckdb"), "run",
                         str(make_sessions(root / "sessions", sessions)), "--dask-address", address,
                         "--concurrency", str(2 * n * nthreads), "--no-drain", "--model-limit", model_limit, "--json"],
                        cwd=root, env=run_env, capture_output=True, text=True, timeout=600)
                    wall = time.perf_counter() - t0
            finally:
                for proc in procs:
                    stop_process_group(proc, timeout=10)
                logs.close()
            rate = traffic.calls_per_second()
            row = {"workers": n, "threads_per_worker": nthreads, "model_calls": len(traffic.arrivals),
                   "calls_per_second": rate, "ideal_calls_per_second": n * nthreads / latency,
                   "wall_seconds": wall, "exit_code": result.returncode,
                   "error": None if result.returncode == 0 else (result.stderr.strip().splitlines() or ["?"])[-1][:300]}
            log(f"  {row['model_calls']} calls, {rate or 0:.2f} calls/s (ideal {row['ideal_calls_per_second']:.1f}), "
                f"om run {wall:.1f} s, exit {result.returncode}")
            rows.append(row)
    finally:
        server.stop()
        if own:
            shutil.rmtree(work, ignore_errors=True)
    base = rows[0]["calls_per_second"] if rows and rows[0]["calls_per_second"] else None
    for row in rows:
        row["scaling_ratio"] = row["calls_per_second"] / base if base and row["calls_per_second"] else None
    return {"latency_seconds": latency, "sessions": sessions, "model_limit": model_limit, "rows": rows}


def print_scaling(out: dict[str, Any]) -> None:
    print(f"\nScaling out: om run --dask-address --no-drain, {out['sessions']} sessions, model latency "
          f"{out['latency_seconds']:.1f} s, model-call limit {out['model_limit']}")
    print(f"  {'workers':>7}  {'calls':>5}  {'calls/s':>7}  {'ideal':>5}  {'ratio':>5}  {'om run s':>8}")
    for r in out["rows"]:
        rate = "n/a" if r["calls_per_second"] is None else f"{r['calls_per_second']:.2f}"
        ratio = "n/a" if r["scaling_ratio"] is None else f"{r['scaling_ratio']:.2f}"
        print(f"  {r['workers']:>7}  {r['model_calls']:>5}  {rate:>7}  {r['ideal_calls_per_second']:>5.1f}  "
              f"{ratio:>5}  {r['wall_seconds']:>8.1f}" + (f"  FAILED: {r['error']}" if r["error"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="threads per worker process")
    parser.add_argument("--latency", type=float, default=LATENCY)
    parser.add_argument("--model-limit", choices=["prefect", "process"], default="prefect",
                        help="the model-call limit: Prefect's global one on the server (om run's default on a "
                             "cluster), or a semaphore per process")
    args = parser.parse_args(argv)
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    out = measure(args.workers, args.sessions, args.threads, args.latency, log, model_limit=args.model_limit)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print_scaling(out)
    return 0 if all(r["exit_code"] == 0 for r in out["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
