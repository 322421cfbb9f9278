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
DEFAULT_SUMMARY_MAX_TOKENS = 8_000  # SPEC §13, when no context window is known
DEFAULT_WORKER_MEMORY_TOKENS = 16_000  # SPEC §13, when the memory model's window is not known
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
    # --- bounded memory (SPEC §13); unset: derived from contextWindow, else the SPEC's fallback
    compactionSummaryMaxTokens: int | None = Field(None, gt=0)  # the rendered memory summary, at most
    reflectionsPoolTargetTokens: int = Field(8_000, gt=0)  # active reflections' rendered lines, the target
    workerMemoryMaxTokens: int | None = Field(None, gt=0)  # the memory one worker request carries, at most

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

    @field_validator("model", mode="before")
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

    # --- project memory (issue 35)
    # folder -> project id: a session whose cwd is that folder or below it belongs to that project
    # (overrides the git work tree's remote or root, om_core.project.repository)
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

    @field_validator("projects", mode="before")
    @classmethod
    def _projects_json(cls, value: Any) -> Any:
        """``OM_PROJECTS='{"/src/app": "app"}'``: a JSON object where a mapping is set from text."""
        if isinstance(value, str):
            value = json.loads(value) if value.strip() else {}
        if isinstance(value, dict):
            return {str(Path(k).expanduser()) if str(k).startswith("~") else str(k): v for k, v in value.items()}
        return value

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
                self.worker_memory_max_tokens, f"contextWindow {self.contextWindow} / 4" if self.contextWindow
                else f"{DEFAULT_WORKER_MEMORY_TOKENS}, as no contextWindow is set")
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
    if key == "model":
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


# ---------------------------------------------------------------- the settings table, documented


class SettingDoc(BaseModel):
    """What a setting does, for the documentation's settings page (docs_gen) and `om config --help`
    readers: ``default`` says a default the model cannot (a derived or unset one); else the
    model's own default is shown."""

    meaning: str
    default: str | None = None


SETTING_DOCS: dict[str, SettingDoc] = {
    "observeAfterTokens": SettingDoc(meaning="the observer's clock threshold: new tokens before the observer runs"),
    "reflectAfterTokens": SettingDoc(meaning="the reflector's clock threshold"),
    "observerChunkMaxTokens": SettingDoc(
        default="20% of `contextWindow`, else 60000 (at least 256)",
        meaning="the most source one observer call reads"),
    "compactAfterTokens": SettingDoc(meaning="proactive compaction: the context size that starts one"),
    "compactAfterTokensMode": SettingDoc(
        meaning="`calibrated` uses `compactAfterTokens`; `ratio` uses `contextWindow` × `compactAfterTokensRatio`"),
    "compactAfterTokensRatio": SettingDoc(meaning="the share of `contextWindow` in ratio mode"),
    "observationsPoolMaxTokens": SettingDoc(meaning="full-fold pressure: the observation pool's size that folds in full"),
    "observationsPoolTargetTokens": SettingDoc(
        default="half of `observationsPoolMaxTokens`", meaning="the dropper's target for the observation pool"),
    "agentMaxTurns": SettingDoc(meaning="model calls per worker run"),
    "model": SettingDoc(
        default="none (the offline baseline)",
        meaning="`{provider, id, thinking}` or a litellm string such as `\"openai/gpt-4o-mini\"`, in `om.toml`, "
                "Pi's settings or `OM_MODEL`"),
    "passive": SettingDoc(meaning="no background work"),
    "tokenCounter": SettingDoc(meaning="`pi` or `tiktoken`: the count that drives clocks and budgets"),
    "contextWindow": SettingDoc(default="none",
                                meaning="the model's window when known (the budget guard assumes 200000 otherwise)"),
    "keepRecentTokens": SettingDoc(
        meaning="Pi's cut-point budget (also read from Pi's own `compaction.keepRecentTokens`, below every om source)"),
    "cutPointRules": SettingDoc(
        meaning="Pi's compaction rules to simulate: `pi-1.6` (projection, Pi 1.6 estimate, decline cases) or "
                "`legacy` (Pi before 1.6)"),
    "clockBasis": SettingDoc(
        meaning="observer and reflector clocks on the provider's usage growth (`usage`, SPEC §7), or `source` "
                "tokens everywhere"),
    "gapSafeCompaction": SettingDoc(meaning="simulated compactions keep no gap between memory and the kept tail"),
    "gapSafeMaxContextShare": SettingDoc(meaning="the budget guard of a gap-safe compaction: the kept tail's "
                                                 "largest share of the context window"),
    "redactSecrets": SettingDoc(
        meaning="redact secrets from prompts and the offline baseline's observations (compaction summaries are "
                "always redacted)"),
    "storePrompts": SettingDoc(
        meaning="keep each model call's request and response text in the database (`llm_call_texts`, "
                "`om logs --full`)"),
    "requestTimeoutSeconds": SettingDoc(meaning="a model request's timeout"),
    "modelConcurrency": SettingDoc(meaning="model calls in flight at once across a run"),
    "breakerFailures": SettingDoc(
        meaning="the run's breaker: after this many model calls in a row failed with a transient error (500s, "
                "429s, timeouts; across stages, each retry counted, no success in between) no stage starts and "
                "the run ends with one line naming the cause and exit 1; a rerun resumes. `0` never stops (each "
                "stage is still retried 5 times)"),
    "apiBase": SettingDoc(default="none", meaning="the base URL of an OpenAI-compatible server"),
    "resultStorage": SettingDoc(
        default="`<db>.stage-results/` next to the database",
        meaning="where the pipeline keeps computed stage results (exactly-once): a folder, an fsspec URL "
                "(`s3://…`), or a Prefect storage block slug (`s3-bucket/NAME`). A cluster needs one every "
                "worker reaches"),
    "agentClosingTurn": SettingDoc(
        meaning="after a tool call accepted in full, ask the model once more (the extension's loop); off, a "
                "clean receipt ends the stage in one call"),
    "keepUncitedCritical": SettingDoc(
        meaning="the dropper never drops a critical observation that no reflection cites (om's guard beyond "
                "SPEC §8: proposing one gets a `kept` receipt line, no new turn); false: SPEC's rule alone"),
    "observerToolMaxTokens": SettingDoc(
        meaning="the observer reads a tool call's arguments, a tool result or a command's output longer than "
                "this (Pi's estimate, 4 characters a token) as its head (60%) and tail, the cut marked with its "
                "size; `0` shows them whole. Its view only: the stored entries, `om recall`, summaries and the "
                "ledger keep everything (the default is measured: `bench/prompts.py`)"),
    "reflectorBackoff": SettingDoc(
        meaning="after a deliberate empty reflector result, wait for another `reflectAfterTokens` of source "
                "before asking it again, as the observer always does (SPEC §9); off, the extension's behaviour: "
                "it is asked again at each turn end while its clock is due and its input changed"),
    "projects": SettingDoc(
        default="none",
        meaning="folder → project id (`{\"/src/monorepo/api\" = \"api\"}` in om.toml, JSON in `OM_PROJECTS`): a "
                "session whose cwd (or work tree) is that folder or below belongs to that project, overriding "
                "its repository"),
    "projectReflectAfterTokens": SettingDoc(
        meaning="the project stage runs (om run, om serve) when the project's sessions recorded this many tokens "
                "of reflections and critical observations since it last read"),
    "projectInputMaxTokens": SettingDoc(
        meaning="new session memory one project stage reads at most (whole records; the rest waits for the next)"),
    "projectMemoryInCompaction": SettingDoc(
        meaning="add the project's memory (its newest reflections within the budget) to a session's first "
                "compaction (`om compact`, `om export --compact`, the live compaction)"),
    "projectMemoryMaxTokens": SettingDoc(meaning="the project reflections such a compaction adds, at most"),
    "reflectionsPoolTargetTokens": SettingDoc(
        meaning="the reflection dropper's target for the active reflections, measured on their rendered lines "
                "`[id] content` (SPEC §13)"),
    "workerMemoryMaxTokens": SettingDoc(
        default="`contextWindow` / 4, else 16000",
        meaning="the memory one observer, reflector or dropper request carries: observations at least half, "
                "newest first for the observer and reflector, oldest first for the droppers (SPEC §13)"),
    "compactionSummaryMaxTokens": SettingDoc(
        default="`contextWindow` / 8, else 8000",
        meaning="the rendered memory summary at most: newest records first, observations at least half (SPEC §13)"),
    "prefectServerIdleSeconds": SettingDoc(
        meaning="the local Prefect server an `om run` starts (when `PREFECT_API_URL` is unset) stays for the next "
                "runs and stops after this many seconds without one; `om server status` / `om server stop` show "
                "and end it; `0`: each run starts Prefect's temporary API and stops it"),
    "recallEmbeddings": SettingDoc(
        meaning="recall by query fuses local semantic similarity (the `embeddings` extra) with the keyword ranking"),
}
