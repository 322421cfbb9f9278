"""Secret redaction for everything that leaves the machine: model prompts and compaction summaries.

The stored session is never changed, and ``recall`` still shows the original text locally. Each
secret becomes ``[REDACTED:<kind>]`` so the model still sees that something was there.

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
the plugins' patterns run here in one span-collecting pass (see ``bench/redact.py``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")


def marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    group: int | str | Callable[[re.Match[str]], str] = 0  # the part of the match that is the secret
    keywords: tuple[str, ...] = ()  # lowercase literals; the rule runs only when one occurs (empty: always)
    check: Callable[[re.Match[str]], bool] | None = None  # a last look at the match (shape, entropy, context)


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

# where a name can start: line start, after whitespace, quotes, shell separators, or a JSON-escaped \n
_START = r"(?:(?<=^)|(?<=[\s;&|(`'\"{,])|(?<=\\n)|(?<=\\t))"
_ASSIGN = re.compile(
    _START + r"(?P<export>(?:export|set|setenv|ENV)\s+)?"
    r"(?P<name>[A-Za-z_$][A-Za-z0-9_.\-]{0,80})(?P<nq>\\?[\"']?)"
    r"(?P<sp1>[ \t]*)(?P<op>:=|=>|=|:(?!//))(?P<sp2>[ \t]*)"
    r"(?:(?P<q>\\?[\"'`])(?P<qv>[^\"'`\n\\]{1,400})(?P=q)|(?P<v>[^\s\"'`\\,;&)\]}]{1,400}))",
    re.MULTILINE)
_NAME_WORDS = ("pass", "pwd", "pw", "secret", "token", "key", "auth", "cred")


def _line_prefix(text: str, at: int) -> str:
    """What precedes ``at`` on its line (a JSON-escaped ``\\n`` ends a line too), stripped."""
    begin = max(text.rfind("\n", max(0, at - 200), at) + 1, text.rfind("\\n", max(0, at - 200), at) + 2, max(0, at - 200))
    return text[begin:at].strip()


def _assignment(m: re.Match[str]) -> bool:
    strength = secret_name(m.group("name"))
    if strength is None:
        return False
    quoted = m.group("qv") is not None
    value = m.group("qv") if quoted else m.group("v")
    # .env / shell / INI / YAML: the name starts its line (or follows `export`), the value is data
    line_start = _line_prefix(m.string, m.start("export") if m.group("export") else m.start("name")) in ("", "-", "-e",
                                                                                                         "--env")
    # pure data (anything goes): `export NAME=…`, `NAME=value` with no spaces (an env file, a shell
    # prefix); elsewhere (INI, YAML, code) a variable, attribute, call or small number is no secret
    tight = m.group("op") == "=" and not m.group("sp1") and not m.group("sp2")
    data_style = bool(m.group("export")) or (tight and (line_start or m.group("name").isupper()))
    if not plausible_value(value, data_style=data_style, quoted=quoted):
        return False
    if not quoted and m.end() < len(m.string) and m.string[m.end()] == "(":
        return False  # a call
    if strength == "key":
        return looks_random(value, 12) or (data_style and len(value) >= 12 and entropy(value) >= 3.0)
    return True


def _assignment_group(m: re.Match[str]) -> str:
    return "qv" if m.group("qv") is not None else "v"


# a word starts here; a JSON-escaped newline or tab (tool-call arguments are rendered as JSON) counts as a gap
_WB = r"(?:(?<![A-Za-z0-9_])|(?<=\\[nrt]))"
_NEAR_WORD = re.compile(r"(?i)" + _WB + r"(?:api[ _-]?keys?|keys?|tokens?|secrets?|passwords?|passwd|pwd|credentials?|"
                        r"bearer|auth(?:orization)?|access[ _-]?keys?)\b")
_CANDIDATE = re.compile(r"(?:(?<![\w+/=\-\\])|(?<=\\[nrt]))[A-Za-z0-9][A-Za-z0-9_\-+/.]{11,}[A-Za-z0-9]={0,2}")


def _near_word_spans(text: str) -> Iterable[tuple[int, int]]:
    """High-entropy tokens within a few characters after a secret-ish word."""
    for m in _NEAR_WORD.finditer(text):
        if text.rfind("[REDACTED:", max(0, m.start() - 40), m.start()) > text.rfind("]", max(0, m.start() - 40), m.start()):
            continue  # the word is part of a marker
        window_end = min(len(text), m.end() + 40)
        for c in _CANDIDATE.finditer(text, m.end(), window_end + 80):
            if c.start() > window_end:
                break
            if looks_random(c.group(), 16):
                yield c.start(), c.end()
                break


def _url_password(m: re.Match[str]) -> bool:
    pw = m.group(2)
    return not re.match(r"\d+(?:/|$)", pw) and not pw.startswith(("[REDACTED:", "$", "{", "<")) and pw != "****"


def _not_a_word(m: re.Match[str]) -> bool:
    value = m.group(m.re.groups)
    return not value.isalpha() and not value.startswith("[REDACTED")


# ------------------------------------------------------------------ rules


def _own_rules() -> list[Rule]:
    r = re.compile
    b = r"(?:(?<![A-Za-z0-9_\-])|(?<=\\[nrt]))"  # the token starts here
    e = r"(?![A-Za-z0-9_\-])"
    return [
        Rule("private-key", r(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY((?: BLOCK)?)-----.*?"
                              r"(?:-----END \1PRIVATE KEY\2-----|\Z)", re.DOTALL), keywords=("private key",)),
        Rule("private-key", r(r"PuTTY-User-Key-File-\d+:.*?(?:Private-MAC:\s*\S+|\Z)", re.DOTALL), keywords=("putty",)),
        # base64 key material without its BEGIN line (an excerpt, a `sed -n` of a key file)
        Rule("key-material", r(r"(?m)(?:^[A-Za-z0-9+/]{60,76}={0,2}[ \t]*\r?\n){3,}(?:^[A-Za-z0-9+/]{4,76}={0,2}$)?")),
        Rule("jwt", r(b + r"eyJ[A-Za-z0-9_\-]{8,}={0,2}\.eyJ[A-Za-z0-9_\-]{8,}={0,2}\.(?:[A-Za-z0-9_\-]+={0,2})?"
                                r"(?:\.[A-Za-z0-9_\-]+){0,2}"), keywords=("eyj",)),
        Rule("anthropic-key", r(b + r"sk-ant-[A-Za-z0-9_\-]{20,}"), keywords=("sk-ant-",)),
        Rule("openrouter-key", r(b + r"sk-or-(?:v1-)?[A-Za-z0-9]{20,}"), keywords=("sk-or-",)),
        Rule("openai-key", r(b + r"sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}"), keywords=("sk-",)),
        Rule("google-api-key", r(b + r"AIza[0-9A-Za-z_\-]{35}"), keywords=("aiza",)),
        Rule("google-oauth-token", r(b + r"ya29\.[0-9A-Za-z_\-]{20,}"), keywords=("ya29.",)),
        Rule("google-client-secret", r(b + r"GOCSPX-[0-9A-Za-z_\-]{20,}"), keywords=("gocspx-",)),
        Rule("aws-access-key", r(b + r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16}" + e)),
        Rule("github-token", r(b + r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})"),
             keywords=("gh", "github_pat_")),
        Rule("gitlab-token", r(b + r"gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|oas|agent)-[A-Za-z0-9_\-]{20,}"), keywords=("gl",)),
        Rule("slack-token", r(b + r"(?:xox[a-z]|xapp|xoxe\.xox[a-z])-[A-Za-z0-9\-]{10,}"), keywords=("xox", "xapp-")),
        Rule("slack-webhook", r(r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/\-]+"),
             keywords=("hooks.slack.com",)),
        Rule("discord-webhook", r(r"https://(?:\w+\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_\-]+"),
             keywords=("discord",)),
        Rule("stripe-key", r(b + r"(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}|" + b + r"whsec_[A-Za-z0-9]{20,}"),
             keywords=("_live_", "_test_", "whsec_")),
        # many SaaS keys are <prefix>_live_<random> / <prefix>_test_<random>
        Rule("live-key", r(b + r"[a-z][a-z0-9]{0,11}_(?:live|test|prod|sandbox)_[A-Za-z0-9]{12,}" + e),
             keywords=("_live_", "_test_", "_prod_", "_sandbox_")),
        Rule("huggingface-token", r(b + r"hf_[A-Za-z0-9]{30,}"), keywords=("hf_",)),
        Rule("groq-key", r(b + r"gsk_[A-Za-z0-9]{40,}"), keywords=("gsk_",)),
        Rule("replicate-token", r(b + r"r8_[A-Za-z0-9]{30,}"), keywords=("r8_",)),
        Rule("perplexity-key", r(b + r"pplx-[A-Za-z0-9]{40,}"), keywords=("pplx-",)),
        Rule("xai-key", r(b + r"xai-[A-Za-z0-9]{40,}"), keywords=("xai-",)),
        Rule("npm-token", r(b + r"npm_[A-Za-z0-9]{36}" + e), keywords=("npm_",)),
        Rule("pypi-token", r(b + r"pypi-[A-Za-z0-9_\-]{50,}"), keywords=("pypi-",)),
        Rule("mailgun-key", r(b + r"key-[0-9a-zA-Z]{32}" + e), keywords=("key-",)),
        Rule("sendgrid-key", r(b + r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}"), keywords=("sg.",)),
        Rule("shopify-token", r(b + r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}"), keywords=("shp",)),
        Rule("digitalocean-token", r(b + r"do[opr]_v1_[a-f0-9]{64}"), keywords=("_v1_",)),
        Rule("heroku-key", r(b + r"HRKU-[A-Za-z0-9_\-]{20,}"), keywords=("hrku-",)),
        Rule("linear-key", r(b + r"lin_(?:api|oauth)_[A-Za-z0-9]{32,}"), keywords=("lin_",)),
        Rule("notion-token", r(b + r"(?:secret|ntn)_[A-Za-z0-9]{40,}"), keywords=("secret_", "ntn_")),
        Rule("atlassian-token", r(b + r"ATATT3[A-Za-z0-9_\-=]{50,}"), keywords=("atatt3",)),
        Rule("databricks-token", r(b + r"dapi[a-f0-9]{32}(?:-\d)?" + e), keywords=("dapi",)),
        Rule("vault-token", r(b + r"hv[sbr]\.[A-Za-z0-9_\-]{24,}"), keywords=("hvs.", "hvb.", "hvr.")),
        Rule("doppler-token", r(b + r"dp\.(?:pt|st|sa|ct|scim|audit)\.[A-Za-z0-9]{40,}"), keywords=("dp.",)),
        Rule("postman-key", r(b + r"PMAK-[a-f0-9]{24}-[a-f0-9]{34}"), keywords=("pmak-",)),
        Rule("sentry-token", r(b + r"sntr[ysu]_[A-Za-z0-9+/=_\-]{30,}"), keywords=("sntr",)),
        Rule("grafana-token", r(b + r"gl(?:c|sa)_[A-Za-z0-9_+/=\-]{32,}"), keywords=("glc_", "glsa_")),
        Rule("newrelic-key", r(b + r"NRAK-[A-Z0-9]{27}"), keywords=("nrak-",)),
        Rule("age-secret-key", r(r"AGE-SECRET-KEY-1[0-9A-Z]{58}"), keywords=("age-secret-key-",)),
        Rule("square-token", r(b + r"sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,}"), keywords=("sq0",)),
        Rule("azure-storage-key", r(r"(?i)AccountKey=([A-Za-z0-9+/=]{40,})"), 1, keywords=("accountkey=",)),
        # scheme://user:password@host; the password may hold "/" (only "@" and whitespace end it)
        Rule("connection-password", r(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://([^\s:/@'\"<>]*):([^\s@'\"<>]+)@(?=[\w\[])"), 2,
             keywords=("://",), check=_url_password),
        Rule("query-secret", r(r"(?i)[?&;](?:access_token|refresh_token|id_token|auth_token|token|api_?key|key|"
                               r"secret|client_secret|password|passwd|pwd|sig|signature|auth)=([^&\s#'\"\\<>]{6,})"),
             1, keywords=("=",), check=_not_a_word),
        Rule("bearer-token", r(r"(?i)" + _WB + r"(?:bearer|token)\s+([A-Za-z0-9_\-.~+/]{12,}=*)"), 1,
             keywords=("bearer", "token"), check=_not_a_word),
        Rule("basic-auth", r(r"(?i)" + _WB + r"basic\s+([A-Za-z0-9+/]{12,}={0,2})"), 1, keywords=("basic",), check=_not_a_word),
        Rule("authorization-header", r(r"(?i)" + _WB + r"(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?:[A-Za-z]+\s+)?"
                                       r"([A-Za-z0-9_\-.~+/]{8,}=*)"), 1, keywords=("authorization",),
             check=_not_a_word),
        Rule("cli-secret", r(r"(?i)(?<![\w-])--?(?:password|passwd|pass|pwd|token|api[-_]?key|secret|client-secret|"
                             r"auth-token|access-token)(?:=|\s+)[\"']?([^\s\"'\\-][^\s\"'\\]{2,})"), 1,
             keywords=("--", "-p", "-t", "-s", "-a"),
             check=lambda m: plausible_value(m.group(1), data_style=True, quoted=False)),
        Rule("basic-auth", r(r"(?<![\w-])(?:-u|--user)\s+[\"']?[^\s:\"']+:([^\s\"']{3,})"), 1, keywords=("-u",)),
        # credential files
        Rule("netrc-password", r(r"(?i)" + _WB + r"machine\s+\S+\s+(?:login\s+\S+\s+)?password\s+([^\s\\]+)"), 1, keywords=("machine",)),
        Rule("netrc-password", r(r"(?im)^[ \t]*password[ \t]+(\S+)[ \t]*$"), 1, keywords=("password",)),
        Rule("pgpass-password", r(r"(?m)(?:^|(?<=\\n))[A-Za-z0-9_.\-*]+:(?:\d+|\*):[^\s:\\]+:[^\s:\\]+:([^\s\\]+)(?:$|(?=\\n))"), 1, keywords=(":",)),
        Rule("secret-assignment", _ASSIGN, _assignment_group, keywords=_NAME_WORDS, check=_assignment),
    ]


# detect-secrets regex plugins used as maintained shape lists; (module, class)
_PLUGINS = [
    ("aws", "AWSKeyDetector"), ("cloudant", "CloudantDetector"),
    ("discord", "DiscordBotTokenDetector"), ("github_token", "GitHubTokenDetector"),
    ("gitlab_token", "GitLabTokenDetector"), ("ibm_cloud_iam", "IbmCloudIamDetector"),
    ("ibm_cos_hmac", "IbmCosHmacDetector"), ("mailchimp", "MailchimpDetector"), ("npm", "NpmDetector"),
    ("openai", "OpenAIDetector"), ("pypi_token", "PypiTokenDetector"), ("sendgrid", "SendGridDetector"),
    ("slack", "SlackDetector"), ("softlayer", "SoftlayerDetector"), ("square_oauth", "SquareOAuthDetector"),
    ("stripe", "StripeDetector"), ("telegram_token", "TelegramBotTokenDetector"), ("twilio", "TwilioKeyDetector"),
    ("artifactory", "ArtifactoryDetector"),
    # AzureStorageKeyDetector's pattern takes `AccountKey=` with the key; the own azure rule keeps the name

]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _plugin_rules() -> list[Rule]:
    import importlib

    rules = []
    for module, name in _PLUGINS:
        cls = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        kind = _slug(cls.secret_type)
        for pattern in cls().denylist:
            # a pattern with a group marks the secret with its first group (the rest is context)
            rules.append(Rule(kind, pattern, 1 if pattern.groups else 0))
    return rules


@lru_cache(maxsize=1)
def rules() -> tuple[Rule, ...]:
    """Loaded on first use: importing detect-secrets takes ~0.2 s, which read paths without
    secrets to redact need not pay."""
    return tuple(_own_rules() + _plugin_rules())


# ------------------------------------------------------------------ redaction


def _matches(rule: Rule, text: str) -> Iterable[re.Match[str]]:
    """The rule's accepted matches. A rejected match does not hide the next one inside it
    (``shared: TOKEN=…`` is first tried with the name ``shared``)."""
    if rule.check is None:
        yield from rule.pattern.finditer(text)
        return
    pos = 0
    while (m := rule.pattern.search(text, pos)) is not None:
        if rule.check(m):
            yield m
            pos = max(m.end(), m.start() + 1)
        else:
            pos = m.start() + 1


def secret_spans(text: str) -> list[tuple[int, int, str]]:
    """Non-overlapping (start, end, kind) spans of the secrets in ``text``, in order."""
    low = text.lower()
    found: list[tuple[int, int, str]] = []
    for rule in rules():
        if rule.keywords and not any(k in low for k in rule.keywords):
            continue
        for m in _matches(rule, text):
            start, end = m.span(rule.group(m) if callable(rule.group) else rule.group)
            if start < end:
                found.append((start, end, rule.kind))
    for start, end in _near_word_spans(text):
        found.append((start, end, "high-entropy-token"))
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
            merged[-1] = (s0, max(e0, end), k0)
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


def redact_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with redacted text content (tool-call arguments included)."""
    out = []
    for message in messages:
        copy = dict(message)
        content = copy.get("content")
        if isinstance(content, str):
            copy["content"] = redact(content)
        elif isinstance(content, list):
            copy["content"] = [{**part, "text": redact(part["text"])} if isinstance(part, dict)
                               and isinstance(part.get("text"), str) else part for part in content]
        if copy.get("tool_calls"):
            copy["tool_calls"] = [{**call, "function": {**call["function"],
                                                        "arguments": redact(call["function"].get("arguments", ""))}}
                                  for call in copy["tool_calls"]]
        out.append(copy)
    return out
