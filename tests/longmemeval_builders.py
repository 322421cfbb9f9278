"""LongMemEval-format data written by the project (never the public file), and a scripted fake model
for `om eval longmemeval`.

Every instance hides one keyword (``KW-…``) in a turn of its evidence session; its answer names the
keyword in a sentence that appears nowhere in the haystack, and its session and question ids carry
``LEAK`` so a test can look for them in every request. The abstention instance mentions no keyword.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from fake_openai import Reply, text, tool_call

from om_core.eval import prompts as P

TYPES = ["single-session-user", "single-session-assistant", "single-session-preference", "multi-session",
         "temporal-reasoning", "knowledge-update"]
KEYWORD = re.compile(r"KW-[A-Z0-9]+")
_FILLER = ["We talked about the weather and weekend plans.", "I asked for a pasta recipe with mushrooms.",
           "Can you suggest a podcast about history?", "I am thinking about repainting the kitchen.",
           "What is a good stretch after running?", "My sister visits next month."]


def _session(prefix: str, n: int, turns: int, keyword: str | None = None, at: int | None = None) -> list[dict]:
    out = []
    for k in range(turns):
        user = f"{_FILLER[(n + k) % len(_FILLER)]} (note {prefix}{n}.{k})"
        has = keyword is not None and k == at
        if has:
            user = f"By the way, remember this: my code word is {keyword}, please keep it in mind."
        out.append({"role": "user", "content": user, "has_answer": has})
        out.append({"role": "assistant", "content": f"Noted, thanks for telling me about item {prefix}{n}.{k}."})
    return out


def instance(qid: str, qtype: str, keyword: str | None, *, sessions: int = 4, turns: int = 3,
             evidence: int = 1, abstention: bool = False) -> dict:
    """Sessions dated out of order on purpose (the builder must sort them); the evidence is never the
    last session, so a tail-only context misses it."""
    days = list(range(sessions))
    random.Random(qid).shuffle(days)
    ids = [f"sess-LEAK-{qid}-{i}" for i in range(sessions)]
    tag = qid.split("-")[0]  # the ids carry LEAK; the conversation must not
    hay = [_session(tag, i, turns, keyword if i == evidence else None, at=1) for i in range(sessions)]
    dates = [f"2023/05/{10 + d:02d} (Mon) {9 + i:02d}:30" for i, d in enumerate(days)]
    last = max(range(sessions), key=lambda i: days[i])
    if evidence == last:  # keep the evidence away from the kept tail
        days[evidence], days[(evidence + 1) % sessions] = days[(evidence + 1) % sessions], days[evidence]
        dates = [f"2023/05/{10 + d:02d} (Mon) {9 + i:02d}:30" for i, d in enumerate(days)]
    question = ("What was the code word I told you about the red bicycle?" if abstention
                else "What is the code word I asked you to keep in mind?")
    answer = ("You never told me a code word about a red bicycle; you only mentioned other topics."
              if abstention else f"The code word was {keyword} (LEAK-ANSWER-{qid.split('-')[0]}).")
    return {"question_id": qid, "question_type": qtype, "question": question, "answer": answer,
            "question_date": "2023/06/01 (Thu) 10:00", "haystack_session_ids": ids, "haystack_dates": dates,
            "haystack_sessions": hay, "answer_session_ids": [ids[evidence]]}


def small_dataset() -> list[dict]:
    data = [instance(f"q{i}-LEAK", t, f"KW-{chr(65 + i) * 3}{i}") for i, t in enumerate(TYPES)]
    data.append(instance("q6-LEAK_abs", "single-session-user", None, abstention=True))
    return data


def write_dataset(path: Path, data: list[dict] | None = None, *, broken: bool = True) -> Path:
    data = list(small_dataset() if data is None else data)
    if broken:  # one bad instance: reported and skipped, the rest goes on
        bad = instance("qbad-LEAK", "multi-session", "KW-BAD")
        bad["haystack_dates"] = bad["haystack_dates"][:-1]
        data.insert(3, bad)
    path.write_text(json.dumps(data, indent=1))
    return path


def large_instance(qid: str = "bench-1", sessions: int = 48, target_tokens: int = 115_000) -> dict:
    """A LongMemEval-S-sized instance (~48 sessions, ~115k tokens of history) for the benchmark."""
    rng = random.Random(qid)
    words = ("garden bicycle recipe flight budget sister museum laptop concert marathon paint novel coffee "
             "weekend podcast insurance apartment camera guitar hiking").split()
    per_session = target_tokens // sessions
    hay = []
    for n in range(sessions):
        turns, used = [], 0
        while used < per_session:
            user = " ".join(rng.choice(words) for _ in range(40)) + f" (session {n})."
            reply = " ".join(rng.choice(words) for _ in range(160)) + "."
            turns += [{"role": "user", "content": user, "has_answer": False}, {"role": "assistant", "content": reply}]
            used += (len(user) + len(reply)) // 4
        hay.append(turns)
    hay[7][0]["content"] = "Remember: my code word is KW-BENCH."
    hay[7][0]["has_answer"] = True
    ids = [f"sess-{qid}-{n}" for n in range(sessions)]
    dates = [f"2023/{1 + n // 28:02d}/{1 + n % 28:02d} (Mon) 10:00" for n in range(sessions)]
    return {"question_id": qid, "question_type": "single-session-user", "question": "What is my code word?",
            "answer": "KW-BENCH", "question_date": "2023/03/01 (Wed) 09:00", "haystack_session_ids": ids,
            "haystack_dates": dates, "haystack_sessions": hay, "answer_session_ids": [ids[7]]}


# ------------------------------------------------------------------ the scripted model

_DAY = re.compile(r"^=== (\d{4}-\d{2}-\d{2}) ===$", re.M)
_LABEL = re.compile(r"^\[(\S+) ([^\]\n]+?)(?: (\d{2}:\d{2}))?\] ", re.M)
_MEMORY_ID = re.compile(r"^\[([0-9a-f]{12})\]", re.M)
_ENTRY_ID = re.compile(r"\b(00[0-9a-f]{6})\b")  # the haystack's entry ids (a counter)
_MINUTE = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}")


def chunk_entries(user: str) -> list[tuple[str, str, str, str]]:
    """(entry id, role, minute, text) of each entry in an observer prompt. The prompt's own layout
    first; failing that, any text between two entry ids (so a new prompt layout still parses)."""
    start = user.find("## New entries")
    if start >= 0:  # `=== date ===` lines, then `[id Role HH:MM] text` per entry
        body = user[start:]
        marks = sorted([(m.start(), m) for m in _DAY.finditer(body)] + [(m.start(), m) for m in _LABEL.finditer(body)],
                       key=lambda pair: pair[0])
        found, day = [], "2023-01-01"
        for i, (_, m) in enumerate(marks):
            if m.re is _DAY:
                day = m.group(1)
                continue
            end = marks[i + 1][0] if i + 1 < len(marks) else len(body)
            found.append((m.group(1), m.group(2), f"{day} {m.group(3) or '00:00'}", body[m.end():end].rstrip("\n")))
        if found:
            return found
    marks = list(_ENTRY_ID.finditer(user))
    out = []
    for mark, following in zip(marks, marks[1:] + [None]):
        segment = user[mark.end(): following.start() if following else len(user)]
        minute = _MINUTE.search(segment)
        role = "User" if "User" in segment[:40] else "Assistant"
        out.append((mark.group(1), role, minute.group(0) if minute else "2023-01-01 00:00", segment))
    return out


def _tools(body: dict) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or []}


_TASK = re.compile(r"^## Task: (observe|reflect|drop)$", re.M)


def kind_of(body: dict) -> str:
    if "record_observations" in _tools(body):  # a memory worker (the three offer the same tools): by its task
        content = body["messages"][1]["content"]
        user = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
        return {"observe": "observer", "reflect": "reflector", "drop": "dropper"}[_TASK.search(user).group(1)]
    system = body["messages"][0]["content"]
    if system.startswith(P.READER_SYSTEM):
        return "reader"
    if system == P.NATIVE_SUMMARY_SYSTEM:
        return "native"
    if system == P.JUDGE_SYSTEM:
        return "judge"
    return "unknown"


class EvalModel:
    """A FakeOpenAI responder playing every part: the observer records each user turn verbatim, the
    reader answers with the keyword it can see (else that it does not know), the native summarizer
    writes a generic summary, and the judge compares the keyword of the reference with the response."""

    def __init__(self, use_recall: bool = False, fail_reader_for: str | None = None, observe_every: int = 1,
                 note_chars: int = 300) -> None:
        self.use_recall = use_recall
        self.fail_reader_for = fail_reader_for
        self.observe_every = observe_every  # record every n-th user turn (and every one with a keyword)
        self.note_chars = note_chars
        self.kinds: list[str] = []

    def __call__(self, body: dict) -> Reply:
        kind = kind_of(body)
        self.kinds.append(kind)
        messages = body["messages"]
        last = messages[-1]
        if kind in ("observer", "reflector", "dropper"):
            if last["role"] == "tool" or kind == "dropper":
                return text("nothing more to record")
            user = "\n".join(m["content"] for m in messages if m["role"] == "user")
            if kind == "reflector":  # one reflection over the newest few observations
                ids = list(dict.fromkeys(_MEMORY_ID.findall(user)))[-3:]
                if not ids:
                    return text("nothing durable")
                return tool_call("record_reflections", {"reflections": [
                    {"content": f"The user keeps sharing everyday plans ({len(ids)} notes).",
                     "supportingObservationIds": ids}]})
            turns = [(e, ts, t) for e, role, ts, t in chunk_entries(user) if role.strip() == "User"]
            observations = [{"timestamp": ts.strip(), "content": f"User said: {t[:self.note_chars]}",
                             "relevance": "high", "sourceEntryIds": [entry_id]}
                            for n, (entry_id, ts, t) in enumerate(turns)
                            if n % self.observe_every == 0 or KEYWORD.search(t)]
            if not observations:
                return text("nothing to record")
            return tool_call("record_observations", {"observations": observations})
        if kind == "reader":
            context = "\n".join(m.get("content") or "" for m in messages[1:-1] if m["role"] != "tool")
            if self.fail_reader_for and self.fail_reader_for in last.get("content", ""):
                return Reply(status=400, error_body={"error": {"message": "bad request", "type": "invalid_request_error"}})
            if self.use_recall and last["role"] != "tool" and _tools(body):
                ids = _MEMORY_ID.findall(context)
                if ids:
                    return tool_call("recall", {"id": ids[0]})
            seen = KEYWORD.findall(context + "\n".join(m["content"] for m in messages if m["role"] == "tool"))
            return text(f"Your code word is {seen[0]}." if seen else "I don't know; you never told me.")
        if kind == "native":
            return text("## About the user\nThe user chatted about everyday topics.\n## What happened\nSmall talk.")
        if kind == "judge":
            user = messages[-1]["content"]
            reference = user.split("Reference answer:", 1)[1].split("Response:", 1)[0]
            response = user.split("Response:", 1)[1]
            want = KEYWORD.findall(reference)
            if want:
                return text("yes" if want[0] in response else "no")
            return text("yes" if "don't know" in response else "no")
        return text("(unexpected request)")
