"""Realistic fake secrets, in the shapes people paste into coding sessions.

Values are derived from a seeded hash, so no complete key-shaped literal sits in the source (the
repository's own secret scanners stay quiet) and every run sees the same values.
Each entry: (family, text as it would appear, the secret part(s) that must not leave the machine).
"""

from __future__ import annotations

import hashlib
import json
import string
from dataclasses import dataclass, field

ALNUM = string.ascii_letters + string.digits
LOWER_ALNUM = string.ascii_lowercase + string.digits
HEX = "0123456789abcdef"
UPPER_ALNUM = string.ascii_uppercase + string.digits
B64 = ALNUM + "+/"


def rnd(seed: str, n: int, alphabet: str = ALNUM) -> str:
    """``n`` characters of ``alphabet``, pseudo-random and deterministic in ``seed``."""
    out, counter = [], 0
    while len(out) < n:
        for byte in hashlib.sha256(f"{seed}:{counter}".encode()).digest():
            out.append(alphabet[byte % len(alphabet)])
        counter += 1
    return "".join(out[:n])


def b64url(seed: str, n: int) -> str:
    return rnd(seed, n, ALNUM + "-_")


PEM = "\n".join(rnd(f"pem{i}", 64, B64) for i in range(6)) + "\n" + rnd("pem-last", 24, B64) + "=="
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJ" + b64url("jwt-claims", 60) + "." + b64url("jwt-sig", 43))
def uuid_shaped(seed: str) -> str:
    h = rnd(seed, 32, HEX)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"


UUID_SECRET, UUID_SECRET_2, UUID_SECRET_3, UUID_SECRET_4 = (uuid_shaped(f"uuid-secret-{i}") for i in range(4))
AWS_SECRET = rnd("aws-secret-a", 18, ALNUM) + "/" + rnd("aws-secret-b", 10, ALNUM) + "/" + rnd("aws-secret-c", 10, ALNUM)

# family, template ({s} is the secret), secret
SECRETS: list[tuple[str, str, str]] = [
    # cloud keys and secret keys
    ("aws-access-key", "aws_access_key_id = {s}", "AKIA" + rnd("akia", 16, UPPER_ALNUM)),
    ("aws-secret-ini", "[default]\naws_secret_access_key = {s}\nregion = eu-west-1", AWS_SECRET),
    ("aws-secret-env", "AWS_SECRET_ACCESS_KEY={s}", rnd("aws-env", 40, ALNUM + "/+")),
    ("aws-session-token", "export AWS_SESSION_TOKEN={s}", "IQoJb3JpZ2luX2Vj" + rnd("aws-sts", 120, B64)),
    ("gcp-api-key", "https://maps.googleapis.com/maps/api/js?key={s}&callback=init", "AIza" + rnd("aiza", 35, ALNUM + "_-")),
    ("gcp-service-account", '{{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n{s}\\n'
                            '-----END PRIVATE KEY-----\\n", "client_email": "ci@proj.iam.gserviceaccount.com"}}',
     rnd("gcp-pk", 64, B64)),
    ("azure-storage", "DefaultEndpointsProtocol=https;AccountName=prodlogs;AccountKey={s};EndpointSuffix=core.windows.net",
     rnd("azure", 86, B64) + "=="),
    ("google-oauth", "access token {s}", "ya29." + rnd("ya29", 60, ALNUM + "_-")),
    # tokens of the big SaaS providers
    ("openai", "my key is {s} ok", "sk-proj-" + rnd("openai", 48, ALNUM + "_-")),
    ("anthropic", "ANTHROPIC_API_KEY={s}", "sk-ant-api03-" + rnd("anthropic", 80, ALNUM + "_-")),
    ("github-classic", "git clone https://{s}@github.com/org/repo", "ghp_" + rnd("ghp", 36)),
    ("github-in-summary", "The CI uses the token {s} for releases.", "ghs_" + rnd("ghs", 36)),
    ("github-fine-grained", "GH token {s}", "github_pat_" + rnd("ghpat", 82, ALNUM + "_")),
    ("gitlab", "glab auth login --token {s}", "glpat-" + rnd("glpat", 20, ALNUM + "_-")),
    ("slack-bot", "slack bot {s}", "xoxb-" + rnd("xoxb1", 12, string.digits) + "-" + rnd("xoxb2", 13, string.digits)
     + "-" + rnd("xoxb3", 24)),
    ("slack-app", "Socket mode needs the app token {s} too", "xapp-1-A" + rnd("xapp1", 10, UPPER_ALNUM) + "-"
     + rnd("xapp2", 13, string.digits) + "-" + rnd("xapp3", 64, HEX)),
    ("slack-webhook", "curl -X POST -d @msg.json {s}", "https://hooks.slack.com/services/T" + rnd("T", 8, UPPER_ALNUM)
     + "/B" + rnd("B", 10, UPPER_ALNUM) + "/" + rnd("hook", 24)),
    ("stripe", "charge with {s}", "sk_live_" + rnd("stripe", 24)),
    ("stripe-webhook", "STRIPE_WEBHOOK_SECRET: {s}", "whsec_" + rnd("whsec", 32)),
    ("twilio", "TWILIO_AUTH_TOKEN={s}", rnd("twilio", 32, HEX)),
    ("sendgrid", "sg = SendGridAPIClient('{s}')", "SG." + rnd("sg1", 22, ALNUM + "_-") + "." + rnd("sg2", 43, ALNUM + "_-")),
    ("mailgun", "MAILGUN_KEY={s}", "key-" + rnd("mailgun", 32, LOWER_ALNUM)),
    ("npm-env", "NPM_AUTH={s}", "npm_" + rnd("npm", 36)),
    ("npmrc", "//registry.npmjs.org/:_authToken={s}", "npm_" + rnd("npmrc", 36)),
    ("pypi", "twine upload -u __token__ -p {s} dist/*", "pypi-AgEIcHlwaS5vcmc" + rnd("pypi", 80, ALNUM + "_-")),
    ("huggingface", "HF_TOKEN={s} huggingface-cli login", "hf_" + rnd("hf", 34)),
    ("discord-webhook", "post to {s}", "https://discord.com/api/webhooks/" + rnd("dw1", 18, string.digits) + "/"
     + rnd("dw2", 68, ALNUM + "_-")),
    ("telegram", "bot = Bot('{s}')", rnd("tg1", 10, string.digits) + ":" + rnd("tg2", 35, ALNUM + "_-")),
    ("shopify", "X-Shopify-Access-Token: {s}", "shpat_" + rnd("shopify", 32, HEX)),
    ("unfamiliar-live-token", "curl -H \"X-Api-Key: $K\" # K was {s}", "qk_live_" + rnd("qk", 20, HEX)),
    ("unfamiliar-live-token-bare", "rotated {s} yesterday", "qk_live_" + rnd("qk2", 20, HEX)),
    # URL credentials
    ("postgres-url", "DATABASE_URL is postgres://orders_app:{s}@db.internal.example.com:5432/orders", "Tr0ub4dor-and-3"),
    ("url-password-slash", "mysql://admin:{s}@10.0.0.5/app", "p4ss/w0rd/" + rnd("slash", 8)),
    ("redis-url-no-user", "REDIS_URL=redis://:{s}@cache.example.com:6379/0", rnd("redis", 20)),
    ("git-credentials", "https://x-access-token:{s}@github.example.com", rnd("gitcred", 30)),
    # KEY= / TOKEN= / SECRET= / PASSWORD= / PASS= assignments, any case
    ("export-api-key", "export API_KEY={s}", rnd("apikey", 24)),
    ("export-db-pass", "export DB_PASS={s}", "hunter2" + rnd("dbpass", 6)),
    ("lowercase-db-password", "db_password={s}", "s3cr3t-" + rnd("lower", 8, LOWER_ALNUM)),
    ("bare-api-key", "API_KEY={s}", rnd("bare-api", 20)),
    ("bare-token", "TOKEN={s}", rnd("bare-token", 28)),
    ("bare-password", "PASSWORD={s}", "Winter2026!" + rnd("bare-pw", 4)),
    ("bare-key", "KEY={s}", rnd("bare-key", 32)),
    ("secret-env", "SECRET={s}", rnd("bare-secret", 30)),
    ("pass-env", "PASS={s}", "correct-horse-" + rnd("pass", 6, LOWER_ALNUM)),
    ("django-secret-key", "SECRET_KEY = '{s}'", rnd("django", 50, ALNUM + "!@#%^&*(-_=+)")),
    ("yaml-password", "database:\n  user: app\n  password: {s}\n", rnd("yaml", 16)),
    ("json-api-key", '{{"apiKey": "{s}", "region": "eu"}}', rnd("json", 32)),
    ("python-token-literal", 'client = Client(token="{s}")', rnd("pytoken", 40)),
    ("toml-secret", 'client_secret = "{s}"', rnd("toml", 40)),
    ("docker-env", "docker run -e POSTGRES_PASSWORD={s} postgres:16", rnd("docker", 18)),
    ("cli-flag", "vault login --token={s}", "hvs." + rnd("vault", 90)),
    ("cli-password-flag", "psql --password {s} -h db", rnd("psqlflag", 14)),
    ("query-string", "GET /v1/export?format=csv&access_token={s} 200", rnd("query", 40)),
    ("authorization-header", "curl -H 'Authorization: Bearer {s}' https://api.example.com", "opaque-" + rnd("bearer", 30)),
    ("authorization-token-scheme", "Authorization: token {s}", rnd("tokscheme", 40, HEX)),
    ("basic-auth-header", "Authorization: Basic {s}", rnd("basic", 28, B64) + "=="),
    ("curl-user", "curl -u deploy:{s} https://ci.example.com", rnd("curlu", 20)),
    # credential files
    ("netrc", "machine api.heroku.com\n  login me@example.com\n  password {s}\n", rnd("netrc", 36, HEX)),
    ("netrc-one-line", "machine github.com login me password {s}", rnd("netrc1", 40)),
    ("pgpass", "db.example.com:5432:orders:app:{s}", rnd("pgpass", 18)),
    # private key blocks and JWTs
    ("pem-rsa", "-----BEGIN RSA PRIVATE KEY-----\n{s}\n-----END RSA PRIVATE KEY-----", PEM),
    ("pem-openssh", "key file:\n-----BEGIN OPENSSH PRIVATE KEY-----\n{s}\n-----END OPENSSH PRIVATE KEY-----\nend", PEM),
    ("jwt", "cookie session={s}; path=/", JWT),
    ("jwt-in-json", '{{"id_token": "{s}"}}', JWT),
    # high-entropy tokens next to secret-ish words
    ("entropy-near-word", "the api key is {s}, keep it safe", rnd("near", 26, LOWER_ALNUM)),
    ("entropy-near-secret", "secret: {s}", rnd("near2", 32)),
    ("entropy-credentials-prose", "credentials for staging are {s}", rnd("near3", 24)),
    # shapes that reached the model, and secrets that look like identifiers where a secret's
    # name is assigned (a UUID or hex value assigned to a token's name is the token: Consul, Heroku)
    ("pgpassword-prose", "run it as PGPASSWORD={s} psql -h db.internal -U orders", rnd("pgpw", 16)),
    ("pgpassword-backticks", "I used `PGPASSWORD={s} pg_dump orders > dump.sql`", "Pg-" + rnd("pgpw2", 12)),
    ("mysql-pwd", "MYSQL_PWD={s} mysql -u root orders", rnd("mysqlpwd", 14)),
    ("mysql-password-flag", "mysql -u root --password={s} orders", rnd("mysqlflag", 14)),
    ("password-prose-is", "the staging db password is {s} for now", "Winter2026!" + rnd("prose-is", 3)),
    ("password-prose-for-is", "The password for the orders db is {s}", "Tr0ub4dor&" + rnd("prose-for", 4)),
    ("password-prose-colon", "Staging password: {s}", "hunter2-" + rnd("prose-colon", 6)),
    ("passphrase-prose", "the key passphrase was {s}, do not share it", rnd("passphrase", 6) + "#" + rnd("pp2", 5)),
    ("secret-prose-is", "the webhook secret is {s}.", rnd("webhook", 24)),
    ("consul-token-prose-colon", "my Consul token: {s}", UUID_SECRET),
    ("heroku-api-key-uuid", "HEROKU_API_KEY={s}", UUID_SECRET_2),
    ("yaml-password-uuid", "db:\n  password: {s}\n", UUID_SECRET_3),
    ("json-token-hex40", '{{"token": "{s}"}}', rnd("hex40", 40, HEX)),
    ("authorization-uuid", "curl -H 'Authorization: Bearer {s}' https://api.example.com", UUID_SECRET_4),
    ("bearer-prose", "call it with Bearer {s} in the header", rnd("bearer-prose", 32)),
    ("yaml-password-ampersand", "staging:\n  password: {s}\n", "Tr0ub4dor&" + rnd("amp", 5)),
]


def fill(template: str, secret: str) -> str:
    return template.replace("{s}", secret).replace("{{", "{").replace("}}", "}")


def secret_parts(secret: str) -> list[str]:
    """The pieces that must not appear: each line of a multi-line secret, a long secret's 12-char pieces
    (half a key is still a leak), and the JSON-escaped form."""
    parts = [p for p in secret.split("\n") if p]
    if len(secret) >= 24:
        parts += [secret[i:i + 12] for i in range(0, len(secret) - 11, 12) if "\n" not in secret[i:i + 12]]
    return parts


def all_texts() -> list[str]:
    return [fill(t, s) for _, t, s in SECRETS]


# ordinary text and code that must come through unchanged
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
    "num_tokens = count_tokens(text)",
    "max_tokens=100000",
    'password = os.environ["DB_PASSWORD"]',
    "api_key = settings.api_key",
    "token = get_token(user)",
    "def login(username: str, password: str) -> Token:",
    "    password=password,",
    "token: Optional[str] = None",
    "API_KEY=$API_KEY ./run.sh",
    "export GITHUB_TOKEN=${{ secrets.GITHUB_TOKEN }}",
    "TOKEN_URL=https://auth.example.com/oauth/token",
    "The password reset flow sends a token by email.",
    "primary_key = 'id'",
    "sort(key=lambda r: r.name)",
    "cache_key = f'user:{user_id}'",
    "Mask to qk_live_**** so one can still see which kind of token it was.",
    "curl -H \"Authorization: Bearer $TOKEN\" https://api.example.com/v1/me",
    "http://localhost:8080/users/@me and npm i @scope/pkg",
    "KEY_PREFIX=om",
    "secret_name = 'prod/db'",
    "Use `om recall 0123456789ab` to see the exact evidence.",
    "[a1b2c3d4e5f6] 2026-01-15 14:01 [high] User chose Apollo Server 4 over GraphQL Yoga.",
    "password: str",
    "if token is None:",
]


# ------------------------------------------------------------------ identifiers that must pass

def _b64_digest(data: bytes, algorithm: str) -> str:
    import base64

    return base64.b64encode(hashlib.new(algorithm, data).digest()).decode()


SHA1 = hashlib.sha1(b"om corpus commit").hexdigest()
SHA256 = hashlib.sha256(b"om corpus blob").hexdigest()

# family, value. The memory keeps these verbatim: the observer is asked to copy them exactly.
IDENTIFIERS: list[tuple[str, str]] = [
    ("path", "migrations/0042_users.sql"),
    ("path", ".venv/lib/python3.12/site-packages/httpx/_client.py"),
    ("path", "/home/dev/harbor-sync/src/harbor_sync/config.py"),
    ("path", "~/.config/om/settings.json"),
    ("path", "./scripts/rotate_tokens.sh"),
    ("path", "packages/api/src/middleware/authToken.test.ts"),
    ("path", "/tmp/pytest-of-root/pytest-3/test_redaction0/om.duckdb"),
    ("path", "/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T"),
    ("path", "/run/secrets/db_password"),
    ("file-line", "tests/test_check_secrets.py:11"),
    ("file-line", "src/harbor_sync/config.py:9:5"),
    ("file-line", "config.py:9"),
    ("file-line", "om_core/redaction/redact.py#L42-L57"),
    ("test-id", "tests/test_redact.py::test_each_secret_kind_becomes_a_marker[openai]"),
    ("test-id", "tests/test_auth.py::TestTokenRefresh::test_expired_token_is_refreshed"),
    ("uuid", "d703a1a9-1b7b-4fb1-b512-c9738b1fe617"),
    ("uuid", "7c9e6679-7425-40de-944b-e07fc1f90ae7"),
    ("uuid", "5EC7E700-0000-4000-8000-000000000001"),
    ("git-sha", "879ecea"),
    ("git-sha", SHA1[:10]),
    ("git-sha", SHA1),
    ("git-sha", SHA256),
    ("digest", "sha256:" + SHA256),
    ("digest", "sha512-" + _b64_digest(b"om corpus package", "sha512")),
    ("digest", "ghcr.io/org/om-worker@sha256:" + hashlib.sha256(b"om image").hexdigest()),
    ("digest", "md5:d41d8cd98f00b204e9800998ecf8427e"),
    ("version", "1.2.3-rc.1+build.5a3f9c2"),
    ("version", "15.0.3+20260115.sha.879ecea"),
    ("version", "v2.46.1"),
    ("version", "2026.1.0.dev4+g879ecea"),
    ("version", "@supabase/ssr@0.5.1"),
    ("version", "httpx==0.27.2"),
    ("url", "https://api.example.com/v1/tokens?page=2&per_page=50"),
    ("url", "https://github.com/org/repo/commit/" + SHA1),
    ("url", "https://docs.example.com/auth/secrets#rotation"),
    ("url", "postgres://db.internal.example.com:5432/orders"),
    ("url", "git@github.com:org/harbor-sync.git"),
    ("url", "s3://om-stage-results/runs/2026-01-15/"),
    ("table", "om_internal.compactions"),
    ("table", "auth_tokens"),
    ("table", "user_secrets_2026_01"),
    ("table", "analytics.api_keys_v2"),
    ("regex", r"qk_(live|test)_[0-9a-f]{20}"),
    ("regex", r"^sk-[A-Za-z0-9]{48}$"),
    ("regex", r"(?:AKIA|ASIA)[0-9A-Z]{16}"),
    ("regex", r"\d{8,10}:[A-Za-z0-9_-]{35}"),
    ("call-id", "toolu_01" + rnd("toolu", 22)),
    ("call-id", "call_" + rnd("call", 24)),
    ("call-id", "chatcmpl-" + rnd("chatcmpl", 29)),
    ("run-id", "run_" + rnd("run", 24)),
    ("run-id", "run-20260115-140102"),
    ("vault-path", "secret/data/prod/orders/db-password"),
    ("vault-path", "kv/harbor/api-token"),
    ("vault-path", "projects/123456789012/secrets/quayline-token/versions/3"),
    ("vault-path", "arn:aws:secretsmanager:eu-west-1:123456789012:secret:prod/orders/db-password-AbC12x"),
    ("vault-path", "op://Engineering/quayline/credential"),
    ("vault-path", "vault:secret/data/harbor#api_token"),
    ("code", "check_secrets.scan_text"),
    ("code", "settings.api_key"),
    ("code", "getAccessToken()"),
    ("code", "AuthTokenProvider"),
    ("code", "PASSWORD_MIN_LENGTH"),
    ("code", "self._token_cache"),
    ("code", "om_core.redaction.rules.secret_name"),
    ("code", "hashPassword2"),
]

# Random ids (a UUID, a hex id) assigned to a secret's name are that secret (a Consul token is a
# UUID), so only references and paths are also placed after `word:`.
ASSIGNABLE = {"path", "file-line", "test-id", "url", "vault-path"}
SECRET_WORDS = ("auth", "token", "secret", "key", "password", "credentials", "api key", "passphrase")
PROSE = ("{v}", "See {v} for details.", "Fixed the {w} bug in {v}.", "Use the {w} job {v} for the replay",
         "the {w} rotation job id is {v}", "the {w} is {v}", "the {w} for staging is {v}")


def identifier_texts() -> list[tuple[str, str, str]]:
    """(family, text, identifier): each identifier alone, right after each secret-ish word, in prose,
    and (references) as a value of ``word:``."""
    out = []
    for family, value in IDENTIFIERS:
        texts = [p.format(v=value, w="") for p in PROSE[:2]]
        texts += [f"{w} {value}" for w in SECRET_WORDS]
        texts += [p.format(v=value, w=w) for p in PROSE[2:] for w in SECRET_WORDS]
        if family in ASSIGNABLE:
            texts += [f"{w}: {value}" for w in SECRET_WORDS]
        out += [(family, text, value) for text in dict.fromkeys(texts)]
    return out


# text that looks like it holds a secret and does not: placeholders and fixtures seen in the real
# sessions and examples, references assigned to secret names, secret-ish words before ordinary values
LOOKALIKES = [
    "export ANTHROPIC_API_KEY=sk-ant-...",
    "export OPENROUTER_API_KEY=sk-or-...",
    "OPENAI_API_KEY=<your-key>",
    "OPENAI_API_KEY=your-api-key-here",
    'API_TOKEN = "qk_live_…"',
    'settings = Settings(base_url="https://partner.test/v2", api_token="test-token")',
    'env = {"HARBOR_API_TOKEN": "not-a-real-token"}',
    "The example is `HARBOR_API_TOKEN=` and a pointer to `.env.example`.",
    'assert check_secrets.scan_text("Authorization: Bearer qk_live_") == []',
    'assert check_secrets.scan_text(f"token = \'{FAKE_LIVE}\'")',
    "# The partner token lives in pass: `pass show quayline/live`",
    'assert check_secrets.scan_text("-----BEGIN OPENSSH PRIVATE KEY-----") == [(1, "private key")]',
    "PWD=/home/dev/harbor-sync",
    "OLDPWD=/home/dev",
    "TOKEN_FILE=/run/secrets/quayline_token",
    "password: ${DB_PASSWORD}",
    "The password is required.",
    "the password is stored in 1Password",
    "the password is base64-encoded",
    "The token is None until login.",
    "The secret is in vault at secret/data/prod/orders/db-password",
    "auth: oauth2",
    "SESSION_KEY=d703a1a9-1b7b-4fb1-b512-c9738b1fe617",
    "the token expires at 2026-01-15T14:01:02Z",
    "use --token-file ~/.config/gh/token",
    "secret_key_base = Rails.application.credentials.secret_key_base",
    "api key rotated: see PR #1234 and commit " + SHA1,
    "tokens used: 123456 of 200000",
    "cache key users:42:profile:v3",
    "the key is in ~/.ssh/id_ed25519.pub",
    # an om run id (16 hex) after a token count is no token: nothing assigns it to the word
    "Token usage: 1,234,567 prompt tokens in run 3f9a2c7d1e0b4a56",
    "token usage 12,345 prompt / 678 completion in run 9b1c2d3e4f5a6b7c (see om logs)",
]


# ------------------------------------------------------------------ scoring

@dataclass
class Score:
    """Recall over secrets (a secret counts when no piece of it is left) and precision over
    redactions (a redaction counts when it lies on a secret; one anywhere else is a false one)."""
    secrets: int = 0
    found: int = 0
    redactions: int = 0
    true_redactions: int = 0
    missed: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.found / self.secrets if self.secrets else 1.0

    @property
    def precision(self) -> float:
        return self.true_redactions / self.redactions if self.redactions else 1.0

    def line(self) -> str:
        return (f"recall {self.recall:.1%} ({self.found}/{self.secrets} secrets), precision {self.precision:.1%} "
                f"({self.true_redactions}/{self.redactions} redactions)")


def escaped(text: str) -> str:
    """``text`` as a tool call's JSON arguments carry it (a line of a file being written)."""
    return "write(" + json.dumps({"path": "notes.txt", "content": f"line one\n{text}\nlast"},
                                 ensure_ascii=False, separators=(",", ":")) + ")"


def score() -> Score:
    """Every secret and every identifier of the corpus, as written and JSON-escaped, through the
    redactor (imported here, so a test can swap its rules)."""
    from om_core.redaction.redact import redact, secret_spans

    result = Score()
    for family, template, secret in SECRETS:
        for text, shown in ((fill(template, secret), secret), (escaped(fill(template, secret)), json.dumps(secret)[1:-1])):
            at = text.index(shown)
            spans = secret_spans(text)
            out = redact(text)
            result.secrets += 1
            if any(part in out for part in secret_parts(shown)):
                result.missed.append(f"{family}: {out!r}")
            else:
                result.found += 1
            for start, end, kind in spans:
                result.redactions += 1
                if start < at + len(shown) and at < end:
                    result.true_redactions += 1
                else:
                    result.false.append(f"{family} [{kind}] {text[start:end]!r} in {text!r}")
    clean = [(f, t) for f, t, _ in identifier_texts()] + [("lookalike", t) for t in LOOKALIKES] \
        + [("near-miss", t) for t in NEAR_MISSES]
    for family, text in clean:
        for variant in (text, escaped(text)):
            for start, end, kind in secret_spans(variant):
                result.redactions += 1
                result.false.append(f"{family} [{kind}] {variant[start:end]!r} in {variant!r}")
    return result
