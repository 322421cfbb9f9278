#!/usr/bin/env python3
"""What bounded memory (SPEC §13) does to a session that runs for weeks: per 1,000 source tokens,
the prompt and uncached tokens the workers send, and at the tip, the compaction summary's tokens,
the active reflections' tokens and the drops.

Sessions: a long session built in code (``--turns`` rounds of coding work, two hours apart: 600 by
default, about three weeks), and the two real samples (../shared/sessions). Each is ingested into a
fresh DuckDB and replayed with the drain, its model talking through litellm's real HTTP path to the
fake OpenAI-compatible server (tests/fake_openai.py) answered by the scripted workers
(tests/fake_brains.py: ScriptedWorkers), whose reflector records a new reflection on every pass: a
model whose memory keeps growing. ``prompt`` and ``uncached`` are the server's usage as
``llm_calls`` keeps it (its tokens: characters / 4; ``cached``: the prefix shared with any earlier
request of the run). ``largest`` is the largest single request.

Two conditions on the same small clocks (so that even the samples outgrow the budgets):
``on`` has the bounded-memory budgets below; ``off`` sets each of them to 10^9 (memory unbounded).
Before and after a change: run this file against the other checkout's code (``--code``), e.g.

    .venv/bin/python bench/cost/bounded_memory.py --code /path/to/main/checkout --json > before.json
    .venv/bin/python bench/cost/bounded_memory.py --json > after.json

Usage (from the repository root):

    .venv/bin/python bench/cost/bounded_memory.py             # the long session and both samples
    .venv/bin/python bench/cost/bounded_memory.py --smoke     # a tiny built session only (seconds)
    .venv/bin/python bench/cost/bounded_memory.py --turns 300 --no-samples
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _code_root(argv: list[str]) -> Path:
    """The checkout whose om_core runs (``--code``, else this one): read before anything is imported."""
    for i, arg in enumerate(argv):
        if arg == "--code" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if arg.startswith("--code="):
            return Path(arg.split("=", 1)[1]).resolve()
    return Path(__file__).resolve().parents[2]


REPO = Path(__file__).resolve().parents[2]
CODE = _code_root(sys.argv[1:])
for extra in (REPO / "tests", CODE):  # the test helpers of this checkout; om_core of the measured one
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network here

SHARED = REPO.parent / "shared" / "sessions"
SAMPLES = [SHARED / "before-compaction.jsonl", SHARED / "large-session.jsonl"]
SESSION_ID = "0b0dded0-0000-4000-8000-000000000040"
UNBOUNDED = 10**9
# the clocks of every condition: small, so that the samples' memory outgrows the budgets too
CLOCKS = dict(observeAfterTokens=2_000, reflectAfterTokens=4_000, compactAfterTokens=30_000, keepRecentTokens=4_000,
              observationsPoolMaxTokens=3_000, observationsPoolTargetTokens=1_500, clockBasis="source")
BUDGETS = dict(reflectionsPoolTargetTokens=800, compactionSummaryMaxTokens=1_500, workerMemoryMaxTokens=1_200)
CONDITIONS = {"on": BUDGETS, "off": {key: UNBOUNDED for key in BUDGETS}}


def built_session(folder: Path, turns: int) -> Path:
    """``turns`` rounds of coding work, two hours apart."""
    from builders import SessionBuilder

    b = SessionBuilder(SESSION_ID, start="2026-01-05T09:00:00", step_seconds=1_800)
    b.work_turns(turns, "ledger")
    return b.write(folder / f"weeks-{turns}.jsonl")


def _settings(condition: str) -> Any:
    from om_core.settings import Settings

    return Settings(**CLOCKS, **CONDITIONS[condition])


def _rendered_tokens(rows: list[dict[str, Any]]) -> int:
    """Active reflections' rendered lines ``[id] content``, in Pi's estimate (4 characters a token)."""
    return sum(math.ceil(len(f"[{r['id']}] {r['content']}") / 4) for r in rows
               if r["item_kind"] == "reflection" and not r["dropped"])


def measure(path: Path, condition: str, folder: Path) -> dict[str, Any]:
    """Ingest and replay one session under one condition; its figures."""
    from conftest import workspace
    from fake_brains import ScriptedWorkers
    from fake_openai import FakeOpenAI
    from om_core.ingest import ingest
    try:
        from om_core.memory import views as fold
    except ImportError:  # a checkout from before the module was named after what it holds (--code)
        from om_core.memory import fold
    from om_core.memory.compaction import compact, summary_tokens
    from om_core.model.client import RetryPolicy
    from om_core.replay.engine import replay_session
    from om_core.store import db as dbmod
    from om_core.store.workspace import Workspace
    from om_core.workers.run_config import ModelConfig, make_brain

    settings = _settings(condition)
    db = folder / f"{path.stem}-{condition}.duckdb"
    ingest(workspace(db, settings), [path])
    with dbmod.reading(db) as con:
        sid, tip = con.execute("SELECT session_id, leaf_id FROM sessions ORDER BY session_id LIMIT 1").fetchone()
        source = con.execute("SELECT coalesce(sum(tokens_pi), 0) FROM entries WHERE session_id = ? AND is_source",
                             [sid]).fetchone()[0]
    started = time.perf_counter()
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        ws = Workspace.on_connection(dbmod.connect(db), settings)
        try:
            config = ModelConfig(model="openai/fake-model", api_base=server.base_url,
                                 retry=RetryPolicy(attempts=1, base_seconds=0.001, max_seconds=0.002))
            result = replay_session(ws, sid, make_brain(config, settings), drain=True, run_id="bench")
        finally:
            ws.close()
    seconds = time.perf_counter() - started
    ws = workspace(db, settings)
    summary = compact(ws, sid, tip, tip)
    with dbmod.reading(db) as con:
        calls, prompt, uncached, largest = con.execute(
            "SELECT count(*), coalesce(sum(input_tokens), 0), coalesce(sum(input_tokens - coalesce(cached_tokens, 0)), 0),"
            " coalesce(max(input_tokens), 0) FROM llm_calls WHERE session_id = ?", [sid]).fetchone()
        by_stage = dict(con.execute("SELECT stage, max(input_tokens) FROM llm_calls WHERE session_id = ? GROUP BY stage",
                                    [sid]).fetchall())
        drops = dict(con.execute("SELECT kind, count(*) FROM om_internal.ledger WHERE session_id = ? AND kind IN "
                                 "('om.reflections.dropped', 'om.observations.dropped') GROUP BY kind",
                                 [sid]).fetchall())
        recorded = con.execute("SELECT count(*) FROM reflections WHERE session_id = ?", [sid]).fetchone()[0]
        rows = fold.ledger_rows(con, sid, tip)
    per_1k = (lambda n: round(1000 * n / source, 1)) if source else (lambda n: None)
    return {
        "session": path.name, "condition": condition, "error": result.error, "seconds": round(seconds, 1),
        "source_tokens": int(source), "calls": int(calls),
        "prompt_per_1k": per_1k(prompt), "uncached_per_1k": per_1k(uncached), "largest_request": int(largest),
        "largest_by_stage": {k: int(v or 0) for k, v in sorted(by_stage.items())},
        "summary_tokens": summary_tokens(summary.summary, settings) if summary.summary else None,
        "summary_declined": None if summary.summary else str(summary.declined),
        "reflections_recorded": int(recorded), "active_reflection_tokens": _rendered_tokens(rows),
        "reflection_drops": int(drops.get("om.reflections.dropped", 0)),
        "observation_drops": int(drops.get("om.observations.dropped", 0)),
    }


def _row(r: dict[str, Any]) -> str:
    return (f"{r['session'][:26]:<26} {r['condition']:>4} {r['source_tokens']:>8,} {r['calls']:>6} "
            f"{r['prompt_per_1k'] or 0:>9,.1f} {r['uncached_per_1k'] or 0:>9,.1f} {r['largest_request']:>8,} "
            f"{r['summary_tokens'] if r['summary_tokens'] is not None else 'declined':>8} "
            f"{r['active_reflection_tokens']:>7,} {r['reflections_recorded']:>5} {r['reflection_drops']:>5} "
            f"{r['observation_drops']:>5} {r['seconds']:>7.1f}")


HEADER = (f"{'session':<26} {'cond':>4} {'source':>8} {'calls':>6} {'prompt/1k':>9} {'uncch/1k':>9} {'largest':>8} "
          f"{'summary':>8} {'reflTok':>7} {'refl':>5} {'rDrop':>5} {'oDrop':>5} {'seconds':>7}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=600, help="rounds of the built session (default 600)")
    parser.add_argument("--smoke", action="store_true", help="a tiny built session only (a quick check)")
    parser.add_argument("--no-samples", action="store_true", help="leave out the two real sample sessions")
    parser.add_argument("--sessions", nargs="*", type=Path, help="other session files instead of the samples")
    parser.add_argument("--conditions", nargs="*", default=list(CONDITIONS), choices=list(CONDITIONS))
    parser.add_argument("--code", type=Path, help="the checkout whose om_core is measured (default: this one)")
    parser.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = parser.parse_args(argv)
    turns = 24 if args.smoke else args.turns
    results = []
    with tempfile.TemporaryDirectory(prefix="om-bounded-") as tmp:
        folder = Path(tmp)
        sessions = [built_session(folder, turns)]
        if not (args.smoke or args.no_samples):
            sessions += [p for p in (args.sessions or SAMPLES) if p.exists()]
        if not args.json:
            print(f"om_core from {CODE}; budgets on: {BUDGETS}; clocks: {CLOCKS}")
            print(HEADER)
        for path in sessions:
            for condition in args.conditions:
                row = measure(path, condition, folder)
                results.append(row)
                if not args.json:
                    print(_row(row), flush=True)
    if args.json:
        print(json.dumps({"code": str(CODE), "turns": turns, "clocks": CLOCKS, "budgets": BUDGETS,
                          "results": results}, indent=2))
    return 1 if any(r["error"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
