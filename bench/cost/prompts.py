#!/usr/bin/env python3
"""What each worker sends, by part, and how much of it a provider's prefix cache could serve.

Each sample session (../shared/sessions/{before-compaction,large-session}.jsonl) is replayed into a
fresh DuckDB with default settings (``om_core.replay.replay_session``, drained at the end, one stage
at a time through the one stage runner), the model workers talking through litellm to the fake
OpenAI-compatible server (tests/fake_openai.py). Two scripted models answer:

* ``scripted``: tests/fake_brains.ScriptedWorkers, one short note per chunk (what bench/cost/workers.py
  uses; its memory stays tiny, so the dropper never runs);
* ``careful``: ``CarefulWorkers`` below, sized like a careful model's answers: a note per user
  message and about one per 4,000 characters of the rest of the chunk (each 20-40 words, stamped
  with its entry's time, most medium or low), a reflection when two or more uncited high notes wait,
  and drops of covered or low notes when the dropper is asked. Its memory grows to the pool target,
  so all three workers run and the memory's layout between stages matters.

Every request body the server received is split into its parts as the provider bills them (the
fake server's layout: tool definitions, the system prompt, then the messages): ``tools``,
``system``, ``memory`` (the user message's ``## Memory`` block, up to the next heading) and
``new`` (the rest of the user message, plus any later turn's messages). Tokens are the fake
server's: characters / 4, so the parts add up to what it bills. ``shared`` is the prefix a request
shares with the request right before it (any worker); ``cached`` the longest prefix it shares with
any earlier request (what the fake server reports as cached_tokens).

The totals line is per 1,000 source tokens (Pi's estimate): prompt tokens, uncached tokens
(prompt - cached), the prefix-servable share (cached / prompt) and model calls per stage.

Usage (from the repository root):

    .venv/bin/python bench/cost/prompts.py                      # both sessions, both scripted models
    .venv/bin/python bench/cost/prompts.py --model careful --json
    .venv/bin/python bench/cost/prompts.py --sessions ../shared/sessions/large-session.jsonl
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

import duckdb  # noqa: E402

from fake_openai import FakeOpenAI, PrefixCache, Reply, prompt_text, text, tool_call  # noqa: E402
from om_core.store import db as dbmod  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.replay.engine import replay_session  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.workers.run_config import make_brain  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

CHARS_PER_TOKEN = 4
PARTS = ("system", "tools", "memory", "new")
WORKERS = ("observer", "reflector", "dropper")


# ------------------------------------------------------------------ reading a request


def user_text(body: dict) -> str:
    content = body["messages"][1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


_TOOL_STAGE = {"record_observations": "observer", "record_reflections": "reflector", "drop_observations": "dropper"}


def worker_of(body: dict) -> str:
    """Which worker sent a request: by its one tool where a request carries one, else by its task."""
    tools = [t["function"]["name"] for t in body.get("tools") or []]
    if len(tools) == 1:
        return _TOOL_STAGE.get(tools[0], "observer")
    user = user_text(body)
    if "\n## New entries (" in user or user.startswith("## New entries ("):
        return "observer"
    task = re.search(r"^## Task: (\w+)", user, re.MULTILINE)
    if task:
        return {"observe": "observer", "reflect": "reflector", "drop": "dropper"}.get(task.group(1), task.group(1))
    return "dropper" if "## Budget" in user else "reflector"


def memory_split(user: str) -> tuple[str, str]:
    """(the ``## Memory`` block up to the next heading, the rest) of a user message."""
    if not user.startswith("## Memory\n"):
        return "", user
    end = user.find("\n\n## ")
    end = len(user) if end < 0 else end + 2
    return user[:end], user[end:]


def parts_of(body: dict) -> dict[str, int]:
    """Characters of each billed part, laid out as fake_openai.prompt_text lays the request out."""
    tools = len(json.dumps(body.get("tools") or [], sort_keys=True, ensure_ascii=False))
    messages = body["messages"]
    system = len("<system>") + len(messages[0]["content"])
    memory, rest = memory_split(user_text(body))
    later = prompt_text({"tools": [], "messages": messages[2:]}) if len(messages) > 2 else ""
    new = len("<user>") + len(rest) + (len(later) - len("[]") if later else 0)
    return {"tools": tools, "system": system, "memory": len(memory), "new": new + 3}  # + the 3 joining newlines


# ------------------------------------------------------------------ a careful scripted model

_CHUNK = re.compile(r"^## New entries \((\S+) to (\S+)\)$", re.MULTILINE)
_DAY = re.compile(r"^=== (\d{4}-\d{2}-\d{2}) ===$")
_ENTRY = re.compile(r"^\[(\S+) ([^\]\n]*?) (\d{2}:\d{2})\] ?(.*)$")
_OBS = re.compile(r"^\[([0-9a-f]{12})\] (\d{4}-\d{2}-\d{2} \d{2}:\d{2}) \[(low|medium|high|critical)\] (.*)$",
                  re.MULTILINE)
_IDS = re.compile(r"\b[0-9a-f]{12}\b")
_WORD = re.compile(r"[A-Za-z0-9_./:-]{2,}")
_AT_MOST = re.compile(r"at most (\d+)", re.IGNORECASE)


def _entries(chunk: str) -> list[dict[str, Any]]:
    """The chunk's entries: id, role, YYYY-MM-DD HH:MM and text."""
    out: list[dict[str, Any]] = []
    day = None
    for block in chunk.strip("\n").split("\n\n"):
        first = block.split("\n", 1)[0]
        if m := _DAY.match(first):
            day = m.group(1)
            continue
        m = _ENTRY.match(first)
        if m and day:
            out.append({"id": m.group(1), "role": m.group(2), "time": f"{day} {m.group(3)}",
                        "text": m.group(4) + block[len(first):]})
        elif out:
            out[-1]["text"] += "\n\n" + block
    return out


def _cited(rest: str) -> set[str]:
    """The observations some reflection cites, from the stage's coverage as either layout gives it:
    ``strong: ids`` / ``partial: ids`` lines, or a dropper's table row ``id age relevance tokens partial
    citing-ids`` (an older layout: ``id age partial``)."""
    cited = {i for line in re.findall(r"^(?:strong|partial): (.+)$", rest, re.MULTILINE) for i in _IDS.findall(line)}
    return cited | set(re.findall(r"^([0-9a-f]{12}) \S+ (?:\S+ \S+ )?(?:partial|strong)(?: \S+)?$", rest,
                                  re.MULTILINE))


def _gist(text_: str, words: int, salt: str) -> str:
    picked = _WORD.findall(text_)[:words] or ["(no text)"]
    return " ".join(picked) + f" (note {salt})"


def _level(key: str, user: bool) -> str:
    if user:
        return "high"
    n = int(hashlib.sha256(key.encode()).hexdigest()[:4], 16) % 20
    return "critical" if n == 0 else "high" if n < 3 else "low" if n < 9 else "medium"


class CarefulWorkers:
    """A responder for FakeOpenAI whose answers are sized like a careful model's (see the docstring)."""

    NOTE_EVERY_CHARS = 4000

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, body: dict) -> Reply:
        if body["messages"][-1]["role"] == "tool":
            return text("done")
        worker = worker_of(body)
        user = user_text(body)
        memory, rest = memory_split(user)
        dropped = set()
        if "## Dropped" in rest:  # ids listed as dropped after the memory block
            section = rest.split("## Dropped", 1)[1].split("\n## ", 1)[0]
            dropped = set(_IDS.findall(section))
        active = [(m.group(1), m.group(3), m.group(4)) for m in _OBS.finditer(memory) if m.group(1) not in dropped]
        if worker == "observer":
            return self._observe(rest)
        cited = _cited(rest)
        if worker == "reflector":
            return self._reflect(active, cited)
        return self._drop(rest, active, cited)

    def _observe(self, rest: str) -> Reply:
        m = _CHUNK.search(rest)
        chunk = rest[m.end():] if m else rest
        notes, pending, size = [], [], 0
        for e in _entries(chunk):
            is_user = e["role"] == "User"
            if is_user:
                notes.append(self._note([e], True))
                continue
            pending.append(e)
            size += len(e["text"])
            if size >= self.NOTE_EVERY_CHARS:
                notes.append(self._note(pending, False))
                pending, size = [], 0
        if pending and (size >= self.NOTE_EVERY_CHARS // 4 or not notes):
            notes.append(self._note(pending, False))
        if not notes:
            return text("Nothing worth keeping in this chunk.")
        return tool_call("record_observations", {"observations": notes})

    def _note(self, entries: list[dict[str, Any]], user: bool) -> dict[str, Any]:
        first = entries[0]
        ids = [e["id"] for e in entries][:6]
        body = " ".join(e["text"] for e in entries)
        who = "User said" if user else "Assistant worked on"
        words = 24 if user else 30
        return {"timestamp": first["time"], "content": f"{who}: {_gist(body, words, first['id'])}",
                "relevance": _level(first["id"], user), "sourceEntryIds": ids}

    def _reflect(self, active: list[tuple[str, str, str]], cited: set[str]) -> Reply:
        waiting = [(i, c) for i, rel, c in active if rel in ("high", "critical") and i not in cited]
        if len(waiting) < 2:
            return text("Nothing durable to add.")
        support = [i for i, _ in waiting[:3]]
        content = f"Durable point: {_gist(waiting[0][1], 18, support[0])}"
        return tool_call("record_reflections", {"reflections": [
            {"content": content, "supportingObservationIds": support}]})

    def _drop(self, rest: str, active: list[tuple[str, str, str]], cited: set[str]) -> Reply:
        m = _AT_MOST.search(rest)
        limit = int(m.group(1)) if m else 1
        candidates = [i for i, rel, _ in active if rel == "low" or (i in cited and rel != "critical")]
        if not candidates:
            return text("Nothing is safe to drop.")
        return tool_call("drop_observations", {"ids": candidates[:limit],
                                               "reason": "low-signal or carried by a reflection"})


# ------------------------------------------------------------------ one run


def run_one(session_path: Path, model: str, workdir: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    from fake_brains import ScriptedWorkers

    db_path = workdir / f"{session_path.stem}-{model}.duckdb"
    if db_path.exists():
        db_path.unlink()
    settings = Settings(**(overrides or {}))
    ingest(Workspace.open(db_path, settings=settings), [session_path])
    con = duckdb.connect(str(db_path), read_only=True)
    sid, source_pi = con.execute("SELECT s.session_id, (SELECT sum(tokens_pi) FROM entries e WHERE "
                                 "e.session_id = s.session_id AND e.is_source) FROM sessions s").fetchone()
    con.close()
    server = FakeOpenAI(responder=ScriptedWorkers() if model == "scripted" else CarefulWorkers())
    server.start()
    run_id = dbmod.new_run_id()
    ws = Workspace.on_connection(dbmod.connect(db_path), settings)
    config = harness.fake_model_config(server.base_url)
    try:
        replay_session(ws, sid, make_brain(config, settings), drain=True, run_id=run_id)
    finally:
        ws.close()
        server.stop()
    con = duckdb.connect(str(db_path), read_only=True)
    stages = dict(con.execute("SELECT stage, count(DISTINCT stage_run_id) FROM llm_calls WHERE session_id = ? "
                              "AND status = 'ok' GROUP BY stage", [sid]).fetchall())
    outcomes = {f"{s}:{o}": n for s, o, n in con.execute(
        "SELECT stage, outcome, count(*) FROM stages WHERE session_id = ? GROUP BY ALL ORDER BY ALL", [sid]).fetchall()}
    memory = con.execute("SELECT count(*) FROM observations WHERE session_id = ?", [sid]).fetchone()[0]
    reflector = [r[0] for r in con.execute("SELECT outcome FROM stages WHERE session_id = ? AND stage = 'reflector' "
                                           "AND outcome IN ('recorded', 'empty') ORDER BY started_at, finished_at",
                                           [sid]).fetchall()]
    con.close()
    result = measure(session_path.stem, model, server.requests, source_pi, stages, outcomes, memory)
    # item 9: the reflector asked again after a deliberate empty result, and what it answered then
    again = [b for a, b in zip(reflector, reflector[1:]) if a == "empty"]
    result["reflector_after_empty"] = {"asked": len(again), "empty_again": again.count("empty"),
                                       "recorded": again.count("recorded")}
    return result


def measure(session: str, model: str, requests: list[dict], source_pi: int, stages: dict[str, int],
            outcomes: dict[str, int], recorded: int) -> dict[str, Any]:
    cache = PrefixCache()
    previous = None
    rows = []
    for body in requests:
        whole = prompt_text(body)
        cached = cache.add(whole)
        shared = harness.common_prefix(previous[1], whole) if previous is not None else 0
        rows.append({"worker": worker_of(body), "after": previous[0] if previous else None, "chars": len(whole),
                     "cached": cached, "shared": shared, "parts": parts_of(body)})
        previous = (rows[-1]["worker"], whole)
    per_worker: dict[str, Any] = {}
    for worker in WORKERS:
        mine = [r for r in rows if r["worker"] == worker]
        if not mine:
            continue
        per_worker[worker] = {
            "requests": len(mine),
            "tokens": {p: sum(r["parts"][p] for r in mine) // CHARS_PER_TOKEN for p in PARTS},
            "prompt_tokens": sum(r["chars"] for r in mine) // CHARS_PER_TOKEN,
            "shared_with_previous_tokens": sum(r["shared"] for r in mine) // CHARS_PER_TOKEN,
            "cached_tokens": sum(r["cached"] for r in mine) // CHARS_PER_TOKEN,
            "after": {k: sum(1 for r in mine if r["after"] == k) for k in (*WORKERS, None)
                      if any(r["after"] == k for r in mine)},
        }
    hops: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["after"] is None:
            continue
        hop = hops.setdefault(f"{r['after']} -> {r['worker']}", {"requests": 0, "shared": 0, "chars": 0})
        hop["requests"] += 1
        hop["shared"] += r["shared"]
        hop["chars"] += r["chars"]
    prompt = sum(r["chars"] for r in rows) / CHARS_PER_TOKEN
    cached = sum(r["cached"] for r in rows) / CHARS_PER_TOKEN
    per_1k = (lambda n: 1000 * n / source_pi) if source_pi else (lambda n: None)
    return {
        "session": session, "model": model, "source_tokens_pi": source_pi, "requests": len(rows),
        "observations_recorded": recorded, "stages": outcomes,
        "prompt_per_1k_source": per_1k(prompt), "uncached_per_1k_source": per_1k(prompt - cached),
        "prefix_servable_share": cached / prompt if prompt else None,
        "calls_per_stage": len(rows) / sum(stages.values()) if stages else None,
        "workers": per_worker,
        "hops": {k: {"requests": v["requests"], "shared_share": v["shared"] / v["chars"] if v["chars"] else 0}
                 for k, v in sorted(hops.items())},
    }


# ------------------------------------------------------------------ output


def print_result(r: dict[str, Any]) -> None:
    print(f"\n{r['session']} · {r['model']} model · {r['source_tokens_pi']:,} source tokens · {r['requests']} requests"
          f" · {r['observations_recorded']} observations recorded")
    print(f"  {'worker':<10} {'requests':>8} " + " ".join(f"{p:>9}" for p in PARTS)
          + f" {'prompt':>9} {'shared w/ previous':>19} {'cached':>9}")
    for worker, w in r["workers"].items():
        t = w["tokens"]
        share = w["shared_with_previous_tokens"] / w["prompt_tokens"] if w["prompt_tokens"] else 0
        print(f"  {worker:<10} {w['requests']:>8} " + " ".join(f"{t[p]:>9,}" for p in PARTS)
              + f" {w['prompt_tokens']:>9,} {w['shared_with_previous_tokens']:>11,} ({share:>5.1%})"
              + f" {w['cached_tokens']:>9,}")
    print("  prefix shared with the request before, by hop: " + "; ".join(
        f"{hop} {v['shared_share']:.0%} ({v['requests']})" for hop, v in r["hops"].items()))
    print(f"  per 1,000 source tokens: prompt {r['prompt_per_1k_source']:,.0f}, uncached "
          f"{r['uncached_per_1k_source']:,.0f}; prefix-servable {r['prefix_servable_share']:.1%}; "
          f"calls per stage {r['calls_per_stage']:.2f}")
    print("  stages: " + ", ".join(f"{k} {v}" for k, v in r["stages"].items()))
    again = r.get("reflector_after_empty")
    if again:
        print(f"  reflector asked again after an empty result: {again['asked']} "
              f"({again['empty_again']} empty again, {again['recorded']} recorded)")


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--sessions", nargs="*", type=Path, default=harness.SAMPLES,
                        help="session files (default: the samples)")
    parser.add_argument("--model", nargs="*", choices=("scripted", "careful"), default=["scripted", "careful"])
    parser.add_argument("--keep", type=Path, default=None, help="keep the databases in this directory")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting other than its default (JSON value), e.g. --set observerToolMaxTokens=2000")
    args = parser.parse_args(argv)
    overrides = harness.setting_overrides(args.set)
    sessions = harness.present(args.sessions)
    if not sessions:
        print("no session to benchmark", file=sys.stderr)
        return 0
    results = []
    with harness.work_dir("om-bench-prompts-", args.keep) as workdir:
        for path in sessions:
            for model in args.model:
                if not args.json:
                    print(f"replaying {path.name} with the {model} model…", file=sys.stderr, flush=True)
                results.append(run_one(path, model, workdir, overrides))
    if args.json:
        print(json.dumps({"settings": overrides or "defaults", "tokens": "characters / 4 (the fake server's)",
                          "results": results}, indent=2))
    else:
        print(f"Settings: {'defaults, but ' + str(overrides) if overrides else 'defaults'}. Tokens: characters / 4, as the fake server bills them. shared w/ previous: the "
              "prefix each request shares with the request right before it; cached: with any earlier request.")
        for r in results:
            print_result(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
