#!/usr/bin/env python3
"""LongMemEval benchmark note: the cost (model calls, tokens) and wall time of ONE instance of
LongMemEval-S size at the default settings, so a user can estimate the bill of the full 500.

The instance is synthetic (tests/longmemeval_builders.py ``large_instance``: 48 sessions, about
115k tokens of history by Pi's estimate, like the public LongMemEval-S), and every model is the
fake OpenAI-compatible server (tests/fake_openai.py) scripted by ``EvalModel``: the observer
records each user turn, the reader and judge answer in one line. So the CALL COUNTS and the INPUT
TOKENS are what the pipeline really sends at the default settings (the fake server reports
prompt tokens as len(JSON body) / 4); the OUTPUT tokens are the fake's (20 per call) and a real
observer writes more; the wall time is our own processing plus ~localhost latency, i.e. the floor
under a real run, which is bound by the provider's latency instead.

Usage (from the repository root):

    .venv/bin/python bench/cost/longmemeval.py            # all four conditions, 3 runs of the timing
    .venv/bin/python bench/cost/longmemeval.py --runs 1 --conditions om

It prints one table per condition (memory / reader / judge: calls, input and output tokens) and the
wall time of each run, plus the x500 projection.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from fake_openai import FakeOpenAI  # noqa: E402
from longmemeval_builders import EvalModel, large_instance  # noqa: E402

from om_core.eval.run import EvalOptions, run_longmemeval  # noqa: E402
from om_core.model.client import _import_litellm  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.pi.tokens import count_text_tokens  # noqa: E402


def one_run(conditions: list[str], workdir: Path, instance: dict | None = None) -> tuple[dict, float]:
    data = workdir / "lme.json"
    data.write_text(json.dumps([instance or large_instance()]))
    with FakeOpenAI() as server:
        server.responder = EvalModel(observe_every=4, note_chars=160)
        options = EvalOptions(data=data, out=workdir / "out", model="openai/fake-worker", reader="openai/fake-reader",
                              judge="openai/fake-judge", api_base=server.base_url, reader_window=128_000,
                              conditions=conditions, settings=Settings())
        started, cpu = time.perf_counter(), time.process_time()
        summary = run_longmemeval(options)
        seconds = time.perf_counter() - started
        summary.report["cpu_seconds"] = round(time.process_time() - cpu, 2)  # this process (fake server included)
    if summary.failures:
        raise SystemExit(f"failures: {summary.failures}")
    return summary.report, seconds


def main() -> None:
    parser = harness.parser(__doc__.splitlines()[0], json_flag=False,
                            smoke="one run of the om condition on an 8-session, ~8,000-token instance")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--conditions", default="om,oracle,native,full")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.conditions = 1, "om"
    conditions = args.conditions.split(",")
    _import_litellm()  # its import (seconds) is not part of any run
    inst = large_instance(sessions=8, target_tokens=8000) if args.smoke else large_instance()
    history = "\n".join(t["content"] for s in inst["haystack_sessions"] for t in s)
    print(f"instance: {len(inst['haystack_sessions'])} sessions, {sum(len(s) for s in inst['haystack_sessions'])} "
          f"turns, {len(history) // 4:,} tokens (Pi's estimate), {count_text_tokens(history):,} (o200k_base)")
    times: dict[str, list[float]] = {c: [] for c in conditions}
    cpu: dict[str, list[float]] = {c: [] for c in conditions}
    report = None
    for run in range(args.runs):
        for condition in conditions:  # one condition at a time, so each wall time is its own
            with tempfile.TemporaryDirectory() as tmp:
                r, _ = one_run([condition], Path(tmp), inst)
            c = r["conditions"][condition]
            times[condition].append(c["wall_seconds"]["total"])
            cpu[condition].append(r["cpu_seconds"])
            report = report or {}
            report[condition] = c
        print(f"run {run + 1}: " + ", ".join(f"{c} {times[c][-1]:.2f} s (cpu {cpu[c][-1]:.2f} s)" for c in conditions))
    print()
    print(f"{'condition':10} {'part':7} {'calls':>6} {'input tokens':>13} {'output tokens':>14}")
    for condition in conditions:
        usage = report[condition]["usage"]
        for part in ("memory", "reader", "judge", "total"):
            u = usage[part]
            print(f"{condition:10} {part:7} {u['calls']:>6} {u['input_tokens']:>13,} {u['output_tokens']:>14,}")
        med = statistics.median(times[condition])
        total = usage["total"]
        print(f"{condition:10} wall time median {med:.2f} s (runs: {', '.join(f'{t:.2f}' for t in times[condition])}); "
              f"x500: {total['calls'] * 500:,} calls, {total['input_tokens'] * 500 / 1e6:.1f} M input tokens, "
              f"{med * 500 / 60:.0f} min of wall time at concurrency 1 (divide by --concurrency)")
        if condition == "om":
            stages = report[condition]
            tokens, chars = stages["context_tokens_mean"], stages["summary_chars_median"]  # None: no answer had one
            print(f"{'':10} context sent to the reader: {'–' if tokens is None else f'{tokens:,}'} tokens; "
                  f"summary {'–' if chars is None else f'{chars:,}'} chars")


if __name__ == "__main__":
    main()
