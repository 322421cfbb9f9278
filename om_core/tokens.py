"""Token counts for source entries (SPEC §12).

Two counts are kept for every source entry:

* ``estimate_message_tokens``: Pi's own estimate, ``ceil(chars / 4)`` where chars are JavaScript
  string lengths (UTF-16 code units) of exactly the parts Pi's ``estimateTokens`` looks at
  (pi-sessions.md §2.2). The extension's thresholds were tuned on this number.
* a real tokenizer count (tiktoken ``o200k_base``) of the same text pieces, loaded offline from the
  encoding files that litellm ships.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import threading
from decimal import Decimal
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

IMAGE_CHARS = 4800  # Pi counts 1200 tokens per image for custom and toolResult messages.
DEFAULT_ENCODING = "o200k_base"

# Roles whose messages Pi's estimate understands; everything else counts 0 and is not a source.
SOURCE_ROLES = frozenset(
    {"user", "assistant", "toolResult", "bashExecution", "custom", "branchSummary", "compactionSummary"}
)


# ---------------------------------------------------------------- JavaScript string lengths


def js_len(text: str) -> int:
    """``text.length`` in JavaScript: UTF-16 code units (astral characters count 2)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) >> 1


# Characters JSON.stringify escapes: controls become \b \f \n \r \t or \u00XX; quote and backslash
# get a backslash; lone surrogates become \uDXXX (well-formed JSON.stringify, ES2019).
_JSON_ESCAPES = re.compile(r'[\x00-\x1f"\\\ud800-\udfff]')
_SHORT_ESCAPES = frozenset('"\\\b\f\n\r\t')


def _js_string_json_len(text: str) -> int:
    extra = 0
    for match in _JSON_ESCAPES.finditer(text):
        extra += 1 if match.group() in _SHORT_ESCAPES else 5
    return js_len(text) + 2 + extra


def js_number(value: float) -> str:
    """Format a float the way JavaScript's Number#toString does (shortest round-trip digits)."""
    if value != value or value in (math.inf, -math.inf):
        return "null"  # JSON.stringify turns NaN and Infinity into null
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr() gives the same shortest round-trip digits as JavaScript; only the layout differs.
    _, digit_tuple, exp = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).lstrip("0")
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    digits = stripped
    k = len(digits)
    n = k + exp  # value = 0.<digits> * 10**n
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if e >= 0 else "-") + str(abs(e))
    return sign + out


def js_json_length(value: Any) -> int:
    """``JSON.stringify(value).length`` for a value parsed from JSON (compact, raw Unicode)."""
    if value is None:
        return 4
    if value is True:
        return 4
    if value is False:
        return 5
    if isinstance(value, str):
        return _js_string_json_len(value)
    if isinstance(value, int):
        if -(2**53) < value < 2**53:
            return len(str(value))
        return len(js_number(float(value)))
    if isinstance(value, float):
        return len(js_number(value))
    if isinstance(value, list):
        return 2 + sum(js_json_length(v) for v in value) + max(0, len(value) - 1)
    if isinstance(value, dict):
        parts = [_js_string_json_len(str(k)) + 1 + js_json_length(v) for k, v in value.items()]
        return 2 + sum(parts) + max(0, len(parts) - 1)
    return len(str(value))


# ---------------------------------------------------------------- Pi's estimate


def _text(block: Any, key: str) -> str:
    value = block.get(key) if isinstance(block, dict) else None
    return value if isinstance(value, str) else ""


def estimate_message_chars(message: dict) -> int:
    """Characters Pi's ``estimateTokens`` counts for one AgentMessage (pi-sessions.md §2.2)."""
    role = message.get("role")
    content = message.get("content")
    chars = 0
    if role == "user":
        if isinstance(content, str):
            return js_len(content)
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "text":
                    chars += js_len(_text(block, "text"))
        return chars
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
        if isinstance(content, str):
            return js_len(content)
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                chars += js_len(_text(block, "text"))
            elif block.get("type") == "image":
                chars += IMAGE_CHARS
        return chars
    if role == "bashExecution":
        return js_len(_text(message, "command")) + js_len(_text(message, "output"))
    if role in ("branchSummary", "compactionSummary"):
        return js_len(_text(message, "summary"))
    return 0


def estimate_message_tokens(message: dict) -> int:
    return math.ceil(estimate_message_chars(message) / 4)


# ---------------------------------------------------------------- text for the real tokenizer


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
        import json

        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                pieces.append(_text(block, "text"))
            elif kind == "thinking":
                pieces.append(_text(block, "thinking"))
            elif kind == "toolCall":
                args = json.dumps(block.get("arguments"), ensure_ascii=False, separators=(",", ":"))
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


def litellm_tokenizer_dir() -> Path | None:
    """Where litellm keeps its bundled tiktoken files, found without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


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


def count_tokens(texts: Sequence[str], encoding: str = DEFAULT_ENCODING, threads: int = 2) -> list[int]:
    """Real token counts for many texts at once (tiktoken releases the GIL across threads)."""
    if not texts:
        return []
    enc = get_encoding(encoding)
    return [len(t) for t in enc.encode_ordinary_batch(list(texts), num_threads=threads)]


def count_text_tokens(text: str, encoding: str = DEFAULT_ENCODING) -> int:
    return len(get_encoding(encoding).encode_ordinary(text)) if text else 0


def sum_pieces(counts: Iterable[int]) -> int:
    return sum(counts)
