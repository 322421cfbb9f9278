#!/usr/bin/env python3
"""What the project stage sends, per 1,000 tokens of the session memory it reads.

The sample sessions (../shared/sessions/{before-compaction,large-session}.jsonl; both worked in one
folder, so they are one project) are ingested one after the other into a fresh DuckDB and replayed
with the offline baseline on om's defaults (their memory is what the project stage reads); after each
session the project stage runs (``run_project_stages`` with force: until nothing is new), its model
talking through litellm to the fake OpenAI-compatible server (tests/fake_openai.py). The scripted
distiller answers like a careful model: one project reflection per session reflection it is shown,
worded as recorded, citing that reflection and the critical observations it names, at most 8 a call.
So the second session's stage reads the first one's project memory.

Every request is split into its parts as the provider bills them: ``tools``, ``system``, ``memory``
(the user message's ``## Project memory`` block) and ``new`` (the rest: the new session memory), in
the fake server's tokens (characters / 4); ``cached`` is the prefix the request shares with any earlier
request of the run. ``read`` is the session memory the stage read (its ``input_tokens``: the token
counts of the reflections and critical observations shown). The totals line: prompt tokens, uncached
tokens and calls per 1,000 tokens read. ``sharing`` shows what the session workers' shared request
head would cost instead (the shared-prefix layout): the project tool's schema added to every session worker's
request, against the head it would let this stage's one request share.

Usage (from the repository root):

    .venv/bin/python bench/cost/project_stage.py
    .venv/bin/python bench/cost/project_stage.py --json
    .venv/bin/python bench/cost/project_stage.py --sessions examples/sessions/*.jsonl
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from fake_openai import FakeOpenAI, PrefixCache, Reply, prompt_text, text  # noqa: E402

_REFLECTION = re.compile(r"^\[([0-9a-f]{12})\] reflection: (.+)$", re.MULTILINE)
_CRITICAL = re.compile(r"^\[([0-9a-f]{12})\] \S+ \S+ \[critical\] (.+)$", re.MULTILINE)


def distiller(body: dict) -> Reply:
    """One project reflection per session reflection shown (at most 8), citing it and up to two
    critical observations; nothing when no reflection is shown."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return text("Recorded.")
    user = messages[1]["content"]
    new = user[-1]["text"] if isinstance(user, list) else user
    reflections = _REFLECTION.findall(new)
    critical = [i for i, _ in _CRITICAL.findall(new)]
    items = [{"content": f"Across sessions: {content}", "supportingIds": [rid, *critical[:2]]}
             for rid, content in reflections[:8]]
    if not items:
        return text("Nothing here holds beyond its session.")
    return Reply(tool_calls=[("record_project_reflections", {"reflections": items})])


def tokens(text_value: str) -> int:
    return math.ceil(len(text_value) / 4)


def parts(body: dict) -> dict[str, int]:
    """The request's tokens by part, as the fake server bills them."""
    tools = tokens(json.dumps(body.get("tools") or [], sort_keys=True, ensure_ascii=False))
    system = tokens(body["messages"][0]["content"])
    user = body["messages"][1]["content"]
    whole = "".join(p.get("text", "") for p in user) if isinstance(user, list) else user
    memory, _, new = whole.partition("## Task")  # the project memory block, then the task and what is new
    rest = tokens(prompt_text({"messages": body["messages"][2:]})) if len(body["messages"]) > 2 else 0
    return {"tools": tools, "system": system, "memory": tokens(memory), "new": tokens("## Task" + new) + rest}


def run(sessions: list[Path]) -> dict[str, Any]:
    from om_core.ingest import ingest
    from om_core.project.stage import PROJECT_SYSTEM, RECORD_PROJECT_REFLECTIONS_TOOL, run_project_stages
    from om_core.workers.prompts import WORKER_SYSTEM, WORKER_TOOLS
    from om_core.store.repository import list_projects
    from om_core.replay.engine import replay_session
    from om_core.settings import Settings
    from om_core.workers.run_config import ModelConfig, make_brain
    from om_core.store.workspace import Workspace

    cache = PrefixCache()
    stages: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(responder=distiller) as server:
        db = Path(tmp) / "om.duckdb"
        settings = Settings()
        ws = Workspace.open(db, settings=settings)
        offline = make_brain(ModelConfig(model="offline"), settings)
        model = make_brain(ModelConfig(model="openai/fake-model", api_base=server.base_url, api_key="k"), settings)
        for path in sessions:
            sid = ingest(ws, [path]).files[0].session_id
            replay_session(ws, sid, offline, run_id="bench-offline")
            with ws.read() as con:
                (project,) = [p for p in list_projects(con) if p.sessions]  # the samples share one folder
            seen = len(server.requests)
            outcomes = run_project_stages(ws, project.project_id, model, run_id="bench", force=True)
            requests = server.requests[seen:]
            for outcome in outcomes:
                mine, requests = requests[:len(outcome.calls)], requests[len(outcome.calls):]
                row = {"after": path.name, "outcome": outcome.outcome, "read": outcome.input_tokens,
                       "inputs": outcome.inputs, "calls": len(mine), "reflections": len(outcome.reflections),
                       "tools": 0, "system": 0, "memory": 0, "new": 0, "prompt": 0, "cached": 0}
                for body in mine:
                    by_part = parts(body)
                    for key, value in by_part.items():
                        row[key] += value
                    whole = prompt_text(body)
                    row["prompt"] += tokens(whole)
                    row["cached"] += cache.add(whole) // 4
                stages.append(row)
    read = sum(s["read"] for s in stages) or 1
    prompt, cached = sum(s["prompt"] for s in stages), sum(s["cached"] for s in stages)
    project_tool = tokens(json.dumps([RECORD_PROJECT_REFLECTIONS_TOOL[2]], sort_keys=True)) + tokens(
        RECORD_PROJECT_REFLECTIONS_TOOL[0] + RECORD_PROJECT_REFLECTIONS_TOOL[1])
    head = tokens(WORKER_SYSTEM) + tokens(json.dumps([t[2] for t in WORKER_TOOLS], sort_keys=True))
    return {
        "stages": stages,
        "totals": {"read_tokens": read, "prompt_tokens": prompt, "uncached_tokens": prompt - cached,
                   "prompt_per_1k_read": round(1000 * prompt / read, 1),
                   "uncached_per_1k_read": round(1000 * (prompt - cached) / read, 1),
                   "calls_per_1k_read": round(1000 * sum(s["calls"] for s in stages) / read, 2),
                   "system_tokens": tokens(PROJECT_SYSTEM)},
        "sharing": {"project_tool_tokens_per_session_request": project_tool,
                    "session_worker_head_tokens": head,
                    "break_even_session_requests_per_project_call": round(head / max(project_tool, 1), 1)},
    }


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--sessions", nargs="+", type=Path, default=harness.SAMPLES)
    args = parser.parse_args()
    missing = [str(p) for p in args.sessions if not p.is_file()]
    if missing:
        sys.exit(f"missing session files: {', '.join(missing)}")
    report = run(args.sessions)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    cols = ["after", "outcome", "inputs", "read", "calls", "reflections", "tools", "system", "memory", "new",
            "prompt", "cached"]
    print("\t".join(cols))
    for s in report["stages"]:
        print("\t".join(str(s[c]) if not isinstance(s[c], float) else f"{s[c]:g}" for c in cols))
    t, sh = report["totals"], report["sharing"]
    print(f"\nper 1,000 tokens of session memory read ({t['read_tokens']:g}): prompt {t['prompt_per_1k_read']}, "
          f"uncached {t['uncached_per_1k_read']}, calls {t['calls_per_1k_read']} (system prompt {t['system_tokens']} "
          "tokens)")
    print(f"sharing the session workers' head instead: +{sh['project_tool_tokens_per_session_request']} tokens on every "
          f"session worker request to share a {sh['session_worker_head_tokens']}-token head on one project call "
          f"(worth it below {sh['break_even_session_requests_per_project_call']} session requests per project call)")


if __name__ == "__main__":
    main()
