"""The model layer: one chat-completion call through litellm, classified errors, retries, and a
record of every call (the ``llm_calls`` view).

litellm is imported only when a model is actually called (it takes seconds to import), with its
cost map read from the package itself so nothing is downloaded at run time.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

from om_core.errors import OmError

ErrorKind = Literal["transient", "permanent"]
OFFLINE = "offline"

# Pi's thinking levels mapped to litellm's reasoning_effort (None: do not ask for reasoning).
REASONING_EFFORT: dict[str, str | None] = {
    "off": None, "minimal": "minimal", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high",
}


class ModelError(OmError):
    """A model/API failure. Never "nothing to record": the stage fails and appends nothing."""

    kind: ErrorKind = "permanent"

    def __init__(self, message: str, kind: ErrorKind, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.kind == "transient"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text, exactly as the model sent it


@dataclass
class ChatReply:
    text: str | None
    tool_calls: list[ToolCall]
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cost: float | None = None


@dataclass
class CallRecord:
    """One row of ``model_calls``."""

    model: str
    turn: int
    attempt: int
    started_at: datetime
    latency_ms: float
    status: Literal["ok", "error"]
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    cost: float | None = None
    error_kind: ErrorKind | None = None
    error: str | None = None
    call_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])


class ChatModel(Protocol):
    name: str

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], turn: int) -> ChatReply: ...


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter for transient errors; permanent ones fail at once."""

    attempts: int = 4
    base_seconds: float = 1.0
    max_seconds: float = 30.0
    sleep: Callable[[float], None] = time.sleep

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.max_seconds, self.base_seconds * 2 ** (attempt - 1)))


_MISSING_CREDENTIALS = re.compile(r"missing credentials|api[_ ]key\b.{0,40}\bmust be set|no api key provided|"
                                  r"incorrect api key|invalid api key", re.IGNORECASE)


def classify(exc: BaseException) -> ModelError:
    """Map a litellm/httpx failure to transient (retry) or permanent (fail the stage now)."""
    if isinstance(exc, ModelError):
        return exc
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    message = f"{name}: {str(exc).strip()[:500]}"
    permanent_names = {"AuthenticationError", "PermissionDeniedError", "BadRequestError", "NotFoundError",
                       "ContextWindowExceededError", "UnprocessableEntityError", "UnsupportedParamsError",
                       "ContentPolicyViolationError", "InvalidRequestError", "BudgetExceededError"}
    transient_names = {"RateLimitError", "Timeout", "APIConnectionError", "InternalServerError",
                       "ServiceUnavailableError", "BadGatewayError", "ConnectError", "ReadTimeout",
                       "ConnectTimeout", "RemoteProtocolError", "ReadError", "TimeoutException"}
    mro = {cls.__name__ for cls in type(exc).__mro__}
    if mro & {"ContextWindowExceededError", "AuthenticationError"} or _MISSING_CREDENTIALS.search(message):
        # litellm reports a missing key as a 500 from the provider; retrying cannot help
        return ModelError(message, "permanent", status)
    if mro & transient_names:
        return ModelError(message, "transient", status)
    if isinstance(status, int):
        if status in (408, 409, 425, 429) or status >= 500:
            return ModelError(message, "transient", status)
        return ModelError(message, "permanent", status)
    if mro & permanent_names:
        return ModelError(message, "permanent", status)
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return ModelError(message, "transient", status)
    return ModelError(message, "permanent", status)


def _import_litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from om_core.tokens import litellm_tokenizer_dir

    bundled = litellm_tokenizer_dir()
    if bundled is not None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(bundled))
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


class LiteLLMModel:
    """Any model litellm reaches: ``openai/…``, ``anthropic/…``, ``openrouter/…``, ``ollama/…``, or an
    OpenAI-compatible server at ``api_base``. Each attempt is recorded through ``record``."""

    def __init__(self, model: str, *, api_base: str | None = None, api_key: str | None = None,
                 thinking: str = "off", timeout: float = 120.0, stream: bool = False,
                 retry: RetryPolicy | None = None, record: Callable[[CallRecord], None] | None = None,
                 gate: Callable[[], Any] | None = None) -> None:
        if api_base and "/" not in model:
            model = f"openai/{model}"  # an OpenAI-compatible server
        self.name = model
        self.api_base = api_base
        self.api_key = api_key
        self.thinking = thinking
        self.timeout = timeout
        self.stream = stream
        self.retry = retry or RetryPolicy()
        self.record = record or (lambda _: None)
        self.gate = gate  # a context-manager factory around each call (the pipeline's global limit)
        self._litellm = None

    def _kwargs(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"model": self.name, "messages": messages, "timeout": self.timeout,
                                  "num_retries": 0, "max_retries": 0, "drop_params": True}
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto"
        if self.api_base:
            kwargs["api_base"] = self.api_base
            kwargs["api_key"] = self.api_key or os.environ.get("OM_API_KEY") or "not-needed"
        elif self.api_key:
            kwargs["api_key"] = self.api_key
        effort = REASONING_EFFORT.get(self.thinking)
        if effort is not None:
            try:
                if self._litellm.supports_reasoning(model=self.name):
                    kwargs["reasoning_effort"] = effort
            except Exception:  # unknown model: litellm cannot tell, so do not ask
                pass
        if self.stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        return kwargs

    def _once(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ChatReply:
        litellm = self._litellm
        response = litellm.completion(**self._kwargs(messages, tools))
        if self.stream:
            chunks = list(response)
            response = litellm.stream_chunk_builder(chunks, messages=messages)
        choice = response.choices[0].message
        calls = [ToolCall(id=c.id or f"call_{i}", name=c.function.name or "", arguments=c.function.arguments or "")
                 for i, c in enumerate(getattr(choice, "tool_calls", None) or [])]
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None) if usage else None
        try:
            cost = float(litellm.completion_cost(completion_response=response))
        except Exception:  # a model litellm has no price for
            cost = None
        return ChatReply(
            text=choice.content if isinstance(choice.content, str) else None,
            tool_calls=calls,
            input_tokens=getattr(usage, "prompt_tokens", None),
            output_tokens=getattr(usage, "completion_tokens", None),
            cached_tokens=getattr(details, "cached_tokens", None) if details else None,
            cost=cost,
        )

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], turn: int) -> ChatReply:
        if self._litellm is None:
            self._litellm = _import_litellm()
        attempt = 0
        while True:
            attempt += 1
            started = datetime.now(timezone.utc)
            t0 = time.perf_counter()
            try:
                if self.gate is None:
                    reply = self._once(messages, tools)
                else:
                    with self.gate():
                        reply = self._once(messages, tools)
            except Exception as exc:  # classified below; nothing escapes unclassified
                error = classify(exc)
                self.record(CallRecord(model=self.name, turn=turn, attempt=attempt, started_at=started,
                                       latency_ms=(time.perf_counter() - t0) * 1000, status="error",
                                       error_kind=error.kind, error=str(error)))
                if error.retryable and attempt < self.retry.attempts:
                    self.retry.sleep(self.retry.delay(attempt))
                    continue
                raise error from None
            self.record(CallRecord(model=self.name, turn=turn, attempt=attempt, started_at=started,
                                   latency_ms=(time.perf_counter() - t0) * 1000, status="ok",
                                   input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                                   cached_tokens=reply.cached_tokens, cost=reply.cost))
            return reply


def tool_schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def parse_arguments(raw: str) -> tuple[Any, str | None]:
    """(arguments, error) for a tool call's raw JSON arguments."""
    try:
        return json.loads(raw or "{}"), None
    except ValueError as exc:
        return None, f"the arguments were not valid JSON ({exc}); send the call again with valid JSON"
