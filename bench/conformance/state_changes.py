#!/usr/bin/env python3
"""How often does the change-of-state rule (om_core/workers/near_duplicates.py) call a repeat a change,
or a change a repeat, on notes of the real sessions?

The notes are the offline baseline's observer proposals (``om_core.workers.offline.observe_entries``)
on every chunk of the real sessions (../shared/sessions and examples/sessions), before any check: what
an extractive note-taker writes of real work. Each note is then the earlier note of cases whose answer
is known by construction, each matched against all the notes of its session:

* a change of state (the rule must say "changed"): a negation put in, a number or a version changed, a
  count word changed, a state word swapped for its opposite (passes/fails, open/closed, …);
* a repeat (the rule must say "duplicate"): the same note in other case and punctuation, or with
  "the" put in or left out;
* another subject (the rule must not say "changed"): another path, file name or item number.

A false positive is a repeat or another subject called a change (a careful model gets a needless
second turn; the offline baseline, which has none, loses the note); a false negative is a change
called a repeat or nothing (the change would be skipped as a duplicate, or recorded beside the note
it contradicts without naming it). The real notes themselves are matched in session order too: the
near copies among them are counted and, with ``--show``, listed for reading.

The rule is measured twice: as the checks run it, each note with the entries it cites and the
session's entry ids and the pool's memory ids known (a case cites what its note cites), and by the
fallback that guesses ids by their look (``ID_SHAPE``, no ids known).

Usage (from the repository root):

    .venv/bin/python bench/conformance/state_changes.py            # every real session
    .venv/bin/python bench/conformance/state_changes.py --smoke    # the smallest example session only
    .venv/bin/python bench/conformance/state_changes.py --show     # also list each miss and each natural near copy
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from om_core.ingest import ingest  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store import db as dbmod  # noqa: E402
from om_core.store.catalog import resolve_tip  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402
from om_core.workers.inputs import observer_input  # noqa: E402
from om_core.workers.near_duplicates import ID_SHAPE, NearDuplicates, known_ids, normalised_words  # noqa: E402
from om_core.workers.offline import observe_entries  # noqa: E402

SESSIONS = sorted((REPO.parent / "shared" / "sessions").glob("*.jsonl")) + sorted(
    (REPO / "examples" / "sessions").glob("*.jsonl"))
SMOKE = [REPO / "examples" / "sessions" / "tidewatch-units.jsonl"]

OPPOSITES = {"passes": "fails", "passed": "failed", "pass": "fail", "passing": "failing", "open": "closed",
             "opened": "closed", "enabled": "disabled", "added": "removed", "fixed": "broken", "works": "fails",
             "succeeded": "failed", "true": "false", "accepted": "rejected", "installed": "missing",
             "available": "unavailable", "valid": "invalid", "required": "optional", "done": "pending"}
OPPOSITES.update({v: k for k, v in list(OPPOSITES.items())})
COUNTS = {"one": "two", "two": "three", "three": "four", "four": "five", "five": "six", "six": "seven"}
_AUX = re.compile(r"\b(is|are|was|were|must|should|can|will|does|did|has|have)\b", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w./:,-])(\d+)(?![\w/-]|\.\d)")  # not a path's line number
_VERSION = re.compile(r"(?<![\w./-])(v?\d+\.\d+(?:\.\d+)?)(?![\w/-])")
_PATH = re.compile(r"(?<![\w/])((?:[\w.-]+/)+[\w.-]+\.[a-z]{1,4})\b")
_LABELLED = re.compile(r"\b(step|item|part|phase|issue|attempt|line|row|section)\s+#?(\d+)\b", re.IGNORECASE)
_NOT_A_NUMBER = re.compile(r"\b(?:step|item|part|phase|stage|task|issue|pr|chunk|entry|line|round|row|column|section|"
                           r"chapter|page|ticket|bug|milestone|iteration|example|case|question|option|attempt|wp|"
                           r"seed|commit)\s+#?$", re.IGNORECASE)


Note = tuple[str, tuple[str, ...]]  # a note's content and the entry ids it cites


def notes_of(paths: list[Path]) -> dict[str, tuple[list[Note], set[str]]]:
    """The offline observer's proposals on every chunk of each session, in order, with the entry ids
    of the session's chunks (by session file)."""
    out: dict[str, tuple[list[Note], set[str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "om.duckdb"
        ws = Workspace.open(db, settings=Settings())
        ingest(ws, paths)
        settings = Settings()
        with dbmod.reading(db) as con:
            sessions = con.execute("SELECT session_id, file_path FROM sessions ORDER BY file_path").fetchall()
            for sid, path in sessions:
                tip = resolve_tip(con, sid, None)
                notes: list[Note] = []
                entries: set[str] = set()
                after = None
                while (inp := observer_input(con, sid, tip, settings, after_position=after)) is not None:
                    notes += [(n["content"], tuple(n["sourceEntryIds"])) for n in observe_entries(inp.chunk)]
                    entries |= {e.entry_id for e in inp.chunk}
                    after = inp.chunk[-1].position
                out[Path(path).name] = (notes, entries)
    return out


def _swap(text: str, match: re.Match, new: str, group: int = 1) -> str:
    return text[:match.start(group)] + new + text[match.end(group):]


def changes(note: str) -> list[tuple[str, str]]:
    """Variants of ``note`` that change one of its states, each (kind, text)."""
    out = []
    aux = _AUX.search(note)
    if aux:
        out.append(("negation", _swap(note, aux, aux.group(1) + " not")))
    for m in _NUMBER.finditer(note):
        if not _NOT_A_NUMBER.search(note[:m.start(1)]):
            out.append(("number", _swap(note, m, str(int(m.group(1)) + 1))))
            break
    version = _VERSION.search(note)
    if version:
        parts = version.group(1).split(".")
        out.append(("version", _swap(note, version, ".".join(parts[:-1] + [str(int(parts[-1]) + 1)]))))
    for kind, table in (("state word", OPPOSITES), ("count word", COUNTS)):
        for m in re.finditer(r"\b([A-Za-z]+)\b", note):
            if m.group(1).lower() in table:
                out.append((kind, _swap(note, m, table[m.group(1).lower()])))
                break
    return out


def repeats(note: str) -> list[tuple[str, str]]:
    """Variants that say the same: another case and end, "the" put in or left out."""
    out = [("case and punctuation", note.upper().rstrip(".!") + "!")]
    the = re.search(r"\bthe ", note)
    out.append(("article", note[:the.start()] + note[the.end():] if the else "The " + note))
    return out


def other_subjects(note: str) -> list[tuple[str, str]]:
    """Variants about another path, file or item."""
    out = []
    path = _PATH.search(note)
    if path:
        out.append(("another path", _swap(note, path, "other/" + path.group(1).rsplit("/", 1)[-1])))
    item = _LABELLED.search(note)
    if item:
        out.append(("another item", _swap(note, item, str(int(item.group(2)) + 1), group=2)))
    return out


def verdict(pool: NearDuplicates, text: str, cited: tuple[str, ...]) -> str:
    found = pool.match(text, cited)
    return "none" if found is None else "changed" if found.changed else "duplicate"


def measure(notes: dict[str, tuple[list[Note], set[str]]], show: bool, by_shape: bool = False) -> dict:
    """The rule's counts, with the ids known as the checks know them or (``by_shape``) guessed."""
    counts: Counter = Counter()
    misses: list[dict] = []
    natural: list[dict] = []
    for session, (session_notes, entries) in notes.items():
        firsts: dict[str, tuple[str, ...]] = {}  # each note's content -> its first citations, in order
        for text, cited in session_notes:
            firsts.setdefault(text, cited)
        texts = [t for t, _ in session_notes]
        memory = {f"{i:012x}" for i in range(len(firsts))}
        ids = None if by_shape else entries | memory
        pool = NearDuplicates(((f"{i:012x}", t, c) for i, (t, c) in enumerate(firsts.items())), ids=ids)
        for text, cited in firsts.items():  # where the two ways to tell an id disagree
            known = known_ids(entries | memory | set(cited))
            for word in normalised_words(text):
                shaped = ID_SHAPE.match(word) is not None
                if shaped != (word in known):
                    counts["id-shaped words no one cites" if shaped else "cited ids of another shape"] += 1
        for expected, make in (("changed", changes), ("duplicate", repeats), ("other", other_subjects)):
            for note, cited in firsts.items():
                for kind, variant in make(note):
                    if variant in firsts:
                        continue  # the variant is a real note of its own: no case
                    got = verdict(pool, variant, cited)
                    counts[f"{expected} cases"] += 1
                    wrong = (got != "changed") if expected == "changed" else (got == "changed")
                    if expected == "duplicate" and got == "none":
                        counts["repeats not found"] += 1  # neither error: recorded twice, the old behaviour
                        if show:
                            misses.append({"session": session, "expected": expected, "kind": kind, "got": got,
                                           "note": note, "variant": variant})
                    if wrong:
                        counts["false negatives" if expected == "changed" else "false positives"] += 1
                        misses.append({"session": session, "expected": expected, "kind": kind, "got": got,
                                       "note": note, "variant": variant})
        seen = NearDuplicates(ids=ids)
        for i, (text, cited) in enumerate(session_notes):
            found = seen.match(text, cited)
            if found is not None and found.content == text:
                counts["natural exact repeats"] += 1
            elif found is not None:
                counts[f"natural {'changes' if found.changed else 'duplicates'}"] += 1
                natural.append({"session": session, "changed": found.changed, "earlier": found.content, "note": text})
            seen.add(f"{i:012x}", text, cited)
    result = {"ids": "by shape" if by_shape else "cited", "sessions": len(notes),
              "notes": sum(len(n) for n, _ in notes.values()),
              "cases": {k: counts[k] for k in ("changed cases", "duplicate cases", "other cases")},
              "false positives": counts["false positives"], "false negatives": counts["false negatives"],
              "repeats not found": counts["repeats not found"],
              "ids told apart": {k: counts[k] for k in ("id-shaped words no one cites", "cited ids of another shape")},
              "natural near copies": {"exact repeats": counts["natural exact repeats"],
                                      "duplicates": counts["natural duplicates"],
                                      "changes": counts["natural changes"]}}
    if show:
        result["misses"], result["natural"] = misses, natural
    return result


def report(result: dict) -> None:
    print(f"ids {result['ids']}: {result['notes']} notes of {result['sessions']} sessions; cases: "
          + ", ".join(f"{v} {k}" for k, v in result["cases"].items()))
    print(f"  false positives {result['false positives']}, false negatives {result['false negatives']}, "
          f"repeats not found {result['repeats not found']}")
    print("  words the two ways tell apart: " + ", ".join(f"{v} {k}" for k, v in result["ids told apart"].items()))
    print(f"  natural near copies: {result['natural near copies']['exact repeats']} exact repeats, "
          f"{result['natural near copies']['duplicates']} other duplicates, "
          f"{result['natural near copies']['changes']} changes of state")
    for miss in result.get("misses", []):
        print(f"  MISS {miss['kind']} ({miss['expected']} -> {miss['got']}): {miss['variant']!r}")
    for near in result.get("natural", []):
        print(f"  {'CHANGE' if near['changed'] else 'DUP'}: {near['note']!r}\n    earlier: {near['earlier']!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the smallest example session only")
    parser.add_argument("--show", action="store_true", help="list each miss and each natural near copy")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    notes = notes_of(SMOKE if args.smoke else SESSIONS)
    results = [measure(notes, args.show), measure(notes, args.show, by_shape=True)]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for result in results:
        report(result)


if __name__ == "__main__":
    main()
