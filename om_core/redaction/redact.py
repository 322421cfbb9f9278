"""Secret redaction for everything that leaves the machine: model prompts and compaction summaries.

The stored session is never changed, and ``recall`` still shows the original text locally. Each
secret becomes ``[REDACTED:<kind>]`` so the model still sees that something was there. The shapes
it finds are the rules of ``om_core.redaction.rules``; this module runs them over a text in one
span-collecting pass and writes the markers.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from functools import lru_cache

from om_core.redaction.rules import Rule, anchored, near_word_spans, rules, token_start
from om_core.redaction.values import KEYWORD_KINDS

MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")


def marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


# ------------------------------------------------------------------ redaction


_ASCII_LOWER = {c: c + 32 for c in range(65, 91)}


def _lower(text: str) -> str:
    """``text`` lower-cased with every offset kept (``str.lower`` may change the length: İ)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)



def _matches(rule: Rule, text: str, low: str) -> Iterable[tuple[re.Match[str], str]]:
    """The rule's accepted matches, each with its kind (the rule's, or the one its check names).
    A rejected match does not hide the next one inside it (``shared: TOKEN=…`` is first tried with
    the name ``shared``)."""
    subject = low if rule.lower else text

    def verdict(m: re.Match[str]) -> str | None:
        if rule.boundary and not token_start(text, m.start()):
            return None
        found = True if rule.check is None else rule.check(m, text)
        return (found if isinstance(found, str) else rule.kind) if found else None

    if rule.at_start:
        m = rule.pattern.match(subject)
        if m is not None and (kind := verdict(m)):
            yield m, kind
        return
    if rule.needles:
        for m in anchored(rule.pattern, subject, rule.needles, rule.window, low):
            if kind := verdict(m):
                yield m, kind
        return
    if rule.check is None and not rule.boundary:
        for m in rule.pattern.finditer(subject):
            yield m, rule.kind
        return
    pos = 0
    while (m := rule.pattern.search(subject, pos)) is not None:
        if kind := verdict(m):
            yield m, kind
            pos = max(m.end(), m.start() + 1)
        else:
            pos = m.start() + 1


def secret_spans(text: str) -> list[tuple[int, int, str]]:
    """Non-overlapping (start, end, kind) spans of the secrets in ``text``, in order. Where spans
    overlap, a shape's kind (``live-key``) wins over a keyword rule's guess (``token``)."""
    low = _lower(text)
    found: list[tuple[int, int, str]] = []
    for rule in rules():
        if rule.keywords and not any(k in low for k in rule.keywords):
            continue
        for m, kind in _matches(rule, text, low):
            start, end = m.span(rule.group(m) if callable(rule.group) else rule.group)
            if start < end:
                found.append((start, end, kind))
    found.extend(near_word_spans(text, low))
    if not found:
        return []
    protected = [m.span() for m in MARKER.finditer(text)] if "[REDACTED:" in text else []
    found.sort(key=lambda s: (s[0], -s[1]))
    merged: list[tuple[int, int, str]] = []
    for start, end, kind in found:
        if any(p0 <= start and end <= p1 for p0, p1 in protected):
            continue  # already a marker (redaction is idempotent)
        if merged and start < merged[-1][1]:
            s0, e0, k0 = merged[-1]
            merged[-1] = (s0, max(e0, end), kind if k0 in KEYWORD_KINDS and kind not in KEYWORD_KINDS else k0)
        else:
            merged.append((start, end, kind))
    return merged


def redact(text: str) -> str:
    """``text`` with every recognised secret replaced by a marker."""
    if not text:
        return text
    spans = secret_spans(text)
    if not spans:
        return text
    out, last = [], 0
    for start, end, kind in spans:
        out.append(text[last:start])
        out.append(marker(kind))
        last = end
    out.append(text[last:])
    return "".join(out)


@lru_cache(maxsize=65_536)
def redact_line(line: str) -> str:
    """``redact`` for short texts that recur (memory lines in every compaction summary): cached."""
    return redact(line)


# What redact_payload keeps: about this many characters of texts and their redactions, then it starts over.
PAYLOAD_MEMO_CHARS = 16_000_000
_memo: dict[str, str] = {}
_memo_chars = 0
_memo_lock = threading.Lock()


def redact_payload(text: str) -> str:
    """``redact``, once per text in this process: a part of a model's prompt that recurs from stage to
    stage (the memory block, an entry read again as context, the same input after a retry) is looked
    up, not scanned again. Exact, since redaction depends on the text alone; bounded by
    ``PAYLOAD_MEMO_CHARS`` (when full, it starts over)."""
    global _memo_chars
    found = _memo.get(text)
    if found is not None:
        return found
    found = redact(text)
    size = len(text) + (0 if found is text else len(found))
    with _memo_lock:
        if _memo_chars + size > PAYLOAD_MEMO_CHARS:
            _memo.clear()
            _memo_chars = 0
        if size <= PAYLOAD_MEMO_CHARS:
            _memo[text] = found
            _memo_chars += size
    return found
