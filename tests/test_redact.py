"""Secret redaction: every common secret shape becomes a marker in
what leaves the machine, ordinary text and code are left alone, the stored session is untouched, and
recall still shows the original locally. The end-to-end tests read what the fake model server actually
received and every compaction summary.

The fake secrets (tests/secret_corpus.py) are derived from a seeded hash, so no complete key-shaped
literal sits in the source.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys

import pytest

from builders import SessionBuilder
from fake_brains import _CHUNK as CHUNK, ScriptedWorkers, stage_of
from fake_openai import FakeOpenAI, Reply, text, tool_call
from conftest import workspace
from om_core.store import db as dbmod
from om_core.ingest import ingest
from om_core.model.client import RetryPolicy
from om_core.recall.evidence import recall
from om_core.redaction.redact import redact
from secret_corpus import B64, NEAR_MISSES, SECRETS, fill, rnd, score, secret_parts
from om_core.settings import Settings
from om_core.store.workspace import Workspace
from om_core.replay.stage_runner import observe_now, reflect_now
from om_core.workers.run_config import ModelConfig

SID = "5ec7e700-0000-4000-8000-000000000001"


@pytest.mark.parametrize("kind, template, secret", SECRETS, ids=[s[0] for s in SECRETS])
def test_each_secret_kind_becomes_a_marker(kind, template, secret):
    original = fill(template, secret)
    out = redact(original)
    for part in secret_parts(secret):
        assert part not in out
    assert "[REDACTED:" in out
    # the text around the secret is kept, so the model still knows something was there
    before, after = fill(template, "\x00").split("\x00")
    first_line_before = before.split("-----BEGIN")[0]
    assert out.startswith(first_line_before)
    if "-----END" not in after:
        assert out.endswith(after)


@pytest.mark.parametrize("kind, template, secret", SECRETS, ids=[s[0] for s in SECRETS])
def test_each_secret_is_found_inside_json_escaped_text(kind, template, secret):
    """Tool-call arguments reach the observer as JSON (newlines and quotes escaped)."""
    rendered = "write(" + json.dumps({"path": "notes.txt", "content": f"line one\n{fill(template, secret)}\nlast"},
                                     ensure_ascii=False, separators=(",", ":")) + ")"
    out = redact(rendered)
    for part in secret_parts(json.dumps(secret)[1:-1]):
        assert part not in out
    assert out.startswith('write({"path":"notes.txt","content":"line one\\n')


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


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_ordinary_text_and_code_are_untouched(line):
    assert redact(line) == line


def test_the_corpus_is_redacted_with_full_precision_and_recall():
    """Every secret of the corpus goes (recall) and nothing else does (precision): each
    identifier alone, after each secret-ish word, in prose and as a reference's value; the lookalikes;
    the near misses; each as written and JSON-escaped in a tool call's arguments."""
    result = score()
    print(result.line())
    assert result.secrets >= 2 * len(SECRETS) and result.redactions >= result.secrets
    assert not result.missed, f"{result.line()}; secrets left:\n" + "\n".join(result.missed)
    assert not result.false, f"{result.line()}; not secrets:\n" + "\n".join(result.false[:40])
    assert result.recall == result.precision == 1.0


def test_the_score_falls_when_a_rule_breaks(monkeypatch):
    """The corpus test can fail: an identifier check that no longer knows UUIDs costs precision, a
    provider rule that is gone costs recall."""
    import om_core.redaction.identifiers as identifiers
    import om_core.redaction.redact as redact_module

    monkeypatch.setattr(identifiers, "_UUID", re.compile(r"(?!)"))
    broken = score()
    assert broken.recall == 1.0 and broken.precision < 1.0
    assert any("uuid" in line and "d703a1a9-1b7b-4fb1-b512-c9738b1fe617" in line for line in broken.false)
    monkeypatch.undo()

    kept = tuple(r for r in redact_module.rules() if r.kind != "discord-webhook")
    monkeypatch.setattr(redact_module, "rules", lambda: kept)
    broken = score()
    assert broken.recall < 1.0 and any(line.startswith("discord-webhook") for line in broken.missed)


@pytest.mark.parametrize("text, expected", [
    ("Fixed the auth bug in migrations/0042_users.sql", None),
    ("Use the session key d703a1a9-1b7b-4fb1-b512-c9738b1fe617 for the replay", None),
    ("token tests/test_check_secrets.py:11", None),
    ("PGPASSWORD=hunter2Xq9 psql -h db", "PGPASSWORD=[REDACTED:password] psql -h db"),
    ("the staging password is Winter2026!q4z for now", "the staging password is [REDACTED:password] for now"),
    ("export ANTHROPIC_API_KEY=sk-ant-...", None),
    ("PWD=/home/dev", None),
])
def test_identifiers_stay_and_secrets_go_with_their_kind(text, expected):
    assert redact(text) == (text if expected is None else expected)


def test_a_shape_names_the_kind_over_a_keyword_guess():
    """`API_TOKEN = "qk_live_…"` is found by the assignment rule and the live-key shape: the marker
    says what the value is."""
    value = "qk_live_" + "4f9a2c7e1b8d6035a9e2"
    assert redact(f'API_TOKEN = "{value}"') == 'API_TOKEN = "[REDACTED:live-key]"'
    assert redact(f"HARBOR_API_TOKEN={value[:8]}{value[8:].upper()}x") == "HARBOR_API_TOKEN=[REDACTED:live-key]"


def test_a_begin_line_alone_is_not_a_private_key():
    """A test that names the BEGIN line holds no key: the rest of the text stays."""
    line = 'assert scan("-----BEGIN OPENSSH PRIVATE KEY-----") == [(1, "private key")]\nnext line'
    assert redact(line) == line
    lines = [rnd(f"k{i}", 64, B64) for i in range(2)]
    excerpt = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(lines) + "\n[cut]"  # no END line
    assert redact(excerpt) == "[REDACTED:private-key]\n[cut]"


# ------------------------------------------------------------------ end to end through the fake server


def config(server: FakeOpenAI) -> ModelConfig:
    return ModelConfig(model="openai/fake-model", api_base=server.base_url,
                       retry=RetryPolicy(attempts=1, base_seconds=0.001))


GROUPS = 8  # user text, thinking, tool-call arguments, tool results, bash output, custom messages,
#            branch summaries, imported observations (records the TypeScript extension wrote)


def _group(g: int) -> list[tuple[str, str, str]]:
    return SECRETS[g::GROUPS]


def _texts(g: int) -> list[str]:
    return [fill(t, s) for _, t, s in _group(g)]


def mid(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def leaky_session() -> tuple[SessionBuilder, dict[str, str]]:
    """Every secret of the corpus, spread over every place a session can hold one."""
    b = SessionBuilder(SID)
    ids = {}
    ids["start"] = b.user("Let's set up the orders service.")
    # memory the extension recorded, quoting secrets (it has no redaction of its own)
    imported = [{"id": mid(text), "content": f"User shared: {text}", "timestamp": "2026-01-15 14:02",
                 "relevance": "high", "sourceEntryIds": [ids["start"]], "tokenCount": 30}
                for text in _texts(7)]
    for o in imported:
        o["id"] = mid(o["content"])
    b.custom("om.observations.recorded", {"observations": imported, "coversUpToId": ids["start"]})
    reflection = {"id": mid("Standing constraint: " + _texts(7)[0]), "content": "Standing constraint: "
                  + _texts(7)[0].replace("\n", " "), "supportingObservationIds": [imported[0]["id"]], "tokenCount": 20}
    reflection["id"] = mid(reflection["content"])
    b.custom("om.reflections.recorded", {"reflections": [reflection], "coversUpToId": ids["start"]})
    b.assistant("Sure, tell me what you have.")
    b.compaction("summary the extension rendered", ids["start"], details={
        "type": "om.folded", "version": 1, "fullFold": False, "observations": imported, "reflections": [reflection]},
        from_hook=True)
    ids["user"] = b.user("Here are my credentials:\n" + "\n".join(_texts(0)))
    ids["assistant"] = b.assistant(
        "I will check the database.", thinking="The user pasted these; do not repeat them:\n" + "\n".join(_texts(1)),
        tool_calls=[("call_1", "bash", {"command": " && ".join(_texts(2)[:4])}),
                    ("call_2", "write", {"path": ".env", "content": "\n".join(_texts(2)[4:]) + "\n"})])
    ids["tool"] = b.tool_result("call_1", "bash", "\n".join(_texts(3)))
    b.tool_result("call_2", "write", "Wrote .env")
    ids["bash"] = b.bash("env | grep -i secret", "\n".join(_texts(4)))
    ids["custom"] = b.custom_message("deploy-notes", "Deploy notes:\n" + "\n".join(_texts(5)))
    ids["branch"] = b.branch_summary("Tried another approach with these settings:\n" + "\n".join(_texts(6)))
    ids["done"] = b.assistant("Connected to the orders database. Done.")
    ids["after"] = b.user("Now please run the migrations.")
    b.assistant("Migrations ran.")
    return b, ids


def assert_no_secret(text: str, where: str) -> None:
    leaked = [kind for kind, _, secret in SECRETS for part in secret_parts(secret) if part in text]
    assert not leaked, f"secrets leaked to {where}: {sorted(set(leaked))}"


def all_summaries(db_path, tmp_path) -> list[str]:
    """Every compaction summary om can produce for the session: simulated ones stored by a replay,
    `om compact` at each entry, and the visible memory's."""
    from om_core.memory.views import view
    from om_core.memory.compaction import compact

    summaries = []
    with dbmod.reading(db_path) as con:
        summaries += [r[0] for r in con.execute("SELECT summary FROM om_internal.compactions WHERE summary IS NOT NULL "
                                                "AND origin = 'simulated'").fetchall()]
        entry_ids = [r[0] for r in con.execute("SELECT entry_id FROM entries WHERE session_id = ? AND entry_type "
                                               "= 'message'", [SID]).fetchall()]
    for first_kept in entry_ids:
        for pool in (10, 20_000):  # a normal and a full fold
            result = compact(workspace(db_path), SID, first_kept, None, pool)
            if result.summary:
                summaries.append(result.summary)
    for kind in ({"full": False}, {"full": True}, {"replayed": True}):
        summary = view(workspace(db_path), SID, None, **kind).memory.summary()
        if summary:
            summaries.append(summary)
    return summaries


def test_no_secret_reaches_the_model_or_a_summary_and_recall_shows_the_original(server, tmp_path, db_path):
    b, ids = leaky_session()
    path = b.write(tmp_path / "leaky.jsonl")
    ingest(workspace(db_path), [path])
    content = "User shared credentials for the orders database."
    server.add(tool_call("record_observations", {"observations": [
        {"timestamp": "2026-01-15 14:01", "content": content, "relevance": "high",
         "sourceEntryIds": [ids["user"], ids["tool"]]}]}))
    outcome = observe_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert outcome.outcome == "recorded"
    server.add(text("nothing durable"))
    reflect_now(Workspace.open(db_path, settings=Settings()), SID, None, config(server))
    assert len(server.requests) >= 2

    sent = server.sent_text()
    for where in ("user", "assistant", "tool", "bash", "custom", "branch"):
        assert f"[{ids[where]} " in sent  # every place was in the observer's chunk
    assert "User shared: " in sent  # the imported observations were in the reflector's input
    assert_no_secret(sent, "the model")
    assert sent.count("[REDACTED:") >= len(SECRETS) - 2
    assert "postgres://orders_app:[REDACTED:" in sent  # context kept around the marker
    for summary in all_summaries(db_path, tmp_path):
        assert_no_secret(summary, "a compaction summary")

    # recall shows the exact original text locally
    found = recall(workspace(db_path), mid(content), SID)
    local = "\n".join(s.text for s in found.observations[0].sources)
    for text_ in _texts(0) + _texts(3):
        assert text_ in local

    # the stored session is untouched
    lines = path.read_text().splitlines()[1:]
    with dbmod.reading(db_path) as con:
        raws = [r[0] for r in con.execute("SELECT raw FROM entries WHERE session_id = ? ORDER BY entry_id",
                                          [SID]).fetchall()]
    assert sorted(json.dumps(json.loads(r), sort_keys=True) for r in raws) == sorted(
        json.dumps(json.loads(line), sort_keys=True) for line in lines)
    assert any(_texts(0)[0] in r for r in raws)


def test_offline_baseline_summaries_hold_no_secret(tmp_path, db_path):
    """The extractive observer quotes the session; a replay folds its excerpts into compactions."""
    from om_core.replay.engine import replay_session
    from om_core.workers.run_config import make_brain

    b, _ = leaky_session()
    ingest(workspace(db_path), [b.write(tmp_path / "leaky.jsonl")])
    settings = Settings(observeAfterTokens=50, reflectAfterTokens=100, compactAfterTokens=200, keepRecentTokens=50,
                        observationsPoolMaxTokens=400, observationsPoolTargetTokens=200)
    con = dbmod.connect(db_path)
    try:
        replay_session(Workspace.on_connection(con, settings), SID, make_brain(ModelConfig(model="offline"), settings))
    finally:
        con.close()
    with dbmod.reading(db_path) as con:
        offline_contents = [r[0] for table in ("observations", "reflections") for r in con.execute(
            f"SELECT o.content FROM {table} o JOIN ledger r USING (session_id, ledger_id) "
            "WHERE r.origin = 'pipeline' AND o.session_id = ?", [SID]).fetchall()]
    assert any(c.startswith("User required:") or c.startswith("User requested:") for c in offline_contents)
    assert_no_secret("\n".join(offline_contents), "the offline baseline's observations")
    summaries = all_summaries(db_path, tmp_path)
    assert summaries
    for summary in summaries:
        assert_no_secret(summary, "a compaction summary")


def test_with_redaction_off_the_secret_is_sent(server, tmp_path, db_path):
    b, _ = leaky_session()
    ingest(workspace(db_path), [b.write(tmp_path / "leaky.jsonl")])
    server.add(text("nothing"))
    observe_now(Workspace.open(db_path, settings=Settings(redactSecrets=False)), SID, None, config(server))
    sent = server.sent_text()
    assert _group(0)[0][2] in sent
    assert "[REDACTED:" not in sent


def test_reflector_prompt_is_redacted_too(server, tmp_path, db_path):
    """The offline observer quotes the user verbatim into local memory; a model reflector must still
    receive only the marker."""
    b = SessionBuilder(SID)
    key = "sk-" + "Abc123Def456Ghi789Jkl012Mno345Pqr678Stu901Vwx"
    b.user(f"You must always use the key {key} for the staging account.")
    b.assistant("Understood.")
    ingest(workspace(db_path), [b.write(tmp_path / "s.jsonl")])
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
    ingest(workspace(db_path), [b.write(tmp_path / "s.jsonl")])
    server.add(text("nothing"))
    observe_now(Workspace.open(db_path, settings=Settings(observerChunkMaxTokens=256)), SID, None, config(server))
    sent = server.sent_text()
    assert "characters omitted from the middle of this entry" in sent  # the excerpt was used
    assert "-----END RSA PRIVATE KEY-----" in sent or "[REDACTED:" in sent
    leaked = [line for line in key_lines if line in sent]
    assert leaked == [], f"{len(leaked)} of {len(key_lines)} private key lines were sent to the model"


# ------------------------------------------------------------------ identifiers end to end


EXAMPLE_SECRETS = {"qk_live_4f9a2c7e1b8d6035a9e2", "qk_live_2b81f0c4d7e95a36c1f8", "qk_live_0123456789abcdef0123",
                   "qk_test_fedcba9876543210"}  # the harbor example's hard-coded partner tokens and fixtures


def test_on_the_examples_every_redaction_is_a_secret_and_every_secret_is_redacted():
    """The example sessions quote paths, ids, placeholders (`api_token="test-token"`, `sk-...`) and
    four secret-shaped partner tokens: exactly the tokens go, each wherever it occurs."""
    from pathlib import Path

    from om_core.redaction.redact import secret_spans
    from om_core.pi.source_text import entry_text

    redacted, occurrences = [], 0
    for path in sorted((Path(__file__).parent.parent / "examples" / "sessions").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            obj = json.loads(line)
            if obj.get("type") in ("message", "custom_message", "branch_summary"):
                observed = entry_text(obj["type"], obj, tool_call_ids=False)
                redacted += [(observed[a:b], kind) for a, b, kind in secret_spans(observed)]
                occurrences += sum(observed.count(s) for s in EXAMPLE_SECRETS)
    assert {value for value, _ in redacted} == EXAMPLE_SECRETS
    assert {kind for _, kind in redacted} == {"live-key"}
    assert len(redacted) == occurrences == 14


USER_HEADER = re.compile(r"^\[([0-9a-f]{8}) User \d{2}:\d{2}\]", re.MULTILINE)


class QuotingWorkers(ScriptedWorkers):
    """The fake model as the observer prompt asks it to be: every line of its chunk that holds a
    corpus identifier is copied into an observation exactly; other stages answer as ScriptedWorkers."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def _first_turn(self, body: dict) -> Reply:
        user = body["messages"][1]["content"]
        quoted = [line for line in self.lines if line in user] if stage_of(body) == "observer" else []
        if not quoted:
            return super()._first_turn(body)
        first, last = CHUNK.search(user).groups()
        # a note of what the user wrote cites the user's message holding the line (the check refuses
        # a "User …" note that cites no message of the user's)
        return tool_call("record_observations", {"observations": [
            {"timestamp": "2026-01-15 14:00", "content": f"User wrote: {line}", "relevance": "high",
             "sourceEntryIds": [self._user_entry(user, line) or first, last]} for line in quoted]})

    @staticmethod
    def _user_entry(user: str, line: str) -> str | None:
        """The id of the user message the line is quoted from (the last user header before it)."""
        task = user.find("## Task")  # the entries, not the memory (which may quote the line already)
        headers = [m for m in USER_HEADER.finditer(user, task, user.find(line, task))]
        return headers[-1].group(1) if headers else None


def identifier_session() -> tuple[SessionBuilder, list[str]]:
    """A session whose user lines hold every corpus identifier right after a secret-ish word or in
    prose, a tool result holding every secret, and the extension's imported observations quoting both."""
    from secret_corpus import IDENTIFIERS, PROSE, SECRET_WORDS

    lines = []
    for i, (_, value) in enumerate(IDENTIFIERS):
        word = SECRET_WORDS[i % len(SECRET_WORDS)]
        # each prose line names a file of its own: the same sentence with another value would be a changed
        # state the observer's check refuses (om_core.workers.near_duplicates), not what this test is about
        lines.append(f"{word} {value}" if i % 2 else
                     f"{PROSE[2 + i % (len(PROSE) - 2)].format(v=value, w=word)} (s{i}.md)")
    b = SessionBuilder(SID)
    first = b.user("Let's tidy up the secret handling of the harbor service.")
    imported_lines = [f"Imported: {line}" for line in lines] + [f"Imported: {t}" for t in _texts(0) + _texts(1)]
    b.custom("om.observations.recorded", {"observations": [
        {"id": mid(c), "content": c, "timestamp": "2026-01-15 14:01", "relevance": "high", "sourceEntryIds": [first],
         "tokenCount": 30} for c in (line.replace("\n", " ") for line in imported_lines)], "coversUpToId": first})
    b.assistant("Sure.")
    for n, line in enumerate(lines):
        b.user(line)
        if n % 8 == 7:
            b.assistant("Noted.", tool_calls=[(f"call_{n}", "bash", {"command": "env"})])
            b.tool_result(f"call_{n}", "bash", "\n".join(fill(t, s) for _, t, s in SECRETS[n:n + 12]))
        else:
            b.assistant("Noted.")
    b.user("That is all for today.")
    b.assistant("Done.")
    return b, lines


@pytest.mark.prefect
def test_om_run_sends_every_identifier_verbatim_and_om_compact_keeps_them(prefect_api, tmp_path):
    """`om run` with the fake model server: every corpus identifier reaches the
    recorded observer prompts verbatim and no secret does; `om compact`'s summary keeps every
    identifier (from the model's observations and the extension's) and holds no secret."""
    import os
    import subprocess
    import sys

    from fake_openai import prompt_text

    b, lines = identifier_session()
    path = b.write(tmp_path / "ids.jsonl")
    db = tmp_path / "om.duckdb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OM_")}
    env.update({"PREFECT_API_URL": prefect_api, "OM_OBSERVE_AFTER_TOKENS": "300",
                "OM_OBSERVER_CHUNK_MAX_TOKENS": "800", "COLUMNS": "200", "OPENAI_API_KEY": "not-needed"})

    def om(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flows.cli", "--db", str(db), *args], env=env,
                              capture_output=True, text=True, timeout=300)

    with FakeOpenAI(responder=QuotingWorkers(lines)) as fake:
        done = om("run", str(path), "--model", "openai/fake-model", "--api-base", fake.base_url)
        sent = [prompt_text(r) for r in fake.requests]
    assert done.returncode == 0, done.stderr[-3000:]
    listed = om("logs", "--json", "--full", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    recorded = [prompt_text(c["request"]) for c in json.loads(listed.stdout)]
    assert sorted(recorded) == sorted(sent)
    observer = "\n".join(p for p in recorded if "## New entries (" in p)
    lost = [line for line in lines if line not in observer]
    assert not lost, f"{len(lost)} of {len(lines)} identifier lines did not reach the observer verbatim: {lost[:5]}"
    assert_no_secret("\n".join(recorded), "the recorded prompts")
    assert "[REDACTED:" in observer

    first_kept = b.entries[-2]["id"]
    compacted = om("compact", SID, "--first-kept", first_kept, "--json")
    assert compacted.returncode == 0, compacted.stderr
    summary = json.loads(compacted.stdout)["summary"]
    missing = [f"{source}: {line}" for line in lines for source in ("User wrote", "Imported")
               if f"{source}: {line}" not in summary]
    assert not missing, f"{len(missing)} identifier lines not in the om compact summary: {missing[:5]}"
    assert "Imported: " + _texts(0)[0].split("\n")[0][:10] in summary  # the secrets' lines are there, redacted
    assert_no_secret(summary, "the om compact summary")



def test_a_payload_is_redacted_once_and_the_same_as_redact(monkeypatch):
    """redact_payload gives redact's text, keeps it for the next stage, and keeps nothing over its bound."""
    from om_core.redaction.redact import redact_payload

    module = sys.modules[redact_payload.__module__]  # the module whose globals it reads
    memory = "- [high] The deploy key is sk-live-" + "4f9c2a7b1e8d3c6f5a0b9e2d7c4f1a3b" + " for staging.\n" * 40
    plain = "Nothing secret here, only the selectors of region r1 moving to table sel_1.\n" * 40
    monkeypatch.setattr(module, "_memo", {})
    monkeypatch.setattr(module, "_memo_chars", 0)
    for _ in range(3):
        assert module.redact_payload(memory) == redact(memory) != memory
        assert module.redact_payload(plain) == plain
    assert set(module._memo) == {memory, plain}  # kept once each, for the next stage
    monkeypatch.setattr(module, "PAYLOAD_MEMO_CHARS", 100)
    assert module.redact_payload(memory + "x") == redact(memory + "x")  # too large for the memo: not kept
    assert memory + "x" not in module._memo


def test_the_copied_provider_shapes_are_the_installed_plugins():
    """Redaction runs detect-secrets' provider shapes from a copy (no detect-secrets import on a live
    compaction's path): the copy must be what the installed plugins hold."""
    from om_core.redaction.provider_shapes import SHAPES, current
    from om_core.redaction.rules import _PLUGINS

    assert [(module, name) for module, name, _, _ in SHAPES] == [(module, name) for module, name, _ in _PLUGINS]
    assert SHAPES == current()
