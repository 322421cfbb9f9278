#!/usr/bin/env python3
"""Long runs without spaces: ingest time of a tool result of one repeated character vs words.

Builds two Pi sessions, each holding one tool result of ``--mb`` MB (default 20): one of a single
repeated character, one of words, and ingests each into a fresh database (alternating, ``--runs``
times each). Prints the median wall times and their ratio: the target is at most 3x.
Without the bounded run count (``om_core.pi.tokens.LONG_RUN_CHARS``) the repeated character took
4.1x as long at 20 MB and grew faster than linearly.

``--tokenizer`` also times the tokenizer alone on the two texts, bounded and exact (the exact one
on ``--exact-mb`` MB only: it is the slow path this fixes).

Usage (from the repository root):

    .venv/bin/python bench/perf/tokenizer_runs.py
    .venv/bin/python bench/perf/tokenizer_runs.py --mb 20 --runs 3 --tokenizer --json

MB means 10^6 bytes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402, F401 - its import sets the paths up

from om_core.ingest import ingest  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402
from om_core.pi import tokens  # noqa: E402

VOCAB = ("the service returns order items when retry policy allows cache warm branch merge tests pass "
         "function value request session token count handler error config module build deploy").split()


def words(n: int, seed: int = 5) -> str:
    rng = random.Random(seed)
    out, size = [], 0
    while size < n:
        w = rng.choice(VOCAB)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n]


def session_file(path: Path, big: str, sid: str) -> Path:
    ts = "2026-01-15T14:00:0{}.000Z"
    lines = [
        {"type": "session", "version": 3, "id": sid, "timestamp": ts.format(0), "cwd": "/home/dev/p"},
        {"type": "message", "id": "00000001", "parentId": None, "timestamp": ts.format(1),
         "message": {"role": "user", "content": "Show me the build output.", "timestamp": 1768485601000}},
        {"type": "message", "id": "00000002", "parentId": "00000001", "timestamp": ts.format(2),
         "message": {"role": "assistant", "content": [{"type": "toolCall", "id": "c1", "name": "bash",
                                                       "arguments": {"command": "cat build.log"}}],
                     "stopReason": "toolUse", "timestamp": 1768485602000}},
        {"type": "message", "id": "00000003", "parentId": "00000002", "timestamp": ts.format(3),
         "message": {"role": "toolResult", "toolCallId": "c1", "toolName": "bash",
                     "content": [{"type": "text", "text": big}], "isError": False, "timestamp": 1768485603000}},
        {"type": "message", "id": "00000004", "parentId": "00000003", "timestamp": ts.format(4),
         "message": {"role": "assistant", "content": [{"type": "text", "text": "That is the log."}],
                     "stopReason": "stop", "timestamp": 1768485604000}},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    return path


def time_ingest(path: Path, workdir: Path, run: int) -> float:
    db = workdir / f"{path.stem}-{run}.duckdb"
    t0 = time.perf_counter()
    report = ingest(Workspace.open(db, settings=Settings()), [path])
    elapsed = time.perf_counter() - t0
    assert not report.summary().get("errors"), report.summary()
    db.unlink()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokenizer", action="store_true", help="also time the tokenizer alone")
    parser.add_argument("--exact-mb", type=float, default=2.0, help="size for the exact (unbounded) tokenizer timing")
    parser.add_argument("--base64", action="store_true", help="also ingest one run of random base64 (exact path: digits "
                        "and case changes split it; it holds ~4x the tokens of words)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = int(args.mb * 1e6)
    texts = {"one repeated character": "a" * n, "words": words(n)}
    if args.base64:
        import base64
        texts["base64 (one run)"] = base64.b64encode(random.Random(3).randbytes(n * 3 // 4)).decode()[:n]
    result: dict = {"mb": args.mb, "runs": args.runs, "ingest_s": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = {name: session_file(work / f"{i}.jsonl", text, f"7a1e0000-0000-4000-8000-00000000000{i}")
                 for i, (name, text) in enumerate(texts.items())}
        ingest(Workspace.open(work / "warm.duckdb", settings=Settings()), [files["words"]])  # imports, encoding load, thread pools
        times: dict[str, list[float]] = {name: [] for name in files}
        for run in range(args.runs):
            for name, path in files.items():
                times[name].append(time_ingest(path, work, run))
    for name, ts in times.items():
        result["ingest_s"][name] = {"median": round(statistics.median(ts), 3), "all": [round(t, 3) for t in ts]}
    result["ratio"] = round(result["ingest_s"]["one repeated character"]["median"]
                            / result["ingest_s"]["words"]["median"], 2)
    if args.tokenizer:
        tok = {}
        for name, text in texts.items():
            t0 = time.perf_counter()
            count = tokens.count_tokens([text], threads=1)[0]
            tok[f"{name} (bounded)"] = {"s": round(time.perf_counter() - t0, 3), "tokens": count}
        exact = tokens._make_counter(tokens.get_encoding())  # the plain counter: no bounded runs
        m = int(args.exact_mb * 1e6)
        for name, text in texts.items():
            t0 = time.perf_counter()
            count = exact([text[:m]])[0]
            tok[f"{name}, first {args.exact_mb} MB (exact)"] = {"s": round(time.perf_counter() - t0, 3), "tokens": count}
        result["tokenizer"] = tok
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, r in result["ingest_s"].items():
        print(f"ingest {args.mb:g} MB tool result of {name:>22}: median {r['median']:.2f} s  (runs {r['all']})")
    print(f"ratio repeated character / words: {result['ratio']:.2f}x  (target: at most 3x)")
    for name, r in result.get("tokenizer", {}).items():
        print(f"tokenizer {name:>45}: {r['s']:.2f} s, {r['tokens']} tokens")


if __name__ == "__main__":
    main()
