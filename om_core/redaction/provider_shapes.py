"""The provider token shapes of ``detect-secrets``' regex plugins that redaction runs (see
``om_core.redaction.rules``), copied from detect-secrets 1.5.0 so that a process redacting a few lines
does not import detect-secrets (and through it ``requests``): about a fifth of a live compaction's
command time. ``tests/test_redact.py`` checks the copy against the installed plugins; regenerate it
with ``python -m om_core.redaction.provider_shapes`` when they change."""

from __future__ import annotations


# (module, class, secret_type, ((pattern, flags), ...)), in the order of rules._PLUGINS
SHAPES: tuple[tuple[str, str, str, tuple[tuple[str, int], ...]], ...] = (
    ('aws', 'AWSKeyDetector', 'AWS Access Key', (
        ('(?:A3T[A-Z0-9]|ABIA|ACCA|AKIA|ASIA)[0-9A-Z]{16}', 32),
        ('aws.{0,20}?(?:key|pwd|pw|password|pass|token).{0,20}?[\\\'\\"]([0-9a-zA-Z/+]{40})[\\\'\\"]', 34),
    )),
    ('discord', 'DiscordBotTokenDetector', 'Discord Bot Token', (
        ('[MNO][a-zA-Z\\d_-]{23,25}\\.[a-zA-Z\\d_-]{6}\\.[a-zA-Z\\d_-]{27}', 32),
    )),
    ('github_token', 'GitHubTokenDetector', 'GitHub Token', (
        ('(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9_]{36}', 32),
    )),
    ('gitlab_token', 'GitLabTokenDetector', 'GitLab Token', (
        ('(glpat|gldt|glft|glsoat|glrt)-[A-Za-z0-9_\\-]{20,50}(?!\\w)', 32),
        ('GR1348941[A-Za-z0-9_\\-]{20,50}(?!\\w)', 32),
        ('glcbt-([0-9a-fA-F]{2}_)?[A-Za-z0-9_\\-]{20,50}(?!\\w)', 32),
        ('glimt-[A-Za-z0-9_\\-]{25}(?!\\w)', 32),
        ('glptt-[A-Za-z0-9_\\-]{40}(?!\\w)', 32),
        ('glagent-[A-Za-z0-9_\\-]{50,1024}(?!\\w)', 32),
        ('gloas-[A-Za-z0-9_\\-]{64}(?!\\w)', 32),
    )),
    ('mailchimp', 'MailchimpDetector', 'Mailchimp Access Key', (
        ('[0-9a-z]{32}-us[0-9]{1,2}', 32),
    )),
    ('npm', 'NpmDetector', 'NPM tokens', (
        ('\\/\\/.+\\/:_authToken=\\s*((npm_.+)|([A-Fa-f0-9-]{36})).*', 32),
    )),
    ('openai', 'OpenAIDetector', 'OpenAI Token', (
        ('sk-[A-Za-z0-9-_]*[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}', 32),
    )),
    ('pypi_token', 'PypiTokenDetector', 'PyPI Token', (
        ('pypi-AgEIcHlwaS5vcmc[A-Za-z0-9-_]{70,}', 32),
        ('pypi-AgENdGVzdC5weXBpLm9yZw[A-Za-z0-9-_]{70,}', 32),
    )),
    ('sendgrid', 'SendGridDetector', 'SendGrid API Key', (
        ('SG\\.[a-zA-Z0-9_-]{22}\\.[a-zA-Z0-9_-]{43}', 32),
    )),
    ('slack', 'SlackDetector', 'Slack Token', (
        ('xox(?:a|b|p|o|s|r)-(?:\\d+-)+[a-z0-9]+', 34),
        ('https://hooks\\.slack\\.com/services/T[a-zA-Z0-9_]+/B[a-zA-Z0-9_]+/[a-zA-Z0-9_]+', 98),
    )),
    ('square_oauth', 'SquareOAuthDetector', 'Square OAuth Secret', (
        ('sq0csp-[0-9A-Za-z\\\\\\-_]{43}', 32),
    )),
    ('stripe', 'StripeDetector', 'Stripe Access Key', (
        ('(?:r|s)k_live_[0-9a-zA-Z]{24}', 32),
    )),
    ('telegram_token', 'TelegramBotTokenDetector', 'Telegram Bot Token', (
        ('\\d{8,10}:[0-9A-Za-z_-]{35}', 32),
    )),
    ('twilio', 'TwilioKeyDetector', 'Twilio API Key', (
        ('AC[a-z0-9]{32}', 32),
        ('SK[a-z0-9]{32}', 32),
    )),
)


def current() -> tuple[tuple[str, str, str, tuple[tuple[str, int], ...]], ...]:
    """The shapes as the installed detect-secrets plugins have them (imports detect-secrets)."""
    import importlib

    found = []
    for module, name, _, _ in SHAPES:
        cls = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), name)
        found.append((module, name, cls.secret_type, tuple((p.pattern, p.flags) for p in cls().denylist)))
    return tuple(found)


if __name__ == "__main__":  # print the tuple to paste above
    import pprint

    pprint.pprint(current(), width=110)
