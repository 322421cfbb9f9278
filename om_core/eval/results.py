"""The files of one condition in ``--out``: what makes a run resumable.

``DIR/CONDITION/``
* ``hypotheses.jsonl``: ``{"question_id", "hypothesis"}`` per answered question, the official
  evaluator's input (one line per question; a rerun appends only the missing ones);
* ``results.jsonl``: per question, how its context was made (summary size, kept turns, tokens,
  notes), its wall time, or why it was skipped;
* ``judged.jsonl``: the approximate judge's verdict per question, with the judge model (a rerun
  with another judge grades again);
* ``config.json``: what the hypotheses depend on (models, settings); a rerun with other values is
  refused rather than mixing two runs in one file.

Lines are written whole and flushed one by one; a line cut off by a crash is dropped on reading.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from om_core.errors import OmError


class HypothesisLine(BaseModel):
    """One line of the official hypotheses file."""

    model_config = ConfigDict(extra="forbid")

    question_id: str
    hypothesis: str


class JudgedLine(BaseModel):
    """One verdict of the built-in judge, with the answer it graded."""

    model_config = ConfigDict(extra="allow")

    question_id: str
    judge: str
    verdict: bool | None
    hypothesis: str


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every whole JSON object line; a torn last line (no newline) is cut off the file."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    rows = []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class ConditionFiles:
    def __init__(self, out: Path, condition: str) -> None:
        self.condition = condition
        self.dir = out / condition
        self.hypotheses_path = self.dir / "hypotheses.jsonl"
        self.results_path = self.dir / "results.jsonl"
        self.judged_path = self.dir / "judged.jsonl"
        self.config_path = self.dir / "config.json"
        self._lock = threading.Lock()
        self.hypotheses: dict[str, str] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.judged: dict[str, dict[str, Any]] = {}

    def open(self, config: dict[str, Any]) -> ConditionFiles:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.config_path.is_file():
            before = json.loads(self.config_path.read_text())
            changed = sorted(k for k in set(before) | set(config) if before.get(k) != config.get(k))
            if changed and self.hypotheses_path.is_file() and self.hypotheses_path.stat().st_size:
                detail = ", ".join(f"{k}: {before.get(k)!r} then, {config.get(k)!r} now" for k in changed[:4])
                raise OmError(f"{self.dir} holds hypotheses made with other settings ({detail}); "
                              "use another --out, or remove that folder to start the condition again")
        self.config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for row in read_jsonl(self.hypotheses_path):
            try:
                line = HypothesisLine.model_validate(row)
            except ValidationError:
                continue  # not ours to fix; a rerun answers that question again
            self.hypotheses.setdefault(line.question_id, line.hypothesis)  # the first line is the one kept
        for row in read_jsonl(self.results_path):
            if isinstance(row.get("question_id"), str):
                self.results[row["question_id"]] = row
        for row in read_jsonl(self.judged_path):
            try:
                self.judged[row["question_id"]] = JudgedLine.model_validate(row).model_dump()
            except (ValidationError, KeyError):
                continue
        return self

    def _append(self, path: Path, row: dict[str, Any]) -> None:
        line = json.dumps(row, ensure_ascii=False, default=str) + "\n"
        with path.open("a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()

    def add_answer(self, question_id: str, hypothesis: str, result: dict[str, Any]) -> None:
        with self._lock:
            if question_id not in self.hypotheses:
                self._append(self.hypotheses_path, HypothesisLine(question_id=question_id,
                                                                  hypothesis=hypothesis).model_dump())
                self.hypotheses[question_id] = hypothesis
            row = {"question_id": question_id, "status": "answered", **result}
            self._append(self.results_path, row)
            self.results[question_id] = row

    def add_skip(self, question_id: str, result: dict[str, Any]) -> None:
        with self._lock:
            row = {"question_id": question_id, "status": "skipped", **result}
            if self.results.get(question_id, {}).get("skipped") != row.get("skipped"):
                self._append(self.results_path, row)
            self.results[question_id] = row

    def add_judgement(self, question_id: str, row: dict[str, Any]) -> None:
        with self._lock:
            row = JudgedLine(question_id=question_id, **row).model_dump()
            self._append(self.judged_path, row)
            self.judged[question_id] = row

    def verdict(self, question_id: str, judge_model: str | None) -> dict[str, Any] | None:
        row = self.judged.get(question_id)
        if row is None or judge_model is None or row.get("judge") != judge_model:
            return None
        if row.get("hypothesis") != self.hypotheses.get(question_id):
            return None  # graded another answer
        return row
