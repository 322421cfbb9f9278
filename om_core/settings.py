"""Settings (SPEC §11): names and defaults as in the TypeScript extension, plus this project's own.

Values are resolved from, in rising priority: defaults, Pi's own ``compaction.keepRecentTokens``
(project over global, as Pi reads it), the user's Pi settings files (key
``observational-memory``; project over global), an ``om.toml`` (or ``--config FILE``), environment
variables ``OM_<SETTING_IN_SNAKE_CASE>``, then command-line flags. Nothing is read at import time.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from om_core.errors import OmError

ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]
DEFAULT_CHUNK_TOKENS = 60_000
PASSIVE_ENV = "PI_OBSERVATIONAL_MEMORY_PASSIVE"  # the extension's environment switch for `passive`
DEFAULT_SUMMARY_MAX_TOKENS = 8_000  # SPEC §13, when no context window is known
DEFAULT_WORKER_MEMORY_TOKENS = 16_000  # SPEC §13, when the memory model's window is not known
MIN_CHUNK_TOKENS = 256


class ModelSetting(BaseModel):
    """``{provider, id, thinking}`` as the extension stores it."""

    model_config = ConfigDict(extra="forbid")

    provider: str | None = None
    id: str = Field(min_length=1)
    thinking: ThinkingLevel = "off"
    # this project's: the model's own OpenAI-compatible server (unset: apiBase)
    apiBase: str | None = None

    @property
    def litellm_name(self) -> str:
        """``provider/id`` as litellm expects it (the id alone when it already names a provider)."""
        if self.provider and not self.id.startswith(self.provider + "/"):
            return f"{self.provider}/{self.id}"
        return self.id


ROUTED_STAGES = ("observer", "reflector", "reflection-dropper", "dropper")
MODEL_TOKENS = ("provider", "id", "model", "thinking")  # what a modelMap rule's model may take from the session model
_TOKEN = re.compile(r"\$([A-Za-z_]\w*)")


class ModelRule(BaseModel):
    """One ``modelMap`` rule (SPEC §13): the session model's ``provider/id`` matching the glob ``match``
    routes ``stages`` (all when unset) to ``model`` (``provider/id[:thinking]``, with ``$provider``,
    ``$id``, ``$model``, ``$thinking`` taken from the session model). A rule that cannot work (an unknown
    stage, an unknown token, a model that is no ``provider/id``) is refused when the settings load."""

    model_config = ConfigDict(extra="forbid")

    match: str = Field(min_length=1)
    model: str = Field(min_length=1)
    stages: list[str] | None = None

    @model_validator(mode="after")
    def _well_formed(self) -> ModelRule:
        unknown = [s for s in self.stages or () if s not in ROUTED_STAGES]
        if unknown:
            raise ValueError(f"modelMap rule {self.match!r}: unknown stage {unknown[0]!r} "
                             f"(stages: {', '.join(ROUTED_STAGES)})")
        if self.stages is not None and not self.stages:
            raise ValueError(f"modelMap rule {self.match!r}: an empty stages list routes nothing")
        tokens = [t for t in _TOKEN.findall(self.model) if t not in MODEL_TOKENS]
        if tokens:
            raise ValueError(f"modelMap rule {self.match!r}: unknown token ${tokens[0]} in {self.model!r} "
                             f"(tokens: {', '.join('$' + t for t in MODEL_TOKENS)})")
        probe = _TOKEN.sub(lambda m: "high" if m.group(1) == "thinking" else "x", self.model)
        name, _, thinking = probe.partition(":")
        if "/" not in name.strip("/") or name.startswith("/") or name.endswith("/"):
            raise ValueError(f"modelMap rule {self.match!r}: model {self.model!r} is no provider/id[:thinking]")
        if thinking and thinking not in THINKING_LEVELS:
            raise ValueError(f"modelMap rule {self.match!r}: unknown thinking level {thinking!r} in {self.model!r}")
        return self


THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh", "max")


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
    # --- the extension's settings after 3.1.4 (SPEC §13)
    fallbackModel: ModelSetting | None = None  # tried when the memory model fails; never equal to it
    modelMap: list[ModelRule] = Field(default_factory=list)  # first-match routing per session model and stage
    compactionCatchUpMaxChunks: int = Field(2, ge=0)  # observer chunks a compaction may run to close its gap
    compactionMaxRetainedTokens: int | None = Field(None, gt=0)  # kept tail + summary over it: decline
    # bounded memory; unset: derived from contextWindow, else the SPEC's fallback
    compactionSummaryMaxTokens: int | None = Field(None, gt=0)  # the rendered memory summary, at most
    reflectionsPoolTargetTokens: int = Field(8_000, gt=0)  # active reflections' rendered lines, the target
    workerMemoryMaxTokens: int | None = Field(None, gt=0)  # the memory one worker request carries, at most
    agentMaxTokens: int = Field(32_000, gt=0)  # output reserved per worker request (clamped to the model's limit)

    # --- this project's additions
    tokenCounter: Literal["pi", "tiktoken"] = "pi"  # which count drives clocks and budgets (SPEC §12)
    contextWindow: int | None = Field(None, gt=0)  # the model's window, when known
    keepRecentTokens: int = Field(20_000, ge=0)  # Pi's cut-point budget
    cutPointRules: Literal["pi-1.6", "legacy"] = "pi-1.6"  # Pi's compaction rules to simulate (SPEC §11)
    clockBasis: Literal["usage", "source"] = "usage"  # observer/reflector clocks on provider usage (SPEC §7)
    gapSafeCompaction: bool = True
    gapSafeMaxContextShare: float = Field(0.5, gt=0, le=1)  # budget guard for the kept tail
    redactSecrets: bool = True
    storePrompts: bool = True  # keep each model call's request and response text (om logs --full)
    requestTimeoutSeconds: float = Field(120.0, gt=0)
    modelConcurrency: int = Field(8, ge=1)  # model calls in flight at once across a whole run
    # how long a slot of Prefect's global model-call limit is leased (renewed while its call runs): a
    # slot held by a process that died comes back after this long (--model-limit prefect)
    modelSlotLeaseSeconds: float = Field(300.0, ge=60, le=86_400)
    # transient model-call failures in a row (500s, 429s, timeouts; across stages, no success in
    # between) that stop the run (exit 1, one line; a rerun resumes); 0: never
    breakerFailures: int = Field(12, ge=0)
    apiBase: str | None = None
    # where the pipeline keeps computed stage results (a folder, an fsspec URL, or a Prefect block slug);
    # unset: a folder next to the database
    resultStorage: str | None = None
    # the local Prefect server an om run starts stays for the next run and stops after this many seconds
    # without one; 0: every run starts Prefect's temporary API and stops it (no server outlives a run)
    prefectServerIdleSeconds: float = Field(600.0, ge=0)

    # this project's: how long a live compaction's catch-up may take before the hook answers without it
    compactionCatchUpSeconds: float = Field(20.0, gt=0)

    @field_validator("model", "fallbackModel", mode="before")
    @classmethod
    def _model_string(cls, value: Any) -> Any:
        """A litellm model string (``openai/gpt-4o-mini``) wherever a model is set: om.toml, Pi's settings."""
        if isinstance(value, str):
            return {"id": value.strip()} if value.strip() else None
        return value
    # after a tool call accepted in full, ask the model once more (the extension's loop); off: the
    # clean receipt ends the stage in one call
    agentClosingTurn: bool = False
    # the dropper never drops a critical observation that no reflection cites (beyond SPEC §8)
    keepUncitedCritical: bool = True
    # the observer reads a tool call's arguments, a tool result or a command's output longer than this
    # (Pi's estimate, 4 characters a token) as its head and tail; 0: whole. Its view only: the
    # entries, recall and the ledger keep everything
    observerToolMaxTokens: int = Field(1_000, ge=0)
    # after a deliberate empty reflector result, wait for another reflectAfterTokens of source before
    # asking it again (the observer always backs off so, SPEC §9; the extension's reflector does not)
    reflectorBackoff: bool = False

    # --- project memory
    # folder -> project id: a session whose cwd is that folder or below it belongs to that project
    # (overrides the git work tree's remote or root, om_core.store.repository)
    projects: dict[str, str] = Field(default_factory=dict)
    # the project stage runs when the project's sessions recorded this many tokens of reflections and
    # critical observations since it last read them
    projectReflectAfterTokens: int = Field(2_000, gt=0)
    projectInputMaxTokens: int = Field(16_000, ge=256)  # new session memory one project stage reads at most
    # add the project's memory to a session's first compaction (om export --compact, the live compaction)
    projectMemoryInCompaction: bool = False
    projectMemoryMaxTokens: int = Field(2_000, gt=0)  # the project reflections such a compaction adds, at most

    # --- the agent's tools (SPEC §13)
    # recall by query fuses local semantic similarity (the embeddings extra: a model shipped in its
    # wheel, no embedding API) with the keyword ranking; off: keyword ranking only
    recallEmbeddings: bool = False
    # the compact_context tool of om's Pi extension: the agent compacts at a breakpoint it chooses,
    # leaving a resume note in the kept tail; the compaction is om's (model-free)
    selfCompact: bool = False
    # om's Pi extension: its background tick (`om run`) runs only while the agent is idle; the agent
    # starting a turn stops it (om run resumes at the next settle)
    consolidateWhenIdle: bool = False
    # with selfCompact, ask the agent to compact as its context fills: each rule a share of the
    # window (at most 1) or a count of tokens (above 1); one ask per rule crossed since the latest
    # compaction, the last one firmer
    warnAt: list[float] = Field(default_factory=list)

    @field_validator("warnAt", mode="before")
    @classmethod
    def _warn_at_text(cls, value: Any) -> Any:
        """``OM_WARN_AT='0.6,0.8'`` (or a JSON list): a list where one is set from text."""
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [p for p in text.split(",") if p.strip()]
        return value

    @field_validator("warnAt")
    @classmethod
    def _warn_at_rules(cls, value: list[float]) -> list[float]:
        if any(not math.isfinite(v) or v <= 0 for v in value):
            raise ValueError("each warnAt rule is a share of the window (0 < x <= 1) or a count of tokens (> 1)")
        return value

    @field_validator("projects", mode="before")
    @classmethod
    def _projects_json(cls, value: Any) -> Any:
        """``OM_PROJECTS='{"/src/app": "app"}'``: a JSON object where a mapping is set from text."""
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else {}
        if isinstance(value, dict):
            return {str(Path(k).expanduser()) if str(k).startswith("~") else str(k): v for k, v in value.items()}
        return value

    @field_validator("modelMap", mode="before")
    @classmethod
    def _rules_json(cls, value: Any) -> Any:
        """``OM_MODEL_MAP='[{"match": "anthropic/*", "model": "openai/gpt-4o-mini"}]'``: JSON where set from text."""
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else []
        return value

    @model_validator(mode="after")
    def _target_below_max(self) -> Settings:
        if self.observationsPoolTargetTokens is not None and self.observationsPoolTargetTokens >= self.observationsPoolMaxTokens:
            raise ValueError("observationsPoolTargetTokens must be below observationsPoolMaxTokens")
        if (self.fallbackModel is not None and self.model is not None
                and self.fallbackModel.litellm_name == self.model.litellm_name
                and self.fallbackModel.apiBase == self.model.apiBase):
            raise ValueError("fallbackModel equals model: a fallback must be another model")
        return self

    @property
    def retained_max_tokens(self) -> int:
        """compactionMaxRetainedTokens, else half the session's window, else 60000 (SPEC §13)."""
        if self.compactionMaxRetainedTokens is not None:
            return self.compactionMaxRetainedTokens
        return self.contextWindow // 2 if self.contextWindow else 60_000

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

    @property
    def summary_max_tokens(self) -> int:
        """compactionSummaryMaxTokens: set, else an eighth of the session's window, else 8000."""
        if self.compactionSummaryMaxTokens is not None:
            return self.compactionSummaryMaxTokens
        if self.contextWindow:
            return max(1, self.contextWindow // 8)
        return DEFAULT_SUMMARY_MAX_TOKENS

    @property
    def worker_memory_max_tokens(self) -> int:
        """workerMemoryMaxTokens: set, else a quarter of the memory model's window (contextWindow),
        else 16000."""
        if self.workerMemoryMaxTokens is not None:
            return self.workerMemoryMaxTokens
        if self.contextWindow:
            return max(1, self.contextWindow // 4)
        return DEFAULT_WORKER_MEMORY_TOKENS

    def derived(self) -> dict[str, tuple[Any, str]]:
        """Settings whose effective value follows from others: key -> (value, the rule that gave it)."""
        found: dict[str, tuple[Any, str]] = {}
        if self.workerMemoryMaxTokens is None:
            found["workerMemoryMaxTokens"] = (
                self.worker_memory_max_tokens, "a quarter of the memory model's window on a run (litellm's model "
                f"card), else contextWindow {self.contextWindow} / 4" if self.contextWindow
                else "a quarter of the memory model's window on a run (litellm's model card), else "
                f"{DEFAULT_WORKER_MEMORY_TOKENS}, as no contextWindow is set")
        if self.compactionSummaryMaxTokens is None:
            found["compactionSummaryMaxTokens"] = (
                self.summary_max_tokens, f"contextWindow {self.contextWindow} / 8" if self.contextWindow
                else f"{DEFAULT_SUMMARY_MAX_TOKENS}, as no contextWindow is set")
        if self.observerChunkMaxTokens is None:
            rule = (f"20% of contextWindow {self.contextWindow}, at least {MIN_CHUNK_TOKENS}" if self.contextWindow
                    else f"{DEFAULT_CHUNK_TOKENS}, as no contextWindow is set")
            found["observerChunkMaxTokens"] = (self.chunk_max_tokens, rule)
        if self.observationsPoolTargetTokens is None:
            found["observationsPoolTargetTokens"] = (
                self.pool_target_tokens, f"half of observationsPoolMaxTokens {self.observationsPoolMaxTokens}")
        if self.compactionMaxRetainedTokens is None:
            found["compactionMaxRetainedTokens"] = (
                self.retained_max_tokens, f"half of contextWindow {self.contextWindow}" if self.contextWindow
                else "60000, as no contextWindow is set")
        if self.compactAfterTokensMode == "ratio":
            found["compactAfterTokens"] = (
                self.compact_threshold,
                f"ratio mode: contextWindow {self.contextWindow} x compactAfterTokensRatio "
                f"{self.compactAfterTokensRatio}" if self.contextWindow else
                f"ratio mode without a contextWindow: compactAfterTokens {self.compactAfterTokens} applies")
        return found


# ---------------------------------------------------------------- where settings come from

PI_SETTINGS_KEY = "observational-memory"
FIELDS = tuple(Settings.model_fields)


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


_BY_SNAKE = {snake(f): f for f in FIELDS}


class SettingsError(OmError, ValueError):
    """A settings value that does not validate; the message names the key and where it came from."""


class ResolvedSettings(BaseModel):
    settings: Settings
    sources: dict[str, str]  # key -> "default" | file path | "env OM_X" | "flag"
    notes: list[str] = Field(default_factory=list)

    def rows(self) -> list[tuple[str, Any, str]]:
        """(key, effective value, source) per setting; a derived value's source is its rule."""
        data = self.settings.model_dump(mode="json")
        derived = self.settings.derived()
        rows = []
        for key in FIELDS:
            source = self.sources.get(key, "default")
            if key in derived:
                value, rule = derived[key]
                rows.append((key, value, f"derived: {rule}" + (f" (value from {source} not used)"
                                                               if key in self.sources else "")))
            else:
                rows.append((key, data[key], source))
        return rows


def _canonical(key: str) -> str | None:
    if key in FIELDS:
        return key
    return _BY_SNAKE.get(key.replace("-", "_").lower())


def _env_value(key: str, raw: str) -> Any:
    if key in ("model", "fallbackModel"):
        raw = raw.strip()
        return json.loads(raw) if raw.startswith("{") else {"id": raw}
    return raw


def load_settings(config: str | os.PathLike | None = None, flags: Mapping[str, Any] | None = None, *,
                  env: Mapping[str, str] | None = None, home: Path | None = None,
                  cwd: Path | None = None, project: bool = True) -> ResolvedSettings:
    """Resolve settings from defaults, Pi's settings files, om.toml, OM_* variables and flags.
    ``project=False``: the working folder's own files (``.pi/settings.json``, ``om.toml``) are not read,
    as Pi reads no settings of a project it does not trust (the extension says so: --no-project-settings)."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    cwd = Path.cwd() if cwd is None else cwd
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []

    def take(layer: Mapping[str, Any], where: str, strict: bool) -> None:
        for raw_key, value in layer.items():
            key = _canonical(str(raw_key))
            if key is None:
                if strict:
                    raise SettingsError(f"unknown setting {raw_key!r} in {where}; known: {', '.join(FIELDS)}")
                notes.append(f"ignored unknown key {raw_key!r} in {where}")
                continue
            values[key] = value
            sources[key] = where

    pi_files = []
    for path in (home / ".pi" / "agent" / "settings.json", *([cwd / ".pi" / "settings.json"] if project else [])):
        if path.is_file():
            try:
                data = json.loads(path.read_text())
            except ValueError as exc:
                raise SettingsError(f"{path} is not valid JSON: {exc}") from None
            pi_files.append((path, data if isinstance(data, dict) else {}))
    # Pi's own compaction budget, as Pi reads it (project over global), below every om source
    for path, data in pi_files:
        compaction = data.get("compaction")
        if isinstance(compaction, dict) and "keepRecentTokens" in compaction:
            value = compaction["keepRecentTokens"]
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values["keepRecentTokens"] = value
                sources["keepRecentTokens"] = f"{path} (compaction.keepRecentTokens)"
            else:
                notes.append(f"ignored compaction.keepRecentTokens {value!r} in {path}: not a number")
    for path, data in pi_files:
        section = data.get(PI_SETTINGS_KEY)
        if isinstance(section, dict):
            take(section, str(path), strict=False)  # Pi's files are read as-is
    toml_path = Path(config) if config else cwd / "om.toml"
    if config and not toml_path.is_file():
        raise SettingsError(f"settings file {toml_path} does not exist")
    if (config or project) and toml_path.is_file():
        try:
            data = tomllib.loads(toml_path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"{toml_path} is not valid TOML: {exc}") from None
        take(data.get(PI_SETTINGS_KEY, data) if isinstance(data.get(PI_SETTINGS_KEY), dict) else data,
             str(toml_path), strict=True)
    # the extension's own switch, below om's OM_PASSIVE
    if env.get(PASSIVE_ENV, "") != "":
        values["passive"] = env[PASSIVE_ENV]
        sources["passive"] = f"env {PASSIVE_ENV}"
    for key in FIELDS:
        name = f"OM_{snake(key).upper()}"
        if name in env and env[name] != "":
            try:
                values[key] = _env_value(key, env[name])
            except ValueError as exc:
                raise SettingsError(f"{name}: {exc}") from None
            sources[key] = f"env {name}"
    for key, value in (flags or {}).items():
        if value is not None:
            canonical = _canonical(key)
            if canonical is None:
                raise SettingsError(f"unknown setting {key!r}")
            values[canonical] = value
            sources[canonical] = "flag"
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            if error["loc"]:
                key = str(error["loc"][0])
                problems.append(f"{key} (from {sources.get(key, 'default')}): {error['msg']}")
            else:  # a rule across keys: name each key the message mentions, with its source
                keys = [k for k in FIELDS if k in error["msg"]] or ["settings"]
                where = ", ".join(f"{k} from {sources.get(k, 'default')}" for k in keys)
                problems.append(f"{error['msg'].removeprefix('Value error, ')} ({where})")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
    return ResolvedSettings(settings=settings, sources=sources, notes=notes)
