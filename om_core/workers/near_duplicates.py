"""Near-duplicates and changes of state: is a new note a repeat of an earlier one, or news about it?

A note nearly repeats an earlier one when their normalised words are at least ``NEAR_DUPLICATE_RATIO``
similar (difflib's ratio over the word lists: one word changed in a note of ten words is 0.9). Then
what it is about and what it says of it decide:

- its *subjects* (the ids it names that are known ids: the entries it cites, the chunk's entries, the
  memory ids of the branch; paths, file names, commit hashes, names like ``WP4``, and a number that
  labels an item: ``Step 2``, ``issue #7``, ``attempt 3``) must be the same: a near copy on another
  subject is another fact, recorded as it is;
- its *states* (negations, ``STATE_WORDS``, numbers, versions, count words, other identifiers such as
  ``max_retries`` or ``user@host``) then decide: the same states, a duplicate (skipped); a state
  changed (``passes`` to ``fails``, ``open`` to ``closed``, ``must`` to ``must not``, ``3 retries`` to
  ``5``, ``PostgreSQL 15`` to ``16``, ``two`` to ``three``), a change of state, which the checks
  refuse until the new note names the one it replaces or is reworded as a fact of its own.

Ids are told by what the caller knows, not by their look: a cited entry id that reads as a word
(``facade``) is a subject, an eight-digit number no one cites is a value. Only where no ids are known
(``ids`` None) does ``ID_SHAPE`` guess them: eight or twelve hex characters, Pi's entry ids and om's
memory ids.

A short note (under ten words, where one changed word already falls under the ratio) is a change of
state too when its other words are the same, in the same order, and there are at least
``SAME_SENTENCE_MIN_WORDS`` of them ("Assistant modified cli.py (edited 3 times)" after "… 2 times";
"Tool bash failed: Command aborted" after "… succeeded: …"). The rule's false positives and negatives on the real sessions
are measured by bench/conformance/state_changes.py (docs/concepts.md gives the counts).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from difflib import SequenceMatcher
from functools import lru_cache

NEAR_DUPLICATE_RATIO = 0.9
SAME_SENTENCE_MIN_WORDS = 4  # "User wrote: token X" after "… token Y": too little left to call it one note

_WORDS = re.compile(r"[\w./:@#+-]+")
NEGATIONS = frozenset({"not", "no", "never", "none", "nothing", "without", "cannot", "can't", "don't", "doesn't",
                       "didn't", "isn't", "aren't", "wasn't", "won't", "shouldn't", "mustn't", "neither", "nor"})
# Words that name a state: a near copy of a note that swaps one of them for another (or drops it)
# records a change, not a repeat.
STATE_WORDS = frozenset({
    "pass", "passes", "passed", "passing", "fail", "fails", "failed", "failing", "failure", "failures",
    "open", "opened", "closed", "fixed", "unfixed", "broken", "works", "working", "done", "pending", "finished",
    "unfinished", "started", "stopped", "running", "enabled", "disabled", "added", "removed", "deleted", "kept",
    "accepted", "rejected", "approved", "declined", "merged", "reverted", "committed", "uncommitted", "pushed",
    "true", "false", "succeeded", "successful", "blocked", "unblocked", "resolved", "unresolved", "valid",
    "invalid", "present", "missing", "installed", "uninstalled", "allowed", "forbidden", "required", "optional",
    "green", "red", "active", "inactive", "available", "unavailable",
})
# Count words: "two tests fail" and "three tests fail" differ as "2" and "3" do.
COUNT_WORDS = frozenset({"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                         "eleven", "twelve", "twenty", "hundred", "thousand", "once", "twice"})
# A number right after one of these labels an item ("Step 2", "issue #7"): it says which one, as a
# path does, not a value of it.
ITEM_LABELS = frozenset({"step", "item", "part", "phase", "stage", "task", "issue", "pr", "chunk", "entry", "line",
                         "round", "row", "column", "section", "chapter", "page", "ticket", "bug", "milestone",
                         "iteration", "example", "case", "question", "option", "attempt", "wp", "seed", "commit",
                         "note", "message", "turn"})
_ARTICLES = frozenset({"the", "a", "an"})
_FILE_NAME = re.compile(r"^[\w-]+(\.[a-z][a-z0-9]{0,4})+$")
# commit hashes and other hex names of things: with a digit and a letter, so neither a number nor a word
_HASH = re.compile(r"^(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}$")
# The fallback where no ids are known: Pi's entry ids (8) and om's memory ids (12) by their look,
# digits alone too (about one id in forty has no letter; citing another entry is another fact, not a
# new count)
ID_SHAPE = re.compile(r"^(?:[0-9a-f]{8}|[0-9a-f]{12})$")
_NAME_WITH_DIGITS = re.compile(r"^[a-z][a-z-]*\d+[a-z]*$")  # wp4, s3, e2e, h264: a name, not a value
_VERSION = re.compile(r"^v?\d+(\.\d+)+$")


@lru_cache(maxsize=16384)
def normalised_words(content: str) -> tuple[str, ...]:
    """A note's words for comparison: lower case, punctuation around words dropped. Cached: every
    stage's checks read the branch's memory notes again (the same texts)."""
    words = (w.strip(".:-#/+@") for w in _WORDS.findall(content.lower().replace("\u2019", "'")))
    return tuple(w for w in words if w)


@lru_cache(maxsize=65536)
def _identifier(word: str) -> bool:
    return any(c.isdigit() or c in "./:@#_+" for c in word)


def known_ids(ids: Iterable[str] | None) -> frozenset[str] | None:
    """Ids as a note's words read them (lower case), or None when none are known."""
    return None if ids is None else frozenset(i.lower() for i in ids)


def is_subject(word: str, before: str | None, ids: frozenset[str] | None = None,
               cited: frozenset[str] = frozenset()) -> bool:
    """A known id (one of ``ids`` or of the note's ``cited``; ``ID_SHAPE`` guesses ids only when ``ids``
    is None), a path, a file name, a hash, a name with digits, or an item's number after its label:
    what a note is about, not a state of it."""
    if ids is not None and (word in ids or word in cited):
        return True
    return _shaped_subject(word, before, ids is None)


@lru_cache(maxsize=65536)
def _shaped_subject(word: str, before: str | None, guess_ids: bool) -> bool:
    """``is_subject`` by the word's shape and the word before it, the known ids aside: the same for a
    word wherever it recurs, so cached (each stage's checks mark the branch's memory notes again)."""
    if before in ITEM_LABELS and _identifier(word) and not _VERSION.match(word.lstrip("#")):
        return True
    if _VERSION.match(word):
        return False
    return ("/" in word or _FILE_NAME.match(word) is not None or _HASH.match(word) is not None
            or (guess_ids and ID_SHAPE.match(word) is not None) or _NAME_WITH_DIGITS.match(word) is not None)


@dataclass(frozen=True)
class Marks:
    """What a near copy must keep to be a duplicate: ``subjects`` (what it is about; another one is
    another fact) and ``states`` (what it says of them; another one is a change of state)."""

    subjects: frozenset[str]
    states: frozenset[str]

    @classmethod
    def of(cls, words: tuple[str, ...], ids: frozenset[str] | None = None,
           cited: frozenset[str] = frozenset()) -> Marks:
        subjects, states = set(), set()
        for i, word in enumerate(words):
            if is_subject(word, words[i - 1] if i else None, ids, cited):
                subjects.add(word)
            elif word in NEGATIONS:  # with the word it negates: "could not find" is no "must not match"
                negated = next((w for w in words[i + 1:] if w not in _ARTICLES), "")
                states.add(f"{word} {negated}")
            elif word in STATE_WORDS or word in COUNT_WORDS or _identifier(word):
                states.add(word)
        return cls(frozenset(subjects), frozenset(states))

    def rest(self, words: tuple[str, ...]) -> tuple[str, ...]:
        """The words that are neither subjects nor states, in order."""
        return tuple(w for w in words if w not in self.subjects and w not in self.states and w not in NEGATIONS)


@dataclass(frozen=True)
class NearMatch:
    """An earlier note a new one nearly repeats: ``changed`` when the new one changes a state of it."""

    note_id: str
    content: str
    changed: bool


class NearDuplicates:
    """Finds an earlier note a new one nearly repeats (``NEAR_DUPLICATE_RATIO``). ``notes``: the earlier
    notes, each (id, content, the ids it cites); ``ids``: the ids known besides a note's own citations
    (the chunk's entries, the branch's memory ids), or None to guess ids by ``ID_SHAPE``."""

    def __init__(self, notes: Iterable[tuple[str, str, Collection[str]]] = (),
                 ids: Iterable[str] | None = None) -> None:
        self._ids = known_ids(ids)
        self._notes: list[tuple[str, str, tuple[str, ...], Marks]] = []
        # (the words but the marks, the subjects) -> the newest note of them
        self._sentences: dict[tuple[tuple[str, ...], frozenset[str]], tuple[str, str, Marks]] = {}
        for note_id, content, cited in notes:
            self.add(note_id, content, cited)

    def _marks(self, words: tuple[str, ...], cited: Collection[str]) -> Marks:
        """The marks of a note's words, its own cited ids known beside the pool's (if any are known)."""
        return Marks.of(words, self._ids, frozenset(c.lower() for c in cited))

    def add(self, note_id: str, content: str, cited: Collection[str] = ()) -> None:
        words = normalised_words(content)
        marks = self._marks(words, cited)
        self._notes.append((note_id, content, words, marks))
        rest = marks.rest(words)
        if len(rest) >= SAME_SENTENCE_MIN_WORDS:
            self._sentences[(rest, marks.subjects)] = (note_id, content, marks)  # the newest of them

    def match(self, content: str, cited: Collection[str] = ()) -> NearMatch | None:
        """The earlier note ``content`` (citing ``cited``) nearly repeats (a repeat before a change of
        state; of several it changes, the newest), or None."""
        words = normalised_words(content)
        if not words:
            return None
        marks = self._marks(words, cited)
        matcher = SequenceMatcher(autojunk=False)
        matcher.set_seq2(words)
        change = None
        for note_id, text, other, other_marks in self._notes:
            size = len(other) + len(words)
            if 2 * min(len(other), len(words)) < NEAR_DUPLICATE_RATIO * size:
                continue  # too different in length to reach the ratio
            if other_marks.subjects != marks.subjects:
                continue  # about another subject: another fact
            matcher.set_seq1(other)
            if matcher.real_quick_ratio() >= NEAR_DUPLICATE_RATIO and matcher.quick_ratio() >= NEAR_DUPLICATE_RATIO \
                    and matcher.ratio() >= NEAR_DUPLICATE_RATIO:
                if other_marks == marks:
                    return NearMatch(note_id, text, False)
                change = NearMatch(note_id, text, True)  # the newest: the state the new note changes
        if change is None:
            same = self._sentences.get((marks.rest(words), marks.subjects))
            if same is not None and same[2] != marks:
                change = NearMatch(same[0], same[1], True)
        return change

    def of(self, content: str, cited: Collection[str] = ()) -> str | None:
        """The id of the note ``content`` nearly repeats (no change of state), or None."""
        found = self.match(content, cited)
        return found.note_id if found is not None and not found.changed else None
