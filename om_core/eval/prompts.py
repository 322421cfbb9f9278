"""The texts `om eval longmemeval` puts in front of a model: the reader, the native-style summarizer
and the approximate judge. Our own words; none of them is the official LongMemEval prompt.

The memory workers' prompts are in ``om_core.workers.prompts``; the wrapper of a compaction summary below
is Pi's own wire text (pi-sessions.md §1.7), because the reader must see the summary as Pi sends it.
"""

from __future__ import annotations

# Pi wraps a compaction summary in this user message (convertToLlm, compactionSummary).
COMPACTION_SUMMARY_PREFIX = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
COMPACTION_SUMMARY_SUFFIX = "\n</summary>"

READER_SYSTEM = """\
You are a personal assistant in a long-running chat with one user. The conversation so far is \
below: possibly shortened, with its earlier part replaced by a summary, followed by the most recent \
messages. Each user message starts with the date and time it was sent, in brackets.

Answer the user's last message from what you know of the conversation. Be brief and specific: give \
the fact, name, number or date asked for, and for questions about time, work it out from the dates. \
When a fact changed over time, the most recent statement holds. If the conversation does not contain \
the information needed, say plainly that you do not know rather than guessing."""

READER_RECALL_NOTE = """

The summary's lines begin with 12-character memory ids. When the exact wording or a detail behind \
a line matters, call `recall` with that id to read the original messages; then answer."""

RECALL_TOOL = (
    "recall",
    "Read the original messages behind a memory id from the summary (12 lowercase hex characters).",
    {"type": "object", "properties": {"id": {"type": "string", "description": "a 12-character memory id"}},
     "required": ["id"]},
)

READER_FINAL_TURN = "Answer the question now from what you have, without calling any tool."

# A summary in the manner of a native compaction: one model call over the serialized history
# (or an update of the previous summary when the history is too long for one call).
NATIVE_SUMMARY_SYSTEM = """\
You write the context checkpoint of a long conversation between a user and an assistant, so that \
the conversation can go on from the summary alone once the old messages are removed. Write a \
structured, factual summary; do not continue the conversation and do not answer any question in it."""

NATIVE_SUMMARY_INSTRUCTIONS = """\
Summarize the conversation above as a checkpoint with these sections:

## About the user
Facts the user stated about themselves, their life, work, possessions, plans and preferences.

## What happened
The topics discussed and the events, decisions and recommendations, with their dates.

## Details to keep
Exact names, numbers, places, dates and anything the assistant provided that may be asked for again.

## Open threads
Questions or plans still pending.

Keep each point short. Prefer concrete facts over general descriptions."""

NATIVE_UPDATE_INSTRUCTIONS = """\
The previous checkpoint is given above between <previous-summary> tags, followed by the \
conversation that came after it. Write the updated checkpoint in the same sections: keep every \
point of the previous checkpoint that still holds, add what is new, and where a newer message \
changes an earlier fact, keep the newer one."""

JUDGE_SYSTEM = """\
You grade answers of a memory benchmark. You get a question, the reference answer and a response. \
Decide whether the response is correct. Reply with one word: yes or no."""

_JUDGE_RULES = {
    "default": "The response is correct if it contains the reference answer or something equivalent to it. "
               "A response that gives only part of the required information, or hedges between several "
               "answers, is not correct. Extra explanation does not matter.",
    "temporal-reasoning": "The response is correct if it contains the reference answer or an equivalent one. "
                          "For counts of days, weeks or months, an answer off by one is still correct.",
    "knowledge-update": "The response is correct if it gives the updated answer in the reference. A response that "
                        "also mentions an older value is still correct as long as it gives the updated one as "
                        "the current answer.",
    "single-session-preference": "The reference describes what a good, personalised response would take into "
                                 "account. The response is correct if it recalls and uses the user's personal "
                                 "information and preferences as described; it need not mention every point.",
    "abstention": "The reference explains why the question cannot be answered from the conversation. The response "
                  "is correct if it says that the information is not available or that it does not know (it may "
                  "say what it does know instead); it is not correct if it gives a definite answer.",
}


def judge_message(question: str, answer: str, hypothesis: str, question_type: str, abstention: bool) -> str:
    rule = _JUDGE_RULES["abstention" if abstention else question_type if question_type in _JUDGE_RULES else "default"]
    return (f"{rule}\n\nQuestion: {question}\n\nReference answer: {answer}\n\nResponse: {hypothesis}\n\n"
            "Is the response correct? Reply yes or no.")
