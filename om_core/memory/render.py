"""Rendering memory as a compaction summary (SPEC §5): deterministic and model-free."""

from __future__ import annotations

from collections.abc import Sequence

from om_core.workers.prompts import SUMMARY_PREAMBLE
from om_core.redaction.redact import redact, redact_line


def observation_line(obs_id: str, timestamp: str, relevance: str, content: str) -> str:
    return f"[{obs_id}] {timestamp} [{relevance}] {content}"


def reflection_line(refl_id: str, content: str) -> str:
    return f"[{refl_id}] {content}"


def render_summary(reflection_lines: Sequence[str], observation_lines: Sequence[str]) -> str | None:
    """The summary text, or None for an empty projection (the caller falls back to Pi's summarizer).

    Pi sends the summary to its model, so every line is redacted (whatever wrote the memory: a model,
    the offline baseline's excerpts, records imported from the extension); lines recur in every
    compaction, so the per-line redaction is cached."""
    if not reflection_lines and not observation_lines:
        return None
    parts = [SUMMARY_PREAMBLE]
    if reflection_lines:
        parts.append("## Reflections\n" + "\n".join(map(redact_line, reflection_lines)))
    if observation_lines:
        parts.append("## Observations\n" + "\n".join(map(redact_line, observation_lines)))
    return "\n\n".join(parts)


def with_instructions(summary: str, instructions: str | None) -> str:
    """The summary with the user's instructions for this compaction (Pi's ``customInstructions``, from
    ``/compact TEXT``) after the memory, where the agent reads them with it; unchanged without any.
    Redacted like every line of the summary."""
    if not instructions or not instructions.strip():
        return summary
    return f"{summary}\n\n## Instructions for this compaction\n{redact(instructions.strip())}"
