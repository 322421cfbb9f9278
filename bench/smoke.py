"""`make bench-smoke`: every bench script once, at a tiny size, so that none stops working unnoticed.

Each script runs in a process of its own with the arguments below (tiny sizes or its --smoke flag),
against the fake model of tests/fake_openai.py only: no real model, no network. It passes when it
exits 0; its figures mean nothing at these sizes. The scripts that need the real Pi and node run
when .ci/pi/node_modules holds them (`.ci/run` installs them) and are skipped with the reason
otherwise; those that need a checkout of the TypeScript extension (which npm does not serve) run
only when $OM_BENCH_EXTENSION names one.

A new script goes into SMOKES (or, if another script runs it, into PARTS with that script's name):
tests/test_bench.py fails on a bench file listed in neither.

    .venv/bin/python bench/smoke.py                  # all of them, two at a time
    .venv/bin/python bench/smoke.py cost/prompts.py  # only these
    .venv/bin/python bench/smoke.py --jobs 1         # one at a time
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PI_MODULES = REPO / ".ci" / "pi" / "node_modules"
NODE = PI_MODULES / "node" / "bin" / "node"
SMALL = REPO / "examples" / "sessions" / "tidewatch-units.jsonl"  # 40 KB: the smallest example session
TIMEOUT = 300  # seconds for one script before it counts as failed


class Needs(enum.Enum):
    NOTHING = "nothing"
    PI = "Pi 1.6.0 and node in .ci/pi/node_modules"
    EXTENSION = "a checkout of the TypeScript extension named by $OM_BENCH_EXTENSION"


@dataclass(frozen=True)
class Smoke:
    """One script and its tiny arguments. Placeholders: {tmp} a fresh folder, {small} the small example
    session, {small_dir} a folder holding only it, {request} a request for extension_answers.mjs on it,
    {pi} .ci/pi, {pi_modules} its node_modules, {extension} $OM_BENCH_EXTENSION."""

    script: str
    args: tuple[str, ...] = ()
    needs: Needs = Needs.NOTHING


SMOKES: tuple[Smoke, ...] = (
    # performance
    Smoke("perf/compaction.py", ("--runs", "2", "--cli-runs", "1", "--other-entries", "0")),
    Smoke("perf/fresh_db.py", ("--runs", "2", "--parts")),
    Smoke("perf/ingest.py", ("--size-mb", "0.3", "--mem-mb", "0.2", "--vs-duckdb", "1", "--breakdown")),
    Smoke("perf/pipeline.py", ("--smoke",)),
    Smoke("perf/readers.py", ("--sessions", "2", "--reads", "3", "--commands", "1", "--delay", "0")),
    Smoke("perf/recall_query.py", ("--items", "200", "--rounds", "1", "--sessions", "{small_dir}")),
    Smoke("perf/redact.py", ("--mb", "0.05", "--runs", "1")),
    Smoke("perf/replay_clocks.py", ("--runs", "1", "--sessions", "{small}")),
    Smoke("perf/run_cpu.py", ("--workload", "instant", "--sessions", "2", "--runs", "1")),
    Smoke("perf/scaling.py", ("--workers", "1", "--sessions", "2", "--threads", "1", "--latency", "0.05")),
    Smoke("perf/tokenizer_runs.py", ("--mb", "0.2", "--runs", "1", "--tokenizer", "--exact-mb", "0.05")),
    Smoke("perf/live_compaction.py", ("--smoke", "--work", "{tmp}"), Needs.PI),
    # prompt cost
    Smoke("cost/prompts.py", ("--sessions", "{small}")),
    Smoke("cost/workers.py", ("--sessions", "{small}")),
    Smoke("cost/project_stage.py", ("--sessions", "{small}")),
    Smoke("cost/longmemeval.py", ("--smoke",)),
    Smoke("cost/hand_answers/run.py", ("--session", "{small}", "--answers", "bench/cost/hand_answers/careful.json",
                                       "--out", "{tmp}")),
    Smoke("cost/bounded_memory.py", ("--smoke",)),
    # conformance
    Smoke("conformance/faults.py", ("--only", "export")),
    Smoke("conformance/ledger_equal.py", ("--profiles", "generated-scripted", "--sessions", "2")),
    Smoke("conformance/state_changes.py", ("--smoke",)),
    Smoke("conformance/world_check.py", ("--sessions", "{small}")),
    Smoke("conformance/usage_clocks_vs_extension.py", ("--out", "{tmp}", "--sessions", "{small}")),
    Smoke("conformance/migration.py", ("--smoke", "--out", "{tmp}"), Needs.PI),
    Smoke("conformance/pi16_sessions.py", ("--out", "{tmp}/pi16"), Needs.PI),
    Smoke("conformance/pi16_cut_points.mjs", ("{pi}", "{small_dir}", "{tmp}/cut-points.json", "100,2000"), Needs.PI),
    Smoke("conformance/usage_clocks_vs_extension.mjs", ("{pi}", "{extension}", "{tmp}"), Needs.EXTENSION),
    Smoke("conformance/extension_answers.mjs", ("{pi_modules}", "{extension}", "{request}"), Needs.EXTENSION),
)

# Bench files that are no script of their own, and the script that runs them.
PARTS: dict[str, str] = {
    "harness.py": "every script",
    "smoke.py": "make bench-smoke",
    "perf/ingest_children.py": "perf/ingest.py",
    "perf/synthetic_archive.py": "perf/ingest.py",
    "perf/pipeline_baselines.py": "perf/pipeline.py",
    "cost/provider_requests.py": "cost/workers.py",
    "conformance/fault_processes.py": "conformance/faults.py",
    "conformance/pi16_probe.ts": "conformance/pi16_sessions.py",
}


def missing(needs: Needs) -> str | None:
    """Why a script with these needs cannot run here, or None."""
    if needs is Needs.NOTHING:
        return None
    if not (PI_MODULES.is_dir() and NODE.is_file()):
        return f"needs {Needs.PI.value}, which is absent (`cd .ci/pi && npm install --no-audit --no-fund`)"
    if needs is Needs.EXTENSION and not os.environ.get("OM_BENCH_EXTENSION"):
        return f"needs {needs.value} (npm does not serve it)"
    return None


def command(smoke: Smoke, tmp: Path) -> list[str]:
    small_dir = tmp / "small"
    small_dir.mkdir(exist_ok=True)
    shutil.copy(SMALL, small_dir / SMALL.name)
    request = tmp / "request.json"
    request.write_text(json.dumps({"file": str(SMALL), "leaf": None, "ids": [], "cuts": [], "poolMaxTokens": 3000,
                                   "repeat": 1}))
    values = {"tmp": str(tmp), "request": str(request), "small": str(SMALL), "small_dir": str(small_dir), "pi": str(PI_MODULES.parent),
              "pi_modules": str(PI_MODULES), "extension": os.environ.get("OM_BENCH_EXTENSION", "")}
    args = [a.format(**values) for a in smoke.args]
    runner = [str(NODE)] if smoke.script.endswith(".mjs") else [sys.executable]
    return [*runner, str(BENCH / smoke.script), *args]


def run(smoke: Smoke) -> tuple[bool, float, float, str]:
    """(passed, wall seconds, CPU seconds of the script and the children it waited for, its output's end)."""
    with tempfile.TemporaryDirectory(prefix="om-bench-smoke-") as tmp:
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(REPO)}
        log = Path(tmp) / "output.log"
        started = time.perf_counter()
        with open(log, "w") as out:  # a file, not a pipe: wait4 below gives the process's own CPU
            proc = subprocess.Popen(command(smoke, Path(tmp)), cwd=REPO, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        timer = threading.Timer(TIMEOUT, lambda: os.killpg(proc.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        text = log.read_text(errors="replace") + (f"\nno end after {TIMEOUT} s" if code == -signal.SIGKILL else "")
        tail = "\n".join(text.strip().splitlines()[-15:])
        return code == 0, time.perf_counter() - started, usage.ru_utime + usage.ru_stime, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scripts", nargs="*", help="only these (paths under bench/)")
    parser.add_argument("--jobs", type=int, default=2, help="scripts at once (default 2, one per core)")
    args = parser.parse_args(argv)
    unknown = set(args.scripts) - {s.script for s in SMOKES}
    if unknown:
        parser.error(f"not in the smoke list: {', '.join(sorted(unknown))}")
    started = time.perf_counter()
    chosen = [s for s in SMOKES if not args.scripts or s.script in args.scripts]
    runnable = []
    for smoke in chosen:
        why = missing(smoke.needs)
        if why:
            print(f"skip  {smoke.script}: {why}", flush=True)
        else:
            runnable.append(smoke)
    failed, cpu = [], 0.0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for smoke, (ok, seconds, cpu_seconds, tail) in zip(runnable, pool.map(run, runnable)):
            cpu += cpu_seconds
            print(f"{'ok  ' if ok else 'FAIL'}  {smoke.script} ({seconds:.1f} s, {cpu_seconds:.1f} CPU-s)", flush=True)
            if not ok:
                failed.append(smoke.script)
                print("      " + tail.replace("\n", "\n      "), flush=True)
    print(f"bench smoke: {len(runnable) - len(failed)} of {len(runnable)} scripts ran to the end, "
          f"{len(chosen) - len(runnable)} skipped, in {time.perf_counter() - started:.0f} s ({cpu:.0f} CPU-s)"
          + (f"; failing: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0

if __name__ == "__main__":
    raise SystemExit(main())
