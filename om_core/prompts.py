"""Every text this project puts in front of a model, in one place and in our own words.

Stable text comes first in every prompt so that provider prompt caches hit across calls.
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
