"""Model routing (SPEC §13): fallbackModel and modelMap, through the fake OpenAI-compatible server (litellm's
real HTTP path), on the one replay path `om run`, `om serve` and `om eval` share."""

from __future__ import annotations

import socket

import pytest

from builders import SessionBuilder
from conftest import workspace
from fake_brains import ScriptedWorkers, stage_of
from fake_openai import FakeOpenAI, Reply, http_error
from om_core.ingest import ingest
from om_core.model.client import RetryPolicy
from om_core.model.routing import SessionModel, routed_model
from om_core.replay.engine import replay_session
from om_core.settings import Settings, SettingsError, load_settings
from om_core.store import db as dbmod
from om_core.workers.run_config import ModelConfig, make_brain

pytestmark = pytest.mark.usefixtures("isolated_home")
SID = "5e551011-0000-4000-8000-000000000041"
QUICK = RetryPolicy(attempts=2, base_seconds=0.001, max_seconds=0.002)


def conversation(turns: int = 6) -> SessionBuilder:
    b = SessionBuilder(SID)
    b.thinking_level("high")
    for i in range(turns):
        b.user(f"Turn {i}: the ledger service keeps invoices in table inv_{i}. " * 6)
        b.assistant(f"Noted: inv_{i} holds the invoices of turn {i}. " * 6, model="claude-sonnet-4-5")
    return b


def load(tmp_path, db_path) -> None:
    ingest(workspace(db_path), [conversation().write(tmp_path / "session.jsonl")])


def calls(db_path) -> list[dict]:
    with dbmod.reading(db_path) as con:
        return dbmod.rows_as_dicts(con.execute(
            "SELECT stage, model, status, fallback FROM llm_calls ORDER BY started_at, attempt"))


def stage_rows(db_path) -> list[dict]:
    with dbmod.reading(db_path) as con:
        return dbmod.rows_as_dicts(con.execute("SELECT stage, outcome, model FROM stages ORDER BY started_at"))


def by_model(answers: dict[str, object]):
    """A responder answering each request by the model it names: a Reply, or ScriptedWorkers."""
    def respond(body: dict) -> Reply:
        answer = answers[body["model"]]
        return answer(body) if callable(answer) else answer
    return respond


SETTINGS = dict(observeAfterTokens=50, reflectAfterTokens=100, clockBasis="source")


def run(db_path, settings: Settings, config: ModelConfig):
    ws = workspace(db_path, settings)
    brain = make_brain(config, settings)
    return replay_session(ws, SID, brain, drain=True)


def test_a_primary_rejected_with_401_falls_back_and_the_fallback_is_named(tmp_path, db_path):
    load(tmp_path, db_path)
    with FakeOpenAI() as server:
        server.responder = by_model({"primary": http_error(401, "Incorrect API key provided"),
                                     "backup": ScriptedWorkers()})
        settings = Settings(**SETTINGS, model={"id": "openai/primary"}, fallbackModel={"id": "openai/backup"})
        result = run(db_path, settings, ModelConfig(model="openai/primary", api_base=server.base_url, retry=QUICK))
    assert result.error is None, result.error
    made = calls(db_path)
    failed = [c for c in made if c["status"] == "error"]
    assert failed and all(c["model"] == "openai/primary" and not c["fallback"] for c in failed)
    answered = [c for c in made if c["status"] == "ok"]
    assert answered and all(c["model"] == "openai/backup" and c["fallback"] for c in answered)
    # once per stage, then reused for the rest of the pass: the primary is asked by one stage only
    assert len({c["stage"] for c in failed}) == 1 and len(failed) == 1, failed  # a 401 is never retried
    stages = stage_rows(db_path)
    assert {s["stage"] for s in stages if s["outcome"] == "recorded"} >= {"observer", "reflector"}
    assert all(s["model"] == "openai/backup" for s in stages if s["outcome"] == "recorded")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_primary_refusing_connections_falls_back_to_a_model_that_answers(tmp_path, db_path):
    load(tmp_path, db_path)
    with FakeOpenAI() as server:
        server.responder = by_model({"backup": ScriptedWorkers()})
        settings = Settings(**SETTINGS, model={"id": "openai/primary"},
                            fallbackModel={"id": "openai/backup", "apiBase": server.base_url})
        result = run(db_path, settings, ModelConfig(model="openai/primary",
                                                    api_base=f"http://127.0.0.1:{_closed_port()}/v1", retry=QUICK))
    assert result.error is None and not result.stopped, result.error
    made = calls(db_path)
    assert {c["model"] for c in made if c["status"] == "error"} == {"openai/primary"}
    assert {(c["model"], c["fallback"]) for c in made if c["status"] == "ok"} == {("openai/backup", True)}
    assert any(s["stage"] == "observer" and s["outcome"] == "recorded" for s in stage_rows(db_path))


def test_model_map_routes_the_reflector_to_its_own_model(tmp_path, db_path):
    load(tmp_path, db_path)
    workers = ScriptedWorkers()
    with FakeOpenAI() as server:
        seen: list[tuple[str, str]] = []

        def respond(body: dict) -> Reply:
            seen.append((body["model"], stage_of(body)))
            return workers(body)

        server.responder = respond
        settings = Settings(**SETTINGS, model={"id": "openai/cheap"}, modelMap=[
            {"match": "anthropic/claude-*", "model": "openai/strong-$id:$thinking", "stages": ["reflector"]}])
        result = run(db_path, settings, ModelConfig(model="openai/cheap", api_base=server.base_url, retry=QUICK))
    assert result.error is None, result.error
    assert {m for m, stage in seen if stage == "observer"} == {"cheap"}
    assert {m for m, stage in seen if stage == "reflector"} == {"strong-claude-sonnet-4-5"}
    models = {(c["stage"], c["model"]) for c in calls(db_path)}
    assert ("reflector", "openai/strong-claude-sonnet-4-5") in models and ("observer", "openai/cheap") in models
    assert not any(c["fallback"] for c in calls(db_path))


def test_routing_rules_first_match_globs_and_substitutions():
    session = SessionModel(provider="anthropic", id="claude-opus-4-5", thinking="high")
    settings = Settings(model={"id": "openai/base"}, modelMap=[
        {"match": "openai/*", "model": "openai/never"},
        {"match": "anthropic/claude-?pus-*", "model": "$provider/$id-mini:low", "stages": ["observer", "dropper"]},
        {"match": "*", "model": "openrouter/$model:$thinking"}])
    observer, rule = routed_model(settings, session, "observer")
    assert (observer.litellm_name, observer.thinking, rule) == ("anthropic/claude-opus-4-5-mini", "low", 1)
    reflector, rule = routed_model(settings, session, "reflector")
    assert (reflector.litellm_name, reflector.thinking, rule) == ("openrouter/anthropic/claude-opus-4-5", "high", 2)
    # an unresolved token ($thinking of a session that set none) leaves the rule out
    plain, rule = routed_model(settings, SessionModel(provider="google", id="gemini"), "reflector")
    assert (plain.litellm_name, rule) == ("openai/base", None)
    assert routed_model(settings, None, "observer") == (settings.model, None)


@pytest.mark.parametrize("rule, says", [
    ({"match": "*", "model": "openai/x", "stages": ["summarizer"]}, "unknown stage 'summarizer'"),
    ({"match": "*", "model": "openai/$name"}, "unknown token $name"),
    ({"match": "*", "model": "gpt-4o"}, "is no provider/id"),
    ({"match": "*", "model": "openai/x:turbo"}, "unknown thinking level 'turbo'"),
])
def test_a_misconfigured_rule_is_one_line_before_any_work(tmp_path, rule, says):
    import json

    env = {"OM_MODEL_MAP": json.dumps([rule])}
    with pytest.raises(SettingsError) as raised:
        load_settings(env=env, home=tmp_path / "home", cwd=tmp_path / "nowhere")
    message = str(raised.value)
    assert "\n" not in message and says in message and "modelMap" in message, message


def test_a_fallback_equal_to_the_model_is_refused(tmp_path):
    with pytest.raises(SettingsError, match="fallbackModel equals model"):
        load_settings(env={"OM_MODEL": "openai/a", "OM_FALLBACK_MODEL": "openai/a"}, home=tmp_path, cwd=tmp_path)


def test_om_run_refuses_a_bad_rule_before_any_work(tmp_path):
    import os

    from om_cli import run_om

    session = conversation().write(tmp_path / "s.jsonl")
    env = {**os.environ, "OM_MODEL_MAP": '[{"match": "*", "model": "openai/x", "stages": ["observe"]}]'}
    result = run_om(["--db", str(tmp_path / "om.duckdb"), "run", str(session)], tmp_path, env)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown stage 'observe'" in lines[0], result.stderr
    assert not (tmp_path / "om.duckdb").exists()
