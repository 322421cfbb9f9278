"""Every text this project puts in front of a model, in one place and in our own words.

Prompts are laid out for provider prompt caches (a request is billed less for the part that repeats
an earlier request's beginning). The three workers send the same request head: the three tool
schemas and one system prompt that explains all three jobs. Then the memory, in ledger order, laid
out so that between full folds it only grows at its end (a drop is listed after it, not cut out of
it: ``om_core.workers.inputs.laid_out_memory``). Only then what is the stage's own: its task and what
is new each call (the current time, the new entries, coverage, ages, budgets). So the reflector's
request shares the observer's head and memory, and the dropper's the reflector's; nothing volatile
precedes the memory. Each instruction answers SPEC §8 or a failure measured on real sessions.
"""

from __future__ import annotations

# ---------------------------------------------------------------- workers (SPEC §8)

# One system prompt for the three workers (the shared head of every request); each request's
# "## Task" after the memory says which job it is.
WORKER_SYSTEM = """\
You keep the memory of a long coding session between a user and an AI coding agent. When the \
conversation outgrows the agent's context, its older part is replaced by this memory and the agent \
carries on from it alone: keep what it needs to continue the work correctly, in few words, and leave \
out what it can look up again. Code, not you, makes ids, counts tokens and checks every item.

The memory (under "## Memory") holds one note per line, oldest first:
- an observation, `[id] YYYY-MM-DD HH:MM [relevance] content`: a dated fact from the conversation;
- a reflection, `[id] reflection: content (supports: id, ...)`: a durable conclusion and the \
observations it rests on.
A line never changes once written. An observation dropped from active memory keeps its line and is \
listed under "## Dropped since" after the memory: treat it as gone. Then "## Task" names this \
request's job (observe, reflect or drop) and gives its inputs. Call that job's tool only.

Relevance says how strongly a note resists leaving active memory. Most notes are medium or low:
- critical: who the user is, their goal, hard constraints and explicit corrections, and completed \
outcomes of what they asked for. "User forbids force-pushes to main: the last one lost a day of work."
- high: decisions and their reasons, technical direction, open requests, blockers, key preferences, \
what the agent waits on the user for. "Waiting on the user to pick one of the two cache designs."
- medium: ordinary progress and the current task's context. "Added retries to src/upload.py; its \
two new tests pass."
- low: routine steps, acknowledgements and details easy to find again. "Listed the files under \
tests/fixtures."
A finished step is medium; a finished outcome of the user's goal, checked, is high, or critical when \
it completes what the user asked for. Creating a branch or running a command is low unless its \
result matters.

# Observe (record_observations)
Record what the new entries add to the memory:
- the user's goal, and what they ask, decide, require, forbid or prefer, in their own terms; a \
statement is not a question ("User said the API is read-only" is not "User asked whether it is");
- open requests and what the agent waits on the user for, and when they are settled;
- corrections with what they replace; decisions with their reasons and the options turned down;
- finished work and how it was checked, so it is not redone; errors, and whether they were fixed;
- exact identifiers, copied as written: paths, names, commands, flags, versions, error text, numbers.
Who said it. A note that starts with "User" (or "The user") says what the user said, asked, decided \
or required: write one only from the user's own message (or a command the user ran) and cite that \
entry; the check refuses it otherwise. What the agent proposes, plans or claims is "Agent proposed \
…" or "Agent claimed …" until the user accepts it (cite their reply) or a tool result shows it. A \
tool result outranks the agent's account of it: record what the result shows.
Do not record routine tool calls and plain results, file contents or output the agent can read \
again, each try of a repeated step (one note for the outcome), or what the memory already says \
unless it changed. When a state changes (passes to fails, open to closed, a number, a name), the new \
note names the one it replaces: "Retries are now 5 (supersedes [3f9a0c1b2d4e])"; a near copy of an \
active note that changes its state without naming it is refused.
Each observation is one line of plain prose that stands on its own. sourceEntryIds: the ids of the \
entries it comes from, the user's own message first when there is one; entries under "## Context" \
came before this chunk and are already observed: record nothing from them alone, but cite one a \
new entry answers (the proposal a user's "no" rejects). timestamp: when it happened, YYYY-MM-DD HH:MM, from the date \
line above its entry and the time in the entry's header; the current time in the task is only a \
fallback for an entry shown without one. The entries: `=== YYYY-MM-DD ===` dates the entries after \
it, each entry starts with `[entry-id Role HH:MM]`, a tool call reads `(tool call) name(arguments)` \
and a result starts with the tool's name in parentheses; a long tool result, argument or entry is \
cut in the middle, and the cut says how much is left out.

# Reflect (record_reflections)
Distill reflections: durable conclusions that should shape the rest of the work (the goal, \
standing preferences and constraints, architecture decisions, lasting facts about the project). \
They are few; most observations stay observations, and low ones never become reflections. Each is \
one line and cites in supportingObservationIds all and only the active observations whose meaning \
it keeps in full: overstated support lets the dropper lose detail. Do not reword an existing \
reflection; when one is outdated, write its replacement and name it: "(supersedes [id])", which \
retires the one it names (name only a reflection). The task \
gives each active observation's coverage: none, partial (one reflection cites it) or strong (two or \
more). Coverage shows what is not yet kept; it is no quota. "New since the last \
reflections" lists the observations recorded after the last reflections were.

# Drop (drop_observations)
The active observations are over their token target, so some may leave the agent's view (a dropped \
note stays in the ledger and can be recalled by id). Keep by default. The maximum given is a \
limit, not a goal: dropping fewer or none is often right. Good to drop: notes a newer one \
replaces, finished routine steps, low notes with nothing unique, notes a reflection carries in \
full. Coverage is evidence, not proof: compare the note with the reflections that cite it. Age \
matters: recent notes hold the working state, old routine ones rarely do. Keep what alone carries \
the goal, an open request, a constraint, a correction, an exact identifier or an unsolved error. \
Give a short reason.

Each tool call gets a receipt. A receipt that rejects an item gives you another turn: send only the \
corrected items. To record or drop nothing, answer in a few words without calling a tool."""

OBSERVATION_ITEM_SCHEMA = {
    "type": "object",
    "properties": {
        "timestamp": {"type": "string", "description": "YYYY-MM-DD HH:MM, from the cited entries"},
        "content": {"type": "string", "description": "One line"},
        "relevance": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
        "sourceEntryIds": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["timestamp", "content", "relevance", "sourceEntryIds"],
}

RECORD_OBSERVATIONS_TOOL = (
    "record_observations",
    "Observe: record observations of the new entries.",
    {"type": "object", "properties": {"observations": {"type": "array", "items": OBSERVATION_ITEM_SCHEMA}},
     "required": ["observations"]},
)

RECORD_REFLECTIONS_TOOL = (
    "record_reflections",
    "Reflect: record durable reflections, each citing the active observations it keeps.",
    {"type": "object", "properties": {"reflections": {"type": "array", "items": {
        "type": "object",
        "properties": {"content": {"type": "string", "description": "One line"},
                       "supportingObservationIds": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
        "required": ["content", "supportingObservationIds"]}}},
     "required": ["reflections"]},
)

DROP_OBSERVATIONS_TOOL = (
    "drop_observations",
    "Drop: retire active observations by id (they stay recallable).",
    {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}},
                                      "reason": {"type": "string"}},
     "required": ["ids", "reason"]},
)

# Every request carries all three tools, in this order: the request head is the same for each job.
WORKER_TOOLS = (RECORD_OBSERVATIONS_TOOL, RECORD_REFLECTIONS_TOOL, DROP_OBSERVATIONS_TOOL)

DROP_REFLECTIONS_TOOL = (
    "drop_reflections",
    "Retire active reflections by id (they stay recallable).",
    {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}},
                                      "reason": {"type": "string"}},
     "required": ["ids", "reason"]},
)
# The reflection dropper runs rarely (the reflections outgrew their target), so its request adds its
# own tool after the three: the other jobs' request head, and their cached prefix, stay as they are.
REFLECTION_DROPPER_TOOLS = (*WORKER_TOOLS, DROP_REFLECTIONS_TOOL)


DAY_LINE = "=== {day} ==="


def reflection_memory_line(reflection_id: str, content: str, supports: list[str]) -> str:
    """A reflection as workers read it: its supporting ids on its own line, which never changes."""
    return f"[{reflection_id}] reflection: {content} (supports: {', '.join(supports)})"


def memory_block(lines: list[str], dropped: list[str] = ()) -> str:
    """The stable first part of a worker's message: the memory as laid out, then the ids dropped
    since it was (they only grow at the end, too)."""
    block = "## Memory\n" + ("\n".join(lines) if lines else "(empty)") + "\n\n"
    if dropped:
        block += "## Dropped since\n" + ", ".join(dropped) + "\n\n"
    return block


def observer_task(now: str, chunk: str, first_id: str, last_id: str, context: str = "") -> str:
    """``context``: the entries just before the chunk, already observed (shown so that a reply that
    opens the chunk can be read, and cited, with what it answers)."""
    shown = f"## Context (before this chunk, already observed)\n{context}\n\n" if context else ""
    return (f"## Task: observe\nCurrent time (a fallback only): {now}\n\n{shown}"
            f"## New entries ({first_id} to {last_id})\n{chunk}")


def coverage_block(coverage: dict[str, list[str]]) -> str:
    """Ids by tier; the ``none`` tier (usually the largest) is named, not listed."""
    rows = [f"{tier}: {', '.join(coverage[tier])}" for tier in ("strong", "partial") if coverage.get(tier)]
    if coverage.get("none"):
        rows.append("none: every other active observation" if rows else "none: every active observation")
    return "## Coverage\n" + ("\n".join(rows) if rows else "(no active observations)")


def reflector_task(coverage: dict[str, list[str]], new_ids: list[str] | None = None) -> str:
    """``new_ids``: the active observations recorded after the last reflections were (None: no
    reflections yet, so every one is new)."""
    if new_ids is None:
        new = "every active observation (no reflections yet)"
    else:
        new = ", ".join(new_ids) if new_ids else "(none)"
    return "## Task: reflect\n" + coverage_block(coverage) + f"\n\n## New since the last reflections\n{new}"


def age(minutes: float) -> str:
    """A short age: 45m, 5h, 3d."""
    if minutes < 60:
        return f"{max(0, int(minutes))}m"
    if minutes < 48 * 60:
        return f"{int(minutes // 60)}h"
    return f"{int(minutes // (24 * 60))}d"


def dropper_guard(guard: bool, guarded: list[str]) -> str:
    """The dropper's guard as the task states it: which notes it keeps this time."""
    if not guard:
        return "Guard: none (keepUncitedCritical is off)."
    if not guarded:
        return "Guard: it keeps no note this time."
    return ("Guard: never dropped, as critical notes of the user's own words that no reflection cites: "
            + ", ".join(guarded) + ".")


def dropper_task(now: str, rows: list[tuple[str, str, str, float, str, list[str]]], active: int,
                 pool_tokens: float, target_tokens: int, max_drops: int, guard: bool = True,
                 guarded: list[str] = ()) -> str:
    """``rows``: (id, age in minutes, relevance, tokens, coverage, citing reflection ids) of each
    active observation, oldest first; ``guarded``: the ids the guard keeps (in ``rows`` order)."""
    table = "\n".join(f"{obs_id} {minutes} {relevance} {tokens:g} {coverage} {','.join(cited) or '-'}"
                      for obs_id, minutes, relevance, tokens, coverage, cited in rows)
    shed = max(0.0, pool_tokens - target_tokens)
    return (f"## Task: drop\nCurrent time: {now}. Active observations: {active} using {pool_tokens:g} tokens; target "
            f"{target_tokens} tokens, so {shed:g} tokens to shed. Drop at most {max_drops}, only what is safe. "
            f"{dropper_guard(guard, list(guarded))}\n\n"
            f"## Active observations: id, age (minutes), relevance, tokens, coverage, citing reflections\n{table}")


def reflection_dropper_task(rows: list[str], active: int, pool_tokens: int, target_tokens: int,
                            max_drops: int) -> str:
    """``rows``: each active reflection's evidence line (id first), oldest reflection first."""
    return (f"## Task: drop reflections\nActive reflections: {active} using {pool_tokens} tokens; target "
            f"{target_tokens} tokens. Retire at most {max_drops} with drop_reflections, only what no longer "
            "earns its place: a reflection a newer one states better, or one about work that is over. Keep "
            "standing preferences, constraints and decisions that still hold. Orphan risk counts the dropped "
            "observations only this reflection still explains: retiring it loses their meaning.\n\n"
            f"## Active reflections: id, evidence\n" + "\n".join(rows))


EXCERPT_MARKER = "\n[… {omitted} characters omitted from the middle of this entry; the stored entry is complete …]\n"
PART_CUT_MARKER = "\n[… {omitted:,} characters cut from the middle …]\n"
TRUNCATION_MARKER = " [… truncated]"
