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
  credential files (``.netrc``, ``.pgpass``), passwords stated in prose (``the password is …``) and
  random-looking tokens next to secret-ish words.

The keyword and entropy rules guess; ``om_core.redaction.values`` holds their checks and
``om_core.redaction.identifiers`` what they leave alone (paths, UUIDs, commits, versions, placeholders…).
A check may name the kind (``password`` for ``DB_PASS=…``); a shape's kind wins over a guess's.

``detect-secrets``' own scanner is not used: it reports lines, not spans, and runs at ~0.05 MB/s;
the plugins' patterns run in ``om_core.redaction.redact``'s one span-collecting pass (see ``bench/perf/redact.py``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from om_core.redaction.identifiers import identifier_kind, name_like, placeholder, reference_kind
from om_core.redaction.values import (entropy, guessed_secret, looks_random, name_kind, password_like,
                                   plausible_value, secret_name, word_kind)


@dataclass(frozen=True)
class Rule:
    kind: str
    pattern: re.Pattern[str]
    group: int | str | Callable[[re.Match[str]], str] = 0  # the part of the match that is the secret
    keywords: tuple[str, ...] = ()  # lowercase literals; the rule runs only when one occurs (empty: always).
    #                                 Not for literal-led patterns: the engine's own search is as fast.
    check: Callable[[re.Match[str], str], bool | str] | None = None  # a last look at (match, original
    #                                 text); a string it returns is the kind (`password` for `DB_PASS=`)
    lower: bool = False  # the pattern is written for lower-cased text and runs on it (case-insensitive
    #                      patterns defeat the regex engine's literal search: ~30x slower)
    needles: tuple[str, ...] = ()  # the pattern is only tried (anchored) where one of these occurs
    window: tuple[int, int] | None = None  # with needles: search from needle+window[0] to needle+window[1]
    at_start: bool = False  # tried at the start of the text only (the twin of a rule led by "\n")
    boundary: bool = False  # the match must not be glued to a token before it (checked in Python: a
    #                         leading look-behind would make the engine try every position)


# ------------------------------------------------------------------ rule callbacks

# The assignment rule is anchored on the secret word (a literal-led pattern is fast to search);
# the rest of the name (`DB_` of `DB_PASS`) is read backwards in Python.
_ASSIGN = re.compile(  # on lower-cased text
    r"(?:passw(?:or)?d|passphrase|pass|pwd|pw|secret|token|api_?key|key|auth|cred(?:ential)?s?)"
    r"(?P<tail>[a-z0-9_.\-]{0,30})(?P<nq>\\?[\"']?)"
    r"(?P<sp1>[ \t]*)(?P<op>:=|=>|=|:(?!//))(?P<sp2>[ \t]*)"
    r"(?:(?P<q>\\?[\"'`])(?P<qv>[^\"'`\n\\]{1,400})(?P=q)|(?P<v>[^\s\"'`\\,;&)\]}]{1,400}(?:&(?![\w.\-]*=)[^\s\"'`\\,;&)\]}=]+)*))")
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


def _assignment(m: re.Match[str], text: str) -> bool | str:
    start = _name_start(text, m.start())
    if start is None:
        return False
    name = text[start:m.start("tail") + len(m.group("tail"))]
    strength = secret_name(name)
    if strength is None:
        return False
    quoted = m.group("qv") is not None
    value = text[slice(*m.span("qv" if quoted else "v"))]
    if quoted and m.group("q")[-1] == "`":
        if not m.group("sp2") and not m.group("nq") and start > 0 and text[start - 1] == "`":
            return False  # `NAME=` in a code span: the backtick closes it, no value follows
        if any(c.isspace() for c in value):
            return False  # a command in a code span (`pass show quayline/live`)
    before = _line_prefix(text, start)
    exported = before.split(" ")[-1] in ("export", "set", "setenv", "ENV")
    # .env / shell / INI / YAML: the name starts its line (or follows `export`), the value is data
    line_start = before in ("", "-", "-e", "--env") or exported
    # pure data (anything goes): `export NAME=…`, `NAME=value` with no spaces (an env file, a shell
    # prefix); elsewhere (INI, YAML, code) a variable, attribute, call or small number is no secret
    tight = m.group("op") == "=" and not m.group("sp1") and not m.group("sp2")
    data_style = exported or (tight and (line_start or name.isupper()))
    random = strength != "key" or looks_random(value, 12) or (data_style and len(value) >= 12 and entropy(value) >= 3.0)
    if not random or not plausible_value(value, data_style=data_style, quoted=quoted):
        return False  # (a `*_KEY` value must look random; tested first, it is the cheaper test)
    if not quoted and m.end() < len(text) and text[m.end()] == "(":
        return False  # a call
    kind = name_kind(name)
    if kind == "credential" and not quoted and name_like(value):
        return False  # `auth: oauth2`, `creds: none`: a method, not a credential
    if strength == "key" and identifier_kind(value) is not None:
        return False
    return kind


def _assignment_group(m: re.Match[str]) -> str:
    return "qv" if m.group("qv") is not None else "v"


# a secret-ish word, a short gap on the same line, an assignment (`:`, `=`, `is`, `are`, `was`), then a
# token-like run (on lower-cased text). Without the assignment a random-looking run is only near the
# word, not given as its value: `token usage 12,345 in run 3f9a2c7d1e0b4a56` names an om run, no token.
_NEAR_NEEDLES = ("key", "token", "secret", "passw", "pwd", "credential", "bearer", "auth")
_NEAR_WORD = re.compile(r"(?P<w>keys?|tokens?|secrets?|passwords?|passwd|pwd|credentials?|bearer|auth(?:orization)?)\b"
                        r"(?P<gap>[^\n]{0,40}?(?:[:=]|\b(?:is|are|was|were)\b)[ \t]*[\"'`]?)"
                        r"(?<![a-z0-9_+/=\-])([a-z0-9][a-z0-9_\-+/.]{14,}[a-z0-9]={0,2})")
# the gap ends in a word that says an id follows (`the key's commit …`, `job id is …`)
_ID_CONTEXT = re.compile(r"(?:^|\W)(?:ids?|uuid|sha\d*|md5|hash|digest|checksum|etag|commit|rev|revision|version)"
                         r"\W*(?:is|was|:|=)?\W*$")
_WORD_BOUNDS = frozenset(" \t\r\n\"'`<>(){},;|\\*")


def whole_word(text: str, start: int, end: int) -> str:
    """The whitespace-delimited word holding ``text[start:end]`` (quotes, brackets and trailing
    punctuation cut off): a path around a run the pattern found, a URL around a query value."""
    while start > 0 and text[start - 1] not in _WORD_BOUNDS and not _escape_before(text, start):
        start -= 1
    while end < len(text) and text[end] not in _WORD_BOUNDS:
        end += 1
    return text[start:end].rstrip(".,:;!?")


def near_word_spans(text: str, low: str) -> Iterable[tuple[int, int, str]]:
    """Random-looking tokens within a few characters after a secret-ish word, with the kind the word
    names; identifiers and placeholders stay (a path, a UUID, a commit, a version)."""
    done = 0
    for m in anchored(_NEAR_WORD, low, _NEAR_NEEDLES):
        if m.start() < done or not token_start(text, m.start()):
            continue
        if text.rfind("[REDACTED:", max(0, m.start() - 40), m.start()) > text.rfind("]", max(0, m.start() - 40), m.start()):
            continue  # the word is part of a marker
        start, end = m.span(3)
        glued = text[start - 1] == "\\" and not _escape_before(text, start)
        if glued or _ID_CONTEXT.search(m.group("gap")) or not guessed_secret(text[start:end]):
            continue
        word = whole_word(text, start, end)
        if identifier_kind(word) is None and not placeholder(word):
            yield start, end, word_kind(m.group("w"))
            done = end


def _url_password(m: re.Match[str], text: str) -> bool:
    pw = m.group(2)
    at = m.start()
    if at == 0 or not text[at - 1].isalnum():  # scheme://
        return False
    return not re.match(r"\d+(?:/|$)", pw) and not pw.startswith(("[REDACTED:", "$", "{", "<")) and pw != "****"


_NAME_WORDS = ("pass", "pwd", "pw", "secret", "token", "key", "auth", "cred")


def _a_value(m: re.Match[str], text: str) -> bool:
    """The rule's last group holds a value: not a word, a marker, a placeholder or a reference."""
    value = text[slice(*m.span(m.re.groups))]
    return not (value.isalpha() or value.startswith("[REDACTED") or placeholder(value)
                or reference_kind(value) is not None)


def _cli_secret(m: re.Match[str], text: str) -> bool | str:
    value = text[slice(*m.span("v"))]
    return plausible_value(value, data_style=True, quoted=False) and word_kind(m.group("flag").split("-")[-1])


def _netrc_line(m: re.Match[str], text: str) -> bool:
    """A ``password X`` line is a .netrc's only below its ``machine`` or ``login`` line."""
    before = text[max(0, m.start() - 300):m.start()].lower()
    return ("machine" in before or "login" in before) and reference_kind(text[slice(*m.span(1))]) is None


# prose: `the password for the orders db is Tr0ub4dor&3` (a token-like secret is the near-word rule's)
_PROSE_PASSWORD = re.compile(r"(?P<w>passw(?:or)?ds?|passphrases?|pwd|secrets?)\b(?P<gap>(?:[^\n.;!?:=]|\.(?=\S)){0,40}?)"
                             r"\b(?:is|was)\b[ \t]*:?[ \t]*[\"'`]?(?P<v>[^\s\"'`\\]{3,199}[^\s\"'`\\.,;:)])")


def _prose_password(m: re.Match[str], text: str) -> bool | str:
    return password_like(text[slice(*m.span("v"))]) and word_kind(m.group("w"))


# ------------------------------------------------------------------ rules


def _line_rules(kind: str, body: str, *, lower: bool = False, escaped: bool = False,
                check: Callable[[re.Match[str], str], bool] | None = None) -> list[Rule]:
    """A rule for a whole line: led by a newline (a literal the engine searches fast; ``(?m)^`` is
    tried at every position), by a JSON-escaped newline when ``escaped``, and at the text's start.
    ``body``'s first group is the secret."""
    rules = [Rule(kind, re.compile("\n" + body), 1, lower=lower, check=check),
             Rule(kind, re.compile(body), 1, lower=lower, at_start=True, check=check)]
    if escaped:
        rules.append(Rule(kind, re.compile(r"\\n" + body), 1, lower=lower, check=check))
    return rules


def _own_rules() -> list[Rule]:
    r = re.compile
    e = r"(?![A-Za-z0-9_\-])"
    pgpass = r"[A-Za-z0-9_.\-*]+:(?:\d+|\*):[^\s:\\]+:[^\s:\\]+:([^\s\\]+)"  # host:port:db:user:password
    return [
        # to its END line; without one (an excerpt) through the key lines that follow the BEGIN line
        Rule("private-key", r(r"-----BEGIN ((?:[A-Z0-9]+ )*)PRIVATE KEY((?: BLOCK)?)-----(?:.*?-----END \1PRIVATE KEY\2-----"
                              r"|(?:(?:\\[rn]|\s)+[A-Za-z\-]+: [^\n\\]*)*(?:(?:\\[rn]|\s)+[A-Za-z0-9+/=]{16,})+)",
                              re.DOTALL)),
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
             1, keywords=("=",), check=_a_value, lower=True),
        Rule("bearer-token", r(r"bearer[ \t]+([a-z0-9_\-.~+/]{12,}=*)"), 1,
             needles=("bearer",), check=_a_value, boundary=True, lower=True),
        Rule("basic-auth", r(r"basic\s+([a-z0-9+/]{12,}={0,2})"), 1, check=_a_value,
             boundary=True, lower=True),
        Rule("authorization-header", r(r"authorization[\"']?\s*[:=]\s*[\"']?(?:[a-z]+\s+)?"
                                       r"([a-z0-9_\-.~+/]{8,}=*)"), 1,
             check=_a_value, lower=True, needles=("authorization",)),
        Rule("cli-secret", r(r"--?(?P<flag>password|passwd|pass|pwd|token|api[-_]?key|secret|client-secret|"
                             r"auth-token|access-token)(?:=|\s+)[\"']?(?P<v>[^\s\"'\\-][^\s\"'\\]{2,})"), "v",
             check=_cli_secret, boundary=True, lower=True),
        Rule("basic-auth", r(r"(?:-u|--user)\s+[\"']?[^\s:\"']+:([^\s\"']{3,})"), 1, boundary=True),
        # credential files
        Rule("netrc-password", r(r"machine\s+\S+\s+(?:login\s+\S+\s+)?password\s+([^\s\\]+)"), 1,
             boundary=True, lower=True),
        *_line_rules("netrc-password", r"[ \t]*password[ \t]+([^\s\\]+)[ \t]*(?=\n|\\n|$)", lower=True,
                     check=_netrc_line),
        *_line_rules("pgpass-password", pgpass + r"(?=\n|\\n|$)", escaped=True),
        Rule("secret-assignment", _ASSIGN, _assignment_group, check=_assignment, lower=True, needles=_NAME_WORDS),
        Rule("password", _PROSE_PASSWORD, "v", check=_prose_password, lower=True, boundary=True,
             needles=("passw", "passphrase", "pwd", "secret")),
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
    """The plugins' shapes (their copy in ``provider_shapes``: importing detect-secrets costs more than a
    live compaction's work), each with the keywords or needles that gate it."""
    from om_core.redaction.provider_shapes import SHAPES

    gates = {(module, name): keywords for module, name, keywords in _PLUGINS}
    rules = []
    for module, name, secret_type, patterns in SHAPES:
        keywords = gates[(module, name)]
        kind = _slug(secret_type)
        for source, flags in patterns:
            pattern = re.compile(source, flags)
            # a pattern with a group marks the secret with its first group (the rest is context)
            if keywords and isinstance(keywords[0], tuple):
                needles, window = keywords
                rules.append(Rule(kind, pattern, 1 if pattern.groups else 0, needles=needles, window=window))
            else:
                rules.append(Rule(kind, pattern, 1 if pattern.groups else 0, keywords=keywords))
    return rules


@lru_cache(maxsize=1)
def rules() -> tuple[Rule, ...]:
    """Compiled on first use: read paths without secrets to redact need not pay it."""
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
