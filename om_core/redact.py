"""Secret redaction for everything that leaves the machine (model prompts).

The stored session is never changed, and ``recall`` still shows the original text locally. Each
secret becomes ``[REDACTED:<kind>]`` so the model still sees that something was there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# Order matters: specific key shapes first, generic assignments last.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("private-key", re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
        re.DOTALL)),
    ("anthropic-key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{20,}")),
    ("openrouter-key", re.compile(r"\bsk-or-(?:v1-)?[A-Za-z0-9]{20,}")),
    ("openai-key", re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}")),
    ("google-api-key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}")),
    ("aws-access-key", re.compile(r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b")),
    ("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})")),
    ("gitlab-token", re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}")),
    ("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}")),
    ("stripe-key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}")),
    ("huggingface-token", re.compile(r"\bhf_[A-Za-z0-9]{30,}")),
    ("groq-key", re.compile(r"\bgsk_[A-Za-z0-9]{40,}")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}")),
    ("bearer-token", re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9_\-\.=+/]{16,})")),
    ("basic-auth", re.compile(r"(?i)(\bbasic\s+)([A-Za-z0-9+/]{16,}={0,2})")),
    # scheme://user:password@host: only the password goes
    ("connection-password", re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]+:)([^\s@/]+)(@)")),
    # env dumps and .env files: UPPER_CASE names that hold a secret (not a $REFERENCE)
    ("env-secret", re.compile(
        r"(?m)(^[ \t]*(?:export[ \t]+)?[A-Z][A-Z0-9_]*(?:PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|APIKEY|ACCESS_KEY|"
        r"PRIVATE_KEY|CREDENTIALS?)[A-Z0-9_]*[ \t]*=[ \t]*[\"']?)([^\s\"'$][^\s\"']{5,})")),
    # configs: "api_key": "value", password: 'value', secret = "value" (a quoted literal, not code)
    ("secret-assignment", re.compile(
        r"(?i)([\"']?\b[a-z0-9_.\-]*(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key)"
        r"[\"']?[ \t]*[:=][ \t]*[\"'])([^\s\"']{6,})(?=[\"'])")),
]

_GROUPED = {"bearer-token", "basic-auth", "connection-password", "env-secret", "secret-assignment"}


def marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def redact(text: str) -> str:
    """``text`` with every recognised secret replaced by a marker."""
    if not text:
        return text
    for kind, pattern in _PATTERNS:
        if kind in _GROUPED:
            if kind == "connection-password":
                text = pattern.sub(lambda m: m.group(1) + marker(kind) + m.group(3), text)
            else:
                text = pattern.sub(lambda m: m.group(1) + (m.group(2) if m.group(2).startswith("[REDACTED:")
                                                          else marker(kind)), text)
        else:
            text = pattern.sub(marker(kind), text)
    return text


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
