"""JavaScript's lengths: ``String.length`` (UTF-16 code units), ``Number#toString`` and the length of
``JSON.stringify``, which Pi's token estimate counts in characters."""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any


def js_len(text: str) -> int:
    """``text.length`` in JavaScript: UTF-16 code units (astral characters count 2)."""
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le", "surrogatepass")) >> 1


# Characters JSON.stringify escapes: controls become \b \f \n \r \t or \u00XX; quote and backslash
# get a backslash; lone surrogates become \uDXXX (well-formed JSON.stringify, ES2019).
_JSON_ESCAPES = re.compile(r'[\x00-\x1f"\\\ud800-\udfff]')
_SHORT_ESCAPES = frozenset('"\\\b\f\n\r\t')  # one extra character each
_LONG_ESCAPES = re.compile(r'[\x00-\x07\x0b\x0e-\x1f\ud800-\udfff]')  # five extra characters each


def _js_string_json_len(text: str) -> int:
    length = js_len(text) + 2
    if _JSON_ESCAPES.search(text) is None:
        return length
    short = sum(text.count(c) for c in _SHORT_ESCAPES)
    return length + short + 5 * len(_LONG_ESCAPES.findall(text))


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


def _js_scalar_json_length(value: Any) -> int:
    if value is None or value is True:
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
    return len(str(value))


def js_json_length(value: Any) -> int:
    """``JSON.stringify(value).length`` for a value parsed from JSON (compact, raw Unicode).
    Iterative: JSON.parse reads nesting deeper than Python's recursion limit."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            total += 2 + max(0, len(item) - 1)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + max(0, len(item) - 1) + sum(_js_string_json_len(str(k)) + 1 for k in item)
            stack.extend(item.values())
        else:
            total += _js_scalar_json_length(item)
    return total


_STRINGIFY_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _js_string_json(text: str) -> str:
    if _JSON_ESCAPES.search(text) is None:
        return f'"{text}"'
    return '"' + _JSON_ESCAPES.sub(lambda m: _STRINGIFY_SHORT.get(m.group()) or f"\\u{ord(m.group()):04x}", text) + '"'


def _index_key(key: str) -> int | None:
    """The number of an object key JavaScript keeps as an array index (listed first, in numeric order)."""
    if key.isdigit() and key.isascii() and (key == "0" or key[0] != "0") and int(key) < 2**32 - 1:
        return int(key)
    return None


def _js_keys(item: dict[Any, Any]) -> list[str]:
    """An object's keys in the order JavaScript enumerates them: array indices ascending, then the rest
    in insertion order (what JSON.parse then JSON.stringify gives)."""
    keys = [str(k) for k in item]
    indices = [k for k in keys if _index_key(k) is not None]
    if not indices:
        return keys
    return sorted(indices, key=_index_key) + [k for k in keys if _index_key(k) is None]


def js_stringify(value: Any) -> str:
    """``JSON.stringify(value)`` for a value parsed from JSON: compact, raw Unicode, JavaScript's number
    layout (1.0 is ``1``, 1e21 is ``1e+21``) and key order. Iterative, like ``js_json_length``."""
    parts: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            parts.append(item.text)
        elif isinstance(item, list):
            if not item:
                parts.append("[]")
                continue
            parts.append("[")
            stack.append(_Raw("]"))
            for i, element in enumerate(reversed(item)):
                stack.append(element)
                if i < len(item) - 1:
                    stack.append(_Raw(","))
        elif isinstance(item, dict):
            keys = _js_keys(item)
            if not keys:
                parts.append("{}")
                continue
            by_name = {str(k): v for k, v in item.items()}
            parts.append("{")
            stack.append(_Raw("}"))
            for i, key in enumerate(reversed(keys)):
                stack.append(by_name[key])
                stack.append(_Raw(_js_string_json(key) + ":"))
                if i < len(keys) - 1:
                    stack.append(_Raw(","))
        elif item is None:
            parts.append("null")
        elif item is True:
            parts.append("true")
        elif item is False:
            parts.append("false")
        elif isinstance(item, str):
            parts.append(_js_string_json(item))
        elif isinstance(item, int):
            parts.append(str(item) if -(2**53) < item < 2**53 else js_number(float(item)))
        elif isinstance(item, float):
            parts.append(js_number(item))
        else:
            parts.append(_js_string_json(str(item)))
    return "".join(parts)


class _Raw:
    """Text js_stringify writes as it is (brackets, commas, a key and its colon)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text
