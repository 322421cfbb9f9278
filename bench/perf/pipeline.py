#!/usr/bin/env python3
"""Pipeline benchmark: the Prefect flow against a model that always answers after 200 ms.

What it does:

1. Generates ``--sessions`` (default 56) small Pi sessions with ``tests/builders.SessionBuilder``:
   3 to 12 turns each (user prompt, assistant tool call, tool result, assistant answer), every fifth
   one with a second branch, so that with low thresholds every session makes several model calls.
2. Starts Prefect's API once (``prefect_test_harness``, a temporary SQLite database) and runs one
   small warm-up flow (imports litellm, opens the first connections); none of that is timed.
3. Serves the fake model (tests/fake_openai.py with ``ScriptedWorkers(delay=0.2)``: every call
   answered after 200 ms; each stage is one tool call, whose clean receipt ends it) and runs
   ``flows.runner.run_pipeline`` over all sessions at ``--concurrency`` 16 (thread runner) with
   ``modelConcurrency`` 16, into a fresh DuckDB, ``--runs`` times (default 3).
4. Reports for each run and the median:
   * wall time of ``run_pipeline`` (ingest, replay, drain, the flow's own start and finish);
   * model calls (``llm_calls`` rows of the run) and stage tasks (every ``memory-stage`` task the
     replay ran, including the ones that found nothing to do);
   * ideal = max(calls × 0.2 s ÷ 16, the busiest session's calls × 0.2 s): a session's branches
     and stages run one after another, so no schedule beats its chain;
   * efficiency = ideal ÷ wall (target: at least 80 %);
   * orchestration overhead = (wall × 16 − calls × 0.2 s) ÷ stage tasks: the worker-seconds
     not spent waiting for the model, per stage task (and the same per model call);
   * a list-scheduling bound: sessions handed in submission order to 16 workers, each lasting
     calls × 0.2 s, which is the best this flow's one-session-per-worker structure can do.
5. With ``--profile`` (on by default; ``--no-profile`` to skip), baselines at the same concurrency:
   bare ``litellm.completion`` calls to the same fake server (litellm's own overhead), bare
   ``http.client`` calls (the fake server's own cost), a Prefect flow of session tasks calling stage
   tasks that only sleep 200 ms (Prefect's own overhead), and the same flow shape whose stage tasks
   make the run's litellm calls with no DuckDB work at all: the **ceiling** this design reaches on
   this machine if the ledger cost nothing. The report gives the pipeline's efficiency as a share of
   that ceiling (target: at least 90 %).
6. With ``--cluster`` (on by default), the same sessions once more on a local multi-process Dask
   cluster (2 worker processes), the fake model in a process of its own: the flow's process then only
   reads payloads and commits results (one writer, many workers), and its CPU per model call is
   reported (target: at most 5 ms).
7. With ``--scaling`` (on by default): bench/perf/scaling.py, model calls per second of ``om run
   --dask-address`` with 1, 2 and 4 Dask worker processes on a local multi-process cluster (and a
   real Prefect server) at 1 s model latency, and the scaling ratio against 1 worker.

Usage (from the repository root):

    .venv/bin/python bench/perf/pipeline.py
    .venv/bin/python bench/perf/pipeline.py --runs 1 --sessions 50 --json
    .venv/bin/python bench/perf/pipeline.py --no-profile
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from flows.runner import prepare_environment  # noqa: E402

prepare_environment()  # before anything imports Prefect

import socket  # noqa: E402
from http.server import ThreadingHTTPServer  # noqa: E402

import duckdb  # noqa: E402
import fake_openai  # noqa: E402
from builders import SessionBuilder  # noqa: E402
from fake_brains import ScriptedWorkers  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from om_core.settings import Settings  # noqa: E402

from bench.perf import scaling  # noqa: E402
from bench.perf.pipeline_baselines import (  # noqa: E402
    DELAY,
    bare_http,
    bare_litellm,
    bare_prefect,
    cpu_seconds,
    list_schedule,
    prefect_with_litellm,
)

class NoDelayHTTPServer(ThreadingHTTPServer):
    """The fake server's HTTP server with TCP_NODELAY on every accepted socket.

    tests/fake_openai.py writes a response's headers and body in two writes on a socket with Nagle's
    algorithm on; with the client's delayed ACK each answer then waits about 40 ms more on loopback
    (measured: 44 ms per request with http.client, 48 ms with litellm; 0.2 ms and 3.6 ms with
    TCP_NODELAY). Unless ``--server-as-is`` is given, this bench swaps this class in (in this process
    only) so that the model really answers after 200 ms."""

    def get_request(self):
        sock, addr = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, addr


def settings(model_concurrency: int) -> Settings:
    # the thresholds of tests/test_flows.py: every few turns a stage falls due
    return Settings(observeAfterTokens=150, reflectAfterTokens=300, compactAfterTokens=700, keepRecentTokens=200,
                    observerChunkMaxTokens=400, observationsPoolMaxTokens=40, observationsPoolTargetTokens=20,
                    modelConcurrency=model_concurrency)


# ------------------------------------------------------------------ sessions


def make_sessions(folder: Path, count: int) -> list[Path]:
    paths = []
    for n in range(count):
        b = SessionBuilder(session_id=f"{n:08x}-aaaa-bbbb-cccc-dddddddddddd",
                           start=f"2026-03-{1 + n % 28:02d}T{8 + n % 10:02d}:00:00")
        turns = 3 + (n * 7) % 10  # 3..12 turns, interleaved so long and short sessions alternate
        b.work_turns(turns, f"topic{n}")
        if n % 5 == 1 and turns >= 4:  # a second branch: go back two turns and continue differently
            b.go(b.entries[-9]["id"])
            b.branch_summary("Tried another approach first; it was abandoned.")
            b.work_turns(2, f"detour{n}")
        paths.append(b.write(folder / f"s{n:03d}.jsonl"))
    return paths


# ------------------------------------------------------------------ one run


def run_once(paths: list[Path], db_path: Path, concurrency: int, model_concurrency: int,
             delay: float = DELAY) -> dict[str, Any]:
    from flows.runner import run_pipeline

    script = ScriptedWorkers(delay=delay)
    with FakeOpenAI(responder=script) as server:
        model = {"model": "openai/fake-model", "api_base": server.base_url, "limit": "process"}
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        summary = run_pipeline([str(p) for p in paths], db_path=str(db_path), model=model,
                               settings=settings(model_concurrency).model_dump(), concurrency=concurrency,
                               runner="threads", window=2 * concurrency)
        wall = time.perf_counter() - t0
        cpu1 = cpu_seconds()
        requests = len(server.requests)
    summary = summary.model_dump()  # the flow's RunResult, read here as its fields
    run_id = summary["run_id"]
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        per_session = dict(con.execute("SELECT session_id, count(*) FROM llm_calls WHERE run_id = ? GROUP BY 1",
                                       [run_id]).fetchall())
        failed_calls = con.execute("SELECT count(*) FROM llm_calls WHERE run_id = ? AND status <> 'ok'",
                                   [run_id]).fetchone()[0]
        latency = con.execute("SELECT avg(latency_ms), quantile_cont(latency_ms, 0.5), quantile_cont(latency_ms, 0.95), "
                              "max(latency_ms) FROM llm_calls WHERE run_id = ?", [run_id]).fetchone()
        stage_rows = con.execute("SELECT count(*) FROM stages WHERE run_id = ?", [run_id]).fetchone()[0]
        records = con.execute("SELECT count(*) FROM ledger WHERE run_id = ?", [run_id]).fetchone()[0] \
            if "run_id" in [r[0] for r in con.execute("DESCRIBE ledger").fetchall()] else None
        compactions = con.execute("SELECT count(*) FROM compactions WHERE origin = 'simulated'").fetchone()[0]
    finally:
        con.close()
    calls = sum(per_session.values())
    stage_tasks = 0
    errors = list(summary["errors"])
    for s in summary["sessions"]:
        if s["error"]:
            errors.append(s["error"])
        for branch in s["branches"]:
            stage_tasks += sum(branch["stages"].values())
            errors += branch["failures"]
    order = [s["session_id"] for s in summary["sessions"]]  # submission order
    busiest = max(per_session.values()) if per_session else 0
    ideal = max(calls * delay / concurrency, busiest * delay)
    scheduled = list_schedule([per_session.get(sid, 0) * delay for sid in order], concurrency)
    result = {
        "wall_seconds": wall,
        "sessions": len(summary["sessions"]),
        "model_calls": calls,
        "fake_server_requests": requests,
        "failed_calls": failed_calls,
        "stage_tasks": stage_tasks,
        "stage_runs_rows": stage_rows,
        "ledger_records": records,
        "simulated_compactions": compactions,
        "calls_per_session": {"min": min(per_session.values(), default=0), "max": busiest,
                              "mean": statistics.fmean(per_session.values()) if per_session else 0},
        "ideal_seconds": ideal,
        "efficiency": ideal / wall if wall else None,
        "list_schedule_seconds": scheduled,
        "efficiency_vs_list_schedule": scheduled / wall if wall else None,
        "overhead_per_stage_task_ms": 1000 * (wall * concurrency - calls * delay) / stage_tasks if stage_tasks else None,
        "overhead_per_model_call_ms": 1000 * (wall * concurrency - calls * delay) / calls if calls else None,
        "call_latency_ms": {"mean": latency[0], "p50": latency[1], "p95": latency[2], "max": latency[3]},
        "cpu_seconds_self": cpu1[0] - cpu0[0],  # this process: flow, replay, DuckDB, litellm, fake server
        "cpu_seconds_prefect_server": cpu1[1] - cpu0[1],
        "cores": os.cpu_count(),
        "cpu_utilisation": ((cpu1[0] - cpu0[0]) + (cpu1[1] - cpu0[1])) / (wall * (os.cpu_count() or 1)),
        "cpu_ms_per_model_call": 1000 * (cpu1[0] - cpu0[0]) / calls if calls else None,
        "errors": errors[:10],
    }
    return result


def cluster_run(paths: list[Path], db_path: Path, model_concurrency: int, workers: int = 2,
                delay: float = DELAY) -> dict[str, Any]:
    """The flow with its replays on a local multi-process Dask cluster: this process only reads
    payloads and commits results, so its CPU per model call is the one writer's cost."""
    from prefect.settings import PREFECT_API_URL
    from prefect_dask import DaskTaskRunner

    from flows.runner import run_pipeline

    # worker processes reach the same API (the harness sets it for this process only)
    os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
    proc, base_url = harness.fake_model_process(delay)
    try:
        runner = DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 8, "processes": True,
                                                "dashboard_address": None})
        model = {"model": "openai/fake-model", "api_base": base_url, "limit": "process"}
        cpu0 = cpu_seconds()
        t0 = time.perf_counter()
        summary = run_pipeline([str(p) for p in paths], db_path=str(db_path), model=model,
                               settings=settings(model_concurrency).model_dump(), concurrency=workers * 8,
                               task_runner_override=runner)
        wall = time.perf_counter() - t0
        own = cpu_seconds()[0] - cpu0[0]
    finally:
        harness.stop_process(proc)
    summary = summary.model_dump()  # the flow's RunResult, read here as its fields
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        calls = con.execute("SELECT count(*) FROM llm_calls WHERE run_id = ?", [summary["run_id"]]).fetchone()[0]
    finally:
        con.close()
    errors = list(summary["errors"]) + [s["error"] for s in summary["sessions"] if s["error"]]
    return {"workers": workers, "sessions": len(summary["sessions"]), "model_calls": calls, "wall_seconds": wall,
            "flow_cpu_seconds": own, "flow_cpu_ms_per_model_call": 1000 * own / calls if calls else None,
            "errors": errors[:5]}


# ------------------------------------------------------------------ output


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def print_report(out: dict[str, Any]) -> None:
    runs = out["runs"]
    print(f"{out['sessions']} sessions, concurrency {out['concurrency']}, modelConcurrency {out['model_concurrency']}, "
          f"every model call answered after {out['delay_ms']:.0f} ms (threads runner, Prefect test harness API, "
          f"fake server {'with TCP_NODELAY' if out['fake_server_tcp_nodelay'] else 'as is: ~40 ms Nagle stall per answer'}, "
          f"{os.cpu_count()} cores)")
    print(f"{'run':>6} {'wall s':>8} {'calls':>6} {'stages':>7} {'busiest':>8} {'ideal s':>8} {'eff.':>7} "
          f"{'list-sched s':>13} {'eff. vs sched':>14} {'ovh/stage ms':>13} {'ovh/call ms':>12} {'call p50 ms':>12}")
    for i, r in enumerate(runs, 1):
        print(f"{i:>6} {r['wall_seconds']:>8.2f} {r['model_calls']:>6} {r['stage_tasks']:>7} "
              f"{r['calls_per_session']['max']:>8} {r['ideal_seconds']:>8.2f} {pct(r['efficiency']):>7} "
              f"{r['list_schedule_seconds']:>13.2f} {pct(r['efficiency_vs_list_schedule']):>14} "
              f"{r['overhead_per_stage_task_ms']:>13.1f} {r['overhead_per_model_call_ms']:>12.1f} "
              f"{r['call_latency_ms']['p50']:>12.1f}")
    m = out["median"]
    print(f"{'median':>6} {m['wall_seconds']:>8.2f} {m['model_calls']:>6} {m['stage_tasks']:>7} {'':>8} "
          f"{m['ideal_seconds']:>8.2f} {pct(m['efficiency']):>7} {'':>13} {'':>14} "
          f"{m['overhead_per_stage_task_ms']:>13.1f} {m['overhead_per_model_call_ms']:>12.1f}")
    print(f"Median efficiency {pct(m['efficiency'])} of the ideal; this process's CPU "
          f"{m['cpu_ms_per_model_call']:.1f} ms per model call (flow, replays, DuckDB, litellm, fake server).")
    errors = [e for r in runs for e in r["errors"]]
    if errors:
        print(f"Errors ({len(errors)}): " + "; ".join(errors[:3]))
    if out.get("bare_litellm"):
        b = out["bare_litellm"]
        print(f"\nBare litellm.completion, {b['calls']} calls from {out['concurrency']} threads: wall {b['wall_seconds']:.2f} s, "
              f"ideal {b['ideal_seconds']:.2f} s, efficiency {pct(b['efficiency'])}, overhead {b['overhead_ms_per_call']:.1f} ms per call")
    if out.get("bare_http"):
        b = out["bare_http"]
        print(f"Bare http.client, same calls and threads (fake server's own cost): wall {b['wall_seconds']:.2f} s, "
              f"efficiency {pct(b['efficiency'])}, overhead {b['overhead_ms_per_call']:.1f} ms per call, "
              f"CPU {b['cpu_ms_per_call']:.1f} ms per call")
    if out.get("bare_litellm"):
        print(f"  (litellm: CPU {out['bare_litellm']['cpu_ms_per_call']:.1f} ms per call, fake server included)")
    if out.get("bare_prefect"):
        b = out["bare_prefect"]
        print(f"Bare Prefect ({b['sessions']} session tasks calling {b['stage_tasks']} sleep-200ms stage tasks): "
              f"wall {b['wall_seconds']:.2f} s, ideal {b['ideal_seconds']:.2f} s, efficiency {pct(b['efficiency'])}, "
              f"overhead {b['overhead_ms_per_task']:.1f} ms per task")
    if out.get("prefect_with_litellm"):
        b = out["prefect_with_litellm"]
        print(f"Prefect + litellm, no DuckDB ({b['sessions']} session tasks, {b['stage_tasks']} stage tasks making "
              f"{b['calls']} calls): wall {b['wall_seconds']:.2f} s, ideal {b['ideal_seconds']:.2f} s, "
              f"efficiency {pct(b['efficiency'])}, CPU {b['cpu_ms_per_call']:.1f} ms per call (this process)")
        print(f"\nThe pipeline reaches {pct(out['share_of_ceiling'])} of that ceiling "
              f"({pct(m['efficiency'])} against {pct(b['efficiency'])}; target: at least 90 %).")
    if out.get("cluster"):
        c = out["cluster"]
        print(f"Local multi-process Dask cluster ({c['workers']} worker processes, fake model in its own process): "
              f"{c['model_calls']} calls in {c['wall_seconds']:.1f} s; the flow's process used {c['flow_cpu_seconds']:.1f} "
              f"CPU-s = {c['flow_cpu_ms_per_model_call']:.1f} ms per model call (target: at most 5 ms)"
              + (f"; errors: {'; '.join(c['errors'])}" if c["errors"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__, smoke="2 sessions, one run, the baselines, a one-worker cluster, no scaling")
    parser.add_argument("--sessions", type=int, default=56)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model-concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                        help="instrument the runs and time the litellm and Prefect baselines (default: on)")
    parser.add_argument("--cluster", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the flow process's CPU per model call with replays on a local "
                             "multi-process Dask cluster (default: on)")
    parser.add_argument("--server-as-is", action="store_true",
                        help="leave the fake server's ~40 ms Nagle/delayed-ACK stall per answer in place")
    parser.add_argument("--keep", type=Path, default=None, help="keep sessions and databases in this directory")
    parser.add_argument("--scaling", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure model calls per second with 1, 2 and 4 Dask worker processes at 1 s "
                             "model latency (bench/perf/scaling.py; default: on)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sessions, args.runs, args.scaling = 2, 1, False
    if args.sessions < 1 or args.runs < 1:
        parser.error("--sessions and --runs must be at least 1")

    from prefect.testing.utilities import prefect_test_harness

    if not args.server_as_is:
        fake_openai.ThreadingHTTPServer = NoDelayHTTPServer
    work = args.keep or Path(tempfile.mkdtemp(prefix="om-bench-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    try:
        paths = make_sessions(work / "sessions", args.sessions)
        warm = make_sessions(work / "warm", 2)
        log("starting Prefect's API (not timed)…")
        t0 = time.perf_counter()
        with prefect_test_harness(server_startup_timeout=90):
            log(f"  started in {time.perf_counter() - t0:.1f} s; warm-up flow…")
            run_once(warm, work / "warm.duckdb", args.concurrency, args.model_concurrency, delay=0.0)
            runs = []
            for i in range(args.runs):
                log(f"run {i + 1}/{args.runs}…")
                r = run_once(paths, work / f"run{i + 1}.duckdb", args.concurrency, args.model_concurrency)
                log(f"  wall {r['wall_seconds']:.2f} s, {r['model_calls']} calls, ideal {r['ideal_seconds']:.2f} s, "
                    f"efficiency {pct(r['efficiency'])}")
                runs.append(r)
            keys = ("wall_seconds", "model_calls", "stage_tasks", "ideal_seconds", "efficiency",
                    "overhead_per_stage_task_ms", "overhead_per_model_call_ms", "cpu_ms_per_model_call")
            median = {k: statistics.median(r[k] for r in runs) for k in keys}
            out: dict[str, Any] = {"sessions": args.sessions, "concurrency": args.concurrency,
                                   "fake_server_tcp_nodelay": not args.server_as_is,
                                   "model_concurrency": args.model_concurrency, "delay_ms": DELAY * 1000,
                                   "runs": runs, "median": median}
            if args.profile:
                log("baseline: bare litellm…")
                out["bare_litellm"] = bare_litellm(round(median["model_calls"]), args.concurrency)
                log("baseline: bare HTTP…")
                out["bare_http"] = bare_http(round(median["model_calls"]), args.concurrency)
                log("baseline: bare Prefect…")
                out["bare_prefect"] = bare_prefect(round(median["stage_tasks"]), args.sessions, args.concurrency)
                log("baseline: Prefect + litellm without DuckDB…")
                out["prefect_with_litellm"] = prefect_with_litellm(
                    round(median["stage_tasks"]), round(median["model_calls"]), args.sessions, args.concurrency)
                out["share_of_ceiling"] = median["efficiency"] / out["prefect_with_litellm"]["efficiency"]
            if args.cluster:
                log("the flow's CPU with replays on a local multi-process Dask cluster…")
                out["cluster"] = cluster_run(paths, work / "cluster.duckdb", args.model_concurrency,
                                             workers=1 if args.smoke else 2)
        if args.scaling:  # outside the ephemeral API: the workers are other processes, on a real server
            out["scaling"] = scaling.measure([1, 2, 4], log=log)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print_report(out)
        if "scaling" in out:
            scaling.print_scaling(out["scaling"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
