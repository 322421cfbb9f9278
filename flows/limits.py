"""The concurrency limit that every model call shares, so a large archive does not trip a provider's
rate limits.

Two implementations of one limit:
* ``prefect``: Prefect's global concurrency limit ``om-model-calls``. It spans every process and
  worker of a deployment on a Prefect server (and a multi-process Dask cluster).
* ``process``: a semaphore in this process. ``om run`` uses it by default: on Prefect's ephemeral
  SQLite-backed API each slot acquisition is a database write that stalls for about 2 s whenever
  the server is recording task runs (measured here), which would dominate 200 ms model calls. A
  local run is one process, so the semaphore enforces the same limit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from om_core.settings import Settings
    from om_core.workers.run_config import ModelConfig, RunGuards

MODEL_CALL_LIMIT = "om-model-calls"
LimitMode = Literal["prefect", "process"]

_semaphores: dict[int, threading.BoundedSemaphore] = {}
_lock = threading.Lock()


def ensure_model_call_limit(slots: int, name: str = MODEL_CALL_LIMIT) -> None:
    """Create Prefect's global limit, or set its size, before sessions start calling models."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots, active=True))
            return
        if existing.limit != slots or not existing.active:
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots, active=True))


class PrefectGate:
    """One slot of Prefect's global limit per model call, leased for ``lease_seconds`` and renewed while
    the call runs: the slots of a process that dies (a lost Dask worker) come back when their lease
    runs out (``modelSlotLeaseSeconds``), not never."""

    def __init__(self, lease_seconds: float) -> None:
        self.lease_seconds = lease_seconds

    def __call__(self) -> AbstractContextManager:
        from prefect.concurrency.sync import concurrency

        # strict: a limit missing on the server is an error, never an unlimited run
        return concurrency(MODEL_CALL_LIMIT, occupy=1, strict=True, lease_duration=self.lease_seconds)


class ProcessGate:
    """``slots`` model calls at once in this process: the semaphore of that size this process keeps (a
    gate that travels to a Dask worker is that process's)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots

    def __call__(self) -> AbstractContextManager:
        with _lock:
            return _semaphores.setdefault(self.slots, threading.BoundedSemaphore(self.slots))


def run_guards(config: ModelConfig, settings: Settings) -> RunGuards:
    """A run's guards, once per run (om_core.workers.run_config.RunGuards): its breaker (``breakerFailures``),
    its --max-cost budget and the model-call gate of ``config.limit``."""
    from om_core.workers.run_config import RunGuards

    gate = None if config.offline else model_call_gate(config.limit, settings.modelConcurrency,
                                                           settings.modelSlotLeaseSeconds)
    return RunGuards.for_run(config, settings, gate)


def model_call_gate(mode: LimitMode, slots: int, lease_seconds: float) -> Callable[[], AbstractContextManager]:
    """A factory of context managers, each holding one slot for the duration of one model call (it
    pickles: a run's guards carry it to the replays on other processes)."""
    return PrefectGate(lease_seconds) if mode == "prefect" else ProcessGate(slots)
