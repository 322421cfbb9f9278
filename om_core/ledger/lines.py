"""A memory record as one line of text: ``[id] timestamp [relevance] content`` for an observation,
``[id] content`` for a reflection. The ledger keeps these lines (records.py) and the summary shows them
(memory/render.py), so they live with the records, below both."""

from __future__ import annotations


def observation_line(obs_id: str, timestamp: str, relevance: str, content: str) -> str:
    return f"[{obs_id}] {timestamp} [{relevance}] {content}"


def reflection_line(refl_id: str, content: str) -> str:
    return f"[{refl_id}] {content}"
