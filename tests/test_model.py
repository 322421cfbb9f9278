"""The model layer: one chat call through litellm's real HTTP path against the fake
OpenAI-compatible server, classified errors, our own retries with backoff, a CallRecord per attempt,
streaming, and the thinking level mapped to reasoning only where litellm says the model supports it.

Nothing here mocks litellm: every call goes over loopback HTTP to ``FakeOpenAI``.
"""

from __future__ import annotations

import json
import random
import socket
import time

import pytest

from fake_openai import FakeOpenAI, Reply, http_error, text
from om_core.model.client import CallRecord, LiteLLMModel, ModelError, RetryPolicy, classify

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say hi."}]
TOOLS = [{"type": "function", "function": {
    "name": "record_observations", "description": "record",
    "parameters": {"type": "object", "properties": {"observations": {"type": "array", "items": {"type": "object"}}},
                   "required": ["observations"]}}}]
CONTEXT_OVERFLOW = ("This model's maximum context length is 8192 tokens. However, your messages resulted in "
                    "9000 tokens. Please reduce the length of the messages.")


def make_model(server: FakeOpenAI | None, *, base: str | None = None, attempts: int = 1, sleeps: list | None = None,
               records: list | None = None, **kw) -> LiteLLMModel:
    policy = RetryPolicy(attempts=attempts, base_seconds=0.001, max_seconds=0.01,
                         sleep=(sleeps.append if sleeps is not None else (lambda _s: None)))
    return LiteLLMModel(kw.pop("model", "openai/fake-model"), api_base=base or server.base_url, retry=policy,
                        record=(records.append if records is not None else None), **kw)


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens here any more: connection refused
    return f"http://127.0.0.1:{port}/v1"


def fail_once(server: FakeOpenAI, reply: Reply, **kw) -> tuple[ModelError, int, list[CallRecord]]:
    """Call once with no retries; return the error, the number of requests the server saw, and the records."""
    records: list[CallRecord] = []
    server.add(reply)
    model = make_model(server, records=records, **kw)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES, [], turn=1)
    return info.value, len(server.requests), records


# ------------------------------------------------------------------ classification


@pytest.mark.parametrize("status, message, exc_name", [
    (429, "Rate limit reached for requests", "RateLimitError"),
    (500, "The server had an error", "InternalServerError"),
    (503, "The engine is currently overloaded", "ServiceUnavailableError"),
])
def test_rate_limit_and_server_errors_are_transient(server, status, message, exc_name):
    error, requests, records = fail_once(server, http_error(status, message))
    assert error.kind == "transient"
    assert error.retryable is True
    assert error.status == status
    assert exc_name in str(error) and message in str(error)
    assert requests == 1  # litellm's / the openai SDK's own retries are off
    assert [(r.status, r.error_kind, r.attempt) for r in records] == [("error", "transient", 1)]


@pytest.mark.parametrize("status, message, exc_name", [
    (401, "Incorrect API key provided", "AuthenticationError"),
    (400, "Invalid value for 'tool_choice'", "BadRequestError"),
    (400, CONTEXT_OVERFLOW, "ContextWindowExceededError"),
])
def test_auth_bad_request_and_context_overflow_are_permanent(server, status, message, exc_name):
    error, requests, records = fail_once(server, http_error(status, message))
    assert error.kind == "permanent"
    assert error.retryable is False
    assert error.status == status
    assert exc_name in str(error)
    assert requests == 1
    assert [(r.status, r.error_kind) for r in records] == [("error", "permanent")]


def test_slow_reply_beyond_the_timeout_is_a_transient_timeout(server):
    t0 = time.perf_counter()
    error, requests, records = fail_once(server, Reply(text="too late", delay=1.5), timeout=0.2)
    elapsed = time.perf_counter() - t0
    assert error.kind == "transient"
    assert "Timeout" in str(error)
    assert requests == 1
    assert elapsed < 1.4  # the client gave up at the timeout, it did not wait for the reply
    assert records[0].status == "error" and records[0].latency_ms >= 150


def test_connection_refused_is_transient():
    records: list[CallRecord] = []
    model = make_model(None, base=closed_port_url(), records=records)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES, [], turn=1)
    assert info.value.kind == "transient"
    assert "Connection" in str(info.value)
    assert len(records) == 1 and records[0].error_kind == "transient"


def test_classify_plain_python_errors():
    assert classify(TimeoutError("read timed out")).kind == "transient"
    assert classify(ConnectionRefusedError("refused")).kind == "transient"
    assert classify(ValueError("something odd")).kind == "permanent"
    already = ModelError("x", "transient", 503)
    assert classify(already) is already


# ------------------------------------------------------------------ retries


def test_transient_errors_are_retried_then_succeed(server):
    sleeps: list[float] = []
    records: list[CallRecord] = []
    server.add(http_error(429, "slow down"), http_error(503, "overloaded"), text("hello"))
    model = make_model(server, attempts=4, sleeps=sleeps, records=records)
    reply = model.complete(MESSAGES, [], turn=3)
    assert len(server.requests) == 3  # one request per attempt
    assert reply.text == "hello"
    assert len(sleeps) == 2
    assert [(r.attempt, r.status, r.error_kind, r.turn) for r in records] == [
        (1, "error", "transient", 3), (2, "error", "transient", 3), (3, "ok", None, 3)]


def test_transient_errors_exhaust_the_attempts(server):
    sleeps: list[float] = []
    records: list[CallRecord] = []
    server.default = http_error(500, "always broken")
    model = make_model(server, attempts=3, sleeps=sleeps, records=records)
    with pytest.raises(ModelError) as info:
        model.complete(MESSAGES, [], turn=1)
    assert len(server.requests) == 3
    assert info.value.kind == "transient"
    assert len(sleeps) == 2  # no sleep after the last attempt
    assert [r.attempt for r in records] == [1, 2, 3]
    assert all(r.status == "error" and "always broken" in r.error for r in records)


@pytest.mark.parametrize("reply", [http_error(401, "bad key"), http_error(400, "bad request"),
                                   http_error(400, CONTEXT_OVERFLOW)])
def test_permanent_errors_are_not_retried(server, reply):
    sleeps: list[float] = []
    records: list[CallRecord] = []
    server.default = reply
    model = make_model(server, attempts=5, sleeps=sleeps, records=records)
    with pytest.raises(ModelError):
        model.complete(MESSAGES, [], turn=1)
    assert len(server.requests) == 1
    assert sleeps == []
    assert len(records) == 1


def test_backoff_grows_exponentially_capped_and_uses_full_jitter(server, monkeypatch):
    """With the jitter pinned to its upper bound the sleeps are base·2^(n-1), capped at max_seconds;
    the jitter itself draws from [0, bound]."""
    draws: list[tuple[float, float]] = []

    class TopOfRange:
        @staticmethod
        def uniform(a, b):
            draws.append((a, b))
            return b

    import om_core.model.client as model_module

    monkeypatch.setattr(model_module, "random", TopOfRange)
    sleeps: list[float] = []
    policy = RetryPolicy(attempts=5, base_seconds=0.001, max_seconds=0.005, sleep=sleeps.append)
    server.default = http_error(503, "overloaded")
    model = LiteLLMModel("openai/fake-model", api_base=server.base_url, retry=policy)
    with pytest.raises(ModelError):
        model.complete(MESSAGES, [], turn=1)
    assert len(server.requests) == 5
    assert sleeps == pytest.approx([0.001, 0.002, 0.004, 0.005])
    assert draws == [(0, pytest.approx(b)) for b in (0.001, 0.002, 0.004, 0.005)]


def test_backoff_delays_are_jittered_and_grow_on_average():
    random.seed(1234)
    policy = RetryPolicy(attempts=6, base_seconds=1.0, max_seconds=30.0)
    samples = {n: [policy.delay(n) for _ in range(300)] for n in (1, 2, 3, 4)}
    for n, values in samples.items():
        bound = min(30.0, 2 ** (n - 1))
        assert all(0 <= v <= bound for v in values)
        assert len(set(values)) > 250  # jittered, not a fixed schedule
    means = [sum(v) / len(v) for v in samples.values()]
    assert means == sorted(means)  # 0.5, 1, 2, 4 in expectation
    assert means[3] > 3 * means[0]


# ------------------------------------------------------------------ call records


def test_every_successful_call_records_tokens_latency_and_cached_tokens(server):
    records: list[CallRecord] = []
    reply = Reply(text="ok", prompt_tokens=1200, completion_tokens=34, cached_tokens=1024, delay=0.05)
    server.add(reply)
    model = make_model(server, records=records)
    out = model.complete(MESSAGES, [], turn=2)
    assert (out.input_tokens, out.output_tokens, out.cached_tokens) == (1200, 34, 1024)
    [rec] = records
    assert rec.status == "ok"
    assert (rec.input_tokens, rec.output_tokens, rec.cached_tokens) == (1200, 34, 1024)
    assert rec.model == "openai/fake-model"
    assert (rec.turn, rec.attempt) == (2, 1)
    assert rec.latency_ms >= 50
    assert rec.error is None and rec.error_kind is None
    assert rec.cost is None  # litellm has no price for fake-model


def test_cost_is_recorded_when_litellm_knows_the_model(server):
    records: list[CallRecord] = []
    server.add(Reply(text="ok", prompt_tokens=1000, completion_tokens=100))
    model = make_model(server, records=records, model="openai/gpt-4o")
    model.complete(MESSAGES, [], turn=1)
    assert records[0].cost is not None and records[0].cost > 0


def test_an_api_base_without_provider_means_an_openai_compatible_server(server):
    server.add(text("hi"))
    model = LiteLLMModel("fake-model", api_base=server.base_url, retry=RetryPolicy(attempts=1))
    assert model.name == "openai/fake-model"
    assert model.complete(MESSAGES, [], turn=1).text == "hi"
    assert server.requests[0]["model"] == "fake-model"


def test_tools_are_sent_and_tool_calls_returned_verbatim(server):
    server.add(Reply(tool_calls=[("record_observations", {"observations": []}),
                                 ("record_observations", '{"observations": [')]))
    reply = make_model(server).complete(MESSAGES, TOOLS, turn=1)
    body = server.requests[0]
    assert body["tools"] == TOOLS
    assert body["tool_choice"] == "auto"
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("record_observations", '{"observations": []}'), ("record_observations", '{"observations": [')]
    assert len({c.id for c in reply.tool_calls}) == 2


# ------------------------------------------------------------------ streaming


def test_streaming_returns_tool_calls_and_usage(server):
    records: list[CallRecord] = []
    args = {"observations": [{"content": "User prefers tabs.", "relevance": "high"}]}
    server.add(Reply(tool_calls=[("record_observations", args)], prompt_tokens=321, completion_tokens=12,
                     cached_tokens=300), Reply(text="All recorded, thanks."))
    model = make_model(server, records=records, stream=True)
    first = model.complete(MESSAGES, TOOLS, turn=1)
    second = model.complete(MESSAGES, TOOLS, turn=2)
    bodies = list(server.requests)
    assert all(b.get("stream") is True for b in bodies)
    [call] = first.tool_calls
    assert call.name == "record_observations"
    assert json.loads(call.arguments) == args
    assert (first.input_tokens, first.output_tokens, first.cached_tokens) == (321, 12, 300)
    assert second.text == "All recorded, thanks." and second.tool_calls == []
    assert [r.status for r in records] == ["ok", "ok"]
    assert records[0].cached_tokens == 300


# ------------------------------------------------------------------ thinking level -> reasoning


@pytest.mark.parametrize("model_name, thinking, expected", [
    ("openai/fake-model", "high", None),  # litellm does not know fake-model supports reasoning: do not ask
    ("openai/fake-model", "off", None),
    ("openai/o3-mini", "off", None),
    ("openai/o3-mini", "low", "low"),
    ("openai/o3-mini", "high", "high"),
])
def test_thinking_maps_to_reasoning_only_when_supported(server, model_name, thinking, expected):
    server.add(text("ok"))
    model = make_model(server, model=model_name, thinking=thinking)
    model.complete(MESSAGES, [], turn=1)
    body = server.requests[0]
    assert body.get("reasoning_effort") == expected
    assert "reasoning" not in body and "thinking" not in body


def test_a_missing_api_key_is_permanent_even_when_reported_as_a_500():
    # litellm raises InternalServerError (500) when the provider's key is not set: retrying cannot help
    class InternalServerError(Exception):
        status_code = 500

    missing = InternalServerError("OpenAIException - Missing credentials. Please pass an `api_key`, or set the "
                                  "`OPENAI_API_KEY` environment variable.")
    assert classify(missing).kind == "permanent"
    assert classify(InternalServerError("upstream overloaded")).kind == "transient"


# ------------------------------------------------------------------ prompt-cache breakpoints


def test_cache_breakpoints_are_kept_only_for_providers_that_take_them():
    from om_core.model.client import prepare_messages, takes_cache_breakpoints
    from om_core.workers.llm import user_parts

    messages = [{"role": "system", "content": "rules"}, {"role": "user", "content": user_parts("memory\n\n", "chunk")}]
    marked = prepare_messages(messages, explicit_cache=True)
    assert marked[0]["content"] == [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}]
    assert marked[1]["content"][0]["cache_control"] == {"type": "ephemeral"}  # the end of the stable prefix
    assert "cache_control" not in marked[1]["content"][1]  # the new part is not cached
    plain = prepare_messages(messages, explicit_cache=False)
    assert plain == [{"role": "system", "content": "rules"}, {"role": "user", "content": "memory\n\nchunk"}]
    assert takes_cache_breakpoints("anthropic/claude-haiku-4-5", None)
    assert not takes_cache_breakpoints("openai/gpt-4o-mini", None)  # OpenAI caches prefixes by itself
    assert not takes_cache_breakpoints("anthropic/claude-haiku-4-5", "http://127.0.0.1:9/v1")  # a compatible server


def test_the_fake_server_reports_the_prefix_shared_with_an_earlier_request(server):
    records: list[CallRecord] = []
    model = make_model(server, records=records)
    stable = "You keep the memory of a session. " * 40  # 1,360 characters
    server.add(text("a"), text("b"), text("c"))
    model.complete([{"role": "system", "content": stable}, {"role": "user", "content": "first chunk"}], TOOLS, turn=1)
    model.complete([{"role": "system", "content": stable}, {"role": "user", "content": "second chunk"}], TOOLS, turn=1)
    model.complete([{"role": "system", "content": "other rules"}, {"role": "user", "content": "x"}], TOOLS, turn=1)
    first, second, third = records
    assert first.cached_tokens == 0
    assert second.cached_tokens > len(stable) // 4  # tools, system prompt and "<user>" are shared
    assert second.cached_tokens < second.input_tokens
    assert 0 < third.cached_tokens < 100  # only the tool definitions and the "<system>" mark are shared
