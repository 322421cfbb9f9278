"""The secret detectors redaction runs: one ``Rule`` per secret shape, and the checks they use.

Where the shapes come from:
* provider token shapes maintained by ``detect-secrets`` (its regex plugins' ``denylist``: AWS,
  Azure storage, GitHub, GitLab, Slack, Stripe, Twilio, SendGrid, Mailchimp, npm, PyPI, Discord,
  Telegram, Square, IBM, SoftLayer, Cloudant, Artifactory, OpenAI);
* this module's own rules for what those plugins miss or only flag (they find a line, we must cut
  the exact secret out): whole private-key blocks, whole JWTs, URL credentials (passwords with
  ``/``), more providers (Anthropic, OpenAI project keys, Google, Hugging Face, Slack app tokens,
  Mailgun, npm, …), ``KEY=``/``TOKEN=``/``SECRET=``/``PASSWORD=``/``PASS=`` assignments in any case
  and syntax (env files, ``export``, INI/TOML, YAML, JSON, code literals, CLI flags, query strings),
  credential files (``.netrc``, ``.pgpass``) and high-entropy tokens next to secret-ish words.

``detect-secrets``' own scanner is not used: it reports lines, not spans, and runs at ~0.05 MB/s;
the plugins' patterns run in ``om_core.redact``'s one span-collecting pass (see ``bench/redact.py``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    group: int | str | Callable[[re.Match[str]], str] = 0  # the part of the match that is the secret
    keywords: tuple[str, ...] = ()  # lowercase literals; the rule runs only when one occurs (empty: always).
    #                                 Not for literal-led patterns: the engine's own search is as fast.
    check: Callable[[re.Match[str], str], bool] | None = None  # a last look at (match, original text)
    lower: bool = False  # the pattern is written for lower-cased text and runs on it (case-insensitive
    #                      patterns defeat the regex engine's literal search: ~30x slower)
    needles: tuple[str, ...] = ()  # the pattern is only tried (anchored) where one of these occurs
    window: tuple[int, int] | None = None  # with needles: search from needle+window[0] to needle+window[1]
    at_start: bool = False  # tried at the start of the text only (the twin of a rule led by "\n")
    boundary: bool = False  # the match must not be glued to a token before it (checked in Python: a
    #                         leading look-behind would make the engine try every position)


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
    """Is ``value`` (assigned to a secret-ish name) a literal secret rather than code or a placeholder?"""
    v = value.strip()
    if len(v) < 3 or v.startswith(("$", "%(", "{{", "${", "<", "[REDACTED:", "***", "…", "...", "!")):
        return False
    if v.lower().strip("_-.<>*") in _PLACEHOLDERS or set(v) <= set("*x.•#-_X"):
        return False
    if quoted or data_style:
        return not (v.isdigit() and len(v) < 6) and (quoted or re.match(r"[A-Za-z_][\w.]*[\[(]", v) is None)
    # code: variables, attribute access, calls and small numbers are not secrets
    return _CODE_VALUE.fullmatch(v) is None


# ------------------------------------------------------------------ names


_SPLIT = re.compile(r"[_\-.]+|(?<=[a-z0-9])(?=[A-Z])")
_STRONG = {"password", "passwd", "passphrase", "pwd", "pw", "pass", "secret", "token", "apikey", "auth",
           "credential", "credentials", "creds", "privatekey", "accesskey", "secretkey", "authtoken"}
_TRAILING = {"base", "value", "b64", "base64", "hex", "raw", "plain", "str", "string", "enc", "encoded"}


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
    if last in _STRONG:
        return "strong"
    if last == "key":
        if len(parts) > 1 and parts[-2] in {"api", "secret", "access", "private", "auth", "signing", "encryption",
                                            "master", "client", "account", "service", "license", "app", "admin"}:
            return "strong"
        return "key"
    return None


# ------------------------------------------------------------------ rule callbacks

# The assignment rule is anchored on the secret word (a literal-led pattern is fast to search);
# the rest of the name (`DB_` of `DB_PASS`) is read backwards in Python.
_ASSIGN = re.compile(  # on lower-cased text
    r"(?:passw(?:or)?d|passphrase|pass|pwd|pw|secret|token|api_?key|key|auth|cred(?:ential)?s?)"
    r"(?P<tail>[a-z0-9_.\-]{0,30})(?P<nq>\\?[\"']?)"
    r"(?P<sp1>[ \t]*)(?P<op>:=|=>|=|:(?!//))(?P<sp2>[ \t]*)"
    r"(?:(?P<q>\\?[\"'`])(?P<qv>[^\"'`\n\\]{1,400})(?P=q)|(?P<v>[^\s\"'`\\,;&)\]}]{1,400}))")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-$")
_NAME_STARTS = frozenset(" \t\r\n;&|(`'\"{,")


def _escape_before(text: str, at: int) -> bool:
    """A JSON escape (``\n``, ``\t``, ``\r``) ends right before ``at``."""
    return at >= 2 and text[at - 2] == "\\" and text[at - 1] in "ntr"


def token_start(text: str, at: int) -> bool:
    """Nothing token-like is glued to the front of ``at`` (a JSON escape counts as a gap)."""
    return at == 0 or not (text[at - 1].isalnum() or text[at - 1] in "_-") or _escape_before(text, at)


def _name_start(text: str, at: int) -> int | None:
    """Where the name holding ``at`` starts, or None when it is glued to something else."""
    i = at
    while i > 0 and at - i < 80 and text[i - 1] in _NAME_CHARS and not _escape_before(text, i):
        i -= 1
    if i == 0 or text[i - 1] in _NAME_STARTS or _escape_before(text, i):
        return i
    return None


def _line_prefix(text: str, at: int) -> str:
    """What precedes ``at`` on its line (a JSON-escaped ``\\n`` ends a line too), stripped."""
    begin = max(text.rfind("\n", max(0, at - 200), at) + 1, text.rfind("\\n", max(0, at - 200), at) + 2, max(0, at - 200))
    return text[begin:at].strip()


def _assignment(m: re.Match[str], text: str) -> bool:
    start = _name_start(text, m.start())
    if start is None:
        return False
    name = text[start:m.start("tail") + len(m.group("tail"))]
    strength = secret_name(name)
    if strength is None:
        return False
    quoted = m.group("qv") is not None
    value = text[slice(*m.span("qv" if quoted else "v"))]
    before = _line_prefix(text, start)
    exported = before.split(" ")[-1] in ("export", "set", "setenv", "ENV")
    # .env / shell / INI / YAML: the name starts its line (or follows `export`), the value is data
    line_start = before in ("", "-", "-e", "--env") or exported
    # pure data (anything goes): `export NAME=…`, `NAME=value` with no spaces (an env file, a shell
    # prefix); elsewhere (INI, YAML, code) a variable, attribute, call or small number is no secret
    tight = m.group("op") == "=" and not m.group("sp1") and not m.group("sp2")
    data_style = exported or (tight and (line_start or name.isupper()))
    if not plausible_value(value, data_style=data_style, quoted=quoted):
        return False
    if not quoted and m.end() < len(text) and text[m.end()] == "(":
        return False  # a call
    if strength == "key":
        return looks_random(value, 12) or (data_style and len(value) >= 12 and entropy(value) >= 3.0)
    return True


def _assignment_group(m: re.Match[str]) -> str:
    return "qv" if m.group("qv") is not None else "v"


# a secret-ish word, a short gap on the same line, then a token-like run (on lower-cased text)
_NEAR_NEEDLES = ("key", "token", "secret", "passw", "pwd", "credential", "bearer", "auth")
_NEAR_WORD = re.compile(r"(?:keys?|tokens?|secrets?|passwords?|passwd|pwd|credentials?|bearer|auth(?:orization)?)\b"
                        r"[^\n]{0,40}?(?<![a-z0-9_+/=\-])([a-z0-9][a-z0-9_\-+/.]{14,}[a-z0-9]={0,2})")


def near_word_spans(text: str, low: str) -> Iterable[tuple[int, int]]:
    """High-entropy tokens within a few characters after a secret-ish word."""
    done = 0
    for m in anchored(_NEAR_WORD, low, _NEAR_NEEDLES):
        if m.start() < done or not token_start(text, m.start()):
            continue
        if text.rfind("[REDACTED:", max(0, m.start() - 40), m.start()) > text.rfind("]", max(0, m.start() - 40), m.start()):
            continue  # the word is part of a marker
        start, end = m.span(1)
        glued = text[start - 1] == "\\" and not _escape_before(text, start)
        if not glued and looks_random(text[start:end], 16):
            yield start, end
            done = end


def _url_password(m: re.Match[str], text: str) -> bool:
    pw = m.group(2)
    at = m.start()
    if at == 0 or not text[at - 1].isalnum():  # scheme://
        return False
    return not re.match(r"\d+(?:/|$)", pw) and not pw.startswith(("[REDACTED:", "$", "{", "<")) and pw != "****"


_NAME_WORDS = ("pass", "pwd", "pw", "secret", "token", "key", "auth", "cred")


def _not_a_word(m: re.Match[str], text: str) -> bool:
    value = text[slice(*m.span(m.re.groups))]
    return not value.isalpha() and not value.startswith("[REDACTED")


# ------------------------------------------------------------------ rules


def _line_rules(kind: str, body: str, *, lower: bool = False, escaped: bool = False) -> list[Rule]:
    """A rule for a whole line: led by a newline (a literal the engine searches fast; ``(?m)^`` is
    tried at every position), by a JSON-escaped newline when ``escaped``, and at the text's start.
    ``body``'s first group is the secret."""
    rules = [Rule(kind, re.compile("\n" + body), 1, lower=lower), Rule(kind, re.compile(body), 1, lower=lower, at_start=True)]
    if escaped:
        rules.append(Rule(kind, re.compile(r"\\n" + body), 1, lower=lower))
    return rules


def _own_rules() -> list[Rule]:
    r = re.compile
    e = r"(?![A-Za-z0-9_\-])"
    pgpass = r"[A-Za-z0-9_.\-*]+:(?:\d+|\*):[^\s:\\]+:[^\s:\\]+:([^\s\\]+)"  # host:port:db:user:password
    return [
        Rule("private-key", r(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY((?: BLOCK)?)-----.*?"
                              r"(?:-----END \1PRIVATE KEY\2-----|\Z)", re.DOTALL)),
        Rule("private-key", r(r"PuTTY-User-Key-File-\d+:.*?(?:Private-MAC:\s*\S+|\Z)", re.DOTALL)),
        # base64 key material without its BEGIN line (an excerpt, a `sed -n` of a key file)
        *_line_rules("key-material", r"((?:[A-Za-z0-9+/]{60,76}={0,2}[ \t]*\r?\n){3,}(?:[A-Za-z0-9+/]{4,76}={0,2}(?=\n|$))?)"),
        Rule("jwt", r(r"eyJ[A-Za-z0-9_\-]{8,}={0,2}\.eyJ[A-Za-z0-9_\-]{8,}={0,2}\.(?:[A-Za-z0-9_\-]+={0,2})?"
                                r"(?:\.[A-Za-z0-9_\-]+){0,2}"), boundary=True),
        Rule("anthropic-key", r(r"sk-ant-[A-Za-z0-9_\-]{20,}"), boundary=True),
        Rule("openrouter-key", r(r"sk-or-(?:v1-)?[A-Za-z0-9]{20,}"), boundary=True),
        Rule("openai-key", r(r"sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}"), boundary=True),
        Rule("google-api-key", r(r"AIza[0-9A-Za-z_\-]{35}"), boundary=True),
        Rule("google-oauth-token", r(r"ya29\.[0-9A-Za-z_\-]{20,}"), boundary=True),
        Rule("google-client-secret", r(r"GOCSPX-[0-9A-Za-z_\-]{20,}"), boundary=True),
        Rule("aws-access-key", r(r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16}" + e), boundary=True),
        Rule("github-token", r(r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})"), boundary=True),
        Rule("gitlab-token", r(r"gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|oas|agent)-[A-Za-z0-9_\-]{20,}"), boundary=True),
        Rule("slack-token", r(r"(?:xox[a-z]|xapp|xoxe\.xox[a-z])-[A-Za-z0-9\-]{10,}"), boundary=True),
        Rule("slack-webhook", r(r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/\-]+")),
        Rule("discord-webhook", r(r"https://(?:\w+\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]+")),
        Rule("stripe-key", r(r"whsec_[A-Za-z0-9]{20,}"), boundary=True),
        # many SaaS keys are <prefix>_live_<random> / <prefix>_test_<random>
        Rule("live-key", r(r"[a-z][a-z0-9]{0,11}_(?:live|test|prod|sandbox)_[A-Za-z0-9]{12,}" + e),
             needles=("_live_", "_test_", "_prod_", "_sandbox_"), window=(-12, 1000), boundary=True),
        Rule("huggingface-token", r(r"hf_[A-Za-z0-9]{30,}"), boundary=True),
        Rule("groq-key", r(r"gsk_[A-Za-z0-9]{40,}"), boundary=True),
        Rule("replicate-token", r(r"r8_[A-Za-z0-9]{30,}"), boundary=True),
        Rule("perplexity-key", r(r"pplx-[A-Za-z0-9]{40,}"), boundary=True),
        Rule("xai-key", r(r"xai-[A-Za-z0-9]{40,}"), boundary=True),
        Rule("npm-token", r(r"npm_[A-Za-z0-9]{36}" + e), boundary=True),
        Rule("pypi-token", r(r"pypi-[A-Za-z0-9_\-]{50,}"), boundary=True),
        Rule("mailgun-key", r(r"key-[0-9a-zA-Z]{32}" + e), boundary=True),
        Rule("sendgrid-key", r(r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"), boundary=True),
        Rule("shopify-token", r(r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"), boundary=True),
        Rule("digitalocean-token", r(r"do[opr]_v1_[a-f0-9]{64}"), boundary=True),
        Rule("heroku-key", r(r"HRKU-[A-Za-z0-9_\-]{20,}"), boundary=True),
        Rule("linear-key", r(r"lin_(?:api|oauth)_[A-Za-z0-9]{32,}"), boundary=True),
        Rule("notion-token", r(r"(?:secret|ntn)_[A-Za-z0-9]{40,}"), needles=("secret_", "ntn_"), window=(0, 400),
             boundary=True),
        Rule("atlassian-token", r(r"ATATT3[A-Za-z0-9_\-=]{50,}"), boundary=True),
        Rule("databricks-token", r(r"dapi[a-f0-9]{32}(?:-\d)?" + e), boundary=True),
        Rule("vault-token", r(r"hv[sbr]\.[A-Za-z0-9_\-]{24,}"), boundary=True),
        Rule("doppler-token", r(r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,}"), boundary=True),
        Rule("postman-key", r(r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"), boundary=True),
        Rule("sentry-token", r(r"sntr[ysu]_[A-Za-z0-9+/=_\-]{30,}"), boundary=True),
        Rule("grafana-token", r(r"gl(?:c|sa)_[A-Za-z0-9_+/=\-]{32,}"), boundary=True),
        Rule("newrelic-key", r(r"NRAK-[A-Z0-9]{27}"), boundary=True),
        Rule("age-secret-key", r(r"AGE-SECRET-KEY-1[0-9A-Z]{58}")),
        Rule("square-token", r(r"sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,}"), boundary=True),
        Rule("azure-storage-key", r(r"AccountKey=([A-Za-z0-9+/=]{40,})"), 1),
        # scheme://user:password@host; the password may hold "/" (only "@" and whitespace end it)
        Rule("connection-password", r(r"://([^\s:/@'\"<>]*):([^\s@'\"<>]+)@(?=[\w\[])"), 2, check=_url_password),
        Rule("query-secret", r(r"[?&;](?:access_token|refresh_token|id_token|auth_token|token|api_?key|key|"
                               r"secret|client_secret|password|passwd|pwd|sig|signature|auth)=([^&\s#'\"\\<>]{6,})"),
             1, keywords=("=",), check=_not_a_word, lower=True),
        Rule("bearer-token", r(r"(?:bearer|token)\s+([a-z0-9_\-.~+/]{12,}=*)"), 1,
             needles=("bearer", "token"), check=_not_a_word, boundary=True, lower=True),
        Rule("basic-auth", r(r"basic\s+([a-z0-9+/]{12,}={0,2})"), 1, check=_not_a_word,
             boundary=True, lower=True),
        Rule("authorization-header", r(r"authorization[\"']?\s*[:=]\s*[\"']?(?:[a-z]+\s+)?"
                                       r"([a-z0-9_\-.~+/]{8,}=*)"), 1,
             check=_not_a_word, lower=True, needles=("authorization",)),
        Rule("cli-secret", r(r"--?(?:password|passwd|pass|pwd|token|api[-_]?key|secret|client-secret|"
                             r"auth-token|access-token)(?:=|\s+)[\"']?([^\s\"'\\-][^\s\"'\\]{2,})"), 1,
             check=lambda m, text: plausible_value(text[slice(*m.span(1))], data_style=True, quoted=False),
             boundary=True, lower=True),
        Rule("basic-auth", r(r"(?:-u|--user)\s+[\"']?[^\s:\"']+:([^\s\"']{3,})"), 1, boundary=True),
        # credential files
        Rule("netrc-password", r(r"machine\s+\S+\s+(?:login\s+\S+\s+)?password\s+([^\s\\]+)"), 1,
             boundary=True, lower=True),
        *_line_rules("netrc-password", r"[ \t]*password[ \t]+([^\s\\]+)[ \t]*(?=\n|\\n|$)", lower=True),
        *_line_rules("pgpass-password", pgpass + r"(?=\n|\\n|$)", escaped=True),
        Rule("secret-assignment", _ASSIGN, _assignment_group, check=_assignment, lower=True, needles=_NAME_WORDS),
    ]


# detect-secrets regex plugins used as maintained shape lists: (module, class, keywords that gate
# them, or (needles, window): tried only in a window around each needle).
# Left out: Artifactory (its `AP…` shape matches plain upper-case words, and both patterns start
# with an alternation the engine tries everywhere), IBM Cloud IAM, IBM COS HMAC, Cloudant and SoftLayer (keyword-assignment shapes the own
# assignment rule covers; their leading look-behinds make the engine try every position, ~8 MB/s
# each), Azure storage (its pattern takes the `AccountKey=` name along; the own rule keeps it),
# private keys and JWTs (they flag a line or a prefix; the own rules cut out the whole secret),
# basic auth (its password may not hold "/"), public IPs and the entropy/keyword scanners.
_PLUGINS: list[tuple[str, str, tuple[str, ...] | tuple[tuple[str, ...], tuple[int, int]]]] = [
    ("aws", "AWSKeyDetector", (("aws", "akia", "asia", "abia", "acca", "a3t"), (0, 200))),
    ("discord", "DiscordBotTokenDetector", ("discord",)),  # [MNO]… is tried everywhere: ~30 MB/s alone
    ("github_token", "GitHubTokenDetector", ()),
    ("gitlab_token", "GitLabTokenDetector", ()),
    ("mailchimp", "MailchimpDetector", (("-us",), (-32, 6))),  # needles and window: [0-9a-z]{32}-us…
    ("npm", "NpmDetector", ("_authtoken",)),
    ("openai", "OpenAIDetector", ()),
    ("pypi_token", "PypiTokenDetector", ()),
    ("sendgrid", "SendGridDetector", ()),
    ("slack", "SlackDetector", (("xox", "https://hooks.slack"), (0, 400))),
    ("square_oauth", "SquareOAuthDetector", ()),
    ("stripe", "StripeDetector", (("k_live_",), (-1, 40))),
    ("telegram_token", "TelegramBotTokenDetector", ((":",), (-10, 37))),  # \d{8,10}:…{35}
    ("twilio", "TwilioKeyDetector", ()),
]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _plugin_rules() -> list[Rule]:
    import importlib

    rules = []
    for module, name, keywords in _PLUGINS:
        cls = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        kind = _slug(cls.secret_type)
        for pattern in cls().denylist:
            # a pattern with a group marks the secret with its first group (the rest is context)
            if keywords and isinstance(keywords[0], tuple):
                needles, window = keywords
                rules.append(Rule(kind, pattern, 1 if pattern.groups else 0, needles=needles, window=window))
            else:
                rules.append(Rule(kind, pattern, 1 if pattern.groups else 0, keywords=keywords))
    return rules


@lru_cache(maxsize=1)
def rules() -> tuple[Rule, ...]:
    """Loaded on first use: importing detect-secrets takes ~0.2 s, which read paths without
    secrets to redact need not pay."""
    return tuple(_own_rules() + _plugin_rules())


# ------------------------------------------------------------------ searching near needles


def anchored(pattern: re.Pattern[str], text: str, needles: tuple[str, ...],
              window: tuple[int, int] | None = None, low: str | None = None) -> Iterable[re.Match[str]]:
    """Matches of ``pattern`` tried only where a needle (lower-case) starts in ``low`` (``str.find``
    is fast), in order: anchored there, or searched in a small window around it."""
    starts = set()
    low = text if low is None else low
    for needle in needles:
        at = low.find(needle)
        while at >= 0:
            starts.add(at)
            at = low.find(needle, at + 1)
    done = -1
    for at in sorted(starts):
        if window is None:
            m = pattern.match(text, at)
        else:
            m = pattern.search(text, max(0, at + window[0], done), min(len(text), at + window[1]))
        if m is not None:
            done = m.end()
            yield m
