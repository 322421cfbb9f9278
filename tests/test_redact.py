"""Secret redaction (issue 4, item 4): every common secret shape becomes a marker in what leaves the
machine, ordinary text and code are left alone, the stored session is untouched, and recall still
shows the original locally. The end-to-end tests read what the fake model server actually received.

The fake secrets are assembled from pieces so that no complete key-shaped literal sits in the source.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from builders import SessionBuilder
from fake_openai import FakeOpenAI, text, tool_call
from om_core import db as dbmod
from om_core.ingest import ingest
from om_core.model import RetryPolicy
from om_core.recall import recall
from om_core.redact import redact, redact_messages
from om_core.settings import Settings
from om_core.workspace import Workspace
from om_core.workers.stages import ModelConfig, observe_now, reflect_now

SID = "5ec7e700-0000-4000-8000-000000000001"

PEM_BODY = ("b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW",
            "QyNTUxOQAAACBkZXZlbG9wZXJrZXlmb3J0ZXN0aW5nb25seTEyMzQ1Njc4OQAAAJg")
RSA_BODY = "MIIEpAIBAAKCAQEA1xKz7fakefakefakefakefakeQ9wIDAQABAoIBAQCfakefake"

# (kind, text as it would appear, the secret part that must not leave the machine)
SECRETS: list[tuple[str, str, str]] = [
    ("openai", "my key is {s} ok", "sk-" + "Abc123Def456Ghi789Jkl012Mno345Pqr678Stu901Vwx"),
    ("openai-project", "export KEY={s}", "sk-" + "proj-" + "Zx9_Yw8-Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe9Dc8Ba7Zy6Xw5"),
    ("anthropic", "anthropic: {s}", "sk-" + "ant-api03-" + "Q1w2E3r4T5y6U7i8O9p0A1s2D3f4G5h6J7k8L9z0X1c2V3b4N5m6-Qw_Er"),
    ("openrouter", "router key {s} here", "sk-" + "or-v1-" + "0123456789abcdef" * 4),
    ("google", "maps key={s}&v=3", "AI" + "za" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q"),
    ("aws", "aws_access_key_id {s}", "AK" + "IA" + "Z7XK4M2P9Q3R5T8V"),
    ("github-classic", "git clone https://{s}@github.com/org/repo", "gh" + "p_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"),
    ("github-fine-grained", "GH token {s}", "github" + "_pat_" + "11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJ"),
    ("slack", "slack bot {s}", "xo" + "xb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"),
    ("stripe", "charge with {s}", "sk" + "_live_" + "51HxYzAbCdEfGhIjKlMnOpQr"),
    ("huggingface", "HF {s}", "h" + "f_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"),
    ("jwt", "cookie session={s}; path=/",
     "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
     + ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    ("bearer", "curl -H 'Authorization: Bearer {s}' https://api.example.com", "opaque-Token.value_1234567890abcdef"),
    ("pem-openssh", "key file:\n-----BEGIN OPENSSH PRIVATE KEY-----\n{s}\n-----END OPENSSH PRIVATE KEY-----\nend",
     "\n".join(PEM_BODY)),
    ("pem-rsa", "-----BEGIN RSA PRIVATE KEY-----\n{s}\n-----END RSA PRIVATE KEY-----", RSA_BODY),
    ("postgres-password", "DATABASE_URL is postgres://orders_app:{s}@db.internal.example.com:5432/orders",
     "Tr0ub4dor-and-3"),
    ("env-database-password", "DATABASE_PASSWORD={s}", "correct-horse-battery"),
    ("env-openai-api-key", "OPENAI_API_KEY={s}", "9f8e7d6c5b4a3928170615"),
    ("env-aws-secret", "AWS_SECRET_ACCESS_KEY={s}", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
]


def fill(template: str, secret: str) -> str:
    return template.replace("{s}", secret)


def secret_parts(secret: str) -> list[str]:
    """The pieces of a secret that must not appear (each line of a multi-line one)."""
    return [p for p in secret.split("\n") if p]


@pytest.mark.parametrize("kind, template, secret", SECRETS, ids=[s[0] for s in SECRETS])
def test_each_secret_kind_becomes_a_marker(kind, template, secret):
    original = fill(template, secret)
    out = redact(original)
    for part in secret_parts(secret):
        assert part not in out
    assert "[REDACTED:" in out
    # the text around the secret is kept, so the model still knows something was there
    before, after = template.split("{s}")
    first_line_before = before.split("-----BEGIN")[0]
    assert out.startswith(first_line_before)
    if "-----END" not in after:
        assert out.endswith(after)


def test_connection_string_keeps_everything_but_the_password():
    out = redact("postgres://orders_app:Tr0ub4dor-and-3@db.internal.example.com:5432/orders?sslmode=require")
    assert out == "postgres://orders_app:[REDACTED:connection-password]@db.internal.example.com:5432/orders?sslmode=require"


def test_bearer_header_keeps_the_scheme():
    out = redact("Authorization: Bearer opaque-Token.value_1234567890abcdef")
    assert out.startswith("Authorization: Bearer [REDACTED:")
    assert "opaque-Token" not in out


def test_env_dump_redacts_each_secret_line_and_keeps_the_rest():
    dump = "\n".join(["HOME=/home/dev", "SHELL=/bin/zsh", "DATABASE_PASSWORD=correct-horse-battery",
                      "OPENAI_API_KEY=9f8e7d6c5b4a3928170615", "EDITOR=vim", "PATH=/usr/local/bin:/usr/bin"])
    out = redact(dump).splitlines()
    assert out[0] == "HOME=/home/dev"
    assert out[1] == "SHELL=/bin/zsh"
    assert out[2].startswith("DATABASE_PASSWORD=[REDACTED:") and "correct-horse" not in out[2]
    assert out[3].startswith("OPENAI_API_KEY=[REDACTED:") and "9f8e7d6c" not in out[3]
    assert out[4:] == ["EDITOR=vim", "PATH=/usr/local/bin:/usr/bin"]


def test_redaction_is_idempotent():
    original = " ".join(fill(t, s) for _, t, s in SECRETS)
    once = redact(original)
    assert redact(once) == once


NEAR_MISSES = [
    "pip install scikit-learn && python -m pytest -q",
    "Keep the ask-user-for-confirmation-dialog component.",
    "AWS access key ids start with AKIA followed by 16 characters.",
    "git@github.com:org/repo.git and https://example.com/docs?page=2&sort=desc",
    "md5 d41d8cd98f00b204e9800998ecf8427e and sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "session 0b5e1111-0000-4000-8000-000000000001, commit 879ecea",
    "def check_password(user, password):\n    return hmac.compare_digest(hash(password), user.hash)",
    "Bearer tokens must never be logged; the token budget is 20000 tokens.",
    "from huggingface_hub import hf_hub_download",
    "redis://localhost:6379/0 and http://localhost:8080/api",
    "PASSWORD_MIN_LENGTH=12",
    "ghp_ and sk- are prefixes; xoxo, AIza alone is not a key.",
    "const header = `-----BEGIN CERTIFICATE-----`;",
    # ordinary Python of this very project: assignments to names that merely contain "token"/"password"
    "num_tokens = count_tokens(text)",
    "max_tokens=100000",
    'password = os.environ["DB_PASSWORD"]',
]


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_ordinary_text_and_code_are_untouched(line):
    assert redact(line) == line


def test_redact_messages_covers_text_parts_and_tool_arguments():
    key = "sk-" + "Abc123Def456Ghi789Jkl012Mno345Pqr678Stu901Vwx"
    messages = [{"role": "user", "content": f"key {key}"},
                {"role": "user", "content": [{"type": "text", "text": f"again {key}"}, {"type": "image_url"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": json.dumps({"k": key})}}]}]
    out = redact_messages(messages)
    assert key not in json.dumps(out)
    assert key in json.dumps(messages)  # the input is not changed in place
    assert out[1]["content"][1] == {"type": "image_url"}


# ------------------------------------------------------------------ end to end through the fake server


def config(server: FakeOpenAI) -> ModelConfig:
    return ModelConfig(model="openai/fake-model", api_base=server.base_url,
                       retry=RetryPolicy(attempts=1, base_seconds=0.001))


def leaky_session() -> tuple[SessionBuilder, dict[str, str]]:
    """One secret of each kind, spread over user text, thinking, tool calls, tool results and bash output."""
    b = SessionBuilder(SID)
    ids = {}
    cut = len(SECRETS) // 2
    ids["user"] = b.user("Here are my credentials:\n" + "\n".join(fill(t, s) for _, t, s in SECRETS[:cut]))
    ids["assistant"] = b.assistant(
        "I will check the database.", thinking=f"The user pasted {SECRETS[0][2]}; do not repeat it.",
        tool_calls=[("call_1", "bash", {"command": fill(SECRETS[12][1], SECRETS[12][2])})])
    ids["tool"] = b.tool_result("call_1", "bash", "\n".join(fill(t, s) for _, t, s in SECRETS[cut:]))
    ids["bash"] = b.bash("env | grep PASSWORD", fill(SECRETS[16][1], SECRETS[16][2]))
    ids["done"] = b.assistant("Connected to the orders database.")
    return b, ids


def test_only_markers_leave_the_machine_and_recall_shows_the_original(server, tmp_path, db_path):
    b, ids = leaky_session()
    path = b.write(tmp_path / "leaky.jsonl")
    ingest(db_path, [path])
    content = "User shared credentials for the orders database."
    server.add(tool_call("record_observations", {"observations": [
        {"timestamp": "2026-01-15 14:01", "content": content, "relevance": "high",
         "sourceEntryIds": [ids["user"], ids["tool"]]}]}), text("done"))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert outcome.outcome == "recorded"

    sent = server.sent_text()
    for kind, _, secret in SECRETS:
        for part in secret_parts(secret):
            assert part not in sent, f"{kind} leaked to the model"
    assert sent.count("[REDACTED:") >= len(SECRETS)
    assert "postgres://orders_app:[REDACTED:" in sent  # context kept around the marker

    # recall shows the exact original text locally
    obs_id = hashlib.sha256(content.encode()).hexdigest()[:12]
    found = recall(db_path, obs_id, SID)
    local = "\n".join(s.text for s in found.observations[0].sources)
    for _, template, secret in SECRETS:
        assert fill(template, secret) in local

    # the stored session is untouched
    lines = path.read_text().splitlines()[1:]
    with dbmod.reading(db_path) as con:
        raws = [r[0] for r in con.execute("SELECT raw FROM entries WHERE session_id = ? ORDER BY entry_id",
                                          [SID]).fetchall()]
    assert [json.loads(r) for r in raws] == [json.loads(line) for line in lines]
    assert SECRETS[0][2] in raws[0]


def test_with_redaction_off_the_secret_is_sent(server, tmp_path, db_path):
    b, _ = leaky_session()
    ingest(db_path, [b.write(tmp_path / "leaky.jsonl")])
    server.add(text("nothing"))
    observe_now(Workspace.open(db_path, settings=Settings(redactSecrets=False)), SID, None, config(server))
    sent = server.sent_text()
    assert SECRETS[0][2] in sent
    assert "Tr0ub4dor-and-3" in sent
    assert "[REDACTED:" not in sent


def test_reflector_prompt_is_redacted_too(server, tmp_path, db_path):
    """The offline observer quotes the user verbatim into local memory; a model reflector must still
    receive only the marker."""
    b = SessionBuilder(SID)
    key = SECRETS[0][2]
    b.user(f"You must always use the key {key} for the staging account.")
    b.assistant("Understood.")
    ingest(db_path, [b.write(tmp_path / "s.jsonl")])
    observed = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, ModelConfig(model="offline"))
    assert observed.outcome == "recorded"
    server.add(text("nothing durable"))
    reflect_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    sent = server.sent_text()
    assert "staging account" in sent  # the observation was in the reflector's input
    assert key not in sent
    assert "[REDACTED:openai-key]" in sent


def test_a_private_key_cut_by_the_head_tail_excerpt_does_not_leak(server, tmp_path, db_path):
    """An entry alone over the chunk cap is sent as a head…tail excerpt. When the key's BEGIN line falls
    in the omitted middle, the key lines that reach the tail must still not be sent."""
    key_lines = [base64.b64encode(hashlib.sha256(f"key line {i}".encode()).digest() * 2).decode()[:64]
                 for i in range(25)]
    pem = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(key_lines) + "\n-----END RSA PRIVATE KEY-----"
    big = "Here is the backup I restored:\n" + "config line ok\n" * 110 + pem + "\nThat was all."
    b = SessionBuilder(SID)
    b.user(big)  # E1: about 850 tokens, alone over a 256-token cap
    b.assistant("Thanks.")
    ingest(db_path, [b.write(tmp_path / "s.jsonl")])
    server.add(text("nothing"))
    observe_now(Workspace.open(db_path, settings=Settings(observerChunkMaxTokens=256)), SID, None, config(server))
    sent = server.sent_text()
    assert "characters omitted from the middle of this entry" in sent  # the excerpt was used
    assert "-----END RSA PRIVATE KEY-----" in sent or "[REDACTED:" in sent
    leaked = [line for line in key_lines if line in sent]
    assert leaked == [], f"{len(leaked)} of {len(key_lines)} private key lines were sent to the model"
