"""Realistic fake secrets, in the shapes people paste into coding sessions.

Values are derived from a seeded hash, so no complete key-shaped literal sits in the source (the
repository's own secret scanners stay quiet) and every run sees the same values.
Each entry: (family, text as it would appear, the secret part(s) that must not leave the machine).
"""

from __future__ import annotations

import hashlib
import string

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
