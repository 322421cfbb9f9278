"""Settings (SPEC §11): names and defaults as in the TypeScript extension, plus this project's own.

Values are resolved from, in rising priority: defaults, the user's Pi settings files (key
``observational-memory``; project over global), an ``om.toml`` (or ``--config FILE``), environment
variables ``OM_<SETTING_IN_SNAKE_CASE>``, then command-line flags. Nothing is read at import time.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]
DEFAULT_CHUNK_TOKENS = 60_000
MIN_CHUNK_TOKENS = 256


class ModelSetting(BaseModel):
    """``{provider, id, thinking}`` as the extension stores it."""

    model_config = ConfigDict(extra="forbid")

    provider: str | None = None
    id: str = Field(min_length=1)
    thinking: ThinkingLevel = "off"

    @property
    def litellm_name(self) -> str:
        """``provider/id`` as litellm expects it (the id alone when it already names a provider)."""
        if self.provider and not self.id.startswith(self.provider + "/"):
            return f"{self.provider}/{self.id}"
        return self.id


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- the extension's settings (SPEC §11)
    observeAfterTokens: int = Field(10_000, gt=0)
    reflectAfterTokens: int = Field(20_000, gt=0)
    observerChunkMaxTokens: int | None = Field(None, ge=MIN_CHUNK_TOKENS)
    compactAfterTokens: int = Field(81_000, gt=0)
    compactAfterTokensMode: Literal["calibrated", "ratio"] = "calibrated"
    compactAfterTokensRatio: float = Field(0.68, gt=0, lt=1)
    observationsPoolMaxTokens: int = Field(20_000, gt=0)
    observationsPoolTargetTokens: int | None = Field(None, gt=0)
    agentMaxTurns: int = Field(16, ge=1)
    model: ModelSetting | None = None
    passive: bool = False

    # --- this project's additions
    tokenCounter: Literal["pi", "tiktoken"] = "pi"  # which count drives clocks and budgets (SPEC §12)
    contextWindow: int | None = Field(None, gt=0)  # the model's window, when known
    keepRecentTokens: int = Field(20_000, ge=0)  # Pi's cut-point budget
    gapSafeCompaction: bool = True
    gapSafeMaxContextShare: float = Field(0.5, gt=0, le=1)  # budget guard for the kept tail
    redactSecrets: bool = True
    requestTimeoutSeconds: float = Field(120.0, gt=0)
    apiBase: str | None = None

    @model_validator(mode="after")
    def _target_below_max(self) -> Settings:
        if self.observationsPoolTargetTokens is not None and self.observationsPoolTargetTokens >= self.observationsPoolMaxTokens:
            raise ValueError("observationsPoolTargetTokens must be below observationsPoolMaxTokens")
        return self

    @property
    def pool_target_tokens(self) -> int:
        if self.observationsPoolTargetTokens is not None:
            return self.observationsPoolTargetTokens
        return self.observationsPoolMaxTokens // 2

    @property
    def chunk_max_tokens(self) -> int:
        if self.observerChunkMaxTokens is not None:
            return self.observerChunkMaxTokens
        if self.contextWindow:
            return max(MIN_CHUNK_TOKENS, math.floor(self.contextWindow * 0.2))
        return DEFAULT_CHUNK_TOKENS

    @property
    def compact_threshold(self) -> int:
        if self.compactAfterTokensMode == "ratio" and self.contextWindow:
            return math.floor(self.contextWindow * self.compactAfterTokensRatio)
        return self.compactAfterTokens
