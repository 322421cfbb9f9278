"""The global concurrency limit that every model call shares (Prefect's, so it spans all sessions,
task runners and worker processes of a run)."""

from __future__ import annotations

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectNotFound

MODEL_CALL_LIMIT = "om-model-calls"


def ensure_model_call_limit(slots: int, name: str = MODEL_CALL_LIMIT) -> None:
    """Create the limit, or set its size, before sessions start calling models."""
    with get_client(sync_client=True) as client:
        try:
            existing = client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=slots, active=True))
            return
        if existing.limit != slots or not existing.active:
            client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=slots, active=True))


def model_call_gate():
    """Hold one slot of the shared limit for the duration of one model call."""
    return concurrency(MODEL_CALL_LIMIT, occupy=1, strict=False)
