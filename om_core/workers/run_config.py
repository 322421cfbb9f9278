"""What a run of the workers is configured and guarded by, for all of its stages alike: which model
answers (``ModelConfig``, the brain ``make_brain`` builds from it, per-stage routing with
``RoutedBrain``) and what stops or paces it (``RunGuards``: the circuit breaker, the cost budget, the
call gate; ``RunStopped`` and ``BudgetReached``, the reasons a run refuses its next stage). The
stages themselves (prepare, compute, record) are ``om_core.workers.stages``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Literal

import duckdb
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_serializer

from om_core.errors import StopReason
from om_core.model.circuit import CircuitBreaker, preflight_model
from om_core.model.client import OFFLINE, CallRecord, LiteLLMModel, RetryPolicy
from om_core.model.cost import CostBudget
from om_core.model.routing import SessionModel, routed_model
from om_core.model.window import memory_window
from om_core.settings import ModelSetting, Settings
from om_core.store import db as dbmod
from om_core.workers.llm import ModelBrain
from om_core.workers.offline import OfflineBrain
from om_core.workers.stage_kinds import Brain


class ModelConfig(BaseModel):
    """Which model the workers use and how a run calls it; ``offline`` (or nothing configured) means the
    extractive baseline. One typed value: the CLI builds it once from the settings (``from_settings``) and
    the flow takes it as a parameter (a deployment carries it as JSON: ``model_dump(mode="json")``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    api_base: str | None = None
    api_key: SecretStr | None = None  # never written out: a flow run's parameters are stored by Prefect
    thinking: str = "off"
    timeout: float = 120.0
    stream: bool = False
    # transient errors are retried inside the model call (each attempt an llm_calls row), never by Prefect:
    # a stage that succeeds after retries is one recorded stage
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    limit: Literal["process", "prefect"] = "process"  # the model-call limit: this process's, or Prefect's global one
    max_cost: float | None = None  # the run's --max-cost (om_core.model.cost)

    @classmethod
    def from_settings(cls, settings: Settings, model: str | None = None, api_base: str | None = None,
                      **run: Any) -> ModelConfig:
        chosen = model or (settings.model.litellm_name if settings.model else None)
        return cls(model=chosen, api_base=api_base or settings.apiBase,
                   thinking=settings.model.thinking if settings.model else "off",
                   timeout=settings.requestTimeoutSeconds, **run)

    @field_serializer("api_key", when_used="json")
    def _no_key_out(self, key: SecretStr | None) -> None:  # a deployment's worker reads its own credentials
        return None

    @field_serializer("retry")
    def _retry_out(self, retry: RetryPolicy) -> dict[str, Any]:  # its sleep (a test's clock) stays in the process
        return {"attempts": retry.attempts, "base_seconds": retry.base_seconds, "max_seconds": retry.max_seconds}

    @property
    def offline(self) -> bool:
        return not self.model or self.model == OFFLINE

    @property
    def name(self) -> str:
        """The model as the plan's fingerprints and the stage keys name it."""
        return OFFLINE if self.offline else self.model

    @property
    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key is not None else None

    def preflight(self, settings: Settings | None = None) -> None:
        """Fail before anything starts on what can be checked offline (om_core.model.circuit). With a
        ``fallbackModel`` in ``settings``, a primary that cannot be resolved is not fatal: the fallback
        answers (it must pass instead)."""
        fallback = settings.fallbackModel if settings is not None else None
        if not self.offline:
            try:
                preflight_model(self.model, self.api_base, self.key)
            except Exception:
                if fallback is None:
                    raise
        if fallback is not None:
            preflight_model(fallback.litellm_name, fallback.apiBase or self.api_base, self.key)


class RunStopped(Exception):
    """A session's replay ends here: the run's circuit breaker tripped (om_core.model.circuit)."""

    reason = StopReason.CIRCUIT


class BudgetReached(Exception):
    """The run's --max-cost stopped a stage before its model call: the replay ends there, cleanly
    (nothing half-done is recorded), and a rerun resumes it (om_core.model.cost)."""

    reason = StopReason.BUDGET


class RunGuards:
    """What stops or paces a run's model calls, as one value: the run's circuit breaker (om_core.model.circuit),
    its --max-cost budget (om_core.model.cost, None without a limit) and the gate each call holds a slot of
    (None: no limit). Built once per run and handed to the stage runner (which refuses a stage once the
    breaker tripped or the budget is spent) and to the brain's model (which consults them before each
    call). Every replay of the run in this process shares the one value; a replay on another process
    (a Dask worker) gets its own copy (``for_replay``)."""

    def __init__(self, breaker: CircuitBreaker | None = None, budget: CostBudget | None = None,
                 gate: Callable[[], AbstractContextManager] | None = None) -> None:
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        self.budget = budget
        self.gate = gate

    @classmethod
    def for_run(cls, config: ModelConfig, settings: Settings,
                gate: Callable[[], AbstractContextManager] | None = None) -> RunGuards:
        """A run's guards: its breaker counts ``breakerFailures``; its budget is ``config.max_cost`` at the
        model's price (``ValueError`` when litellm has none: a limit could not be kept)."""
        budget = None
        if config.max_cost is not None and not config.offline:
            from om_core.model.cost import price_of  # litellm's price list: only when there is a limit

            price = price_of(config.model)
            if price is None:
                raise ValueError(f"--max-cost needs the model's price, and litellm has none for {config.model!r}")
            budget = CostBudget(config.max_cost, price)
        return cls(CircuitBreaker(failure_limit=settings.breakerFailures), budget, gate)

    def for_replay(self, allowance: float | None) -> RunGuards:
        """A copy for a replay on another process: the breaker as it stands (a run stopped already stops
        the replay at its first stage) and a budget of ``allowance`` dollars (the part of the run's budget
        the caller set aside for it; unused without a budget). It pickles (no locks travel)."""
        breaker = CircuitBreaker(self.breaker.unreachable_limit, self.breaker.failure_limit)
        if self.breaker.reason is not None:
            breaker.trip(self.breaker.reason)
        budget = None if self.budget is None else CostBudget(max(0.0, allowance or 0.0), self.budget.price,
                                                             exhausted=self.budget.exhausted)
        return RunGuards(breaker, budget, self.gate)

    def check(self) -> None:
        """Raise the reason the run refuses its next stage: ``RunStopped`` (the breaker tripped) or
        ``BudgetReached`` (the budget is spent)."""
        if self.breaker.tripped:
            raise RunStopped(str(self.breaker.reason))
        if self.budget is not None and self.budget.exhausted:
            raise BudgetReached("the run's cost budget (--max-cost) is reached; rerun to resume")

    def __getstate__(self) -> dict[str, Any]:
        return {"breaker": self.breaker, "budget": self.budget, "gate": self.gate}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _model_brain(config: ModelConfig, settings: Settings, guards: RunGuards, calls: list[CallRecord],
                 model: str, api_base: str | None, thinking: str, *, fallback: bool = False,
                 breaker: CircuitBreaker | None = None) -> ModelBrain:
    record = calls.append
    if fallback:  # each of its calls is recorded as the fallback's
        def record(call: CallRecord) -> None:
            call.fallback = True
            calls.append(call)
    chat = LiteLLMModel(model, api_base=api_base, api_key=config.key, thinking=thinking, timeout=config.timeout,
                        stream=config.stream, retry=config.retry, record=record, gate=guards.gate,
                        breaker=guards.breaker if breaker is None else breaker, keep_texts=settings.storePrompts,
                        budget=guards.budget,
                        max_tokens=memory_window(model, settings).agent_max_tokens(settings))
    return ModelBrain(chat, max_turns=settings.agentMaxTurns, redact_secrets=settings.redactSecrets,
                      closing_turn=settings.agentClosingTurn, calls=calls)


def make_brain(config: ModelConfig, settings: Settings, guards: RunGuards | None = None,
               calls: list[CallRecord] | None = None, session_model: SessionModel | None = None) -> Brain:
    """The offline baseline or a model brain; a model brain's model consults ``guards`` (the run's
    breaker, budget and call gate) before every call and keeps its call records in ``brain.calls``.
    With ``modelMap`` or ``fallbackModel`` set (SPEC §13), a ``RoutedBrain`` picks each stage's model for
    ``session_model`` (it can also learn it later: ``RoutedBrain.bind``)."""
    guards = guards if guards is not None else RunGuards()
    calls = [] if calls is None else calls
    if settings.modelMap or settings.fallbackModel is not None:
        return RoutedBrain(config, settings, guards, calls, session_model)
    if config.offline:
        return OfflineBrain(redact_secrets=settings.redactSecrets)
    return _model_brain(config, settings, guards, calls, config.model, config.api_base, config.thinking)


def read_session_model(con: duckdb.DuckDBPyConnection, session_id: str) -> SessionModel | None:
    """The session model of an ingested session: the one its assistant messages name (None: none does)."""
    row = dbmod.named_row(con, "session_model", {"session_id": session_id})
    if row is None or not row["id"]:
        return None
    return SessionModel(provider=row["provider"] or None, id=row["id"], thinking=row["thinking"] or None)


class RoutedBrain:
    """The workers on the models SPEC §13 routes them to: each stage's model by the first ``modelMap``
    rule matching the session model (else the configured model, or the offline baseline), and
    ``fallbackModel`` when a stage's model cannot be resolved or its call fails: tried once for that
    stage, then used for every later stage of the pass (this brain's life: one session's replay).

    The primaries keep a breaker of their own: a rejected key of the primary must not stop the run's
    calls, which the fallback makes under the run's breaker."""

    offline = False

    def __init__(self, config: ModelConfig, settings: Settings, guards: RunGuards, calls: list[CallRecord],
                 session_model: SessionModel | None = None) -> None:
        self.config, self.settings, self.guards, self.calls = config, settings, guards, calls
        self.session_model = session_model
        self.fell_back = False  # the fallback answered once: every later stage of the pass uses it
        self._brains: dict[tuple, Brain] = {}
        self._primary_breaker = CircuitBreaker() if settings.fallbackModel is not None else None
        fallback = settings.fallbackModel
        self.fallback_name = (None if fallback is None else
                              LiteLLMModel(fallback.litellm_name, api_base=fallback.apiBase or config.api_base).name)

    def bind(self, session_model: SessionModel | None) -> None:
        """The session whose stages it runs (the replay engine tells it once the session is read)."""
        self.session_model = session_model

    def _primary_setting(self, stage: str) -> ModelSetting | None:
        chosen, rule = routed_model(self.settings, self.session_model, stage)
        if rule is None:  # no rule: the run's own model (--model or the settings'), not the settings' alone
            return None if self.config.offline else ModelSetting(id=self.config.model, thinking=self.config.thinking)
        return chosen

    def _brain(self, setting: ModelSetting | None, fallback: bool) -> Brain:
        if setting is None or setting.litellm_name == OFFLINE:
            key: tuple = ("offline",)
        else:
            key = (setting.litellm_name, setting.apiBase, setting.thinking, fallback)
        if key not in self._brains:
            if key == ("offline",):
                self._brains[key] = OfflineBrain(redact_secrets=self.settings.redactSecrets)
            else:
                self._brains[key] = _model_brain(
                    self.config, self.settings, self.guards, self.calls, setting.litellm_name,
                    setting.apiBase or self.config.api_base, setting.thinking, fallback=fallback,
                    breaker=None if fallback else self._primary_breaker)
        return self._brains[key]

    def _resolvable(self, setting: ModelSetting | None) -> bool:
        if setting is None:
            return True
        try:
            preflight_model(setting.litellm_name, setting.apiBase or self.config.api_base, self.config.key)
            return True
        except Exception:
            return False

    def primary_for(self, stage: str) -> Brain:
        """The brain a stage asks first; the stage key is made with its name."""
        return self._brain(self._primary_setting(stage), False)

    def for_stage(self, stage: str) -> Brain:
        """Who answers ``stage`` now: the fallback once it took over, or when the stage's model cannot be
        resolved; else the stage's own model."""
        fallback = self.settings.fallbackModel
        if fallback is not None and (self.fell_back or not self._resolvable(self._primary_setting(stage))):
            self.fell_back = True
            return self._brain(fallback, True)
        return self.primary_for(stage)

    def after_failure(self, stage: str) -> Brain | None:
        """The fallback for a stage whose call failed, once (None: no fallback, or it failed itself)."""
        if self.settings.fallbackModel is None or self.fell_back:
            return None
        self.fell_back = True
        return self._brain(self.settings.fallbackModel, True)

    @property
    def name(self) -> str:
        """The run's model as plans and fingerprints name it."""
        return self.config.name

    def observe(self, inp: Any, check: Any) -> Any:
        return self.for_stage("observer").observe(inp, check)

    def reflect(self, inp: Any, check: Any) -> Any:
        return self.for_stage("reflector").reflect(inp, check)

    def drop(self, inp: Any, check: Any) -> Any:
        return self.for_stage("dropper").drop(inp, check)

    def drop_reflections(self, inp: Any, check: Any) -> Any:
        return self.for_stage("reflection-dropper").drop_reflections(inp, check)
