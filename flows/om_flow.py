"""om's Prefect flows: Prefect's ``Flow``, its run's parameters recorded without FastAPI's encoder.

Prefect records a flow run's parameters (what its UI shows) through ``fastapi.encoders.jsonable_encoder``,
which imports FastAPI into the client: ~0.2 s of CPU for every `om run`, a twentieth of a warm
run, to encode a few small values. pydantic's own encoder (loaded already) gives the same JSON for
them: om's parameters are pydantic models, strings, numbers and lists; a value neither can encode is
recorded as Prefect records it, ``<TypeName>`` (om run's guards).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect.flows import Flow
from prefect.futures import PrefectFuture
from prefect.states import State
from pydantic_core import to_jsonable_python


class OmFlow(Flow):
    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        serialized: dict[str, Any] = {}
        for key, value in parameters.items():
            if isinstance(value, (PrefectFuture, State)):  # as Prefect: never resolved to be recorded
                serialized[key] = f"<{type(value).__name__}>"
                continue
            try:
                serialized[key] = to_jsonable_python(value)
            except Exception:  # a value with no JSON form (a lock, a client): its type, as Prefect records it
                serialized[key] = f"<{type(value).__name__}>"
        return serialized

    def with_options(self, **options: Any) -> OmFlow:
        new = super().with_options(**options)  # Prefect builds a plain Flow: keep om's
        new.__class__ = OmFlow
        return new


def om_flow(**options: Any) -> Callable[[Callable[..., Any]], OmFlow]:
    """``prefect.flow(**options)`` for om's flows."""
    return lambda fn: OmFlow(fn, **options)
