"""What a value and the name it is assigned to say about a secret: the checks the keyword and
entropy rules of ``om_core.redaction.rules`` make (is this value random, plausible, password-like; does
this name hold a secret, and of which kind).
"""

from __future__ import annotations

import math
import re
from collections import Counter

from om_core.redaction.identifiers import identifier_kind, name_like, placeholder, reference_kind


# ------------------------------------------------------------------ value checks


def entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


def looks_random(value: str, min_len: int = 16) -> bool:
    """A token-like run: long, mixed letters and digits, high entropy, not a path or a word chain."""
    if len(value) < min_len or value.startswith(("/", "./", "~", "http")) or "//" in value:
        return False
    digits = sum(c.isdigit() for c in value)
    letters = sum(c.isalpha() for c in value)
    if digits < 2 or letters < 2:
        return False
    if re.fullmatch(r"[a-z]+(?:[_.\-][a-z]+)*\d{0,4}", value):  # snake_case / dotted words
        return False
    return entropy(value) >= 3.0


_PLACEHOLDERS = {
    "none", "null", "nil", "true", "false", "undefined", "yes", "no", "on", "off", "empty", "required",
    "optional", "str", "string", "int", "bool", "bytes", "any", "secret", "password", "token", "xxx",
    "redacted", "hidden", "masked", "example", "placeholder", "changeit", "your", "todo", "tbd", "n/a",
}

_CODE_VALUE = re.compile(r"[A-Za-z_][A-Za-z_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*|[A-Za-z_][\w.]*[\[(].*|\d{1,7}(?:\.\d+)?")


def plausible_value(value: str, *, data_style: bool, quoted: bool) -> bool:
    """Is ``value`` (assigned to a secret-ish name) a literal secret rather than code, a placeholder
    or a reference (a path, a URL without credentials, a vault path)?"""
    v = value.strip()
    if len(v) < 3 or v.startswith(("$", "%(", "{{", "${", "<", "[REDACTED:", "***", "…", "...", "!")):
        return False
    if v.lower().strip("_-.<>*") in _PLACEHOLDERS or set(v) <= set("*x.•#-_X"):
        return False
    if quoted or data_style:
        literal = not (v.isdigit() and len(v) < 6) and (quoted or re.match(r"[A-Za-z_][\w.]*[\[(]", v) is None)
    else:  # code: variables, attribute access, calls and small numbers are not secrets
        literal = _CODE_VALUE.fullmatch(v) is None
    return literal and not placeholder(v) and reference_kind(v) is None


def guessed_secret(value: str, min_len: int = 16) -> bool:
    """A guess rule's candidate (a token near a secret-ish word, a ``*_KEY`` value) is a secret:
    it looks random and is no recognisable identifier or placeholder."""
    return looks_random(value, min_len) and not placeholder(value) and identifier_kind(value) is None


_CALL = re.compile(r"[A-Za-z_][\w.]*\(")
_CODE_SHAPED = re.compile(r"[_.]|::|\(\)|[a-z][A-Z]")


def password_like(value: str) -> bool:
    """A password as prose states it (``the password is Tr0ub4dor&3``): one run of letters with a digit
    or a symbol, not a word chain (``base64-encoded``), a code name (``hashPassword2``), an identifier
    or a placeholder."""
    v = value
    if not 6 <= len(v) <= 128 or not any(c.isalpha() for c in v) or placeholder(v) or _CALL.match(v):
        return False
    if not any(c.isdigit() or (not c.isalnum() and c not in "-_.'") for c in v):
        return False
    kind = identifier_kind(v)
    if kind is not None and (kind != "code-name" or _CODE_SHAPED.search(v)):
        return False
    return not (len(re.split(r"[_.\-]", v)) > 1 and name_like(v))


# ------------------------------------------------------------------ names


_SPLIT = re.compile(r"[_\-.]+|(?<=[a-z0-9])(?=[A-Z])")
_STRONG = {"password", "passwd", "passphrase", "pwd", "pw", "pass", "secret", "token", "apikey", "auth",
           "credential", "credentials", "creds", "privatekey", "accesskey", "secretkey", "authtoken"}
_TRAILING = {"base", "value", "b64", "base64", "hex", "raw", "plain", "str", "string", "enc", "encoded"}


_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token", "apikey")  # PGPASSWORD, GITHUBTOKEN
_WORD_KINDS = {"password": "password", "passwd": "password", "passphrase": "password", "pwd": "password",
               "pw": "password", "pass": "password", "token": "token", "authtoken": "token", "bearer": "token",
               "secret": "secret", "apikey": "api-key", "auth": "credential", "authorization": "credential",
               "credential": "credential", "credentials": "credential", "creds": "credential",
               "privatekey": "private-key", "accesskey": "key", "secretkey": "secret", "key": "key"}
KEYWORD_KINDS = frozenset(_WORD_KINDS.values()) - {"private-key"}  # what the keyword rules guess, not a shape


def word_kind(word: str) -> str:
    """The kind a secret-ish word names: ``passwords`` -> password, ``api key`` -> api-key."""
    w = word.lower().replace(" ", "").replace("_", "").replace("-", "")
    if w not in _WORD_KINDS and w.endswith("s"):
        w = w[:-1]
    if w in _WORD_KINDS:
        return _WORD_KINDS[w]
    return next((_WORD_KINDS[s] for s in _SUFFIXES if w.endswith(s)), "secret")


def name_kind(name: str) -> str:
    """The kind of secret a name holds: ``DB_PASS`` password, ``ANTHROPIC_API_KEY`` api-key,
    ``AWS_SECRET_ACCESS_KEY`` secret."""
    parts = [p.lower() for p in _SPLIT.split(name.strip("\"'`$")) if p]
    while len(parts) > 1 and parts[-1] in _TRAILING:
        parts.pop()
    if not parts or parts[-1] != "key":
        return word_kind(parts[-1] if parts else name)
    for part, kind in (("secret", "secret"), ("api", "api-key"), ("private", "private-key")):
        if part in parts:
            return kind
    return "key"


def secret_name(name: str) -> str | None:
    """'strong' for a name that holds a secret (``DB_PASS``, ``apiKey``, ``aws_secret_access_key``),
    'key' for ``*_KEY``/``KEY`` (secret only when the value looks like one), None otherwise.
    The secret word must end the name (``PASSWORD_MIN_LENGTH``, ``token_budget`` are not secrets)."""
    parts = [p.lower() for p in _SPLIT.split(name.strip("\"'`$")) if p]
    while len(parts) > 1 and parts[-1] in _TRAILING:
        parts.pop()
    if not parts:
        return None
    last = parts[-1]
    if last in _STRONG or last.endswith(_SUFFIXES):
        return "strong"
    if last == "key":
        if len(parts) > 1 and parts[-2] in {"api", "secret", "access", "private", "auth", "signing", "encryption",
                                            "master", "client", "account", "service", "license", "app", "admin"}:
            return "strong"
        return "key"
    return None
