"""`om logs`: the model calls, newest first, like `llm logs`, from ``llm_calls`` and, with their
request and response text, ``llm_call_texts``. A read path: no litellm, no Prefect."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from om_core.store.catalog import resolve_session
from om_core.store.db import named_column, rows_as_dicts
from om_core.errors import InvalidArgument
from om_core.store.sqlfiles import query

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

WORKER_STAGES = ("observer", "reflector", "dropper", "reflection-dropper")


class ModelCallLog(BaseModel):
    started_at: datetime
    session_id: str | None
    stage: str | None
    model: str
    status: str
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None
    cost: float | None
    latency_ms: float
    call_id: str
    run_id: str | None
    turn: int
    attempt: int
    error_kind: str | None
    error: str | None
    request: Any = None  # with full=True: what was sent ({"model", "messages", "tools"})
    response: Any = None  # with full=True: the reply ({"content", "tool_calls"}); None for a failed call
    text_stored: bool = True  # False: the call's text was not kept (storePrompts off, or an older call)


def model_call_log(ws: Workspace, *, session: str | None = None, stage: str | None = None,
                   limit: int = 20, full: bool = False) -> list[ModelCallLog]:
    """The model calls, newest first; ``limit`` 0 means all."""
    if limit < 0:
        raise InvalidArgument("--limit must be 0 (all) or more")
    with ws.read() as con:
        session_id = None
        if session is not None:
            session_id = resolve_session(con, session)
        if stage is not None:
            known = sorted(set(WORKER_STAGES) | set(named_column(con, "model_call_stages")))
            if stage not in known:
                raise InvalidArgument(f"unknown --stage {stage!r}: use {', '.join(known)}")
        rows = rows_as_dicts(con.execute(query("model_call_log"), {
            "session_id": session_id, "stage": stage, "limit": limit or None, "full": full}))
    calls = []
    for row in rows:
        if full:
            row["text_stored"] = row["request"] is not None
            row["request"] = json.loads(row["request"]) if row["request"] else None
            row["response"] = json.loads(row["response"]) if row["response"] else None
        calls.append(ModelCallLog(**row))
    return calls
