"""What is recognisably not a secret: the identifiers memory exists to keep, and placeholders.

Redaction's keyword and entropy rules guess; before a guess removes a value, it asks these checks
whether the value has the shape of something else (the kind of filter detect-secrets' keyword
plugin and gitleaks' allowlists apply). Three families:

* ``placeholder``: templated, elided or example values (``${TOKEN}``, ``<your-token>``, ``sk-...``,
  ``test-token``, a bare prefix like ``qk_live_``). Never a secret, whatever the context.
* ``reference_kind``: values that point at something (paths with a separator, ``file:line``,
  URLs without credentials, vault and secret-manager paths, ARNs, algorithm-tagged digests). Not a secret even when assigned to a secret's
  name (``PWD=/home/dev``, ``"auth": "tests/fixtures/auth.json"``).
* ``identifier_kind``: those plus what reads as an id in prose: UUIDs, hex of git length,
  versions, file names, test ids, regexes, provider call/run ids, code and table names, word chains. Assigned to a secret's name a UUID or a hex string may be the secret (Consul tokens are
  UUIDs, Twilio's are hex), so assignments only skip references.

Every check is on one whitespace-free value: callers cut the value out first.
"""

from __future__ import annotations

import re

# one piece of a name: a word (lower, UPPER, Capitalised or camelCase humps of 2+ lower-case
# letters, which random mixed case rarely forms) with a few digits, a number, or i18n/k8s
_WORD = r"(?:[a-z]+|[A-Z][a-z]+|[A-Z]+)(?:[A-Z][a-z]{2,})*"
_PIECE = re.compile(rf"(?:{_WORD}\d{{0,5}}|\d+[a-z]{{0,3}}|[a-z]{{1,2}}\d{{1,3}}[a-z]{{1,2}})?")
_SEPARATORS = re.compile(r"[_.\-@+]")


def name_like(value: str) -> bool:
    """``value`` is a chain of word-like pieces (``site-packages``, ``0042_users``, ``python3.12``,
    ``getAccessToken``), not a random run (pieces like ``K7mDeNg`` or ``4f9a2c7e1b``)."""
    return bool(value) and any(c.isalnum() for c in value) and all(
        _PIECE.fullmatch(piece) for piece in _SEPARATORS.split(value))


# ------------------------------------------------------------------ placeholders

_PLACEHOLDER_WORDS = {"your", "yours", "test", "testing", "fake", "dummy", "example", "sample", "mock", "placeholder",
                      "changeme", "change", "replace", "here", "redacted", "real", "insert", "enter", "xxx", "foo",
                      "bar", "baz", "todo", "tbd"}
_TEMPLATE = re.compile(r"\$\{.*\}|\{\{.*\}\}|\{[\w.\- ]*\}|<[^<>]*>|%[A-Za-z_]\w*%|\$\(.*\)|\$[A-Za-z_]\w*")


def placeholder(value: str) -> bool:
    """A templated, elided, masked or example value, or a bare prefix (``sk-``, ``qk_live_``)."""
    v = value.strip("\"'`")
    if not v or _TEMPLATE.fullmatch(v):
        return True
    if "..." in v or "…" in v or "***" in v or "xxxx" in v.lower() or set(v) <= set("*x.•#-_X"):
        return True
    if v[-1] in "_-":
        return True  # a prefix, not a whole token
    words = [w for w in re.split(r"[_\-. ]+", v.lower()) if w]
    # a value made of words only, one of which says it is an example (`test-token`, `your_api_key_here`)
    return all(w.isalpha() for w in words) and any(w in _PLACEHOLDER_WORDS for w in words)


# ------------------------------------------------------------------ references

_URL = re.compile(r"[a-z][a-z0-9+.\-]*://[^\s]*", re.I)
_SCP = re.compile(r"[\w.\-]+@[\w.\-]+\.[a-z]{2,}:[\w./\-~]+")
_URL_CREDENTIALS = re.compile(r"://[^/@\s]*:[^/@\s]*@")
_ARN = re.compile(r"arn:aws[\w\-]*:[\w\-]+:[\w\-]*:\d*:\S+")
_SECRET_REF = re.compile(r"(?:vault|ssm|secretsmanager|sm|gcpsm|azurekv|keyvault):\S+", re.I)
_LOCATION = re.compile(r"(?P<path>.+?)(?::\d+(?::\d+)?|::\S*|#L\d+(?:-L?\d+)?)?")  # file:line, test ids
_FILE = re.compile(r"\.?[\w.@+\-]*[A-Za-z0-9_]\.[A-Za-z][A-Za-z0-9]{0,5}|\.[A-Za-z][\w.\-]*")  # name.ext, .env
_SEGMENT = re.compile(r"[\w.@+\-%,=]+")


def _path_kind(value: str) -> str | None:
    """'path' for a path with a separator, 'file' for a file name; either may end in :line or ::test.
    A path's first and last segments must read as names (a base64 secret holds "/" too)."""
    m = _LOCATION.fullmatch(value)
    path = m.group("path") if m else value
    if "/" not in path:
        return "file" if _FILE.fullmatch(path) and name_like(path.lstrip("._")) else None
    absolute = path.startswith(("/", "./", "../", "~/"))
    segments = [s for s in path.split("/") if s not in ("", ".", "..", "~")]
    if not segments or not all(_SEGMENT.fullmatch(s) for s in segments):
        return None
    if not all(_FILE.fullmatch(s) or name_like(s.lstrip(".")) for s in (segments[0], segments[-1])):
        return None
    if absolute or _FILE.fullmatch(segments[-1]) or all(name_like(s) for s in segments):
        return "path"
    return None


def reference_kind(value: str) -> str | None:
    """What ``value`` points at, when it is a reference rather than a value: 'url', 'arn',
    'secret-reference' or 'path'."""
    if _URL.fullmatch(value):
        return None if _URL_CREDENTIALS.search(value) else "url"
    if _SCP.fullmatch(value):
        return "url"  # git@github.com:org/repo.git
    if _ARN.fullmatch(value):
        return "arn"
    if _SECRET_REF.fullmatch(value):
        return "secret-reference"
    if _DIGEST.fullmatch(value):
        return "digest"
    kind = _path_kind(value)
    if kind == "file" and _LOCATION.fullmatch(value).group("path") != value:
        return "path"  # config.py:9 is a location; a bare name.ext may be a password
    return "path" if kind == "path" else None


# ------------------------------------------------------------------ identifiers

_UUID = re.compile(r"(?:[a-z]+[-_:])?\{?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\}?", re.I)
_HEX = re.compile(r"(?:[a-z]+[-_:])?(?:[0-9a-f]+|[0-9A-F]+)")
_GIT_LENGTHS = {*range(7, 13), 40, 64}  # abbreviated and full SHA-1 / SHA-256 object ids
_DIGEST = re.compile(r"(?:[\w.\-/:]+@)?(?:sha(?:1|224|256|384|512)|sha3-\d+|md5|blake2[bs]?|blake3|crc32c?)"
                     r"[:\-=][A-Za-z0-9+/=_\-]{8,}", re.I)
_VERSION = re.compile(r"(?:@?[\w.\-/]+(?:==|>=|<=|~=|@))?v?\d+(?:\.\d+){1,3}(?:[-+.~][0-9A-Za-z][0-9A-Za-z.\-+~]*)?")
_CALL_ID = re.compile(r"(?:toolu_(?:bdrk_|vrtx_)?|call_|chatcmpl-|msg_|req_|resp_|run_|fc_|file-|batch_|asst_|"
                      r"thread_|job_|task_)[A-Za-z0-9]{8,}")
_CODE_NAME = re.compile(r"[A-Za-z_$][\w$]*(?:(?:\.|::|:)[A-Za-z_$][\w$]*)*(?:\(\))?")
_REGEX = re.compile(r"\\[dwsbDWSB.]|\[[^\]]+\]|\(\?[:=!<P]|\{\d+(?:,\d*)?\}|\.[*+]|^\^|[^\\]\$$")


def _hex_id(value: str) -> bool:
    m = _HEX.fullmatch(value)
    if m is None:
        return False
    digits = value.rsplit("-", 1)[-1].rsplit("_", 1)[-1].rsplit(":", 1)[-1]
    return len(digits) in _GIT_LENGTHS and any(c.isdigit() for c in digits)


def _regex(value: str) -> bool:
    if _REGEX.search(value) is None:
        return False
    try:
        re.compile(value)
    except (re.error, RecursionError):
        return False
    return True


def identifier_kind(value: str) -> str | None:
    """The kind of identifier ``value`` recognisably is (a reference, 'uuid', 'git-sha', 'digest',
    'version', 'file', 'call-id', 'regex', 'code-name'), or None."""
    kind = reference_kind(value)
    if kind is not None:
        return kind
    if _UUID.fullmatch(value):
        return "uuid"
    if _hex_id(value):
        return "git-sha"
    if _VERSION.fullmatch(value):
        return "version"
    if _CALL_ID.fullmatch(value):
        return "call-id"
    if _path_kind(value) is not None:
        return "file"
    if _CODE_NAME.fullmatch(value) and all(name_like(p) for p in re.split(r"\.|::|:|\(\)", value) if p):
        return "code-name"
    if _regex(value):
        return "regex"
    if len(_SEPARATORS.split(value)) > 1 and name_like(value):
        return "name"  # a chain of words and numbers: run-20260115-140102, user_secrets_2026_01
    return None
