"""Rendering memory as a compaction summary (SPEC §5): deterministic and model-free."""

from __future__ import annotations

from collections.abc import Sequence

from om_core.ledger import Observation, Reflection
from om_core.prompts import SUMMARY_PREAMBLE


def observation_line(o: Observation) -> str:
    return f"[{o.id}] {o.timestamp} [{o.relevance}] {o.content}"


def reflection_line(r: Reflection) -> str:
    return f"[{r.id}] {r.content}"


def render_summary(reflections: Sequence[Reflection], observations: Sequence[Observation]) -> str | None:
    """The summary text, or None for an empty projection (the caller falls back to Pi's summarizer)."""
    if not reflections and not observations:
        return None
    parts = [SUMMARY_PREAMBLE]
    if reflections:
        parts.append("## Reflections\n" + "\n".join(reflection_line(r) for r in reflections))
    if observations:
        parts.append("## Observations\n" + "\n".join(observation_line(o) for o in observations))
    return "\n\n".join(parts)
