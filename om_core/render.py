"""Rendering memory as a compaction summary (SPEC §5): deterministic and model-free."""

from __future__ import annotations

from collections.abc import Sequence

from om_core.prompts import SUMMARY_PREAMBLE


def observation_line(obs_id: str, timestamp: str, relevance: str, content: str) -> str:
    return f"[{obs_id}] {timestamp} [{relevance}] {content}"


def reflection_line(refl_id: str, content: str) -> str:
    return f"[{refl_id}] {content}"


def render_summary(reflection_lines: Sequence[str], observation_lines: Sequence[str]) -> str | None:
    """The summary text, or None for an empty projection (the caller falls back to Pi's summarizer)."""
    if not reflection_lines and not observation_lines:
        return None
    parts = [SUMMARY_PREAMBLE]
    if reflection_lines:
        parts.append("## Reflections\n" + "\n".join(reflection_lines))
    if observation_lines:
        parts.append("## Observations\n" + "\n".join(observation_lines))
    return "\n\n".join(parts)
