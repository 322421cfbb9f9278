"""Rendering memory as a compaction summary (SPEC §5): deterministic and model-free.

``render_summary`` is the one place a summary's text is put together: the preamble, the project's
memory when a compaction carries it, the reflections, the observations, the line saying how many
records a budget left out (SPEC §13), and the user's instructions for this compaction."""

from __future__ import annotations

from collections.abc import Sequence

from om_core.redaction.redact import redact, redact_line

INSTRUCTIONS_HEADING = "## Instructions for this compaction"

# Opens every compaction summary rendered from the ledger (SPEC §5).
SUMMARY_PREAMBLE = """\
The earlier part of this conversation was replaced by memory kept while the session ran. It was \
assembled from a ledger of notes, not written fresh, so nothing below is a paraphrase of a paraphrase.

- Reflections are durable conclusions: the user's standing preferences and constraints, decisions \
that still hold, and long-lived facts about the project. Follow them while they hold; a reflection \
that names another as "(supersedes [id])" replaces the one it names.
- Observations are dated notes of what happened, oldest first, each marked low, medium, high or \
critical for how much it matters. When two observations disagree, the newer one is the current truth, \
and one that names another as "(supersedes [id])" replaces it.
- A note that says "User …" records the user's own words; "Agent proposed …" or "Agent claimed …" \
records what you said, which is no decision of the user's unless a later note says they accepted it.
- Work an observation records as finished is done: do not redo it unless the user asks again.
- Every line starts with a 12-character memory id. When an exact detail matters before you act (the \
user's own words, a command, an error message, a path, the reason behind a decision), call `recall` \
with that id to read the original messages."""


def left_out_line(observations: int, reflections: int, max_tokens: int) -> str:
    """The summary's last memory line when its budget left records out (SPEC §13)."""
    total = observations + reflections
    return (f"({total} older memory record{'s' if total != 1 else ''} ({observations} observation"
            f"{'s' if observations != 1 else ''}, {reflections} reflection{'s' if reflections != 1 else ''}) "
            f"left out to keep this summary within {max_tokens} tokens; they stay in the session's memory.)")


def instructions_section(instructions: str | None) -> str | None:
    """The user's instructions for this compaction (Pi's ``customInstructions``, from ``/compact
    TEXT``) as a section after the memory, where the agent reads them with it; redacted like every
    line of the summary. None without any."""
    if not instructions or not instructions.strip():
        return None
    return f"{INSTRUCTIONS_HEADING}\n{redact(instructions.strip())}"


def render_summary(reflection_lines: Sequence[str], observation_lines: Sequence[str], *,
                   project_section: str | None = None, left_out: str | None = None,
                   instructions: str | None = None) -> str | None:
    """The summary text, or None when no record is shown (the caller falls back to Pi's summarizer:
    project memory or instructions alone never replace Pi's own summary of the conversation).

    Pi sends the summary to its model, so every line is redacted (whatever wrote the memory: a model,
    the offline baseline's excerpts, records imported from the extension); lines recur in every
    compaction, so the per-line redaction is cached. ``project_section`` is already rendered
    (``om_core.memory.project_memory.project_section``) and redacted here line by line."""
    if not reflection_lines and not observation_lines:
        return None
    parts = [SUMMARY_PREAMBLE]
    if project_section:
        parts.append("\n".join(map(redact_line, project_section.splitlines())))
    if reflection_lines:
        parts.append("## Reflections\n" + "\n".join(map(redact_line, reflection_lines)))
    if observation_lines:
        parts.append("## Observations\n" + "\n".join(map(redact_line, observation_lines)))
    if left_out:
        parts.append(left_out)
    section = instructions_section(instructions)
    if section:
        parts.append(section)
    return "\n\n".join(parts)


def with_instructions(summary: str, instructions: str | None) -> str:
    """``summary`` with the instructions section appended (unchanged without any): what
    ``render_summary(..., instructions=...)`` gives for the same records."""
    section = instructions_section(instructions)
    return summary if section is None else f"{summary}\n\n{section}"
