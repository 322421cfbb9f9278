#!/usr/bin/env python3
"""Workers benchmark: what the memory workers send, how much of it a provider could cache, and how
much the memory compresses the session.

For each sample session (../shared/sessions/{before-compaction,large-session}.jsonl) the whole
session is replayed twice into a fresh DuckDB, the way the pipeline replays an archive
(``om_core.replay.engine.replay_session`` with default settings, draining at the end; no Prefect):

* ``offline``: the extractive baseline. Nothing is sent anywhere, so for this run the figures are
  what a model *would* have been sent: every stage's input is rendered through the model workers'
  own code (``ModelBrain`` driven by a stub chat model that records the request and answers with no
  tool call), i.e. one first-turn request per stage. The baseline's own result is what is stored.
* ``fake``: the model workers through litellm against the fake OpenAI-compatible server
  (tests/fake_openai.py) answering with ``ScriptedWorkers`` (tests/fake_brains.py): each stage gets a
  valid tool call built from its prompt (and a "done" if the worker asks again with the receipt). The
  figures come from the request bodies the server received and the usage it reported, which is what
  a provider with automatic prefix caching would report: prompt tokens at 4 characters a token, and
  cached tokens = the longest prefix shared with an earlier request.

Cost (fake run): the server's usage priced at litellm's listed prices (local cost map) for
openai/gpt-4o-mini and anthropic/claude-haiku-4-5, per 1M source tokens (Pi's estimate). Cached
tokens at the cache-read price; for Anthropic, whose cache needs explicit breakpoints, the part of
each request's marked prefix (system prompt and memory) not yet cached is priced as a cache write.
Providers' minimum cacheable lengths (1,024 tokens for OpenAI) are not applied.

Reported per session and run:

* prompt tokens per 1,000 source tokens: every request's messages (system, user, assistant tool
  calls, tool receipts) plus its tool definitions, counted with tiktoken o200k_base
  (``om_core.pi.tokens.count_tokens``; no per-message chat-template overhead), divided by the session's
  source tokens counted the same way (``entries.tokens``). For the fake run the fake server's own
  usage figure is shown too (``llm_calls.input_tokens``, which it derives as len(JSON body) / 4).
* stable prefix share: for consecutive observer stages (their first-turn requests), the longest
  common prefix of ``system + "\\n\\n" + user`` of the earlier and the later request, divided by the
  later request's length, averaged over pairs (characters), and the token-weighted share
  (sum of prefix tokens / sum of prompt tokens) which is what a provider prompt cache would reuse.
  The share over *all* consecutive observer requests (closing turns included, which repeat the
  first turn whole) is shown as well.
* source tokens per active-memory token at the branch tip: source tokens (Pi's estimate,
  ``entries.tokens_pi``) over the tokenCounts of the active observations plus current reflections
  (``om_core.memory.views.active_memory``; tokenCount uses the same Pi estimate by default). With the fake
  server the memory is the scripted model's (one generic observation per chunk), so that figure
  says how many chunks were observed, not how good the notes are.

Usage (from the repository root):

    .venv/bin/python bench/cost/workers.py            # both sample sessions, both runs
    .venv/bin/python bench/cost/workers.py --json
    .venv/bin/python bench/cost/workers.py --sessions path/a.jsonl path/b.jsonl --keep /tmp/omw
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

import duckdb  # noqa: E402

from om_core.store import db as dbmod  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.memory.views import active_memory, ledger_rows  # noqa: E402
from om_core.model.client import ChatReply  # noqa: E402
from om_core.replay.engine import replay_session  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.pi.tokens import count_tokens  # noqa: E402
from om_core.workers.llm import ModelBrain  # noqa: E402
from om_core.workers.offline import OfflineBrain  # noqa: E402
from om_core.workers.run_config import make_brain  # noqa: E402

from bench.cost.provider_requests import (  # noqa: E402
    new_part,
    observer_composition,
    prefix_stats,
    request_pieces,
    stage_of,
    stage_prompt,
)


# ------------------------------------------------------------------ the offline run's would-be prompts


class _RecordingModel:
    """A chat model that records each request and answers with no tool call (so one turn per stage)."""

    name = "offline"

    def __init__(self, sink: list[dict[str, Any]]) -> None:
        self.sink = sink

    def complete(self, messages, tools, turn):  # noqa: ANN001 - ChatModel protocol
        try:  # as LiteLLMModel sends them to an OpenAI-compatible provider
            from om_core.model.client import prepare_messages

            messages = prepare_messages(messages, False)
        except ImportError:  # older code sent plain strings already
            pass
        self.sink.append({"messages": [dict(m) for m in messages], "tools": tools})
        return ChatReply(text="", tool_calls=[])


class _NoCheck:
    problems = 0

    def submit(self, args):  # noqa: ANN001 - never called: the stub model calls no tool
        return "n/a"


class RenderingOfflineBrain(OfflineBrain):
    """The offline baseline, which also renders each stage's input as the model workers would send it."""

    def __init__(self, sink: list[dict[str, Any]], settings: Settings) -> None:
        super().__init__(redact_secrets=settings.redactSecrets)
        self.renderer = ModelBrain(_RecordingModel(sink), max_turns=1, redact_secrets=settings.redactSecrets)

    def observe(self, inp, check):  # noqa: ANN001
        self.renderer.observe(inp, _NoCheck())
        return super().observe(inp, check)

    def reflect(self, inp, check):  # noqa: ANN001
        self.renderer.reflect(inp, _NoCheck())
        return super().reflect(inp, check)

    def drop(self, inp, check):  # noqa: ANN001
        self.renderer.drop(inp, _NoCheck())
        return super().drop(inp, check)


# ------------------------------------------------------------------ one run


def session_facts(db_path: Path) -> tuple[str, str]:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return con.execute("SELECT session_id, leaf_id FROM sessions").fetchone()
    finally:
        con.close()


def run_one(session_path: Path, mode: str, workdir: Path) -> dict[str, Any]:
    from fake_brains import ScriptedWorkers
    from fake_openai import FakeOpenAI

    db_path = workdir / f"{session_path.stem}-{mode}.duckdb"
    if db_path.exists():
        db_path.unlink()
    ingest(Workspace.open(db_path, settings=Settings()), [session_path])
    sid, leaf = session_facts(db_path)
    settings = Settings()
    run_id = dbmod.new_run_id()
    db = Workspace.on_connection(dbmod.connect(db_path), settings)
    rendered: list[dict[str, Any]] = []
    server = None
    if mode == "fake":
        script = ScriptedWorkers()
        server = FakeOpenAI(responder=script)
        server.start()
        brain = make_brain(harness.fake_model_config(server.base_url), settings)
    else:
        brain = RenderingOfflineBrain(rendered, settings)

    started = time.perf_counter()
    try:
        reports = replay_session(db, sid, brain, drain=True, run_id=run_id).branches
    finally:
        wall = time.perf_counter() - started
        db.close()
        if server is not None:
            server.stop()
    requests = server.requests if server is not None else rendered
    return measure(db_path, sid, leaf, mode, requests, reports, wall)


def measure(db_path: Path, sid: str, leaf: str, mode: str, requests: list[dict[str, Any]], reports, wall: float) -> dict[str, Any]:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        src_pi, src_tt, src_n = con.execute(
            "SELECT sum(tokens_pi), sum(tokens), count(*) FROM entries WHERE session_id = ? AND is_source",
            [sid]).fetchone()
        branch_pi, branch_tt = con.execute(
            "SELECT sum(tokens_pi), sum(tokens) FROM branch_detail(?, ?) WHERE is_source", [sid, leaf]).fetchone()
        calls = con.execute(
            "SELECT stage, count(*), sum(input_tokens), sum(output_tokens), sum(cached_tokens), "
            "count(DISTINCT stage_run_id) FROM llm_calls WHERE session_id = ? "
            "AND status = 'ok' GROUP BY stage ORDER BY stage", [sid]).fetchall()
        stages = con.execute("SELECT stage, outcome, count(*) FROM stages WHERE session_id = ? GROUP BY ALL "
                             "ORDER BY ALL", [sid]).fetchall()
        memory = active_memory(ledger_rows(con, sid, leaf))
        recorded = con.execute("SELECT count(*) FROM observations WHERE session_id = ?", [sid]).fetchone()[0]
        simulated = con.execute("SELECT count(*) FROM compactions WHERE session_id = ? AND origin = 'simulated'",
                                [sid]).fetchone()[0]
    finally:
        con.close()

    # prompt tokens, per request and per stage
    per_request = [request_pieces(r["messages"], r.get("tools")) for r in requests]
    flat = [p for pieces in per_request for p in pieces]
    counts = count_tokens(flat, threads=2) if flat else []
    request_tokens, i = [], 0
    for pieces in per_request:
        request_tokens.append(sum(counts[i:i + len(pieces)]))
        i += len(pieces)
    by_stage: dict[str, dict[str, int]] = {}
    for r, n in zip(requests, request_tokens):
        s = by_stage.setdefault(stage_of(r["messages"]), {"requests": 0, "prompt_tokens": 0})
        s["requests"] += 1
        s["prompt_tokens"] += n
    prompt_tokens = sum(request_tokens)

    observer = [r for r in requests if stage_of(r["messages"]) == "observer"]
    first_requests = [r for r in observer if r["messages"][-1]["role"] == "user"]
    first_turns = [stage_prompt(r["messages"]) for r in first_requests]
    all_turns = ["\n\n".join(request_pieces(r["messages"], None)) for r in observer]

    memory_tokens = memory.observation_tokens() + sum(r.tokenCount for r in memory.reflections)
    server_input = sum(c[2] or 0 for c in calls)
    server_output = sum(c[3] or 0 for c in calls)
    server_cached = sum(c[4] or 0 for c in calls)
    model_calls, called_stages = sum(c[1] for c in calls), sum(c[5] for c in calls)
    fake = mode == "fake"
    per_1k_pi = (lambda n: 1000 * n / src_pi if src_pi else None)
    written = cache_write_tokens(requests, server_cached_by_request(db_path, sid)) if fake else 0
    costs = {}
    for model, price in PRICES.items():
        if fake and price is not None and src_pi:
            auto = price.call(server_input, server_output, server_cached)
            explicit = price.call(server_input, server_output, server_cached, written)
            if model.startswith("anthropic/"):  # caches only at explicit breakpoints: none in older code
                auto = explicit if MARKS_BREAKPOINTS else price.call(server_input, server_output)
            costs[model] = 1_000_000 * auto / src_pi
    return {
        "session": db_path.stem.rsplit("-", 1)[0],
        "mode": mode,
        "sent": mode == "fake",
        "wall_seconds": wall,
        "source_entries": src_n,
        "source_tokens_o200k": src_tt,
        "source_tokens_pi": src_pi,
        "branch_source_tokens_pi": branch_pi,
        "requests": len(requests),
        "requests_by_stage": by_stage,
        "prompt_tokens_o200k": prompt_tokens,
        "prompt_per_1k_source": 1000 * prompt_tokens / src_tt if src_tt else None,
        "server_input_tokens": server_input if fake else None,
        "server_input_per_1k_source": (1000 * server_input / src_tt if src_tt else None) if fake else None,
        "server_prompt_per_1k_source_pi": per_1k_pi(server_input) if fake else None,
        "server_uncached_per_1k_source_pi": per_1k_pi(server_input - server_cached) if fake else None,
        "cacheable_share": server_cached / server_input if fake and server_input else None,
        "model_calls": model_calls if fake else None,
        "model_calls_per_stage": model_calls / called_stages if fake and called_stages else None,
        "cache_write_tokens_anthropic": written if fake else None,
        "usd_per_1m_source_tokens": costs,
        "llm_calls": {stage: {"calls": n, "input_tokens": inp, "output_tokens": out, "cached_tokens": cached,
                              "stages": st} for stage, n, inp, out, cached, st in calls},
        "stages": {f"{stage}:{outcome}": n for stage, outcome, n in stages},
        "replay": [{"leaf": r.leaf, "events": r.events, "stages": r.stages, "compactions": r.compactions,
                    "drained": r.drained, "failures": r.failures} for r in reports],
        "observer_first_turn_tokens": observer_composition(first_requests),
        "observer_stage_prefix": prefix_stats(first_turns, locate=True),
        "observer_request_prefix": prefix_stats(all_turns),
        "observations_recorded": recorded,
        "active_observations": len(memory.observations),
        "reflections": len(memory.reflections),
        "active_memory_tokens": memory_tokens,
        "source_per_memory_token": branch_pi / memory_tokens if memory_tokens else None,
        "simulated_compactions": simulated,
    }


def _price(model: str):
    try:
        from om_core.model.cost import price_of
    except ImportError:
        return None
    return price_of(model)


try:
    from om_core.model.client import takes_cache_breakpoints  # noqa: F401 - marks Anthropic cache breakpoints
    MARKS_BREAKPOINTS = True
except ImportError:
    MARKS_BREAKPOINTS = False
PRICED_MODELS = ("openai/gpt-4o-mini", "anthropic/claude-haiku-4-5")
PRICES: dict[str, Any] = {}


def server_cached_by_request(db_path: Path, sid: str) -> list[int]:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        return [r[0] or 0 for r in con.execute("SELECT cached_tokens FROM llm_calls WHERE session_id = ? AND "
                                               "status = 'ok' ORDER BY started_at", [sid]).fetchall()]
    finally:
        con.close()


def cache_write_tokens(requests: list[dict[str, Any]], cached: list[int]) -> int:
    """Tokens an explicit-breakpoint cache (Anthropic) would write: per request, the marked prefix
    (tools, system prompt, and the user message up to where the new part starts) minus what was
    already cached. Requests and usage are paired in order (the replay runs one stage at a time)."""
    from fake_openai import CHARS_PER_TOKEN

    total = 0
    for body, hit in zip(requests, cached):
        messages = body["messages"]
        user = messages[1]["content"] if isinstance(messages[1]["content"], str) else ""
        cut = new_part(user)
        marked = len(json.dumps(body.get("tools") or [])) + len(messages[0]["content"]) + cut
        total += max(0, marked // CHARS_PER_TOKEN - hit)
    return total


# ------------------------------------------------------------------ output


def fmt(value: Any, spec: str = ".1f") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def print_table(results: list[dict[str, Any]]) -> None:
    headers = ["session", "run", "source tok (o200k / pi)", "requests (obs/refl/drop)", "prompt tok o200k",
               "prompt / 1k src", "server usage / 1k src", "obs prefix share (mean chars / tok-weighted)",
               "obs prefix ends in", "all obs requests prefix", "obs 1st-turn tok: system/tools/memory/chunk",
               "rendered chunk / source", "active memory (obs+refl, tok)", "src tok / memory tok", "wall s"]
    rows = []
    for r in results:
        rs = r["requests_by_stage"]
        p, q = r["observer_stage_prefix"], r["observer_request_prefix"]
        rows.append([
            r["session"], r["mode"] + ("" if r["sent"] else " (would-be)"),
            f"{r['source_tokens_o200k']:,} / {r['source_tokens_pi']:,}",
            f"{r['requests']} ({'/'.join(str(rs.get(s, {}).get('requests', 0)) for s in ('observer', 'reflector', 'dropper'))})",
            f"{r['prompt_tokens_o200k']:,}",
            fmt(r["prompt_per_1k_source"]),
            fmt(r["server_input_per_1k_source"]),
            (f"{fmt(p['mean_share_chars'], '.1%')} / {fmt(p['token_weighted_share'], '.1%')} ({p['pairs']} pairs)"
             if p["pairs"] else "n/a (<2 stages)"),
            ", ".join(f"{k} {v}" for k, v in sorted(p.get("prefix_ends_in", {}).items())) or "n/a",
            f"{fmt(q['mean_share_chars'], '.1%')} / {fmt(q['token_weighted_share'], '.1%')}" if q["pairs"] else "n/a",
            "/".join(f"{c.get(k, 0):,}" for k in ("system", "tools", "memory", "chunk")) if (c := r["observer_first_turn_tokens"]) else "n/a",
            fmt(c["chunk"] / r["source_tokens_o200k"], ".2f") if c and r["source_tokens_o200k"] else "n/a",
            f"{r['active_observations']}+{r['reflections']}, {fmt(r['active_memory_tokens'], '.0f')}",
            fmt(r["source_per_memory_token"]),
            fmt(r["wall_seconds"], ".1f"),
        ])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    # one record per block: a 12-column table does not fit a terminal
    for row in rows:
        print()
        for h, v, w in zip(headers, row, widths):
            print(f"  {h:<{max(map(len, headers))}}  {v}")
    print()
    fake = [r for r in results if r["sent"]]
    if fake:
        print("Cost figures (fake run; server usage = prompt text at 4 chars/token, cached = longest prefix shared "
              "with an earlier request; per 1,000 source tokens by Pi's estimate):")
        names = list(PRICES)
        print(f"  {'session':<20} {'prompt/1k':>10} {'uncached/1k':>12} {'cacheable':>10} {'calls/stage':>12} "
              + " ".join(f"{'$/1M src ' + n.split('/')[-1]:>26}" for n in names))
        for r in fake:
            print(f"  {r['session']:<20} {fmt(r['server_prompt_per_1k_source_pi']):>10} "
                  f"{fmt(r['server_uncached_per_1k_source_pi']):>12} {fmt(r['cacheable_share'], '.1%'):>10} "
                  f"{fmt(r['model_calls_per_stage'], '.2f'):>12} "
                  + " ".join(f"{fmt(r['usd_per_1m_source_tokens'].get(n), '.3f'):>26}" for n in names))
        print()
    print("Summary (prompt tokens per 1,000 source tokens | stable prefix share of consecutive observer stages, "
          "token-weighted | source tokens per active-memory token):")
    print(f"  {'session':<20} {'run':<18} {'prompt/1k src':>14} {'stable prefix':>14} {'src/memory':>11}")
    for r in results:
        print(f"  {r['session']:<20} {r['mode'] + ('' if r['sent'] else ' (would-be)'):<18} "
              f"{fmt(r['prompt_per_1k_source']):>14} {fmt(r['observer_stage_prefix']['token_weighted_share'], '.1%'):>14} "
              f"{fmt(r['source_per_memory_token']):>11}")


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--sessions", nargs="*", type=Path, default=harness.SAMPLES,
                        help="session files (default: the samples)")
    parser.add_argument("--runs", nargs="*", choices=("offline", "fake"), default=["offline", "fake"])
    parser.add_argument("--keep", type=Path, default=None, help="keep the databases in this directory")
    args = parser.parse_args(argv)

    sessions = harness.present(args.sessions)
    if not sessions:
        print("no session to benchmark", file=sys.stderr)
        return 0
    for model in PRICED_MODELS:
        PRICES[model] = _price(model)
    results = []
    with harness.work_dir("om-bench-workers-", args.keep) as workdir:
        for path in sessions:
            for mode in args.runs:
                if not args.json:
                    print(f"replaying {path.name} with {'the offline baseline' if mode == 'offline' else 'the fake server'}…",
                          file=sys.stderr, flush=True)
                results.append(run_one(path, mode, workdir))
    if args.json:
        print(json.dumps({"settings": "defaults (Settings())", "token_counter": "tiktoken o200k_base",
                          "results": results}, indent=2, default=str))
    else:
        print("Settings: defaults. Prompt tokens: o200k_base over message contents, tool-call arguments and tool "
              "definitions. Offline rows: nothing is sent; 'would-be' = the first-turn requests the model workers "
              "would have sent for the same stage inputs.")
        print_table(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
