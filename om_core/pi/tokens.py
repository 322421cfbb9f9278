"""Token counts for source entries (SPEC §12).

Two counts are kept for every source entry:

* ``estimate_message_tokens``: Pi's own estimate, ``ceil(chars / 4)`` where chars are JavaScript
  string lengths (UTF-16 code units) of exactly the parts Pi's ``estimateTokens`` looks at
  (pi-sessions.md §2.2, lengths from ``om_core.pi.js_length``). The extension's thresholds were tuned
  on this number.
* a real tokenizer count (tiktoken ``o200k_base``) of the same text pieces, loaded offline from the
  encoding files that litellm ships.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, overload

from om_core.pi.js_length import js_json_length, js_len

IMAGE_CHARS = 4800  # Pi counts 1200 tokens per image (custom and toolResult; user messages too since 1.6)
DEFAULT_ENCODING = "o200k_base"

# Roles whose messages Pi's estimate understands; everything else counts 0 and is not a source.
SOURCE_ROLES = frozenset(
    {"user", "assistant", "toolResult", "bashExecution", "custom", "branchSummary", "compactionSummary"}
)


# ---------------------------------------------------------------- Pi's estimate


def _text(block: Any, key: str) -> str:
    value = block.get(key) if isinstance(block, dict) else None
    return value if isinstance(value, str) else ""


EstimateRules = Literal["pi-1.6", "legacy"]


def _content_chars(content: Any, images: bool) -> int:
    """A string's length, or the text lengths of text blocks (+ IMAGE_CHARS per image block)."""
    if isinstance(content, str):
        return js_len(content)
    chars = 0
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            chars += js_len(_text(block, "text"))
        elif images and block.get("type") == "image":
            chars += IMAGE_CHARS
    return chars


def system_message_chars(message: dict) -> int:
    """Pi 1.6 counts a system prompt message: its content, its section texts and the JSON of the
    tools it adds, ``toolsAdded`` (pi-sessions.md §7.2). (A section that is no string makes Pi's
    estimate NaN; it counts 0 here.)"""
    chars = _content_chars(message.get("content"), images=True)
    sections = message.get("sections")
    if isinstance(sections, dict):
        for text in sections.values():
            if isinstance(text, str):
                chars += js_len(text)
    tools = message.get("toolsAdded")
    if tools is not None and tools is not False and tools != "":  # JavaScript's truthiness ([] counts)
        chars += js_json_length(tools)
    return chars


def estimate_message_chars(message: dict, rules: EstimateRules = "pi-1.6") -> int:
    """Characters Pi's ``estimateTokens`` counts for one AgentMessage: Pi 1.6 (pi-sessions.md §7.2:
    user images count, system messages count) or the earlier Pi (``legacy``, §2.2)."""
    role = message.get("role")
    content = message.get("content")
    chars = 0
    if role == "user":
        return _content_chars(content, images=rules != "legacy")
    if role == "system":
        return system_message_chars(message) if rules != "legacy" else 0
    if role == "assistant":
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                chars += js_len(_text(block, "text"))
            elif kind == "thinking":
                chars += js_len(_text(block, "thinking"))
            elif kind == "toolCall":
                chars += js_len(_text(block, "name"))
                if "arguments" in block:  # JSON.stringify(undefined) has no length; Pi would throw
                    chars += js_json_length(block["arguments"])
        return chars
    if role in ("custom", "toolResult"):
        return _content_chars(content, images=True)
    if role == "bashExecution":
        return js_len(_text(message, "command")) + js_len(_text(message, "output"))
    if role in ("branchSummary", "compactionSummary"):
        return js_len(_text(message, "summary"))
    return 0


def estimate_message_tokens(message: dict, rules: EstimateRules = "pi-1.6") -> int:
    return math.ceil(estimate_message_chars(message, rules) / 4)


# ---------------------------------------------------------------- text for the real tokenizer

# json.dumps(value, ensure_ascii=False, separators=(",", ":")), without a new encoder for every call.
_compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def message_text_pieces(message: dict) -> list[str]:
    """The same text Pi's estimate measures, as pieces for a real tokenizer (images excluded)."""
    role = message.get("role")
    content = message.get("content")
    pieces: list[str] = []
    if role in ("user", "custom", "toolResult"):
        if isinstance(content, str):
            pieces.append(content)
        elif isinstance(content, list):
            pieces.extend(_text(b, "text") for b in content if isinstance(b, dict) and b.get("type") == "text")
    elif role == "assistant" and isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                pieces.append(_text(block, "text"))
            elif kind == "thinking":
                pieces.append(_text(block, "thinking"))
            elif kind == "toolCall":
                args = _compact_json(block.get("arguments"))
                pieces.append(_text(block, "name") + args)
    elif role == "bashExecution":
        pieces.append(_text(message, "command") + _text(message, "output"))
    elif role in ("branchSummary", "compactionSummary"):
        pieces.append(_text(message, "summary"))
    return [p for p in pieces if p]


# ---------------------------------------------------------------- tiktoken, offline

TIKTOKEN_URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}


class TokenizerUnavailable(RuntimeError):
    """The tiktoken encoding file is not on this machine (nothing is ever downloaded)."""


def litellm_package_dir() -> Path | None:
    """The installed litellm package's folder, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def litellm_tokenizer_dir() -> Path | None:
    """Where litellm keeps its bundled tiktoken files, found without importing litellm."""
    package = litellm_package_dir()
    return None if package is None else package / "litellm_core_utils" / "tokenizers"


def _tiktoken_cache_dir() -> Path:
    configured = os.environ.get("TIKTOKEN_CACHE_DIR")
    if configured:
        return Path(configured)
    bundled = litellm_tokenizer_dir()
    if bundled is None:
        raise TokenizerUnavailable("litellm is not installed, so its bundled tiktoken files are missing")
    return bundled


_encodings: dict[str, Any] = {}
_encodings_lock = threading.Lock()


def get_encoding(name: str = DEFAULT_ENCODING):
    """Load a tiktoken encoding from local files only; raise a clear error if absent."""
    with _encodings_lock:
        if name in _encodings:
            return _encodings[name]
        url = TIKTOKEN_URLS.get(name)
        if url is None:
            raise TokenizerUnavailable(f"unknown tiktoken encoding {name!r}; known: {sorted(TIKTOKEN_URLS)}")
        cache_dir = _tiktoken_cache_dir()
        cached = cache_dir / hashlib.sha1(url.encode()).hexdigest()
        if not cached.is_file():
            raise TokenizerUnavailable(f"tiktoken file for {name} not found at {cached} (downloads are disabled)")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(cache_dir)  # tiktoken reads it when loading
        import tiktoken

        _encodings[name] = tiktoken.get_encoding(name)
        return _encodings[name]


# Counting tokens without building token lists. ``encode_ordinary_batch`` turns every token into a
# Python int while holding the GIL, and takes the GIL back after every text; we only need counts.
#
# tiktoken's core encodes into a buffer of uint32 token ids with the GIL released
# (``encode_to_tiktoken_buffer``, what ``encode_to_numpy`` uses). Many texts go into one call, joined
# by ``<|endoftext|>`` with that special token allowed: the core encodes the text between allowed
# special tokens piece by piece, exactly as ``encode_ordinary`` encodes each piece on its own, and
# puts the special token's id between them, so the count of each text is the distance between two
# separator ids in the buffer. A text that contains the separator itself, or lone surrogates, is
# counted on its own (as ``encode_ordinary`` would). All this is checked against ``encode_ordinary``
# once per encoding; if anything differs, the plain path is used.

_SEPARATOR = "<|endoftext|>"
_NO_SPECIAL: frozenset[str] = frozenset()
_PROBES = [
    "Hello, world! naïve café 😀 def f(x):\n    return x  \n\n\t1234567 ünïcödé",
    "", " ", "  \n", "\n\n", "x", " tail  ", "'s", "12345", "<|endofprompt|> stays text", "a<|endoftext|>b",
    "x\ud800y", "\r\n\r\n", "end.\n", "  lead", "🙂🚀", "?!\n", "CamelCase snake_case", "",
]
CHUNK_CHARS_MIN = 16_384  # texts are handed to the worker threads in runs of about this many chars
CHUNK_CHARS_MAX = 262_144


def _scrub_surrogates(text: str) -> str:
    """What tiktoken does with text that is not valid UTF-8 (lone surrogates): replace them."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _make_counter(enc: Any) -> Callable[[Sequence[str]], list[int]]:
    """A function texts -> token counts for one encoding: joined buffer calls when they are exact."""

    def plain(texts: Sequence[str]) -> list[int]:
        return [len(enc.encode_ordinary(t)) if t else 0 for t in texts]

    encode = getattr(getattr(enc, "_core_bpe", None), "encode_to_tiktoken_buffer", None)
    if encode is None or _SEPARATOR not in enc.special_tokens_set:
        return plain
    separator = enc.encode_single_token(_SEPARATOR).to_bytes(4, sys.byteorder)  # as it sits in the buffer
    allow_separator = frozenset({_SEPARATOR})

    def one(text: str) -> int:
        try:
            return memoryview(encode(text, _NO_SPECIAL)).nbytes >> 2
        except UnicodeEncodeError:
            return memoryview(encode(_scrub_surrogates(text), _NO_SPECIAL)).nbytes >> 2

    def joined(texts: Sequence[str]) -> list[int]:
        if len(texts) < 2:
            return [one(t) for t in texts]
        text = _SEPARATOR.join(texts)
        if text.count(_SEPARATOR) != len(texts) - 1:  # some text contains the separator
            return [one(t) for t in texts]
        try:
            buffer = encode(text, allow_separator)
        except UnicodeEncodeError:  # lone surrogates somewhere
            return [one(t) for t in texts]
        data = memoryview(buffer).cast("B").tobytes()  # uint32 token ids
        find = data.find
        out = []
        start = 0
        for _ in range(len(texts) - 1):
            end = find(separator, start)
            while end & 3:  # the id's bytes must start a token, not straddle two
                end = find(separator, end + 1)
            out.append((end - start) >> 2)
            start = end + 4
        out.append((len(data) - start) >> 2)
        return out

    try:
        if joined(_PROBES) != plain(_PROBES) or [joined([p])[0] for p in _PROBES] != plain(_PROBES):
            return plain
    except Exception:  # an API that changed shape: fall back to the documented one
        return plain
    return joined


# Bounded run count (a fallback, named as one). tiktoken's pre-tokenizer makes a run of letters, of
# punctuation or of whitespace one piece, and BPE on one piece grows faster than linearly with its
# length: 20 MB of one repeated character took many times as long as 20 MB of words. Such a run
# longer than LONG_RUN_CHARS is therefore counted in pieces of RUN_PIECE_CHARS, identical pieces
# once. The count can differ from the exact one by about a token per cut (a token straddling a cut
# counts as two); everything else is counted exactly. Base64, hex or minified code are not one
# piece (digits and case changes split them), so they keep the exact, fast path.
LONG_RUN_CHARS = 1024
RUN_PIECE_CHARS = 256
_LONG_RUN = re.compile(r"[^\W\d_]{%d,}|(?:[^\w\s]|_){%d,}|\s{%d,}" % ((LONG_RUN_CHARS,) * 3))


def bounded_pieces(text: str) -> list[str] | None:
    """``text`` cut so that no piece holds more than RUN_PIECE_CHARS of a long run (letters,
    punctuation or whitespace), or None when it has none longer than LONG_RUN_CHARS (then it is
    counted whole, exactly)."""
    if len(text) <= LONG_RUN_CHARS or not _may_hold_a_long_run(text):
        return None
    pieces: list[str] = []
    last = 0
    for m in _LONG_RUN.finditer(text):
        if m.start() > last:
            pieces.append(text[last:m.start()])
        end = m.end()
        pieces.extend(text[i:min(i + RUN_PIECE_CHARS, end)] for i in range(m.start(), end, RUN_PIECE_CHARS))
        last = m.end()
    if not pieces:
        return None
    if last < len(text):
        pieces.append(text[last:])
    return pieces


def _may_hold_a_long_run(text: str) -> bool:
    """The cheap pre-check before _LONG_RUN's scan (a Python regex over the whole text, a third of an
    ingest): a run of LONG_RUN_CHARS covers a whole stretch text[p:p + LONG_RUN_CHARS // 2] at some p
    that is a multiple of it, and a stretch with a space or a newline and a non-space character lies
    inside no run (letters and punctuation hold no whitespace, a whitespace run nothing else). Prose
    and code pass every stretch with two str.find calls; what fails one is scanned."""
    width = LONG_RUN_CHARS // 2
    for p in range(0, len(text) - width + 1, width):
        if text.find(" ", p, p + width) < 0 and text.find("\n", p, p + width) < 0:
            return True
        if text[p].isspace() and text[p:p + width].isspace():
            return True
    return False


def _bounded_counter(count: Callable[[Sequence[str]], list[int]]) -> Callable[[Sequence[str]], list[int]]:
    """``count`` with long runs counted in bounded pieces (see LONG_RUN_CHARS)."""

    def bounded(texts: Sequence[str]) -> list[int]:
        cut = [bounded_pieces(t) for t in texts]
        if not any(cut):
            return count(texts)
        unique: dict[str, int] = {}
        for t, pieces in zip(texts, cut):
            for piece in pieces or (t,):
                unique.setdefault(piece, 0)
        for piece, n in zip(unique, count(list(unique))):
            unique[piece] = n
        return [sum(unique[p] for p in pieces) if pieces else unique[t] for t, pieces in zip(texts, cut)]

    return bounded


_counters: dict[str, tuple[Any, Callable[[Sequence[str]], list[int]]]] = {}


def _counter(encoding: str) -> Callable[[Sequence[str]], list[int]]:
    enc = get_encoding(encoding)  # raises if the encoding is unavailable, every time
    cached = _counters.get(encoding)
    if cached is None or cached[0] is not enc:
        cached = _counters[encoding] = (enc, _bounded_counter(_make_counter(enc)))
    return cached[1]


# Worker threads live as long as the process: tiktoken keeps per-thread regex state that warms up
# with use, so fresh threads for every call (what encode_ordinary_batch does) are slower.
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    key = (os.getpid(), threads)  # a forked child gets pools of its own
    pool = _pools.get(key)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="om-tokens")
    return pool


class TokenCounts:
    """Counts being computed on worker threads: ``result()`` waits and returns them in input order."""

    __slots__ = ("_parts",)

    def __init__(self, parts: list[Future | list[int]]) -> None:
        self._parts = parts

    def result(self) -> list[int]:
        if len(self._parts) == 1 and not isinstance(self._parts[0], Future):
            return self._parts[0]
        out: list[int] = []
        for part in self._parts:
            out.extend(part.result() if isinstance(part, Future) else part)
        self._parts = [out]
        return out


def _runs(texts: Sequence[str], total: int, threads: int) -> list[Sequence[str]]:
    """Consecutive runs of texts of roughly equal size, a few per thread, so that threads finish
    together (a thread that is done takes the next run)."""
    target = min(CHUNK_CHARS_MAX, max(CHUNK_CHARS_MIN, total // (threads * 4) + 1))
    out = []
    start = size = 0
    for i, t in enumerate(texts):
        size += len(t)
        if size >= target:
            out.append(texts[start:i + 1])
            start, size = i + 1, 0
    if start < len(texts):
        out.append(texts[start:])
    return out


@overload
def count_tokens(texts: Sequence[str], encoding: str = ..., threads: int = ..., *,
                 wait: Literal[True] = ...) -> list[int]: ...
@overload
def count_tokens(texts: Sequence[str], encoding: str = ..., threads: int = ..., *,
                 wait: Literal[False]) -> TokenCounts: ...


def count_tokens(texts: Sequence[str], encoding: str = DEFAULT_ENCODING, threads: int = 2, *,
                 wait: bool = True) -> list[int] | TokenCounts:
    """Real token counts for many texts at once, on ``threads`` worker threads (tiktoken releases
    the GIL while it encodes). ``wait=False`` returns at once with a ``TokenCounts`` to collect later,
    so a caller can go on with other work (the ingest parses the next batch meanwhile)."""
    texts = texts if isinstance(texts, list) else list(texts)
    counter = _counter(encoding)
    total = sum(map(len, texts))
    if threads <= 1 or total < CHUNK_CHARS_MIN:
        counts = counter(texts)
        return counts if wait else TokenCounts([counts])
    pool = _pool(threads)
    pending = TokenCounts([pool.submit(counter, run) for run in _runs(texts, total, threads)])
    return pending.result() if wait else pending


def count_text_tokens(text: str, encoding: str = DEFAULT_ENCODING) -> int:
    return _counter(encoding)([text])[0] if text else 0
