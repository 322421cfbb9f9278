#!/usr/bin/env python3
"""Redactor benchmark: throughput of ``om_core.redaction.redact.redact`` in MB/s.

Corpora (MB = 10^6 bytes of UTF-8):
* ``sessions``: the text the observer reads of every source entry of the real sessions in
  ../shared/sessions (when present) and the project's examples/sessions;
* ``synthetic``: a seeded mix of prose, Python, shell logs, JSON tool-call arguments and .env lines,
  with one fake secret per ~2 KB (tests/secret_corpus.py);
* ``no-space``: one long base64 run (minified/encoded tool output);
* ``one char``: one repeated character, the pathological case for the tokenizer.

Throughput is reported by wall clock and by the process's CPU time (steadier on a shared machine).
For scale it also times detect-secrets' own line scanner (``scan_line`` with its default plugins)
on a 200 KB slice: the reason its plugins' patterns run inside om's one-pass span finder instead.

``--list`` prints every redaction on the real sessions and examples instead (file, entry id, kind,
the text before it, the redacted value): each one should be a secret.

Usage (from the repository root):

    .venv/bin/python bench/perf/redact.py              # 3 runs per corpus, ~4 MB each
    .venv/bin/python bench/perf/redact.py --mb 8 --runs 5 --json
    .venv/bin/python bench/perf/redact.py --list
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from om_core.redaction.redact import redact  # noqa: E402
from om_core.redaction.rules import rules  # noqa: E402
from secret_corpus import all_texts, rnd  # noqa: E402

WORDS = ("the quick service returns order items when the retry policy allows it and the cache is warm so "
         "we check each branch before merging tests pass now").split()
CODE = ["def handle_{w}(request, session):\n    token_count = count_tokens(request.body)\n    if token_count > LIMIT:\n"
        "        raise ValueError(f'too long: {{token_count}}')\n    return session.query(Order).filter_by(id=request.id)\n",
        "    password = os.environ['DB_PASSWORD']\n    api_key = settings.api_key\n",
        "2026-01-15T14:0{n}:00Z INFO worker-{n} processed batch {n} in 12{n} ms (key=orders:{n})\n",
        '{{"path":"src/{w}.py","oldText":"return {w}","newText":"return {w} + 1"}}\n',
        "export PATH=/usr/local/bin:$PATH\nHOME=/home/dev\nLOG_LEVEL=debug\n"]


def synthetic(mb: float, seed: int = 7) -> str:
    rng = random.Random(seed)
    secrets = all_texts()
    out, size = [], 0
    while size < mb * 1e6:
        kind = rng.random()
        if kind < 0.45:
            piece = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120))) + ".\n"
        elif kind < 0.95:
            piece = rng.choice(CODE).format(w=rng.choice(WORDS), n=rng.randint(0, 9))
        else:
            piece = rng.choice(secrets) + "\n"
        out.append(piece)
        size += len(piece)
    return "".join(out)


def session_entries() -> list[tuple[str, str, str]]:
    """(file name, entry id, text the observer reads) of every source entry of the real sessions
    and the examples."""
    from om_core.pi.source_text import entry_text

    paths = sorted(harness.SHARED_SESSIONS.glob("*.jsonl")) + sorted(harness.EXAMPLES.glob("*.jsonl"))
    entries = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("type") in ("message", "custom_message", "branch_summary"):
                entries.append((path.name, str(obj.get("id")), entry_text(obj["type"], obj, tool_call_ids=False)))
    return entries


def session_text() -> str | None:
    return "\n".join(text for _, _, text in session_entries()) or None


def list_redactions() -> None:
    from om_core.redaction.redact import secret_spans

    entries = session_entries()
    count, kinds = 0, {}
    for name, entry_id, text in entries:
        for start, end, kind in secret_spans(text):
            count += 1
            kinds[kind] = kinds.get(kind, 0) + 1
            before = text[max(0, start - 40):start].replace("\n", "\\n")
            print(f"{name}\t{entry_id}\t{kind}\t{before!r}\t{text[start:end]!r}")
    size = sum(len(text.encode()) for _, _, text in entries) / 1e6
    print(f"{count} redactions in {len(entries)} entries ({size:.2f} MB): {kinds}", file=sys.stderr)


def repeat_to(text: str, mb: float) -> str:
    n = max(1, int(mb * 1e6 / max(1, len(text.encode()))))
    return "\n".join([text] * n)


def measure(text: str, runs: int) -> dict:
    size = len(text.encode("utf-8")) / 1e6
    times, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        redact(text)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    best, median, cpu_median = min(times), statistics.median(times), statistics.median(cpu)
    return {"mb": round(size, 2), "runs": runs, "best_s": round(best, 3), "median_s": round(median, 3),
            "mb_per_s_median": round(size / median, 1), "mb_per_s_best": round(size / best, 1),
            "mb_per_cpu_s_median": round(size / max(cpu_median, 1e-9), 1)}


def detect_secrets_scanner(text: str) -> dict:
    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import default_settings

    sample = text[:200_000]
    with default_settings():
        t0 = time.perf_counter()
        for line in sample.splitlines():
            list(scan_line(line))
        dt = time.perf_counter() - t0
    return {"mb": round(len(sample.encode()) / 1e6, 2), "mb_per_s": round(len(sample.encode()) / 1e6 / dt, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=4.0, help="size of each corpus in MB (default 4)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--list", action="store_true", help="list every redaction on the real sessions and examples")
    args = parser.parse_args()
    if args.list:
        list_redactions()
        return
    t0 = time.perf_counter()
    rules()  # load the rules (detect-secrets import) outside the timings
    load_s = time.perf_counter() - t0
    corpora = {}
    real = session_text()
    if real:
        corpora["sessions"] = repeat_to(real, args.mb) if len(real) < args.mb * 1e6 else real
    corpora["synthetic"] = synthetic(args.mb)
    corpora["no-space"] = rnd("bench-b64", int(args.mb * 1e6), "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    corpora["one char"] = "a" * int(args.mb * 1e6)
    results = {name: measure(text, args.runs) for name, text in corpora.items()}
    results["detect-secrets scan_line (for scale)"] = detect_secrets_scanner(corpora["synthetic"])
    report = {"rules": len(rules()), "rule_load_s": round(load_s, 3), "results": results}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['rules']} rules, loaded in {load_s:.2f} s (first use only)")
    for name, r in results.items():
        if "runs" in r:
            print(f"{name:>12}: {r['mb']:6.2f} MB  median {r['median_s']:.3f} s  ->  {r['mb_per_s_median']:6.1f} MB/s "
                  f"(best {r['mb_per_s_best']:.1f}; {r['mb_per_cpu_s_median']:.1f} MB per CPU second)")
        else:
            print(f"{name}: {r['mb_per_s']} MB/s on {r['mb']} MB")


if __name__ == "__main__":
    main()
