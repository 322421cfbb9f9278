"""What each setting does, in words: the documentation's settings page is generated from
``om_core.settings.Settings`` (names, types, defaults) and this table (meanings, derived defaults);
the generator stops on a setting without a text here."""

from __future__ import annotations

from pydantic import BaseModel


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
    "passive": SettingDoc(
        meaning="no background work (also `PI_OBSERVATIONAL_MEMORY_PASSIVE`, the extension's switch, below "
                "`OM_PASSIVE`); explicit commands (`/om:status`, `/om:view`, `/om:recall`, `/om:consolidate`) "
                "still run"),
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
    "modelSlotLeaseSeconds": SettingDoc(
        meaning="with `--model-limit prefect`: the lease of each slot of Prefect's global limit `om-model-calls`, "
                "renewed while its model call runs; a slot held by a process that died (a lost Dask worker) comes "
                "back to the limit after at most this long plus the server's 15 s lease check (docs/operating.md, "
                "\"A lost worker\")"),
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
                "ledger keep everything (the default is measured: `bench/cost/prompts.py`)"),
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
                "`[id] content`; over it, the reflection dropper runs after a reflector pass that added to them and "
                "on its own clock, once `reflectAfterTokens` of source passed since its last record (SPEC §13)"),
    "workerMemoryMaxTokens": SettingDoc(
        default="memory window / 4 (litellm's model card for the memory model, else `contextWindow`), else 16000",
        meaning="the memory one observer, reflector or dropper request carries: observations at least half, "
                "newest first for the observer and reflector, oldest first for the droppers (SPEC §13)"),
    "agentMaxTokens": SettingDoc(
        default="32000, clamped to the model's own output limit (litellm's model card)",
        meaning="the output reserved per worker request: sent as `max_tokens` with every observer, reflector "
                "and dropper request (SPEC §13)"),
    "compactionSummaryMaxTokens": SettingDoc(
        default="session window / 8 (`contextWindow`), else 8000",
        meaning="the rendered memory summary at most: newest records first, observations at least half (SPEC §13)"),
    "prefectServerIdleSeconds": SettingDoc(
        meaning="the local Prefect server an `om run` starts (when `PREFECT_API_URL` is unset) stays for the next "
                "runs and stops after this many seconds without one; `om server status` / `om server stop` show "
                "and end it; `0`: each run starts Prefect's temporary API and stops it"),
    "recallEmbeddings": SettingDoc(
        meaning="recall by query fuses local semantic similarity (the `embeddings` extra) with the keyword ranking"),
    "fallbackModel": SettingDoc(
        default="none",
        meaning="a second model (same forms as `model`), tried when `model` cannot be resolved and once per stage "
                "when its call fails, then used for the rest of that pass; equal to `model` is refused (SPEC §13)"),
    "modelMap": SettingDoc(
        default="`[]`",
        meaning="first-match rules `{match, model, stages?}`: the session model's `provider/id` matching the glob "
                "`match` routes `stages` (observer, reflector, reflection-dropper, dropper; all when unset) to "
                "`model` (`provider/id[:thinking]`, with `$provider`, `$id`, `$model`, `$thinking`); a bad rule "
                "is a one-line error before any work (SPEC §13)"),
    "compactionCatchUpMaxChunks": SettingDoc(
        meaning="observer chunks a compaction runs to close its gap before answering (the configured model or "
                "the offline baseline); 0: none (SPEC §13)"),
    "compactionMaxRetainedTokens": SettingDoc(
        default="session window / 2, else 60000",
        meaning="the kept tail plus the summary above it: a compaction that moved F back declines to Pi's own "
                "summary (SPEC §13)"),
    "compactionCatchUpSeconds": SettingDoc(
        meaning="how long a live compaction's catch-up may take (at most half the hook's deadline); past it the "
                "hook answers without it"),
    "selfCompact": SettingDoc(
        meaning="gives the agent a `compact_context(resume)` tool: Pi compacts through om once the agent settles, "
                "and a short message points the agent at its resume note (SPEC §13)"),
    "warnAt": SettingDoc(
        default="none",
        meaning="rules (a share of the context window, at most 1, or a token count) at which the agent is asked "
                "once to call `compact_context`; the last rule's ask is firmer"),
    "consolidateWhenIdle": SettingDoc(
        meaning="om's Pi extension runs its background tick only while the agent is idle: a new turn stops it, "
                "the next settle resumes it"),
}
