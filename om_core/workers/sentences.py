"""The offline baseline's grammar: where a sentence ends, where an excerpt may be cut, and when a
sentence is a directive to the agent (a constraint) rather than a report of what happened.

Rules on structure, never on particular texts:

* a sentence ends at . ! or ? followed by a space, or at a line break; a dot inside a token (".env",
  "upload.py", "v1.2") ends none, nor does a common abbreviation's;
* a sentence opening with a coordinating conjunction ("And placeholders must not …") continues the
  one before it, so it is joined to it;
* an excerpt is cut where a phrase ends, and never after a connective ("… and …");
* a directive opens a clause with an imperative (never, always, don't, make sure, …), or holds a
  modal of obligation (must, have to, should, not allowed, …), or has the speaker or the agent as the
  subject of one (I never want, you always, we only …). An adverb of a reported event ("the job never
  showed up") is none of these. A standing one is absolute (never, always, must) in a clause not
  bounded in time ("yet", "for now").
"""

from __future__ import annotations

import re

MAX_CHARS = 320

_SENTENCE_END = re.compile(r"(?<=[.!?])(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)(?<!\bvs\.)\s+")
_CLAUSE_END = re.compile(r"[,;:]\s|\s[-–—]\s|\)\s")
# the words that join a sentence to the one before it
CONJUNCTION = re.compile(r"(?i)^(and|but|or|nor|yet|so|plus)\b")
# words an excerpt must not end on: they announce what the cut took away
_DANGLING = re.compile(r"(?i)[\s,;:]+(and|or|but|nor|yet|so|then|that|which|who|the|a|an|to|of|in|on|at|with|for|"
                       r"from|by|as|if|because|when|while|including|includes|like)$")

# a clause's opening words that are not its verb (discourse markers, politeness)
_LEAD = r"(?:(?:and|but|or|so|also|then|just|please|now|again|and please|ok|okay)[,]?\s+)*"
_IMPERATIVE = re.compile(rf"(?i)^{_LEAD}(never|always|don'?t|do not|make sure|only|avoid|stop|prefer)\b")
_OBLIGATION = re.compile(r"(?i)\b(must(n'?t| not)?|ha(s|ve) to|needs? to|should(n'?t| not)?|(is|are) not allowed|"
                         r"under no circumstances|make sure|required?|instead of|rather than)\b")
_ADDRESSED = re.compile(r"(?i)\b(i|you|we)\s+(really\s+|just\s+)?(never|always|only|don'?t|do not|prefer|want)\b")
# the stronger directives: what holds whatever comes next
_ABSOLUTE_OPENING = re.compile(rf"(?i)^{_LEAD}(never|always|don'?t|do not|only)\b")
_ABSOLUTE = re.compile(r"(?i)\b(must( not)?|mustn'?t|not allowed|under no circumstances|"
                       r"(i|you|we)\s+(never|always|only want|don'?t ever))\b")
_CLAUSES = re.compile(r"[,;:]\s+|\s[-–—]\s|\(")
# a directive bounded in time holds for the moment, not from now on
_FOR_NOW = re.compile(r"(?i)\b(yet|for now|right now|for the moment|at the moment|until|today|this time)\b")


def sentences(text: str) -> list[str]:
    """A text's sentences, each on one line: a line break ends one too; one opening with a conjunction
    is joined to the one before it."""
    found: list[str] = []
    for line in text.splitlines():
        for s in _SENTENCE_END.split(" ".join(line.split())):
            if not s:
                continue
            if found and CONJUNCTION.match(s):
                found[-1] = f"{found[-1]} {s}"
            else:
                found.append(s)
    return found


def _clauses(sentence: str) -> list[str]:
    return [c.strip() for c in _CLAUSES.split(sentence) if c.strip()]


def is_directive(sentence: str) -> bool:
    """Whether the sentence tells the agent what to do or not to do (see the module's rules)."""
    return bool(_OBLIGATION.search(sentence) or _ADDRESSED.search(sentence)
                or any(_IMPERATIVE.match(c) for c in _clauses(sentence)))


def is_absolute(sentence: str) -> bool:
    """A directive that holds from now on whatever comes next (never, always, must, not allowed), in a
    clause not bounded in time ("don't change anything yet" holds for the moment)."""
    return any((_ABSOLUTE.search(c) or _ABSOLUTE_OPENING.match(c)) and not _FOR_NOW.search(c)
               for c in _clauses(sentence))


def _without_dangling(text: str) -> str:
    while (stripped := _DANGLING.sub("", text)) != text:
        text = stripped
    return text.rstrip(" ,;:-–—")


def one_line(text: str, limit: int = MAX_CHARS) -> str:
    """The text on one line, whole when it fits; else cut where a phrase ends, never inside one: after
    the last whole sentence that fits, else the first sentence whole when it is at most twice the
    limit, else after the last clause (a comma, semicolon, colon, dash or parenthesis) in the second
    half of the limit, and only as a last resort between words; never after a connective. The cut is
    marked with " …"."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    ends = [m.start() for m in _SENTENCE_END.finditer(text)]
    fitting = [end for end in ends if end <= limit]
    if fitting:
        return text[:fitting[-1]] + " …"
    if ends and ends[0] <= 2 * limit:
        return text[:ends[0]] + " …"
    if not ends and len(text) <= 2 * limit and text[-1] in ".!?":
        return text
    clauses = [m.start() + (1 if text[m.start()] in ",;:)" else 0) for m in _CLAUSE_END.finditer(text[:limit + 1])]
    clauses = [c for c in clauses if c >= limit // 2]
    cut = clauses[-1] if clauses else text.rfind(" ", 0, limit + 1)
    return _without_dangling(text[:cut if cut > 0 else limit]) + " …"


def first_sentence(text: str, limit: int = MAX_CHARS) -> str:
    """The first sentence (when it says something: over 20 characters), else the text, on one line."""
    found = sentences(text)
    first = found[0] if found else ""
    return one_line(first if len(first) > 20 and len(found) > 1 else text, limit)
