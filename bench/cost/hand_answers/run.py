#!/usr/bin/env python3
"""The workers' requests on a real session, answered by hand: what each request shows, and what the
checks say of an answer written as a careful model would (and of its careless variants).

The session is ingested into a fresh DuckDB; then, one stage at a time through the one stage runner
(``observe_now`` / ``reflect_now``), the model workers talk through litellm to the fake
OpenAI-compatible server (tests/fake_openai.py), which answers each request from an answers file
(JSON): ``{"observer": [turns, turns], "reflector": [turns], "dropper": [turns]}``, where ``turns`` is
the list of tool-call arguments sent turn after turn (a receipt that rejects an item gets the next
one; none left: a plain "done"). Each request is written to ``--out`` (``observer-1.txt``, …) with
every receipt it got, so an answer can be written after reading its request and checked by running
again. Stages with no answers left are asked once and answered with a plain "done" (nothing is
recorded; their request is still written).

Usage (from the repository root):

    .venv/bin/python bench/cost/hand_answers/run.py --answers bench/cost/hand_answers/careful.json --out /tmp/hand
    .venv/bin/python bench/cost/hand_answers/run.py --answers bench/cost/hand_answers/careless.json --out /tmp/hand-careless
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from fake_openai import FakeOpenAI, Reply, text, tool_call  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.replay.stage_runner import observe_now, reflect_now  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402
from om_core.workers.prompts import RECORD_OBSERVATIONS_TOOL, RECORD_REFLECTIONS_TOOL, DROP_OBSERVATIONS_TOOL  # noqa: E402

SESSION = harness.SAMPLES[0]
TOOLS = {"observer": RECORD_OBSERVATIONS_TOOL[0], "reflector": RECORD_REFLECTIONS_TOOL[0],
         "dropper": DROP_OBSERVATIONS_TOOL[0]}


class HandAnswers:
    """A responder for FakeOpenAI: the next turn of the answers for the request's stage (by its task)."""

    TASKS = {"## Task: observe": "observer", "## Task: reflect": "reflector", "## Task: drop": "dropper"}

    def __init__(self) -> None:
        self.turns: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, body: dict) -> Reply:
        user = request_text({"messages": body["messages"][:2]})
        stage = next(s for task, s in self.TASKS.items() if task in user)
        queue = self.turns.get(stage) or []
        if not queue:
            return text("done")
        return tool_call(TOOLS[stage], queue.pop(0))


def request_text(body: dict) -> str:
    parts = []
    for m in body["messages"][1:]:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content)
        if m["role"] == "assistant":
            content = json.dumps([c["function"] for c in m.get("tool_calls") or []], ensure_ascii=False)
        parts.append(f"----- {m['role']}\n{content}")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__, json_flag=False)
    parser.add_argument("--session", type=Path, default=SESSION)
    parser.add_argument("--answers", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", action="append", default=["observationsPoolTargetTokens=300"],
                        metavar="KEY=VALUE", help="a setting (default: a pool target low enough for the dropper)")
    args = parser.parse_args(argv)
    answers = json.loads(args.answers.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(**{k: int(v) if v.isdigit() else v for k, v in (s.split("=", 1) for s in args.set)})
    with harness.work_dir("om-hand-") as work:
        return answer(args, answers, settings, work / "om.duckdb")


def answer(args: argparse.Namespace, answers: dict[str, Any], settings: Settings, db: Path) -> int:
    ingest(Workspace.open(db, settings=settings), [args.session])
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        [(sid,)] = con.execute("SELECT session_id FROM sessions").fetchall()
    responder = HandAnswers()
    server = FakeOpenAI(responder=responder)
    server.start()
    config = harness.fake_model_config(server.base_url)
    summary = []
    try:
        for n, turns in enumerate(answers.get("observer", []), start=1):
            responder.turns = {"observer": list(turns)}
            seen = len(server.requests)
            outcome = observe_now(Workspace.open(db, settings=settings), sid, None, config)
            summary.append(report(f"observer-{n}", outcome, server.requests[seen:], args.out))
        if "reflector" in answers:
            responder.turns = {"reflector": list(answers["reflector"]), "dropper": list(answers.get("dropper", []))}
            seen = len(server.requests)
            outcomes = reflect_now(Workspace.open(db, settings=settings), sid, None, config)
            for outcome in outcomes:
                task = {"reflector": "## Task: reflect", "dropper": "## Task: drop"}[outcome.stage]
                summary.append(report(f"{outcome.stage}-1", outcome,
                                      [b for b in server.requests[seen:] if task in request_text(b)], args.out))
    finally:
        server.stop()
    print(json.dumps(summary, indent=1, ensure_ascii=False))
    return 0


def report(name: str, outcome: Any, requests: list[dict], out: Path) -> dict[str, Any]:
    (out / f"{name}.txt").write_text("\n\n".join(request_text(b) for b in requests[:1]) + "\n\n===== receipts\n"
                                     + "\n\n".join(outcome.receipts))
    return {"request": name, "outcome": outcome.outcome, "items": outcome.items, "rejected": outcome.rejected,
            "duplicates": outcome.duplicates, "turns": outcome.turns, "receipts": outcome.receipts}


if __name__ == "__main__":
    raise SystemExit(main())
