"""What bench/perf/pipeline.py measures the pipeline against: the same model calls without om (bare
litellm, bare HTTP), the flow's shape without model calls (bare Prefect) and with them but without any
DuckDB work (Prefect + litellm: the ceiling), and the timing those share."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from fake_openai import FakeOpenAI, Reply

DELAY = 0.2


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
