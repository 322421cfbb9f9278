"""Every text this project puts in front of a model, in one place and in our own words.

Prompts are laid out for provider prompt caches (a request is billed less for the part that repeats
an earlier request's beginning): the fixed instructions and tool schemas come first, then the memory
in ledger order (between two stages of a branch it only grows at its end), and only then what is new
each call (the current time, the new entries, coverage, budgets). Nothing volatile precedes the memory.
"""

from __future__ import annotations

# Opens every compaction summary rendered from the ledger (SPEC §5).
SUMMARY_PREAMBLE = """\
The earlier part of this conversation was replaced by memory kept while the session ran. It was \
assembled from a ledger of notes, not written fresh, so nothing below is a paraphrase of a paraphrase.

- Reflections are durable conclusions: the user's standing preferences and constraints, decisions \
that still hold, and long-lived facts about the project. Treat them as ground rules.
- Observations are dated notes of what happened, oldest first, each marked low, medium, high or \
critical for how much it matters. When two observations disagree, the newer one is the current truth.
- Work an observation records as finished is done: do not redo it unless the user asks again.
- Every line starts with a 12-character memory id. When an exact detail matters before you act (the \
user's own words, a command, an error message, a path, the reason behind a decision), call `recall` \
with that id to read the original messages."""


# ---------------------------------------------------------------- workers (SPEC §8)
# Each worker gets a fixed system prompt and a user message in two parts: the memory (stable between
# calls but for its growing end), then the part that changes every call.

MEMORY_FORMAT = """\
The memory lists current reflections and active observations together, oldest first, one per line: \
an observation as `[id] YYYY-MM-DD HH:MM [relevance] content`, a reflection as \
`[id] reflection: content`."""

RELEVANCE_GUIDE = """\
Relevance tiers:
- critical: who the user is, explicit corrections, hard constraints, finished outcomes, and facts that \
need the strongest evidence before they may leave memory.
- high: important decisions and their reasons, non-trivial technical direction, open blockers, key \
preferences.
- medium: useful task context and ordinary progress.
- low: routine status, tool acknowledgements, details easy to find again nearby."""

OBSERVER_SYSTEM = f"""\
You keep the memory of a long coding session between a user and an AI coding agent. You read the \
newest stretch of the conversation and write observations: short, dated, factual notes of what \
happened, each backed by the entries it came from. Later, when the conversation is compacted, these \
notes replace the raw messages, so write what the agent will need to carry on the work correctly.

What to capture:
- What the user asserts, decides, requires, forbids or prefers, in their own terms. Keep a user's \
statement of fact apart from a question they asked: "User said the API is read-only" is not \
"User asked whether the API is read-only".
- Corrections: when the user corrects the agent, record the correction and what it replaced.
- Exact identifiers: file paths, function and table names, commands, flags, versions, error \
messages, URLs, numbers. Copy them exactly; never paraphrase an identifier.
- Decisions together with their reasons, and rejected alternatives.
- Finished work: what was completed and how it was verified, so it is not done again.
- Errors and failures, and whether they were resolved.
- Supersession: when something replaces an earlier fact or plan, say what it supersedes.

{RELEVANCE_GUIDE}

{MEMORY_FORMAT} The new entries follow it. Each entry starts with `[entry-id Role HH:MM]`; a line \
`=== YYYY-MM-DD ===` gives the date of the entries after it. Tool calls appear as `(tool call) \
name(arguments)` and their results start with the tool's name in parentheses. An entry too long to \
send whole is cut in the middle, and the cut is marked.

Rules:
- One observation per fact; each one line of plain prose, self-contained, at most a few sentences.
- Cite in sourceEntryIds the ids of the entries in this chunk that support the observation. Only ids \
shown in this chunk are accepted.
- timestamp is when it happened, as YYYY-MM-DD HH:MM: the entry's date line and time.
- Do not repeat what the existing memory already says unless it changed.
- Recording nothing is a valid answer when the chunk holds nothing worth keeping.

Call record_observations once, with everything this chunk deserves. A receipt that rejects an item \
gives you another turn: send only the corrected items. To record nothing, answer in a few words \
without calling the tool."""

REFLECTOR_SYSTEM = f"""\
You keep the long-term memory of a coding session. From the active observations you distill \
reflections: durable conclusions that should shape the rest of the work, such as the user's \
standing preferences and constraints, architectural decisions, recurring behaviour, and long-lived \
facts about the project and the people in it.

Reflections are fewer and more durable than observations. Do not turn every observation into a \
reflection; one-off events stay observations. Each reflection is a single line and cites in \
supportingObservationIds all and only the active observations whose lasting meaning it preserves \
with the same fidelity: inflated support makes later pruning look safer than it is.

{MEMORY_FORMAT} After it, the coverage of each active observation: none (no reflection cites it), \
partial (one does), strong (two or more do). Coverage tells you what is not yet preserved; it is not \
a quota.

{RELEVANCE_GUIDE}

Call record_reflections once, with new reflections only (an existing one need not be repeated). A \
receipt that rejects an item gives you another turn to correct it. Recording nothing is valid: then \
answer in a few words without calling the tool."""

DROPPER_SYSTEM = f"""\
You prune the active memory of a coding session. The active observations take more tokens than \
their target, so some may leave active memory. Dropping only retires an observation from what the \
agent sees; it stays in the ledger and can still be recalled by id.

An observation is safe to drop when its lasting meaning is preserved elsewhere: by reflections \
that cite it (coverage partial or strong), by a newer observation that supersedes it, or because \
it is routine and easy to find again. Keep user assertions, exact decisions, unique identifiers, \
dated events, errors and their resolution, and reasons, unless they are safely represented. \
Relevance is resistance, not a lock: critical observations need the strongest case.

{MEMORY_FORMAT} After it come each active observation's coverage (how many reflections cite it) and \
the pool's budget.

Call drop_observations once, with the ids to drop (at most the maximum given) and a short reason. \
Dropping fewer, or none, is valid: to drop none, answer in a few words without calling the tool."""

OBSERVATION_ITEM_SCHEMA = {
    "type": "object",
    "properties": {
        "timestamp": {"type": "string", "description": "When it happened: YYYY-MM-DD HH:MM"},
        "content": {"type": "string", "description": "One line of plain prose"},
        "relevance": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
        "sourceEntryIds": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                           "description": "Ids of the entries in this chunk that support it"},
    },
    "required": ["timestamp", "content", "relevance", "sourceEntryIds"],
}

RECORD_OBSERVATIONS_TOOL = (
    "record_observations",
    "Record observations about the conversation chunk. Returns a receipt per observation.",
    {"type": "object", "properties": {"observations": {"type": "array", "items": OBSERVATION_ITEM_SCHEMA}},
     "required": ["observations"]},
)

RECORD_REFLECTIONS_TOOL = (
    "record_reflections",
    "Record durable reflections, each citing the active observations it preserves.",
    {"type": "object", "properties": {"reflections": {"type": "array", "items": {
        "type": "object",
        "properties": {"content": {"type": "string", "description": "One line"},
                       "supportingObservationIds": {"type": "array", "items": {"type": "string"}, "minItems": 1}},
        "required": ["content", "supportingObservationIds"]}}},
     "required": ["reflections"]},
)

DROP_OBSERVATIONS_TOOL = (
    "drop_observations",
    "Retire active observations from active memory by id (they remain recallable).",
    {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"}},
                                      "reason": {"type": "string"}},
     "required": ["ids"]},
)


DAY_LINE = "=== {day} ==="


def reflection_memory_line(reflection_id: str, content: str) -> str:
    return f"[{reflection_id}] reflection: {content}"


def memory_block(lines: list[str]) -> str:
    """The stable first part of a worker's message: the memory in ledger order."""
    return "## Memory\n" + ("\n".join(lines) if lines else "(empty)") + "\n\n"


def observer_message(memory: str, now: str, chunk: str, first_id: str, last_id: str) -> tuple[str, str]:
    """(memory part, new part)."""
    return memory, f"## Current time\n{now}\n\n## New entries ({first_id} to {last_id})\n{chunk}"


def coverage_block(coverage: dict[str, list[str]]) -> str:
    """Ids by tier; the ``none`` tier (usually the largest) is named, not listed."""
    rows = [f"{tier}: {', '.join(coverage[tier])}" for tier in ("strong", "partial") if coverage.get(tier)]
    if coverage.get("none"):
        rows.append("none: every other active observation" if rows else "none: every active observation")
    return "## Coverage\n" + ("\n".join(rows) if rows else "(no active observations)")


def reflector_message(memory: str, coverage: dict[str, list[str]]) -> tuple[str, str]:
    return memory, coverage_block(coverage)


def dropper_message(memory: str, coverage: dict[str, list[str]], active: int, pool_tokens: float,
                    target_tokens: int, max_drops: int) -> tuple[str, str]:
    return memory, (coverage_block(coverage) + f"\n\n## Budget\nActive observations: {active} using "
                    f"{pool_tokens:g} tokens; target {target_tokens} tokens. Drop at most {max_drops}.")


EXCERPT_MARKER = "\n[… {omitted} characters omitted from the middle of this entry; the stored entry is complete …]\n"
TRUNCATION_MARKER = " [… truncated]"
