"""The public LongMemEval file: a JSON list of instances, each validated on its own.

A bad instance (a missing field, lists of different lengths, a date that does not parse, a turn
without a role) is reported with its index and reason and skipped; the rest of the file goes on.
Labels (``has_answer`` on turns, ``answer_session_ids``, the answer) are kept here for the oracle
selection and the judge's answer key only; nothing else reads them.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from om_core.errors import OmError

QUESTION_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference",
                  "multi-session", "temporal-reasoning", "knowledge-update")

# "2023/05/20 (Sat) 02:21" as LongMemEval writes it; the weekday is optional, seconds are allowed.
_DATE = re.compile(r"^\s*(\d{4})[/-](\d{1,2})[/-](\d{1,2})(?:\s*\(\w+\))?(?:[ T]+(\d{1,2}):(\d{2})(?::(\d{2}))?)?\s*$")


def parse_date(value: str) -> datetime:
    """A LongMemEval date as an aware UTC datetime (the data set gives no zone; UTC is our convention)."""
    match = _DATE.match(value)
    if not match:
        raise ValueError(f"date {value!r} is not like '2023/05/20 (Sat) 02:21'")
    y, mo, d, h, mi, s = (int(g) if g else 0 for g in match.groups())
    return datetime(y, mo, d, h, mi, s, tzinfo=timezone.utc)


class Turn(BaseModel):
    model_config = ConfigDict(extra="allow")  # has_answer and anything newer stay here, never sent

    role: Literal["user", "assistant"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return "" if value is None else value


class Instance(BaseModel):
    model_config = ConfigDict(extra="ignore")

    question_id: str = Field(min_length=1)
    question_type: str = Field(min_length=1)
    question: str = Field(min_length=1)
    answer: str
    question_date: str
    haystack_session_ids: list[str]
    haystack_dates: list[str]
    haystack_sessions: list[list[Turn]]
    answer_session_ids: list[str] = Field(default_factory=list)

    @field_validator("answer", mode="before")
    @classmethod
    def _answer_text(cls, value: Any) -> Any:
        # some answers in the public file are numbers
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @field_validator("haystack_session_ids", "answer_session_ids", mode="before")
    @classmethod
    def _ids_text(cls, value: Any) -> Any:
        return [str(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _consistent(self) -> Instance:
        n = len(self.haystack_sessions)
        if not n:
            raise ValueError("haystack_sessions is empty")
        if len(self.haystack_session_ids) != n or len(self.haystack_dates) != n:
            raise ValueError(f"haystack_session_ids ({len(self.haystack_session_ids)}), haystack_dates "
                             f"({len(self.haystack_dates)}) and haystack_sessions ({n}) differ in length")
        for value in [*self.haystack_dates, self.question_date]:
            parse_date(value)
        if not any(self.haystack_sessions):
            raise ValueError("the haystack has no turns at all")
        return self

    @property
    def abstention(self) -> bool:
        return "_abs" in self.question_id  # as the official scripts test it

    @property
    def asked_at(self) -> datetime:
        return parse_date(self.question_date)


class InvalidInstance(BaseModel):
    index: int
    question_id: str | None
    reason: str


class Dataset(BaseModel):
    path: str
    instances: list[Instance]
    invalid: list[InvalidInstance] = Field(default_factory=list)
    duplicates: list[str] = Field(default_factory=list)


def _reason(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(p) for p in error["loc"]) or "instance"
        parts.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def load_dataset(path: str | Path) -> Dataset:
    """Read and validate the file. Only an unreadable file, or one that is not a JSON list, is an error."""
    path = Path(path)
    if not path.is_file():
        raise OmError(f"no LongMemEval file at {path} (download it first; nothing is fetched at run time)")
    try:
        with path.open("rb") as fh:
            data = json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OmError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise OmError(f"{path} is not a LongMemEval file: expected a JSON list of instances")
    out = Dataset(path=str(path), instances=[])
    seen: set[str] = set()
    for index, item in enumerate(data):
        qid = item.get("question_id") if isinstance(item, dict) else None
        try:
            instance = Instance.model_validate(item)
        except ValidationError as exc:
            out.invalid.append(InvalidInstance(index=index, question_id=qid if isinstance(qid, str) else None,
                                               reason=_reason(exc)))
            continue
        except ValueError as exc:
            out.invalid.append(InvalidInstance(index=index, question_id=qid if isinstance(qid, str) else None,
                                               reason=str(exc)))
            continue
        if instance.question_id in seen:  # the first one wins; a second would overwrite its answers
            out.duplicates.append(instance.question_id)
            out.invalid.append(InvalidInstance(index=index, question_id=instance.question_id,
                                               reason="duplicate question_id (the first instance is used)"))
            continue
        seen.add(instance.question_id)
        out.instances.append(instance)
    return out


def select(instances: list[Instance], types: list[str] | None = None, limit: int | None = None) -> list[Instance]:
    chosen = [i for i in instances if not types or i.question_type in types]
    return chosen[:limit] if limit is not None else chosen


def require_known_types(instances: list[Instance]) -> None:
    """Refuse questions of a type the official metrics do not know (their script fails on one), before
    anything is asked: a score over them could not be compared with any published one."""
    unknown = [i for i in instances if i.question_type not in QUESTION_TYPES]
    if unknown:
        shown = ", ".join(f"{i.question_id} ({i.question_type!r})" for i in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise OmError(f"{len(unknown)} question(s) of a type the official LongMemEval metrics do not know: "
                      f"{shown}{more}; known types: {', '.join(QUESTION_TYPES)} (fix the file, or choose "
                      "known ones with --types)")
