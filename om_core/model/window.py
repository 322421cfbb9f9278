"""The memory model's window (SPEC §13): what the worker budgets derive from.

The window comes from litellm's model card for the memory model (its bundled cost map only:
nothing downloads), else from the ``contextWindow`` setting, else it is unknown and the SPEC's
fallbacks apply. ``workerMemoryMaxTokens`` defaults to a quarter of it; ``agentMaxTokens``, the
output reserved per worker request, is clamped to the card's own output limit.

Only a run asks for the card (litellm is imported inside ``model_card``): read paths (`om sql`,
`om view`, `om live compact`) never load litellm for it.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel

from om_core.model.client import OFFLINE
from om_core.settings import DEFAULT_WORKER_MEMORY_TOKENS, Settings


class WindowSource(str, Enum):
    MODEL_CARD = "model card"  # litellm's card for the memory model
    CONTEXT_WINDOW = "contextWindow"  # the setting
    UNKNOWN = "unknown"  # neither: the SPEC's fallbacks


class ModelCard(BaseModel):
    """What litellm's card says of a model's limits (None: the card does not say)."""

    input_tokens: int | None = None
    output_tokens: int | None = None


class MemoryWindow(BaseModel):
    """The memory model's window and where it came from."""

    model: str
    tokens: int | None  # the context window (None: unknown)
    output_tokens: int | None = None  # the card's output limit (None: unknown)
    source: WindowSource

    def worker_memory_max_tokens(self, settings: Settings) -> int:
        """``workerMemoryMaxTokens``: set, else a quarter of this window, else 16000."""
        if settings.workerMemoryMaxTokens is not None:
            return settings.workerMemoryMaxTokens
        return max(1, self.tokens // 4) if self.tokens else DEFAULT_WORKER_MEMORY_TOKENS

    def agent_max_tokens(self, settings: Settings) -> int:
        """``agentMaxTokens``, clamped to the model's own output limit where the card gives one."""
        if self.output_tokens:
            return min(settings.agentMaxTokens, self.output_tokens)
        return settings.agentMaxTokens


def _positive(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def model_card(model: str) -> ModelCard | None:
    """litellm's card for ``model`` from its bundled cost map (None: litellm does not know it)."""
    if not model or model == OFFLINE:
        return None
    from om_core.model.client import _import_litellm  # the run path only

    litellm = _import_litellm()
    try:
        info = litellm.get_model_info(model)
    except Exception:  # unknown to litellm
        return None
    card = ModelCard(input_tokens=_positive(info.get("max_input_tokens")) or _positive(info.get("max_tokens")),
                     output_tokens=_positive(info.get("max_output_tokens")))
    return card if card.input_tokens or card.output_tokens else None


def memory_window(model: str, settings: Settings) -> MemoryWindow:
    """The memory model's window: litellm's card, else ``contextWindow``, else unknown."""
    card = model_card(model)
    if card is not None and card.input_tokens:
        return MemoryWindow(model=model, tokens=card.input_tokens, output_tokens=card.output_tokens,
                            source=WindowSource.MODEL_CARD)
    output = card.output_tokens if card is not None else None
    if settings.contextWindow:
        return MemoryWindow(model=model, tokens=settings.contextWindow, output_tokens=output,
                            source=WindowSource.CONTEXT_WINDOW)
    return MemoryWindow(model=model, tokens=None, output_tokens=output, source=WindowSource.UNKNOWN)


def sized_for(settings: Settings, window: MemoryWindow) -> Settings:
    """``settings`` with ``workerMemoryMaxTokens`` as this window gives it (a setting the user made
    stays as made): the settings a run's stages read their inputs with."""
    if settings.workerMemoryMaxTokens is not None:
        return settings
    return settings.model_copy(update={"workerMemoryMaxTokens": window.worker_memory_max_tokens(settings)})
