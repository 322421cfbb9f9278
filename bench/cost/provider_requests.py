"""The memory workers' requests as a provider sees them (bench/cost/workers.py): the texts it bills,
which worker sent a request, and how much of consecutive prompts a prefix cache could reuse."""

from __future__ import annotations

import json
import statistics
from typing import Any

from bench import harness
from om_core.pi.tokens import count_tokens


def request_pieces(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[str]:
    """The texts of one chat request that a provider bills as input."""
    pieces: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            pieces += [p.get("text", "") for p in content if isinstance(p, dict)]
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            pieces += [fn.get("name") or "", fn.get("arguments") or ""]
    if tools:
        pieces.append(json.dumps(tools, ensure_ascii=False))
    return [p for p in pieces if p]


def stage_prompt(messages: list[dict[str, Any]]) -> str:
    """The stage's serialized prompt: system + user content (what stays the same across its turns)."""
    return messages[0]["content"] + "\n\n" + messages[1]["content"]


def stage_of(messages: list[dict[str, Any]]) -> str:
    """The worker of a request, by the task after its memory (the three share system prompt and tools)."""
    user = messages[1]["content"]
    for task, stage in (("## Task: observe", "observer"), ("## Task: reflect", "reflector")):
        if task in user:
            return stage
    return "dropper"


def new_part(user: str) -> int:
    """Where the part of a worker's message that is new each call starts (its task)."""
    return min([i for i in (user.find("## Task: "), user.find("## Current time"), user.find("## Coverage")) if i >= 0],
               default=len(user))


def _where(prompt: str, n: int) -> str:
    """Which part of an observer prompt the common prefix ends in."""
    if "## Memory\n" in prompt:  # one memory list in ledger order
        marks = [("system prompt", prompt.find("## Memory\n")), ("memory", prompt.find("## Task: observe")),
                 ("time/chunk", len(prompt) + 1)]
    else:
        marks = [("system prompt", prompt.find("## Current reflections")),
                 ("reflections", prompt.find("## Active observations")),
                 ("observations", prompt.find("## Current time")),
                 ("time/chunk", len(prompt) + 1)]
    for name, end in marks:
        if end >= 0 and n < end:
            return name
    return "whole prompt"


def prefix_stats(prompts: list[str], locate: bool = False) -> dict[str, Any]:
    """Stable-prefix share across consecutive prompts (characters, and token-weighted)."""
    if len(prompts) < 2:
        return {"pairs": 0, "mean_share_chars": None, "token_weighted_share": None}
    shares, prefixes, wholes = [], [], []
    ends: dict[str, int] = {}
    for earlier, later in zip(prompts, prompts[1:]):
        n = harness.common_prefix(earlier, later)
        shares.append(n / len(later) if later else 0.0)
        prefixes.append(later[:n])
        wholes.append(later)
        if locate:
            where = _where(later, n)
            ends[where] = ends.get(where, 0) + 1
    counts = count_tokens(prefixes + wholes, threads=2)
    prefix_tokens, whole_tokens = sum(counts[: len(prefixes)]), sum(counts[len(prefixes):])
    return {"pairs": len(shares), "mean_share_chars": statistics.fmean(shares),
            "median_share_chars": statistics.median(shares), "min_share_chars": min(shares),
            "token_weighted_share": prefix_tokens / whole_tokens if whole_tokens else None,
            "prefix_tokens": prefix_tokens, "prompt_tokens": whole_tokens,
            **({"prefix_ends_in": ends} if locate else {})}


def observer_composition(first_turns: list[dict[str, Any]]) -> dict[str, int]:
    """o200k tokens of the observer's first-turn requests by part: system, tools, memory, chunk."""
    if not first_turns:
        return {}
    systems = [r["messages"][0]["content"] for r in first_turns]
    tools = [json.dumps(r.get("tools") or [], ensure_ascii=False) for r in first_turns]
    memory, chunk = [], []
    for r in first_turns:
        user = r["messages"][1]["content"]
        cut = new_part(user)
        memory.append(user[:cut])
        chunk.append(user[cut:])
    n = len(first_turns)
    counts = count_tokens(systems + tools + memory + chunk, threads=2)
    return {"requests": n, "system": sum(counts[:n]), "tools": sum(counts[n:2 * n]),
            "memory": sum(counts[2 * n:3 * n]), "chunk": sum(counts[3 * n:])}
