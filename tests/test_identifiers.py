"""What redaction's guesses leave alone (om_core/redaction/identifiers.py): the shapes are told apart
from secrets of the same characters, and references from ids a secret's name may hold."""

from __future__ import annotations

import pytest

from om_core.redaction.identifiers import identifier_kind, name_like, placeholder, reference_kind
from secret_corpus import AWS_SECRET, IDENTIFIERS, rnd


@pytest.mark.parametrize("family, value", IDENTIFIERS, ids=[f"{f}-{v[:24]}" for f, v in IDENTIFIERS])
def test_every_corpus_identifier_is_recognised(family, value):
    assert identifier_kind(value) is not None


@pytest.mark.parametrize("value, kind", [
    ("tests/test_check_secrets.py:11", "path"), ("config.py:9", "path"), ("/run/secrets/db_password", "path"),
    ("https://api.example.com/v1/tokens?page=2", "url"), ("git@github.com:org/repo.git", "url"),
    ("arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/db-AbC12x", "arn"),
    ("sha256:" + "ab" * 32, "digest"),
    ("d703a1a9-1b7b-4fb1-b512-c9738b1fe617", None), ("879ecea", None), ("config.py", None),
    ("postgres://app:hunter2@db:5432/orders", None),  # a URL with credentials is no reference
])
def test_references_are_what_an_assignment_may_hold_without_a_secret(value, kind):
    """A UUID, a commit or a bare file name assigned to `TOKEN=` may be the secret; a path may not."""
    assert reference_kind(value) == kind


@pytest.mark.parametrize("value", [
    "qk_live_4f9a2c7e1b8d6035a9e2", AWS_SECRET, "/" + rnd("slash-led", 39, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+"),
    rnd("hex-24", 24, "0123456789abcdef"), rnd("hex-32", 32, "0123456789abcdef"), "Tr0ub4dor&3", "hunter2-Qx9z",
    rnd("random", 26, "abcdefghijklmnopqrstuvwxyz0123456789"),
])
def test_random_values_are_no_identifiers(value):
    """Hex of a length git does not use, base64 with slashes, a live key's random part: not ids."""
    assert identifier_kind(value) is None, identifier_kind(value)


@pytest.mark.parametrize("value, expected", [
    ("site-packages", True), ("0042_users", True), ("python3.12", True), ("getAccessToken", True), ("k8s", True),
    ("wJalrXUtnFEMI", False), ("4f9a2c7e1b8d", False), ("bPxRfiCY", False),
])
def test_name_like_tells_word_chains_from_random_runs(value, expected):
    assert name_like(value) is expected


@pytest.mark.parametrize("value, expected", [
    ("sk-ant-...", True), ("<your-token>", True), ("${DB_PASSWORD}", True), ("{FAKE_LIVE}", True), ("qk_live_", True),
    ("qk_live_…", True), ("test-token", True), ("not-a-real-token", True), ("your_api_key_here", True), ("****", True),
    ("correct-horse-battery", False), ("hunter2", False), ("Winter2026!", False),
])
def test_placeholders(value, expected):
    assert placeholder(value) is expected
