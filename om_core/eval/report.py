"""Scores, cost and time of an evaluation: ``DIR/report.json`` and a short ``DIR/report.html``.

Scores come from the built-in judge, which is approximate (our own prompt, not the official
evaluator), but are computed as the official ``print_qa_metrics.py`` computes them: per question
type the mean of its verdicts, the per-question average over all judged questions ("Overall
Accuracy"), the mean of the type averages ("Task-averaged Accuracy", the headline Mastra reports),
and abstention over the questions whose id contains ``_abs`` (which also count in their type). The
figures are exact; only the page rounds them. Tokens, calls and cost come from ``llm_calls``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from om_core.store.db import rows_as_dicts
from om_core.eval.data import QUESTION_TYPES, Instance
from om_core.eval.haystack import session_id_for
from om_core.eval.results import ConditionFiles
from om_core.store.sqlfiles import query

JUDGE_LABEL = "approximate: the built-in judge (our own prompt), not the official LongMemEval evaluator"
_WORKER_STAGES = {"observer", "reflector", "dropper", "reflection-dropper"}


def _ratio(correct: int, total: int) -> float | None:
    return correct / total if total else None


def scores(instances: Iterable[Instance], verdicts: dict[str, bool | None]) -> dict[str, Any]:
    """Per-type, per-question and mean-of-type scores over the judged questions of ``instances``."""
    by_type: dict[str, dict[str, int]] = {}
    abstention = {"questions": 0, "correct": 0}
    total = correct = 0
    for inst in instances:
        if inst.question_id not in verdicts:
            continue
        ok = int(verdicts[inst.question_id] is True)
        row = by_type.setdefault(inst.question_type, {"questions": 0, "correct": 0})
        row["questions"] += 1
        row["correct"] += ok
        total += 1
        correct += ok
        if inst.abstention:
            abstention["questions"] += 1
            abstention["correct"] += ok
    order = [t for t in QUESTION_TYPES if t in by_type] + sorted(t for t in by_type if t not in QUESTION_TYPES)
    types = {t: {**by_type[t], "accuracy": _ratio(by_type[t]["correct"], by_type[t]["questions"])} for t in order}
    type_averages = [v["accuracy"] for v in types.values() if v["accuracy"] is not None]
    return {
        "judged": total,
        "correct": correct,
        "per_question_average": _ratio(correct, total),
        # over the types judged (the official script averages its six; a run of fewer types would be nan there)
        "mean_of_type_averages": sum(type_averages) / len(type_averages) if type_averages else None,
        "by_type": types,
        "abstention": {**abstention, "accuracy": _ratio(abstention["correct"], abstention["questions"])},
    }


def _empty_usage() -> dict[str, Any]:
    return {"calls": 0, "failed_calls": 0, "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0,
            "cost": None, "latency_seconds": 0.0}


def _add(usage: dict[str, Any], row: dict[str, Any]) -> None:
    for key in ("calls", "failed_calls", "input_tokens", "output_tokens", "cached_tokens"):
        usage[key] += int(row[key] or 0)
    if row["cost"] is not None:
        usage["cost"] = round((usage["cost"] or 0.0) + float(row["cost"]), 6)
    usage["latency_seconds"] = round(usage["latency_seconds"] + float(row["latency_ms"] or 0) / 1000, 3)


def usage_by_condition(db: Any, instances: list[Instance], conditions: list[str]) -> dict[str, dict[str, Any]]:
    """Calls, tokens and cost per condition and part (memory, reader, judge), from ``llm_calls``."""
    ids = [session_id_for(i.question_id) for i in instances]
    out = {c: {"memory": _empty_usage(), "reader": _empty_usage(), "judge": _empty_usage(),
               "total": _empty_usage()} for c in conditions}
    if db is None or not ids:
        return out
    with db.read() as con:
        rows = rows_as_dicts(con.execute(query("eval_call_totals"), {"session_ids": ids}))
    for row in rows:
        stage = row["stage"] or ""
        if stage in _WORKER_STAGES:  # the om memory, whichever om column this report has
            condition, part = next((c for c in ("om", "om-recall") if c in out), "om"), "memory"
        elif stage.count(":") == 1:
            part, condition = stage.split(":")
            part = "memory" if part == "native" else part
        else:
            continue
        if condition in out and part in out[condition]:
            _add(out[condition][part], row)
            _add(out[condition]["total"], row)
    return out


def build_report(instances: list[Instance], files: dict[str, ConditionFiles], db: Any, *, judge_model: str | None,
                 run: dict[str, Any]) -> dict[str, Any]:
    usage = usage_by_condition(db, instances, list(files))
    conditions: dict[str, Any] = {}
    for name, f in files.items():
        wanted = [i.question_id for i in instances]
        answered = [q for q in wanted if q in f.hypotheses]
        skipped = [q for q in wanted if q not in f.hypotheses and f.results.get(q, {}).get("status") == "skipped"]
        verdicts = {q: row["verdict"] for q in answered if (row := f.verdict(q, judge_model)) is not None}
        seconds = [float(f.results[q].get("seconds") or 0) for q in answered if q in f.results]
        tokens = [int(f.results[q].get("context_tokens") or 0) for q in answered if q in f.results]
        summaries = [int(f.results[q]["summary_chars"]) for q in answered
                     if f.results.get(q, {}).get("summary_chars") is not None]
        total_seconds = round(sum(seconds), 3)
        conditions[name] = {
            "questions": len(wanted), "answered": len(answered), "skipped": len(skipped),
            "missing": len(wanted) - len(answered) - len(skipped),
            "skipped_reasons": {q: f.results[q].get("skipped") for q in skipped[:20]},
            "hypotheses": str(f.hypotheses_path),
            "scores": scores(instances, verdicts) if judge_model else None,
            "unparsed_verdicts": sum(1 for v in verdicts.values() if v is None),
            "context_tokens_mean": round(sum(tokens) / len(tokens)) if tokens else None,
            "summary_chars_median": sorted(summaries)[len(summaries) // 2] if summaries else None,
            "wall_seconds": {"total": total_seconds,
                             "per_question": round(total_seconds / len(seconds), 3) if seconds else None},
            "usage": usage[name],
        }
    return {"benchmark": "LongMemEval", "judge": judge_model, "judge_note": JUDGE_LABEL if judge_model else
            "no judge was run (--judge off): grade the hypotheses with the official evaluator", **run,
            "conditions": conditions}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def write_report(out: Path, report: dict[str, Any]) -> tuple[Path, Path]:
    json_path = out / "report.json"
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n")
    html_path = out / "report.html"
    html_path.write_text(render_html(report))
    return json_path, html_path


def render_html(report: dict[str, Any]) -> str:
    e = html.escape
    conds = report["conditions"]
    types = list(dict.fromkeys(t for c in conds.values() if c["scores"] for t in c["scores"]["by_type"]))
    head = "".join(f"<th>{e(name)}</th>" for name in conds)

    def row(label: str, cells: Iterable[str], cls: str = "") -> str:
        return f"<tr class='{cls}'><th>{e(label)}</th>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"

    def score(c: dict[str, Any], pick) -> str:
        s = c["scores"]
        return "–" if not s else pick(s)

    rows = [row("mean of type averages", (score(c, lambda s: _pct(s["mean_of_type_averages"])) for c in conds.values()), "key"),
            row("per-question average", (score(c, lambda s: _pct(s["per_question_average"])) for c in conds.values()), "key")]
    for t in types:
        rows.append(row(t, (score(c, lambda s, t=t: f"{_pct(s['by_type'][t]['accuracy'])} "
                                                    f"<small>({s['by_type'][t]['correct']}/{s['by_type'][t]['questions']})</small>"
                                  if t in s["by_type"] else "–") for c in conds.values())))
    rows.append(row("abstention (_abs)", (score(c, lambda s: f"{_pct(s['abstention']['accuracy'])} "
                                                           f"<small>({s['abstention']['correct']}/{s['abstention']['questions']})</small>")
                                          for c in conds.values())))
    rows.append(row("answered / skipped / missing", (f"{c['answered']} / {c['skipped']} / {c['missing']}" for c in conds.values())))
    for part in ("memory", "reader", "judge", "total"):
        rows.append(row(f"{part}: calls, tokens in/out", (
            f"{c['usage'][part]['calls']}, {c['usage'][part]['input_tokens']:,} / {c['usage'][part]['output_tokens']:,}"
            for c in conds.values())))
    rows.append(row("cost (USD)", ("–" if c["usage"]["total"]["cost"] is None else f"${c['usage']['total']['cost']:.4f}"
                                   for c in conds.values())))
    rows.append(row("wall time per question", (f"{c['wall_seconds']['per_question'] or 0:.2f} s" for c in conds.values())))
    rows.append(row("reader context tokens (mean)", (str(c["context_tokens_mean"] or "–") for c in conds.values())))
    rows.append(row("summary chars (median)", (str(c["summary_chars_median"] or "–") for c in conds.values())))
    meta = "".join(f"<li>{e(k)}: {e(str(report.get(k)))}</li>" for k in
                   ("data", "model", "reader", "judge", "reader_recall", "questions", "started_at", "wall_seconds"))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>om eval longmemeval</title>
<style>body{{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}th{{text-align:left}}
tr.key td{{font-weight:bold}}.note{{color:#8a5a00}}</style></head><body>
<h1>LongMemEval: om eval</h1>
<p class="note">Scores: {e(report['judge_note'])}. For official numbers, grade each
<code>CONDITION/hypotheses.jsonl</code> with the LongMemEval evaluator.</p>
<ul>{meta}</ul>
<table><tr><th></th>{head}</tr>{''.join(rows)}</table>
</body></html>
"""
