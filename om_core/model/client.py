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
    """A model/API failure. Never "nothing to record": the stage fails and appends nothing.

    ``category`` says what failed (auth, permission, not_found, quota, bad_api_base, unreachable,
    rate_limit, server, timeout, bad_request, context_window, other); ``stops_run`` is true for the
    permanent provider errors no retry and no other stage can fix (see om_core.model.circuit)."""

    kind: ErrorKind = "permanent"

    def __init__(self, message: str, kind: ErrorKind, status: int | None = None, category: str = "other",
                 variables: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.category = category
        self.variables = variables  # missing credentials: the environment variables to set

    @property
    def retryable(self) -> bool:
        return self.kind == "transient"

    def __reduce__(self):  # noqa: ANN204 - it crosses to another process (a run's guards) as a plain ModelError
        return ModelError, (str(self), self.kind, self.status, self.category, self.variables)

    @property
    def stops_run(self) -> bool:
        return self.category in RUN_STOPPING


# Provider errors that fail every later call of a run the same way (a circuit breaker stops the run).
RUN_STOPPING = frozenset({"auth", "permission", "not_found", "quota", "bad_api_base"})


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
    """One row of ``om_internal.llm_calls``."""

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
    request: str | None = None  # JSON of what was sent (model, messages, tools), when texts are kept
    response: str | None = None  # JSON of the reply (content, tool calls); None for a failed call
    # the run that made the call: a stage result computed by an interrupted run and recorded by the run
    # that resumed it still counts the call under the run that paid for it
    run_id: str | None = None
    fallback: bool = False  # made by the fallbackModel after the stage's own model failed (SPEC §13)


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


_MISSING_CREDENTIALS = re.compile(r"missing credentials|api[_ ]key\b.{0,40}\bmust be set|no api key provided",
                                  re.IGNORECASE)
_BAD_KEY = re.compile(r"incorrect api key|invalid api key|invalid x-api-key", re.IGNORECASE)
_ENV_VARIABLE = re.compile(r"`([A-Z][A-Z0-9_]*_(?:API_KEY|KEY|TOKEN))`")
_UNKNOWN_MODEL = re.compile(r"model\b.{0,80}\b(does not exist|not found|not exist|unknown|invalid model)|"
                            r"model_not_found|invalid model|unknown model", re.IGNORECASE)
_NO_QUOTA = re.compile(r"insufficient_quota|exceeded your current quota|credit balance is too low", re.IGNORECASE)


def _causes(exc: BaseException) -> list[BaseException]:
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen and len(chain) < 12:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _connection_failure(exc: BaseException) -> tuple[str, str] | None:
    """(category, cause) when the call never reached a server: a URL that cannot work, or no server
    at the address. litellm reports both as a 500 "Connection error."; the cause is in the chain."""
    for cause in _causes(exc)[1:]:
        name = type(cause).__name__
        if name in ("UnsupportedProtocol", "InvalidURL"):
            return "bad_api_base", f"{name}: {cause}"
        if isinstance(cause, ConnectionRefusedError) or name == "gaierror":
            return "unreachable", f"{name}: {cause}"
    return None


def classify(exc: BaseException) -> ModelError:
    """Map a litellm/httpx failure to transient (retry) or permanent (fail the stage now), with a
    category that says whether the whole run must stop (``ModelError.stops_run``)."""
    if isinstance(exc, ModelError):
        return exc
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    text = str(exc).strip()
    # litellm repeats the class name ("litellm.AuthenticationError: AuthenticationError: ..."): once is enough
    bare = re.sub(rf"^(?:(?:litellm\.)?{re.escape(name)}:\s*)+", "", text)
    message = f"{name}: {bare[:500]}"
    permanent_names = {"AuthenticationError", "PermissionDeniedError", "BadRequestError", "NotFoundError",
                       "ContextWindowExceededError", "UnprocessableEntityError", "UnsupportedParamsError",
                       "ContentPolicyViolationError", "InvalidRequestError", "BudgetExceededError"}
    transient_names = {"RateLimitError", "Timeout", "APIConnectionError", "InternalServerError",
                       "ServiceUnavailableError", "BadGatewayError", "ConnectError", "ReadTimeout",
                       "ConnectTimeout", "RemoteProtocolError", "ReadError", "TimeoutException"}
    mro = {cls.__name__ for cls in type(exc).__mro__}
    if _MISSING_CREDENTIALS.search(text):
        # litellm reports a missing key as a 500 from the provider: it is an auth error, and
        # retrying cannot help
        variables = tuple(dict.fromkeys(_ENV_VARIABLE.findall(text)))
        hint = f": set {' or '.join(variables)}" if variables else ""
        detail = text.rsplit(" - ", 1)[-1]  # litellm's own prefixes name the wrong class
        return ModelError(f"AuthenticationError: missing credentials{hint} ({detail[:300]})", "permanent", None,
                          "auth", variables)
    if "ContextWindowExceededError" in mro:
        return ModelError(message, "permanent", status, "context_window")
    if "AuthenticationError" in mro or status == 401 or _BAD_KEY.search(text):
        return ModelError(message, "permanent", status, "auth")
    if "PermissionDeniedError" in mro or status == 403:
        return ModelError(message, "permanent", status, "permission")
    if _NO_QUOTA.search(text):
        return ModelError(message, "permanent", status, "quota")
    if "NotFoundError" in mro or status == 404:
        return ModelError(message, "permanent", status, "not_found")
    if status in (400, 422) and _UNKNOWN_MODEL.search(text):
        return ModelError(message, "permanent", status, "not_found")
    failure = _connection_failure(exc)
    if failure is not None:
        category, cause = failure
        kind: ErrorKind = "permanent" if category == "bad_api_base" else "transient"
        return ModelError(f"APIConnectionError: {cause}", kind, None, category)
    if "RateLimitError" in mro or status == 429:
        return ModelError(message, "transient", status, "rate_limit")
    if mro & transient_names:
        timeout = bool(mro & {"Timeout", "ReadTimeout", "ConnectTimeout", "TimeoutException"})
        return ModelError(message, "transient", status, "timeout" if timeout else "server")
    if isinstance(status, int):
        if status in (408, 409, 425) or status >= 500:
            return ModelError(message, "transient", status, "server")
        return ModelError(message, "permanent", status, "bad_request")
    if mro & permanent_names:
        return ModelError(message, "permanent", status, "bad_request")
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return ModelError(message, "transient", status, "timeout" if isinstance(exc, TimeoutError) else "unreachable")
    return ModelError(message, "permanent", status)


def litellm_model_name(model: str, api_base: str | None) -> str:
    """The name litellm is called with: a bare name at an ``api_base`` is an OpenAI-compatible server's."""
    return f"openai/{model}" if api_base and "/" not in model else model


def _import_litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from om_core.pi.tokens import litellm_tokenizer_dir

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
                 gate: Callable[[], Any] | None = None, breaker: Any = None, keep_texts: bool = False,
                 budget: Any = None, max_tokens: int | None = None) -> None:
        self.name = litellm_model_name(model, api_base)
        self.max_tokens = max_tokens  # the output reserved per request (agentMaxTokens, SPEC §13)
        self.api_base = api_base
        self.api_key = api_key
        self.thinking = thinking
        self.timeout = timeout
        self.stream = stream
        self.retry = retry or RetryPolicy()
        self.record = record or (lambda _: None)
        self.gate = gate  # a context-manager factory around each call (the pipeline's global limit)
        self.breaker = breaker  # om_core.model.circuit.CircuitBreaker: the run stops on a permanent provider error
        self.keep_texts = keep_texts  # each CallRecord carries the request and response text (om logs --full)
        self.budget = budget  # om_core.model.cost.CostBudget: consulted before every call (--max-cost)
        self._litellm = None
        self._explicit_cache: bool | None = None

    def _kwargs(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        if self._explicit_cache is None:
            self._explicit_cache = takes_cache_breakpoints(self.name, self.api_base)
        kwargs: dict[str, Any] = {"model": self.name, "messages": prepare_messages(messages, self._explicit_cache),
                                  "timeout": self.timeout,
                                  "num_retries": 0, "max_retries": 0, "drop_params": True}
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
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
        # serialised now (the tool loop goes on appending to ``messages``), and as sent: the text
        # parts flattened or kept with their cache marks, as this provider gets them
        request = None
        if self.keep_texts:
            if self._explicit_cache is None:
                self._explicit_cache = takes_cache_breakpoints(self.name, self.api_base)
            request = json.dumps({"model": self.name, "messages": prepare_messages(messages, self._explicit_cache),
                                  "tools": tools}, ensure_ascii=False, default=str)
        while True:
            attempt += 1
            if self.breaker is not None:
                self.breaker.check()  # tripped: fail at once with the original reason, send nothing
            # raises BudgetExceeded before anything is sent when this call could pass --max-cost
            held = self.budget.reserve(self.budget.worst_case(messages, tools)) if self.budget is not None else 0.0
            started = datetime.now(timezone.utc)
            t0 = time.perf_counter()
            try:
                if self.gate is None:
                    reply = self._once(messages, tools)
                else:
                    with self.gate():
                        reply = self._once(messages, tools)
            except Exception as exc:  # classified below; nothing escapes unclassified
                if self.budget is not None:
                    self.budget.settle(held, None)  # a failed call is not billed
                error = classify(exc)
                if self.breaker is not None:
                    self.breaker.record(error)
                self.record(CallRecord(model=self.name, turn=turn, attempt=attempt, started_at=started,
                                       latency_ms=(time.perf_counter() - t0) * 1000, status="error",
                                       error_kind=error.kind, error=str(error), request=request))
                if error.retryable and attempt < self.retry.attempts:
                    self.retry.sleep(self.retry.delay(attempt))
                    continue
                raise error from None
            if self.breaker is not None:
                self.breaker.record(None)
            if self.budget is not None:
                if reply.cost is None:  # litellm priced the response under another name: use the budget's price
                    reply.cost = self.budget.cost_of(reply.input_tokens, reply.output_tokens, reply.cached_tokens)
                self.budget.settle(held, reply.cost)
            self.record(CallRecord(model=self.name, turn=turn, attempt=attempt, started_at=started,
                                   latency_ms=(time.perf_counter() - t0) * 1000, status="ok",
                                   input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
                                   cached_tokens=reply.cached_tokens, cost=reply.cost, request=request,
                                   response=_reply_json(reply) if self.keep_texts else None))
            return reply


def _reply_json(reply: ChatReply) -> str:
    return json.dumps({"content": reply.text, "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                                            for c in reply.tool_calls]}, ensure_ascii=False)


CACHE_BREAKPOINT = {"type": "ephemeral"}


def prepare_messages(messages: list[dict[str, Any]], explicit_cache: bool) -> list[dict[str, Any]]:
    """Messages for the provider. Workers send the system prompt as text and the user message as text
    parts, the stable ones marked with ``cache_control``. Where the provider takes explicit cache
    breakpoints (Anthropic's models), the system prompt is marked too and the marks stay; elsewhere
    the parts are joined into plain text (OpenAI and others cache matching prefixes on their own)."""
    prepared = []
    for m in messages:
        content = m.get("content")
        if explicit_cache and m.get("role") == "system" and isinstance(content, str):
            m = {**m, "content": [{"type": "text", "text": content, "cache_control": CACHE_BREAKPOINT}]}
        elif not explicit_cache and isinstance(content, list) and all(p.get("type") == "text" for p in content):
            m = {**m, "content": "".join(p["text"] for p in content)}
        prepared.append(m)
    return prepared


def takes_cache_breakpoints(model: str, api_base: str | None) -> bool:
    """Whether litellm passes Anthropic-style ``cache_control`` breakpoints to this model's provider."""
    if api_base:  # an OpenAI-compatible server
        return False
    try:
        from litellm.llms.anthropic.common_utils import supports_anthropic_cache_control

        return bool(supports_anthropic_cache_control(model, None))
    except Exception:  # an older or newer litellm without this helper: the plain rule
        provider = model.split("/", 1)[0] if "/" in model else ""
        return provider in ("anthropic", "bedrock", "vertex_ai") and "claude" in model.lower()


def tool_schema(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def parse_arguments(raw: str) -> tuple[Any, str | None]:
    """(arguments, error) for a tool call's raw JSON arguments."""
    try:
        return json.loads(raw or "{}"), None
    except ValueError as exc:
        return None, f"the arguments were not valid JSON ({exc}); send the call again with valid JSON"
