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
5. With ``--profile`` (on by default; ``--no-profile`` to skip), the timed runs are instrumented from
   the outside (nothing in om_core or flows is edited: wrappers are installed on module attributes in
   this process) to show where the time goes: time waiting for and holding
   ``om_core.db.SharedDatabase``'s lock, time inside ``execute_stage``, Prefect's cost per stage task
   (the task call minus ``execute_stage``), replay work between stages, litellm's latency per call
   beyond the 200 ms, and the session tasks' spread. Then baselines at the same concurrency: bare
   ``litellm.completion`` calls to the same fake server (litellm's own overhead), a Prefect flow of
   session tasks calling stage tasks that only sleep 200 ms (Prefect's own overhead), and the same
   flow whose stage tasks make the run's litellm calls with no DuckDB work at all (the ceiling this
   design reaches on this machine if the ledger cost nothing).
6. With ``--scaling`` (on by default): bench/scaling.py, model calls per second of ``om run
   --dask-address`` with 1, 2 and 4 Dask worker processes on a local multi-process cluster (and a
   real Prefect server) at 1 s model latency, and the scaling ratio against 1 worker.

Usage (from the repository root):

    .venv/bin/python bench/pipeline.py
    .venv/bin/python bench/pipeline.py --runs 1 --sessions 50 --json
    .venv/bin/python bench/pipeline.py --no-profile
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from flows.runner import prepare_environment  # noqa: E402

prepare_environment()  # before anything imports Prefect

import socket  # noqa: E402
from http.server import ThreadingHTTPServer  # noqa: E402

import duckdb  # noqa: E402
import fake_openai  # noqa: E402
from builders import SessionBuilder  # noqa: E402
from fake_brains import ScriptedWorkers  # noqa: E402
from fake_openai import FakeOpenAI, Reply  # noqa: E402

from om_core.settings import Settings  # noqa: E402

DELAY = 0.2


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


# ------------------------------------------------------------------ instrumentation (outside the library)


class Profile:
    """Timings collected by wrappers around module attributes, for one run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: dict[str, list[float]] = defaultdict(list)
        self.sessions: dict[str, tuple[float, float]] = {}  # session -> (start, end) of its replay
        self.by_caller: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])  # uses, held s, acquire s

    def add(self, name: str, seconds: float) -> None:
        with self.lock:
            self.samples[name].append(seconds)

    def total(self, name: str) -> float:
        return sum(self.samples.get(name, []))

    def count(self, name: str) -> int:
        return len(self.samples.get(name, []))

    def mean_ms(self, name: str) -> float | None:
        values = self.samples.get(name)
        return 1000 * statistics.fmean(values) if values else None


@contextmanager
def instrumented(profile: Profile):
    """Install timing wrappers (SharedDatabase uses, execute_stage, stage task calls, session replays,
    litellm calls); restore the originals afterwards."""
    import flows.pipeline as fp
    from om_core import db as dbmod
    from om_core.model import LiteLLMModel

    originals = {"_use": dbmod.SharedDatabase._use, "execute_stage": fp.execute_stage,
                 "replay_session": fp.replay_session, "_once": LiteLLMModel._once, "connect": dbmod.connect}
    use, execute, replay, once, connect = (originals[k] for k in ("_use", "execute_stage", "replay_session", "_once",
                                                                   "connect"))
    skip = {contextmanager.__code__.co_filename, dbmod.__file__, __file__}

    def caller() -> str:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename in skip:
            frame = frame.f_back
        if frame is None:
            return "?"
        module = frame.f_globals.get("__name__", "?")
        return f"{module}.{frame.f_code.co_name}"

    def timed_connect(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return connect(*args, **kwargs)
        finally:
            profile.add("db.connect", time.perf_counter() - t0)

    @contextmanager
    def timed_use(self):
        who = caller()
        t0 = time.perf_counter()
        cm = use(self)
        con = cm.__enter__()
        t1 = time.perf_counter()
        profile.add("db.acquire", t1 - t0)  # waiting for the lock (and opening the file when closed)
        try:
            yield con
        except BaseException:
            t2 = time.perf_counter()
            if not cm.__exit__(*sys.exc_info()):
                raise
        else:
            t2 = time.perf_counter()
            cm.__exit__(None, None, None)
        finally:
            t3 = time.perf_counter()
            profile.add("db.held", t2 - t1)
            profile.add("db.release", t3 - t2)  # includes the periodic close + 0.3 s pause
            with profile.lock:
                entry = profile.by_caller[who]
                entry[0] += 1
                entry[1] += t2 - t1
                entry[2] += t1 - t0

    def timed_execute(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return execute(*args, **kwargs)
        finally:
            profile.add("execute_stage", time.perf_counter() - t0)

    def timed_replay(db, session_id, settings, run_stage, **kwargs):
        def timed_stage(request):
            t0 = time.perf_counter()
            try:
                return run_stage(request)
            finally:
                profile.add("stage_task_call", time.perf_counter() - t0)

        t0 = time.perf_counter()
        try:
            return replay(db, session_id, settings, timed_stage, **kwargs)
        finally:
            t1 = time.perf_counter()
            profile.add("session_replay", t1 - t0)
            with profile.lock:
                profile.sessions[session_id] = (t0, t1)

    def timed_once(self, messages, tools):
        t0 = time.perf_counter()
        try:
            return once(self, messages, tools)
        finally:
            profile.add("litellm_call", time.perf_counter() - t0)

    dbmod.SharedDatabase._use = timed_use
    dbmod.connect = timed_connect
    fp.execute_stage = timed_execute
    fp.replay_session = timed_replay
    LiteLLMModel._once = timed_once
    try:
        yield profile
    finally:
        dbmod.SharedDatabase._use = originals["_use"]
        dbmod.connect = originals["connect"]
        fp.execute_stage = originals["execute_stage"]
        fp.replay_session = originals["replay_session"]
        LiteLLMModel._once = originals["_once"]


# ------------------------------------------------------------------ one run


def list_schedule(durations: list[float], workers: int) -> float:
    """Makespan of handing jobs, in order, to the first free of ``workers``."""
    import heapq

    free = [0.0] * workers
    for d in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + d)
    return max(free) if durations else 0.0


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by this process (every thread) and by its children (Prefect's server)."""
    import psutil

    proc = psutil.Process()
    own = proc.cpu_times()
    children = 0.0
    for child in proc.children(recursive=True):
        try:
            t = child.cpu_times()
            children += t.user + t.system
        except psutil.Error:
            pass
    return own.user + own.system, children


def run_once(paths: list[Path], db_path: Path, concurrency: int, model_concurrency: int,
             profile: Profile | None, delay: float = DELAY) -> dict[str, Any]:
    from flows.runner import run_pipeline

    script = ScriptedWorkers(delay=delay)
    with FakeOpenAI(responder=script) as server:
        model = {"model": "openai/fake-model", "api_base": server.base_url, "limit": "process"}
        ctx = instrumented(profile) if profile is not None else _nothing()
        with ctx:
            cpu0 = cpu_seconds()
            t0 = time.perf_counter()
            summary = run_pipeline([str(p) for p in paths], db_path=str(db_path), model=model,
                                   settings=settings(model_concurrency).model_dump(), concurrency=concurrency,
                                   runner="threads")
            wall = time.perf_counter() - t0
            cpu1 = cpu_seconds()
        requests = len(server.requests)
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
        "errors": errors[:10],
    }
    if profile is not None:
        result["profile"] = summarize_profile(profile, result, concurrency, delay)
    return result


@contextmanager
def _nothing():
    yield None


def summarize_profile(p: Profile, r: dict[str, Any], concurrency: int, delay: float) -> dict[str, Any]:
    wall = r["wall_seconds"]
    sessions = p.sessions.values()
    first_start = min((s for s, _ in sessions), default=0.0)
    last_end = max((e for _, e in sessions), default=0.0)
    replay_total = p.total("session_replay")
    stage_call_total = p.total("stage_task_call")
    execute_total = p.total("execute_stage")
    litellm_total = p.total("litellm_call")
    n_calls = p.count("litellm_call")
    return {
        "worker_seconds": wall * concurrency,
        "sessions_window_seconds": last_end - first_start,  # first session replay start to last end
        "outside_sessions_seconds": wall - (last_end - first_start),  # flow start, ingest, resolve, finish
        "session_replay_seconds": replay_total,
        "stage_task_call_seconds": stage_call_total,
        "execute_stage_seconds": execute_total,
        "litellm_seconds": litellm_total,
        "model_wait_seconds": n_calls * delay,
        "litellm_overhead_ms_per_call": 1000 * (litellm_total - n_calls * delay) / n_calls if n_calls else None,
        "execute_stage_non_model_ms_per_stage": (1000 * (execute_total - litellm_total) / p.count("execute_stage")
                                                 if p.count("execute_stage") else None),
        "prefect_task_ms_per_stage": (1000 * (stage_call_total - execute_total) / p.count("stage_task_call")
                                      if p.count("stage_task_call") else None),
        "replay_between_stages_ms_per_stage": (1000 * (replay_total - stage_call_total) / p.count("stage_task_call")
                                               if p.count("stage_task_call") else None),
        "idle_worker_seconds": wall * concurrency - replay_total,
        "db_uses": p.count("db.acquire"),
        "db_connects": p.count("db.connect"),
        "db_connect_seconds": p.total("db.connect"),
        "db_by_caller": sorted(({"caller": k, "uses": v[0], "held_seconds": v[1], "acquire_seconds": v[2],
                                 "held_ms_mean": 1000 * v[1] / v[0] if v[0] else None}
                                for k, v in p.by_caller.items()), key=lambda d: -d["held_seconds"]),
        "db_acquire_seconds": p.total("db.acquire"),
        "db_acquire_ms_mean": p.mean_ms("db.acquire"),
        "db_acquire_ms_max": 1000 * max(p.samples.get("db.acquire", [0.0])),
        "db_held_seconds": p.total("db.held"),
        "db_held_ms_mean": p.mean_ms("db.held"),
        "db_release_seconds": p.total("db.release"),
        "db_held_share_of_wall": (p.total("db.held") + p.total("db.release")) / wall if wall else None,
    }


# ------------------------------------------------------------------ baselines


def bare_litellm(calls: int, concurrency: int, delay: float = DELAY) -> dict[str, Any]:
    """``litellm.completion`` from ``concurrency`` threads to the fake server, each call answered after
    ``delay`` with a small tool call; the same number of calls as a pipeline run."""
    import litellm

    body_text = "x " * 2000  # a prompt about the size of a small observer chunk
    reply = Reply(tool_calls=[("record_observations", {"observations": []})], delay=delay)
    with FakeOpenAI(default=reply) as server:
        def worker(n: int) -> None:
            for _ in range(n):
                litellm.completion(model="openai/fake-model", api_base=server.base_url, api_key="not-needed",
                                   messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": body_text}],
                                   num_retries=0, max_retries=0, timeout=60)

        litellm.completion(model="openai/fake-model", api_base=server.base_url, api_key="not-needed",
                           messages=[{"role": "user", "content": "warm"}])  # warm-up, not timed
        share = [calls // concurrency + (1 if i < calls % concurrency else 0) for i in range(concurrency)]
        wall, cpu = _threads(worker, share)
    ideal = max(share) * delay
    return {"calls": calls, "wall_seconds": wall, "ideal_seconds": ideal, "efficiency": ideal / wall,
            "overhead_ms_per_call": 1000 * (wall * concurrency - calls * delay) / calls,
            "cpu_ms_per_call": 1000 * cpu / calls}


def _threads(worker, share: list[int]) -> tuple[float, float]:
    threads = [threading.Thread(target=worker, args=(n,)) for n in share]
    c0 = cpu_seconds()[0]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, cpu_seconds()[0] - c0


def bare_http(calls: int, concurrency: int, delay: float = DELAY) -> dict[str, Any]:
    """The same calls with ``http.client`` (one keep-alive connection per thread): the fake server's own
    cost, without litellm."""
    import http.client
    from urllib.parse import urlparse

    body = json.dumps({"model": "fake-model", "messages": [{"role": "system", "content": "sys"},
                                                           {"role": "user", "content": "x " * 2000}]})
    reply = Reply(tool_calls=[("record_observations", {"observations": []})], delay=delay)
    with FakeOpenAI(default=reply) as server:
        url = urlparse(server.base_url)

        def worker(n: int) -> None:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
            for _ in range(n):
                conn.request("POST", url.path + "/chat/completions", body=body,
                             headers={"Content-Type": "application/json"})
                json.loads(conn.getresponse().read())
            conn.close()

        share = [calls // concurrency + (1 if i < calls % concurrency else 0) for i in range(concurrency)]
        wall, cpu = _threads(worker, share)
    ideal = max(share) * delay
    return {"calls": calls, "wall_seconds": wall, "ideal_seconds": ideal, "efficiency": ideal / wall,
            "overhead_ms_per_call": 1000 * (wall * concurrency - calls * delay) / calls,
            "cpu_ms_per_call": 1000 * cpu / calls}


def db_solo(paths: list[Path], db_path: Path) -> dict[str, Any]:
    """The same flow on a few sessions at concurrency 1 with an instant model: SharedDatabase hold
    times without any contention for its lock (or for the interpreter)."""
    profile = Profile()
    r = run_once(paths, db_path, 1, 1, profile, delay=0.0)
    p = r["profile"]
    return {"sessions": len(paths), "wall_seconds": r["wall_seconds"], "model_calls": r["model_calls"],
            "stage_tasks": r["stage_tasks"], "db_uses": p["db_uses"], "db_held_seconds": p["db_held_seconds"],
            "db_held_ms_mean": p["db_held_ms_mean"], "db_connects": p["db_connects"],
            "db_connect_seconds": p["db_connect_seconds"], "db_by_caller": p["db_by_caller"][:8],
            "litellm_ms_per_call": 1000 * p["litellm_seconds"] / max(1, r["model_calls"]),
            "cpu_seconds_self": r["cpu_seconds_self"]}


def bare_prefect(stage_tasks: int, sessions: int, concurrency: int, delay: float = DELAY) -> dict[str, Any]:
    """A Prefect flow shaped like the pipeline (session tasks on a thread pool, each calling its stage
    tasks in order) whose stage tasks only sleep ``delay``."""
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner

    @task(name="sleep-stage", persist_result=False)
    def sleep_stage() -> None:
        time.sleep(delay)

    @task(name="sleep-session", persist_result=False)
    def sleep_session(n: int) -> int:
        for _ in range(n):
            sleep_stage()
        return n

    @flow(name="bench-bare-prefect", task_runner=ThreadPoolTaskRunner(max_workers=concurrency), validate_parameters=False)
    def bare(shares: list[int]) -> int:
        return sum(f.result() for f in [sleep_session.submit(n) for n in shares])

    shares = [stage_tasks // sessions + (1 if i < stage_tasks % sessions else 0) for i in range(sessions)]
    bare([1, 1])  # warm-up
    t0 = time.perf_counter()
    bare(shares)
    wall = time.perf_counter() - t0
    ideal = max(list_schedule([n * delay for n in shares], concurrency), max(shares) * delay)
    return {"stage_tasks": stage_tasks, "sessions": sessions, "wall_seconds": wall, "ideal_seconds": ideal,
            "efficiency": ideal / wall, "overhead_ms_per_task": 1000 * (wall * concurrency - stage_tasks * delay) / stage_tasks}


def prefect_with_litellm(stage_tasks: int, calls: int, sessions: int, concurrency: int,
                         delay: float = DELAY) -> dict[str, Any]:
    """The pipeline's shape and model calls without any DuckDB work: session tasks on a thread pool
    calling their stage tasks in order, each stage task making its share of the run's litellm calls
    to the fake server. This is the ceiling the flow could reach on this machine if the ledger reads
    and writes cost nothing."""
    import litellm
    from prefect import flow, task
    from prefect.task_runners import ThreadPoolTaskRunner

    body_text = "x " * 2000
    reply = Reply(tool_calls=[("record_observations", {"observations": []})], delay=delay)
    with FakeOpenAI(default=reply) as server:
        def call() -> None:
            litellm.completion(model="openai/fake-model", api_base=server.base_url, api_key="not-needed",
                               messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": body_text}],
                               num_retries=0, max_retries=0, timeout=60)

        @task(name="litellm-stage", persist_result=False)
        def litellm_stage(n: int) -> None:
            for _ in range(n):
                call()

        @task(name="litellm-session", persist_result=False)
        def litellm_session(per_stage: list[int]) -> int:
            for n in per_stage:
                litellm_stage(n)
            return sum(per_stage)

        @flow(name="bench-prefect-litellm", task_runner=ThreadPoolTaskRunner(max_workers=concurrency),
              validate_parameters=False)
        def shaped(plan: list[list[int]]) -> int:
            return sum(f.result() for f in [litellm_session.submit(stages) for stages in plan])

        # stage tasks spread over sessions, calls spread over stage tasks, both as evenly as possible
        per_session = [stage_tasks // sessions + (1 if i < stage_tasks % sessions else 0) for i in range(sessions)]
        per_task = [calls // stage_tasks + (1 if i < calls % stage_tasks else 0) for i in range(stage_tasks)]
        plan, k = [], 0
        for n in per_session:
            plan.append(per_task[k:k + n])
            k += n
        shaped([[1]])  # warm-up
        c0 = cpu_seconds()[0]
        t0 = time.perf_counter()
        shaped(plan)
        wall = time.perf_counter() - t0
        cpu = cpu_seconds()[0] - c0
    ideal = max(calls * delay / concurrency, max(sum(p) for p in plan) * delay)
    return {"stage_tasks": stage_tasks, "calls": calls, "sessions": sessions, "wall_seconds": wall,
            "ideal_seconds": ideal, "efficiency": ideal / wall, "cpu_ms_per_call": 1000 * cpu / calls}


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
    verdict = "meets" if m["efficiency"] >= 0.8 else "misses"
    print(f"Median efficiency {pct(m['efficiency'])}: {verdict} the 80 % target.")
    errors = [e for r in runs for e in r["errors"]]
    if errors:
        print(f"Errors ({len(errors)}): " + "; ".join(errors[:3]))
    if out.get("profile"):
        print("\nWhere the time goes (median run by wall time; worker-seconds = wall × concurrency):")
        p = out["profile"]
        rows = [
            ("worker-seconds available", f"{p['worker_seconds']:.1f} s"),
            ("  waiting for the model (calls × 200 ms)", f"{p['model_wait_seconds']:.1f} s"),
            ("  litellm beyond the 200 ms", f"{p['litellm_seconds'] - p['model_wait_seconds']:.1f} s "
                                            f"({p['litellm_overhead_ms_per_call']:.1f} ms per call)"),
            ("  execute_stage outside the model call", f"{p['execute_stage_seconds'] - p['litellm_seconds']:.1f} s "
                                                      f"({p['execute_stage_non_model_ms_per_stage']:.1f} ms per stage)"),
            ("  Prefect stage task around execute_stage", f"{p['stage_task_call_seconds'] - p['execute_stage_seconds']:.1f} s "
                                                         f"({p['prefect_task_ms_per_stage']:.1f} ms per stage task)"),
            ("  replay between stages (clocks, compactions)", f"{p['session_replay_seconds'] - p['stage_task_call_seconds']:.1f} s "
                                                              f"({p['replay_between_stages_ms_per_stage']:.1f} ms per stage task)"),
            ("  workers idle (no session running)", f"{p['idle_worker_seconds']:.1f} s"),
            ("flow outside the session window (start, ingest, finish)", f"{p['outside_sessions_seconds']:.2f} s of wall"),
            ("SharedDatabase uses", f"{p['db_uses']}"),
            ("  waiting for its lock (sum over threads)", f"{p['db_acquire_seconds']:.1f} s (mean {p['db_acquire_ms_mean']:.1f} ms, "
                                                         f"max {p['db_acquire_ms_max']:.0f} ms)"),
            ("  holding it (serialised)", f"{p['db_held_seconds']:.1f} s held + {p['db_release_seconds']:.1f} s releasing "
                                          f"= {pct(p['db_held_share_of_wall'])} of wall"),
            ("  (re)opening the file (connect)", f"{p['db_connects']} opens, {p['db_connect_seconds']:.1f} s"),
        ]
        for label, value in rows:
            print(f"  {label:<58} {value}")
        print("  SharedDatabase hold time by caller:")
        for d in p["db_by_caller"][:8]:
            print(f"    {d['caller']:<56} {d['uses']:>6} uses {d['held_seconds']:>7.1f} s held "
                  f"({d['held_ms_mean']:.1f} ms each)")
        r = out["median_run"]
        print(f"  CPU: this process {r['cpu_seconds_self']:.1f} s, Prefect server {r['cpu_seconds_prefect_server']:.1f} s "
              f"over {r['wall_seconds']:.1f} s wall on {r['cores']} cores = {pct(r['cpu_utilisation'])} busy")
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
    if out.get("db_solo"):
        b = out["db_solo"]
        print(f"DuckDB work alone ({b['sessions']} sessions, concurrency 1, instant model): {b['db_uses']} uses, "
              f"{b['db_held_seconds']:.1f} s held ({b['db_held_ms_mean']:.1f} ms each), {b['db_connects']} opens "
              f"({b['db_connect_seconds']:.1f} s); wall {b['wall_seconds']:.1f} s for {b['stage_tasks']} stage tasks, "
              f"{b['model_calls']} calls ({b['litellm_ms_per_call']:.1f} ms per instant call)")
        for d in b["db_by_caller"][:5]:
            print(f"    {d['caller']:<56} {d['uses']:>6} uses {d['held_seconds']:>7.1f} s held "
                  f"({d['held_ms_mean']:.1f} ms each)")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=56)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--model-concurrency", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True,
                        help="instrument the runs and time the litellm and Prefect baselines (default: on)")
    parser.add_argument("--server-as-is", action="store_true",
                        help="leave the fake server's ~40 ms Nagle/delayed-ACK stall per answer in place")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", type=Path, default=None, help="keep sessions and databases in this directory")
    parser.add_argument("--scaling", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure model calls per second with 1, 2 and 4 Dask worker processes at 1 s "
                             "model latency (bench/scaling.py; default: on)")
    args = parser.parse_args(argv)
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
            run_once(warm, work / "warm.duckdb", args.concurrency, args.model_concurrency, None, delay=0.0)
            runs = []
            for i in range(args.runs):
                log(f"run {i + 1}/{args.runs}…")
                profile = Profile() if args.profile else None
                r = run_once(paths, work / f"run{i + 1}.duckdb", args.concurrency, args.model_concurrency, profile)
                log(f"  wall {r['wall_seconds']:.2f} s, {r['model_calls']} calls, ideal {r['ideal_seconds']:.2f} s, "
                    f"efficiency {pct(r['efficiency'])}")
                runs.append(r)
            keys = ("wall_seconds", "model_calls", "stage_tasks", "ideal_seconds", "efficiency",
                    "overhead_per_stage_task_ms", "overhead_per_model_call_ms")
            median = {k: statistics.median(r[k] for r in runs) for k in keys}
            out: dict[str, Any] = {"sessions": args.sessions, "concurrency": args.concurrency,
                                   "fake_server_tcp_nodelay": not args.server_as_is,
                                   "model_concurrency": args.model_concurrency, "delay_ms": DELAY * 1000,
                                   "runs": runs, "median": median}
            if args.profile:
                by_wall = sorted(runs, key=lambda r: r["wall_seconds"])
                out["median_run"] = by_wall[len(by_wall) // 2]
                out["profile"] = out["median_run"]["profile"]
                log("baseline: bare litellm…")
                out["bare_litellm"] = bare_litellm(round(median["model_calls"]), args.concurrency)
                log("baseline: bare HTTP…")
                out["bare_http"] = bare_http(round(median["model_calls"]), args.concurrency)
                log("baseline: DuckDB work alone (concurrency 1, instant model, 8 sessions)…")
                out["db_solo"] = db_solo(paths[:8], work / "solo.duckdb")
                log("baseline: bare Prefect…")
                out["bare_prefect"] = bare_prefect(round(median["stage_tasks"]), args.sessions, args.concurrency)
                log("baseline: Prefect + litellm without DuckDB…")
                out["prefect_with_litellm"] = prefect_with_litellm(
                    round(median["stage_tasks"]), round(median["model_calls"]), args.sessions, args.concurrency)
        if args.scaling:  # outside the ephemeral API: the workers are other processes, on a real server
            import scaling

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
