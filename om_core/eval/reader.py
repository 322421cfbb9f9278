"""The evaluation's own model calls: the reader (optionally with ``recall``), the native-style
summarizer and the approximate judge. Each call goes through ``LiteLLMModel`` (retries, error
classes, a ``CallRecord`` per attempt) and is written to ``om_internal.llm_calls`` like the workers' calls."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from om_core.store.sqlfiles import query
from om_core.eval import prompts as P
from om_core.eval.conditions import ReaderContext, serialize
from om_core.eval.data import Instance
from om_core.eval.haystack import HistoryTurn
from om_core.model.client import CallRecord, ChatModel, parse_arguments, tool_schema
from om_core.workers.stages import CALL_COLUMNS, TEXT_COLUMNS, call_columns
from om_core.recall.evidence import recall_in_session, redacted

RECALL_TEXT_MAX_CHARS = 12_000
READER_MAX_TURNS = 8  # recall calls before the reader must answer


# ------------------------------------------------------------------ the reader


def answer(model: ChatModel, ctx: ReaderContext, recall: Callable[[str], str] | None = None,
           max_turns: int = READER_MAX_TURNS) -> tuple[str, int]:
    """(hypothesis, recall calls made). With ``recall``, the model may look ids up before answering."""
    system = P.READER_SYSTEM + (P.READER_RECALL_NOTE if recall else "")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, *ctx.messages]
    tools = [tool_schema(*P.RECALL_TOOL)] if recall else []
    recalls = 0
    for turn in range(1, max_turns + 2):
        if turn == max_turns + 1:
            messages.append({"role": "user", "content": P.READER_FINAL_TURN})
        reply = model.complete(messages, tools, turn)
        if not reply.tool_calls or recall is None or turn == max_turns + 1:
            return (reply.text or "").strip(), recalls
        messages.append({"role": "assistant", "content": reply.text or None,
                         "tool_calls": [{"id": c.id, "type": "function",
                                         "function": {"name": c.name, "arguments": c.arguments}}
                                        for c in reply.tool_calls]})
        for call in reply.tool_calls:
            args, problem = parse_arguments(call.arguments)
            if call.name != "recall":
                result = f"unknown tool {call.name!r}; the only tool is recall"
            elif problem or not isinstance(args, dict):
                result = f"rejected: {problem or 'arguments must be an object with an id'}"
            else:
                recalls += 1
                result = recall(str(args.get("id", "")))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return "", recalls  # not reached


def recall_tool(db: Any, session_id: str, tip: str) -> Callable[[str], str]:
    """``recall(id)`` over the instance's ledger (SPEC §6), as text for the reader."""

    def run(memory_id: str) -> str:
        with db.read() as con:
            result = recall_in_session(con, session_id, tip, memory_id.strip().lower())
        result = redacted(result)  # it goes to the reader model: no secret, as in the recall tool
        if result.status != "found":
            return result.message or result.status
        lines = []
        for r in result.reflections:
            lines.append(f"Reflection [{r.id}]: {r.content} (supported by {', '.join(r.supporting_observation_ids)})")
        for o in result.observations:
            lines.append(f"Observation [{o.id}] {o.ts} ({o.status}): {o.content}")
            for s in o.sources:
                lines.append(f"  [{s.role} @ {s.ts}]: {s.text}")
        text = "\n".join(lines)
        if len(text) > RECALL_TEXT_MAX_CHARS:
            text = text[:RECALL_TEXT_MAX_CHARS] + f"\n[… {len(text) - RECALL_TEXT_MAX_CHARS} characters cut]"
        return text

    return run


# ------------------------------------------------------------------ the native-style summary


def _estimate(turn: HistoryTurn) -> int:
    return math.ceil(len(turn.content) / 4) + 10


def native_summary(model: ChatModel, turns: list[HistoryTurn], budget_tokens: int) -> tuple[str, int]:
    """(summary, model calls): one call over the history, or, when it is longer than
    ``budget_tokens``, a first summary updated chunk by chunk (as Pi updates its previous summary)."""
    chunks: list[list[HistoryTurn]] = [[]]
    used = 0
    for t in turns:
        cost = _estimate(t)
        if chunks[-1] and used + cost > budget_tokens:
            chunks.append([])
            used = 0
        chunks[-1].append(t)
        used += cost
    summary: str | None = None
    calls = 0
    for chunk in chunks:
        text = f"<conversation>\n{serialize(chunk)}\n</conversation>\n\n"
        if summary is None:
            text += P.NATIVE_SUMMARY_INSTRUCTIONS
        else:
            text += f"<previous-summary>\n{summary}\n</previous-summary>\n\n{P.NATIVE_UPDATE_INSTRUCTIONS}"
        calls += 1
        reply = model.complete([{"role": "system", "content": P.NATIVE_SUMMARY_SYSTEM},
                                {"role": "user", "content": text}], [], calls)
        summary = (reply.text or "").strip() or summary
    return summary or "", calls


# ------------------------------------------------------------------ the judge


@dataclass
class Judgement:
    verdict: bool | None  # None: the judge's reply was neither yes nor no (scored as not correct)
    text: str


_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_verdict(text: str) -> bool | None:
    match = _YES_NO.search(text or "")
    return None if match is None else match.group(1).lower() == "yes"


def judge(model: ChatModel, instance: Instance, hypothesis: str) -> Judgement:
    """Our approximate judge (not the official evaluator): the answer key reaches this model only."""
    user = P.judge_message(instance.question, instance.answer, hypothesis, instance.question_type,
                           instance.abstention)
    reply = model.complete([{"role": "system", "content": P.JUDGE_SYSTEM}, {"role": "user", "content": user}], [], 1)
    text = (reply.text or "").strip()
    return Judgement(parse_verdict(text), text[:500])


# ------------------------------------------------------------------ call records


@dataclass
class CallLog:
    """Collects one task's call records; ``write`` puts them in ``om_internal.llm_calls`` with their stage."""

    records: list[tuple[str, CallRecord]] = field(default_factory=list)

    def recorder(self, stage: str) -> Callable[[CallRecord], None]:
        return lambda record: self.records.append((stage, record))

    def write(self, db: Any, session_id: str, run_id: str) -> None:
        if not self.records:
            return
        rows = [r for _, r in self.records]
        calls = call_columns(rows, CALL_COLUMNS, run_id=run_id, stage_run_id=None, session_id=session_id)
        calls["run_id"] = [run_id] * len(rows)
        calls["stage"] = [stage for stage, _ in self.records]
        texts = [r for r in rows if r.request is not None]  # kept when storePrompts is on (om logs --full)
        with db.write() as con:
            con.execute(query("insert_model_calls"), calls)
            if texts:
                text_params = call_columns(texts, TEXT_COLUMNS, run_id=run_id)
                text_params["run_id"] = [run_id] * len(texts)
                con.execute(query("insert_model_call_texts"), text_params)
        self.records.clear()


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
