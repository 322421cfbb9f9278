"""Fail fast: the offline preflight of a model configuration, and a circuit breaker for the model
calls of one run.

A permanent provider error that no retry can fix (a rejected or missing key, no permission, an
unknown model, a base URL that cannot work) fails every later call of the run the same way. The
first such error trips the run's breaker; from then on every model call of that run fails at once
with the original reason and sends no request. Connection failures (nothing listens at the
address, the host does not resolve) trip it after a few in a row with no success in between, and
any transient failure (500s, 429s, timeouts of a server that hangs) after ``breakerFailures`` in a
row across the run's stages: a provider down for good would otherwise be retried stage after stage.

Call points: ``preflight_model`` before anything starts (it needs litellm, imported only for a
configured model); a run's breaker is part of its guards (om_core.workers.run_config.RunGuards), which
its stage runner and its model share (``LiteLLMModel(breaker=...)`` consults it before each attempt
and reports each outcome to it).
"""

from __future__ import annotations

import os
import threading
from urllib.parse import urlparse

from om_core.errors import OmError
from om_core.model.client import ModelError, litellm_model_name


class CircuitOpen(ModelError):
    """A call that was not sent: the run's breaker tripped on an earlier permanent error."""

    def __init__(self, reason: OmError) -> None:
        super().__init__(f"not sent: model calls stopped after {reason}", "permanent", getattr(reason, "status", None),
                         getattr(reason, "category", "storage"), getattr(reason, "variables", ()))
        self.reason = reason


class CircuitBreaker:
    """Thread-safe; shared by every stage of one run in this process."""

    def __init__(self, unreachable_limit: int = 3, failure_limit: int = 0) -> None:
        self.unreachable_limit = unreachable_limit
        self.failure_limit = failure_limit  # transient failures in a row that stop the run; 0: never
        self._lock = threading.Lock()
        self._reason: OmError | None = None  # a ModelError, or a StorageError the run stopped on
        self._unreachable = 0  # connection failures in a row
        self._failing = 0  # transient failures in a row (any stage; a success in between resets it)

    @property
    def reason(self) -> OmError | None:
        return self._reason

    @property
    def tripped(self) -> bool:
        return self._reason is not None

    def check(self) -> None:
        """Before a call: raise ``CircuitOpen`` (with the original reason) once tripped."""
        reason = self._reason
        if reason is not None:
            raise CircuitOpen(reason)

    def record(self, error: ModelError | None) -> None:
        """After a call: None for a success, else its classified error."""
        with self._lock:
            if error is None:
                self._unreachable = self._failing = 0
                return
            if isinstance(error, CircuitOpen) or self._reason is not None:
                return
            if error.stops_run:
                self._reason = error
            elif error.category == "unreachable":
                self._unreachable += 1
                if self._unreachable >= self.unreachable_limit:
                    self._reason = ModelError(f"{error} ({self._unreachable} attempts in a row)", "permanent",
                                              error.status, "unreachable")
                    return
            if error.kind == "transient":
                self._failing += 1
                if self.failure_limit and self._failing >= self.failure_limit:
                    self._reason = ModelError(
                        f"the provider kept failing: {self._failing} model calls in a row failed (breakerFailures), "
                        f"the last with {error}; rerun when it answers again", "permanent", error.status,
                        error.category)

    def trip(self, error: OmError) -> None:
        """Stop the run's model calls for a reason found outside them (a full disk, an interruption)."""
        with self._lock:
            if self._reason is None:
                self._reason = error

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


# ------------------------------------------------------------------ preflight


class PreflightError(OmError):
    """A model configuration that cannot work, found before any call (exit 1)."""


class MissingCredentials(PreflightError):
    def __init__(self, model: str, variables: list[str]) -> None:
        super().__init__(f"missing credentials for {model}: set {' or '.join(variables)} "
                         "(or --api-base for an OpenAI-compatible server)")
        self.variables = variables


def check_api_base(api_base: str | None) -> None:
    if not api_base:
        return
    parsed = urlparse(api_base)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PreflightError(f"--api-base {api_base!r} is not a URL: it needs http:// or https:// and a host")


# The key variables of the most used providers, as litellm.validate_environment names them (any one
# of a provider's variables is enough). Known here so that a missing key fails in a fraction of a
# second instead of after litellm's import (seconds); tests/test_circuit.py checks every entry
# against litellm. Other providers are asked of litellm itself.
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "gemini": ("GOOGLE_API_KEY", "GEMINI_API_KEY"),
    "groq": ("GROQ_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "xai": ("XAI_API_KEY",),
}


def preflight_model(model: str, api_base: str | None = None, api_key: str | None = None) -> None:
    """What can be checked offline: the base URL parses, litellm knows the provider, and the
    provider's API key variable is set. Only API keys are required here: base URLs, cloud projects and
    cloud credentials can come from defaults or profiles, so the provider is left to judge those."""
    check_api_base(api_base)
    name = litellm_model_name(model, api_base)
    provider = name.split("/", 1)[0] if "/" in name else None
    if provider in PROVIDER_KEYS:
        variables = PROVIDER_KEYS[provider]
        if not (api_base or api_key) and not any(os.environ.get(v) for v in variables):
            raise MissingCredentials(name, list(variables))
        return
    from om_core.model.client import _import_litellm

    litellm = _import_litellm()
    try:
        litellm.get_llm_provider(model=name, api_base=api_base)
    except Exception:
        raise PreflightError(f"unknown model {model!r}: litellm cannot tell its provider; use provider/model "
                             "(openai/…, anthropic/…, openrouter/…, ollama/…) or --api-base") from None
    if api_base or api_key:
        return  # an OpenAI-compatible server may need no key (OM_API_KEY is sent when set)
    needed = litellm.validate_environment(model=name).get("missing_keys") or []
    missing = [v for v in needed if v.endswith("API_KEY")]
    if missing:
        raise MissingCredentials(name, missing)
