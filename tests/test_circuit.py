"""Fail fast: error classes, the run's circuit breaker, and the offline preflight,
through litellm's real HTTP path against the fake model server."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from fake_openai import FakeOpenAI, Reply, http_error

import om_cli
from conftest import workspace
from om_core.model.circuit import (
    PROVIDER_KEYS,
    CircuitBreaker,
    CircuitOpen,
    MissingCredentials,
    PreflightError,
    preflight_model,
)
from om_core.ingest import ingest
from om_core.model.client import LiteLLMModel, ModelError, RetryPolicy, classify

SID = "c1c1c1c1-0000-4000-8000-000000000001"
KEY_VARIABLES = sorted({v for names in PROVIDER_KEYS.values() for v in names} | {"OPENAI_API_BASE", "OPENAI_BASE_URL"})


def model_at(base: str, *, breaker=None, attempts: int = 1, records=None) -> LiteLLMModel:
    return LiteLLMModel("openai/fake-model", api_base=base, breaker=breaker,
                        retry=RetryPolicy(attempts=attempts, base_seconds=0.001, max_seconds=0.002),
                        record=(records.append if records is not None else None))


def fail(model: LiteLLMModel) -> ModelError:
    with pytest.raises(ModelError) as info:
        model.complete([{"role": "user", "content": "hi"}], [], 1)
    return info.value


def unused_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# ------------------------------------------------------------------ error classes


@pytest.mark.parametrize("status, message, category", [
    (401, "Incorrect API key provided", "auth"),
    (403, "You are not allowed to use this model", "permission"),
    (404, "The model `gpt-9` does not exist", "not_found"),
    (400, "The model `gpt-9` does not exist or you do not have access to it", "not_found"),
    (429, "You exceeded your current quota, please check your plan (insufficient_quota)", "quota"),
])
def test_permanent_provider_errors_stop_the_run(server, status, message, category):
    server.default = http_error(status, message)
    error = fail(model_at(server.base_url, attempts=3))
    assert (error.kind, error.category, error.stops_run) == ("permanent", category, True)
    assert message[:20] in str(error)
    assert len(server.requests) == 1  # not retried


@pytest.mark.parametrize("reply, category", [
    (http_error(429, "slow down"), "rate_limit"),
    (http_error(500, "overloaded"), "server"),
    (http_error(400, "messages[1].content is too long"), "bad_request"),
])
def test_errors_of_one_request_or_one_moment_do_not_stop_the_run(server, reply, category):
    server.default = reply
    error = fail(model_at(server.base_url))
    assert error.category == category and not error.stops_run


def test_missing_credentials_are_an_auth_error_naming_the_variable(monkeypatch):
    from litellm import InternalServerError

    missing = InternalServerError("OpenAIException - Missing credentials. Please pass an `api_key`, or set the "
                                  "`OPENAI_API_KEY` environment variable.", llm_provider="openai", model="gpt-4o-mini")
    error = classify(missing)
    assert (error.kind, error.category, error.stops_run) == ("permanent", "auth", True)
    assert error.variables == ("OPENAI_API_KEY",)
    assert str(error).startswith("AuthenticationError: missing credentials: set OPENAI_API_KEY")
    assert "InternalServerError" not in str(error)


def test_missing_key_reaching_litellm_is_classified_as_auth(monkeypatch):
    """Past the preflight (e.g. a library caller): litellm's own 500 becomes an auth error."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_BASE", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    error = fail(LiteLLMModel("openai/gpt-4o-mini", retry=RetryPolicy(attempts=3, base_seconds=0.001)))
    assert error.category == "auth" and "OPENAI_API_KEY" in error.variables
    assert "InternalServerError" not in str(error)


def test_a_base_url_without_a_scheme_and_a_refused_connection():
    bad = fail(model_at("localhost:9/v1", attempts=3))
    assert (bad.kind, bad.category, bad.stops_run) == ("permanent", "bad_api_base", True)
    assert "http://" in str(bad)
    refused = fail(model_at(unused_port_url()))
    assert (refused.kind, refused.category) == ("transient", "unreachable")
    assert "Connection refused" in str(refused) and "InternalServerError" not in str(refused)


# ------------------------------------------------------------------ the breaker


def test_after_a_trip_every_call_fails_at_once_with_the_reason_and_sends_nothing(server):
    server.default = http_error(401, "Incorrect API key provided")
    breaker = CircuitBreaker()
    records: list = []
    first = fail(model_at(server.base_url, breaker=breaker, records=records))
    assert breaker.tripped and breaker.reason is first
    for _ in range(5):
        later = fail(model_at(server.base_url, breaker=breaker, records=records))
        assert isinstance(later, CircuitOpen) and later.reason is first
        assert "Incorrect API key provided" in str(later)
    assert len(server.requests) == 1  # no HTTP request after the trip
    assert len(records) == 1  # and no call recorded that was never made


def test_a_success_keeps_the_breaker_closed(server):
    server.default = Reply(text="fine")
    breaker = CircuitBreaker()
    model_at(server.base_url, breaker=breaker).complete([{"role": "user", "content": "hi"}], [], 1)
    assert not breaker.tripped


def test_connection_failures_trip_after_a_few_in_a_row_and_a_success_resets_the_count():
    refused = classify(ConnectionRefusedError(111, "Connection refused"))
    breaker = CircuitBreaker(unreachable_limit=3)
    breaker.record(refused)
    breaker.record(refused)
    breaker.record(None)
    breaker.record(refused)
    assert not breaker.tripped
    breaker.record(refused)
    breaker.record(refused)
    assert breaker.tripped and breaker.reason.category == "unreachable"
    with pytest.raises(CircuitOpen):
        breaker.check()


def test_unreachable_server_stops_retries_within_one_stage():
    breaker = CircuitBreaker(unreachable_limit=3)
    records: list = []
    error = fail(model_at(unused_port_url(), breaker=breaker, attempts=10, records=records))
    assert isinstance(error, CircuitOpen) and error.category == "unreachable"
    assert len(records) == 3  # three attempts, then the breaker; not ten


def test_the_breaker_is_thread_safe_and_keeps_the_first_reason():
    breaker = CircuitBreaker()
    errors = [ModelError(f"AuthenticationError: {i}", "permanent", 401, "auth") for i in range(200)]
    start = threading.Barrier(8)

    def worker(k: int) -> None:
        start.wait()
        for e in errors[k::8]:
            breaker.record(e)
            breaker.record(None)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert breaker.reason in errors
    for _ in range(3):
        with pytest.raises(CircuitOpen) as info:
            breaker.check()
        assert info.value.reason is breaker.reason


def test_a_run_s_guards_travel_to_another_process_as_they_stand():
    """RunGuards.for_replay: a replay on a Dask worker gets a copy that pickles (no lock travels), with the
    breaker as it stands (a run stopped already stops that replay at its first stage)."""
    import pickle

    from om_core.workers.run_config import RunGuards, RunStopped

    guards = RunGuards(CircuitBreaker(failure_limit=7))
    fresh = pickle.loads(pickle.dumps(guards.for_replay(None)))
    assert not fresh.breaker.tripped and fresh.breaker.failure_limit == 7 and fresh.budget is None
    fresh.check()
    guards.breaker.trip(ModelError("AuthenticationError: no", "permanent", 401, "auth"))
    stopped = pickle.loads(pickle.dumps(guards.for_replay(None)))
    with pytest.raises(RunStopped, match="AuthenticationError: no"):
        stopped.check()
    assert not fresh.breaker.tripped  # a copy made before is its own


# ------------------------------------------------------------------ preflight


@pytest.fixture
def no_keys(monkeypatch):
    for name in KEY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("provider", sorted(PROVIDER_KEYS))
def test_the_known_key_variables_agree_with_litellm(no_keys, provider):
    from om_core.model.client import _import_litellm

    litellm = _import_litellm()
    name = f"{provider}/some-model"
    assert sorted(litellm.validate_environment(model=name)["missing_keys"]) == sorted(PROVIDER_KEYS[provider])
    with pytest.raises(MissingCredentials) as info:
        preflight_model(name)
    assert all(v in str(info.value) for v in PROVIDER_KEYS[provider])


def test_preflight_passes_with_a_key_an_api_base_or_an_explicit_key(no_keys, monkeypatch):
    preflight_model("openai/gpt-4o-mini", api_base="http://127.0.0.1:8000/v1")
    preflight_model("openai/gpt-4o-mini", api_key="sk-explicit")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    preflight_model("openai/gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "")
    with pytest.raises(MissingCredentials):  # an empty key is no key
        preflight_model("openai/gpt-4o-mini")


def test_preflight_asks_litellm_about_other_providers(no_keys, monkeypatch):
    monkeypatch.delenv("COHERE_API_KEY", raising=False)
    with pytest.raises(MissingCredentials, match="COHERE_API_KEY"):
        preflight_model("cohere/command-r")
    with pytest.raises(MissingCredentials, match="OPENAI_API_KEY"):
        preflight_model("gpt-4o-mini")  # a bare name litellm knows as OpenAI's
    preflight_model("ollama/llama3")  # a local server: its base URL has a default, no key
    with pytest.raises(PreflightError, match="unknown model 'nosuchprovider/x'"):
        preflight_model("nosuchprovider/x")


@pytest.mark.parametrize("base", ["localhost:8000/v1", "127.0.0.1:8000", "http://", "ftp://host/v1"])
def test_preflight_rejects_a_base_url_that_cannot_work(base):
    with pytest.raises(PreflightError, match="is not a URL"):
        preflight_model("openai/x", api_base=base)


# ------------------------------------------------------------------ the commands


def om_env(cwd: Path, env: dict[str, str]) -> dict[str, str]:
    full = {k: v for k, v in os.environ.items() if k not in KEY_VARIABLES and not k.startswith("OM_")}
    full.update({"COLUMNS": "200", "HOME": str(cwd), **env})
    return full


def om(args: list[str], cwd: Path, env: dict[str, str]):
    """The command through its console entry point, in this process (tests/om_cli.py)."""
    t0 = time.monotonic()
    done = om_cli.run_om(args, cwd, om_env(cwd, env))
    return done, time.monotonic() - t0


def om_process(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300):
    """`om run` in its own process: the flow's Prefect logging goes to that process's stderr, which
    must hold one line."""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=cwd, env=om_env(cwd, env),
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - t0


def session_db(tmp_path: Path, turns: int = 2) -> Path:
    b = SessionBuilder(SID)
    b.work_turns(turns, "circuit")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [b.write(tmp_path / "sessions" / "s.jsonl")])
    return db


def error_lines(stderr: str) -> list[str]:
    from om_cli import progress_line

    return [line for line in stderr.splitlines() if line.strip() and not progress_line(line)]


@pytest.mark.parametrize("command", ["observe", "reflect"])
def test_observe_and_reflect_without_a_key_fail_at_once_naming_the_variable(server, tmp_path, command):
    db = session_db(tmp_path)
    # were a call made, litellm would send it to the fake server: it must see none
    done, seconds = om(["--db", str(db), command, SID, "--model", "openai/gpt-4o-mini"], tmp_path,
                       {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_BASE": server.base_url})
    assert done.returncode == 1
    [line] = error_lines(done.stderr)
    assert "OPENAI_API_KEY" in line and "missing credentials" in line and "Traceback" not in done.stderr
    assert server.requests == []


def test_observe_with_a_rejected_key_exits_1_after_one_call(server, tmp_path):
    db = session_db(tmp_path)
    server.default = http_error(401, "Incorrect API key provided: sk-bad")
    done, _ = om(["--db", str(db), "observe", SID, "--model", "openai/fake-model", "--api-base", server.base_url],
                 tmp_path, {})
    assert done.returncode == 1
    [line] = error_lines(done.stderr)
    assert "AuthenticationError" in line and "Incorrect API key provided" in line
    assert len(server.requests) == 1


def test_observe_with_a_bad_api_base_fails_before_any_call(tmp_path):
    db = session_db(tmp_path)
    done, _ = om(["--db", str(db), "observe", SID, "--model", "fake", "--api-base", "localhost:1234"], tmp_path, {})
    assert done.returncode == 1
    [line] = error_lines(done.stderr)
    assert "--api-base 'localhost:1234' is not a URL" in line


@pytest.mark.prefect
def test_om_run_stops_every_stage_on_a_rejected_key(prefect_api, tmp_path):
    folder = tmp_path / "sessions"
    for n in range(4):
        b = SessionBuilder(f"0000000{n}-aaaa-bbbb-cccc-eeeeeeeeeeee", start=f"2026-03-0{n + 1}T09:00:00")
        b.work_turns(8, f"topic{n}")
        b.write(folder / f"s{n}.jsonl")
    db = tmp_path / "om.duckdb"
    env = {"PREFECT_API_URL": prefect_api, "OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300",
           "OM_OBSERVER_CHUNK_MAX_TOKENS": "400"}
    with FakeOpenAI(default=http_error(401, "Incorrect API key provided: sk-bad")) as server:
        done, _ = om_process(["--db", str(db), "run", str(folder), "--concurrency", "4", "--model",
                              "openai/fake-model", "--api-base", server.base_url], tmp_path, env)
        calls = len(server.requests)
    assert done.returncode == 1, done.stderr[-2000:]
    assert 1 <= calls <= 4, calls  # at most one in flight per session when the breaker trips
    [line] = error_lines(done.stderr)  # one line: no Prefect task-failure lines beside it
    assert line.startswith("error: model calls stopped: AuthenticationError"), done.stderr
    assert "Incorrect API key" in line
    assert "Traceback" not in done.stderr
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM llm_calls").fetchone()[0] == calls
        assert con.execute("SELECT status FROM runs WHERE command = 'run'").fetchone()[0] == "failed"
    finally:
        con.close()


def test_om_run_without_a_key_fails_before_prefect_starts(server, tmp_path):
    folder = tmp_path / "sessions"
    SessionBuilder(SID).write(folder / "s.jsonl")
    done, seconds = om_process(["--db", str(tmp_path / "om.duckdb"), "run", str(folder), "--model",
                                "openai/gpt-4o-mini"], tmp_path,
                               {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_BASE": server.base_url,
                                "PREFECT_API_URL": "http://127.0.0.1:9/api"})  # unreachable: must not be used
    assert done.returncode == 1
    [line] = error_lines(done.stderr)
    assert "OPENAI_API_KEY" in line
    assert server.requests == []
    assert not (tmp_path / "om.duckdb").exists()  # nothing started


def test_transient_failures_in_a_row_across_stages_trip_the_breaker_at_its_limit():
    breaker = CircuitBreaker(failure_limit=4)
    for _ in range(3):
        breaker.record(ModelError("InternalServerError: 500", "transient", 500, "server"))
    breaker.record(None)  # a success in between starts the count again
    for n in range(4):
        assert not breaker.tripped, n
        breaker.record(ModelError("RateLimitError: 429", "transient", 429, "rate_limit"))
    assert breaker.tripped and "4 model calls in a row failed" in str(breaker.reason)
    with pytest.raises(CircuitOpen):
        breaker.check()
    never = CircuitBreaker(failure_limit=0)
    for _ in range(50):
        never.record(ModelError("Timeout", "transient", None, "timeout"))
    assert not never.tripped
