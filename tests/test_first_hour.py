"""A new user's first hour, through the installed `om` entry point (the console script of this
environment, in a process of its own): every command shows what exists and says what it is."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "sessions"
OM = Path(sys.executable).parent / "om"  # what `pip install` put on PATH
# the demo's thresholds (Makefile: DEMO_ENV): the small samples then get every worker and a compaction
DEMO_ENV = {"OM_OBSERVE_AFTER_TOKENS": "4000", "OM_REFLECT_AFTER_TOKENS": "8000", "OM_COMPACT_AFTER_TOKENS": "30000",
            "OM_OBSERVATIONS_POOL_MAX_TOKENS": "3000"}
OFFLINE = "offline baseline (extractive rules, no model)"


def env_for(home: Path, **extra: str) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_API_URL"))}
    return {**env, "HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "COLUMNS": "120", **extra}


def om(*args: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    if not OM.exists():
        pytest.skip(f"{OM} is not installed (pip install -e . puts it there)")
    return subprocess.run([str(OM), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo(tmp_path_factory, prefect_api):
    """examples/sessions run once with the offline baseline and the demo's thresholds: (db, env, run)."""
    root = tmp_path_factory.mktemp("first-hour")
    folder = root / "sessions"
    shutil.copytree(EXAMPLES, folder)
    env = env_for(root / "home", PREFECT_API_URL=prefect_api, **DEMO_ENV)
    db = root / "om.duckdb"
    if not OM.exists():
        pytest.skip(f"{OM} is not installed (pip install -e . puts it there)")
    # piped, as a log or a pipe would take it: stderr read as it comes (--db after the command)
    proc = subprocess.Popen([str(OM), "run", str(folder), "--db", str(db)], cwd=root, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines, ended_first = [], None
    for line in proc.stderr:
        lines.append(line)
        if ended_first is None and " done: " in line:
            ended_first = proc.poll() is None  # a session's end said while the run still runs
    stdout = proc.stdout.read()
    proc.wait(600)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "".join(lines))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    done.ended_first_while_running = ended_first
    return db, env, done, folder


@pytest.mark.prefect
def test_the_run_summary_names_the_database_and_says_the_memory_is_offline(demo):
    db, _, done, _ = demo
    assert f"memory in {db}" in done.stdout
    assert "memory by the offline baseline" in done.stdout


@pytest.mark.prefect
def test_om_run_piped_says_its_progress_as_it_goes_and_names_each_session_by_its_file(demo):
    _, _, done, _ = demo
    for name in ("5b0e7c1a tidewatch-units", "8e3f1d26 harbor-sync-long", "c2a9e4d7 budgetbox-duckdb"):
        assert f"replaying {name}" in done.stderr, done.stderr[-2000:]
        assert re.search(rf"^{name} done: \d+ stages? recorded memory, 0 model calls, \d+ compactions? "
                         r"\(\d of 3 sessions, \d+:\d\d elapsed\)$", done.stderr, re.MULTILINE), done.stderr[-2000:]
    assert done.ended_first_while_running  # as it goes, not all at the end
    header = next(line for line in done.stdout.splitlines() if "observations" in line)
    assert re.search(r"session\s+\S\s+file\s+\S\s+observations", header), header
    row = next(line for line in done.stdout.splitlines() if "5b0e7c1a" in line)
    assert "tidewatch-units" in row


@pytest.mark.prefect
def test_om_run_json_names_each_session_by_its_file(tmp_path, prefect_api):
    (tmp_path / "s").mkdir()
    shutil.copy(EXAMPLES / "tidewatch-units.jsonl", tmp_path / "s" / "tidewatch-units.jsonl")
    env = env_for(tmp_path / "home", PREFECT_API_URL=prefect_api)
    done = om("run", "s", "--json", "--db", "om.duckdb", cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["sessions"]
    assert row["file"] == str(tmp_path / "s" / "tidewatch-units.jsonl")
    assert done.stderr.count("\n") <= 2, done.stderr  # --json: no progress lines, only the model's


@pytest.mark.prefect
def test_a_run_leaves_no_lock_file_nor_an_empty_stage_results_folder(demo):
    db, _, _, _ = demo
    assert db.is_file()
    assert not db.with_name(db.name + ".lock").exists()
    assert not db.with_name(db.name + ".stage-results").exists()


@pytest.mark.prefect
def test_om_view_shows_what_exists_and_labels_it(demo):
    db, env, _, folder = demo
    # the long sample: no om.folded compaction of its own, but the replay simulated some
    long = om("view", str(folder / "harbor-sync-long.jsonl"), "--db", str(db), cwd=folder, env=env)
    assert long.returncode == 0, long.stderr
    assert "## Observations" in long.stdout and re.search(r"^\[[0-9a-f]{12}\] ", long.stdout, re.MULTILINE)
    assert "showing the replayed view" in long.stderr and "what the extension would have shown" in long.stderr
    assert OFFLINE in long.stderr
    # a short sample the replay never compacted: full memory, labelled
    short = om("view", str(folder / "tidewatch-units.jsonl"), "--db", str(db), cwd=folder, env=env)
    assert short.returncode == 0, short.stderr
    assert "## Observations" in short.stdout and "showing full memory" in short.stderr
    assert "is empty" not in short.stderr and OFFLINE in short.stderr
    # --json keeps to the view asked for (scripts read exactly what they asked)
    asked = json.loads(om("view", str(folder / "tidewatch-units.jsonl"), "--json", "--db", str(db), cwd=folder,
                          env=env).stdout)
    assert asked["observations"] == [] and asked["reflections"] == []


@pytest.mark.prefect
def test_om_compact_says_the_memory_is_offline(demo):
    db, env, _, folder = demo
    done = om("--db", str(db), "compact", str(folder / "harbor-sync-long.jsonl"), cwd=folder, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() and OFFLINE in done.stderr


@pytest.mark.prefect
def test_the_report_says_the_memory_is_offline_and_prints_to_stdout(demo):
    db, env, _, folder = demo
    done = om("report", "--out", "-", "--db", str(db), cwd=folder, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<!DOCTYPE html>") and 'class="offline-note"' in done.stdout
    assert done.stdout.count('class="tag offline"') == 3
    assert not (folder / "-").exists()


@pytest.mark.prefect
def test_om_export_out_dash_writes_the_session_file_to_stdout(demo):
    db, env, _, folder = demo
    done = om("export", str(folder / "tidewatch-units.jsonl"), "--out", "-", "--db", str(db), cwd=folder, env=env)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["type"] == "session" and any(line.get("customType", "").startswith("om.") for line in lines)
    assert "to standard output" in done.stderr and not (folder / "-").exists()


@pytest.mark.prefect
def test_the_offline_baseline_ends_its_excerpts_where_a_phrase_ends(demo):
    db, env, _, folder = demo
    done = om("sql", "--json", "SELECT content FROM observations UNION ALL SELECT content FROM reflections",
              "--db", str(db), cwd=folder, env=env)
    contents = [row["content"] for row in json.loads(done.stdout)]
    assert len(contents) > 100
    for content in contents:
        assert not re.search(r"\s[.,;:]$", content), content  # "that includes ." : a sentence cut at ".env"
        if content.endswith("…"):
            assert re.search(r"[.!?,;:)\w] …$", content), content


def test_a_sentence_is_never_cut_inside_a_phrase():
    from om_core.workers.offline import _constraint_sentences, one_line

    # a dotted token (".env") ends no sentence; a sentence opening with a conjunction continues the one before
    said = "Never commit secrets, and that includes .env files. And placeholders must not match the pattern."
    assert _constraint_sentences(said) == [said]
    said = ("Replace it with a placeholder. No allow-list mechanism: an ignore marker is exactly what someone will "
            "paste next to a real token one day. And placeholders must not match the pattern.")
    [kept] = _constraint_sentences(said)
    assert kept.startswith("No allow-list mechanism") and kept.endswith("And placeholders must not match the pattern.")
    # a fragment with no sentence before it to join has lost its antecedent: it is left out
    assert _constraint_sentences("And placeholders must not match the pattern.") == []
    long = ("Read through it and tell me how a sync run works, what the watermark does, and what looks fragile. "
            "Don't change anything yet. ") * 4
    cut = one_line(long, 200)
    assert cut.endswith(". …") and long.startswith(cut[:-2])  # after a whole sentence
    run_on = "first the ledger, then the fold, then the projection, " * 10
    cut = one_line(run_on, 120)
    assert cut.endswith("projection …") or cut.endswith("fold …") or cut.endswith("ledger …"), cut
    # a cut between words never ends on a connective
    words = "the ledger and the fold and the projection and the summary and the " * 10
    cut = one_line(words.replace(",", ""), 100)
    assert not re.search(r"\b(and|the) …$", cut), cut


def test_a_report_of_what_happened_is_no_constraint_and_an_instruction_is():
    from om_core.workers.offline import _constraint_sentences, observe_entries
    from om_core.workers.inputs import SourceEntry
    from om_core.workers.sentences import is_absolute, is_directive

    report = ("Last night's runs each synced exactly 100 bookings, but the partner dashboard shows 340 bookings "
              "changed yesterday evening, and the office says bk_04127 (a change of berth for the \"Seeschwalbe\") "
              "never showed up.")
    assert not is_directive(report) and not is_absolute(report) and _constraint_sentences(report) == []
    for said in ("Never commit secrets, and that includes .env files.",
                 "Unstage .env right now, add it to .gitignore, and don't put the live token into any file.",
                 "Placeholders must not match the pattern.", "I never want a force push on main."):
        assert is_directive(said) and is_absolute(said), said
    assert is_directive("Make sure the tests pass first.") and not is_absolute("Make sure the tests pass first.")
    assert not is_directive("The deploy always failed on Fridays.")
    told = {"type": "message", "message": {"role": "user", "content": "Funny you say that. " + report}}
    entry = SourceEntry(entry_id="a1", position=1, timestamp="2026-02-03 09:00", entry_type="message", role="user",
                        tokens=90, obj=told)
    [seen] = observe_entries([entry])
    assert not seen["content"].startswith("User required:"), seen


def test_an_empty_folder_claims_no_replay_and_creates_no_database(tmp_path):
    (tmp_path / "empty").mkdir()
    env = env_for(tmp_path / "home")
    done = om("run", "empty", "--db", "om.duckdb", cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "nothing changed" not in done.stdout + done.stderr
    assert "no Pi session files" in done.stdout
    assert not (tmp_path / "om.duckdb").exists() and not (tmp_path / "om.duckdb.lock").exists()


def test_a_file_that_is_no_session_is_not_counted_as_ingested(tmp_path):
    (tmp_path / "notes.jsonl").write_text('{"level": "info", "msg": "hello"}\n')
    env = env_for(tmp_path / "home")
    done = om("ingest", "notes.jsonl", "--db", "om.duckdb", cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 1
    assert "ingested 1 file" not in done.stdout and "no session file ingested" in done.stdout
    assert "not a Pi session file" in done.stderr
    run = om("run", "notes.jsonl", "--db", "om.duckdb", cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 1 and "nothing changed" not in run.stdout and "not a Pi session file" in run.stderr


def test_db_is_taken_before_or_after_the_command_and_named(tmp_path):
    env = env_for(tmp_path / "home")
    ingest = om("ingest", str(EXAMPLES / "tidewatch-units.jsonl"), "--db", "mine.duckdb", cwd=tmp_path, env=env,
                timeout=120)
    assert ingest.returncode == 0, ingest.stderr
    assert "into mine.duckdb" in ingest.stdout
    for args in (["--db", "mine.duckdb", "sessions", "--json"], ["sessions", "--json", "--db", "mine.duckdb"],
                 ["sessions", "--db=mine.duckdb", "--json"]):
        done = om(*args, cwd=tmp_path, env=env, timeout=120)
        assert done.returncode == 0, (args, done.stderr)
        assert [s["session_id"][:8] for s in json.loads(done.stdout)] == ["5b0e7c1a"], args
    config = om("config", "--db", "mine.duckdb", cwd=tmp_path, env=env, timeout=120)
    assert config.stdout.startswith("database: mine.duckdb (--db)"), config.stdout[:200]
    data = json.loads(om("config", "--json", cwd=tmp_path, env={**env, "OM_DB": "other.duckdb"}, timeout=120).stdout)
    assert data["database"] == {"path": "other.duckdb", "exists": False, "source": "OM_DB"}
    # a value after `--` is an argument, never the option
    from flows.cli.launch import global_options_first

    assert global_options_first(["sql", "--", "--db"]) == ["sql", "--", "--db"]
    assert global_options_first(["--db", "a", "view", "S", "--config", "c.toml"]) == [
        "--db", "a", "--config", "c.toml", "view", "S"]


@pytest.mark.prefect
def test_om_status_without_a_session_shows_every_session(demo):
    db, env, _, folder = demo
    done = om("status", "--db", str(db), cwd=folder, env=env)
    assert done.returncode == 0, done.stderr
    for name in ("harbor-sync-long", "tidewatch-units", "budgetbox-duckdb"):
        assert name in done.stdout
    assert "offline baseline" in done.stdout and "nothing to do" in done.stdout and f"database {db}" in done.stdout
    rows = json.loads(om("status", "--json", "--db", str(db), cwd=folder, env=env).stdout)
    assert len(rows) == 3 and all(r["offline"] and not r["next_run_replays"] for r in rows)
    assert sum(r["observations"] for r in rows) > 90  # the active memory of three sessions, not an empty one


@pytest.mark.prefect
def test_om_search_kind_keeps_to_the_kinds_asked_and_ranks_them_anew(demo):
    db, env, _, folder = demo
    everything = json.loads(om("search", "watermark", "--json", "--limit", "50", "--db", str(db), cwd=folder,
                               env=env).stdout)["hits"]
    assert {h["kind"] for h in everything} >= {"entry", "observation"}
    only = json.loads(om("search", "watermark", "--kind", "reflection", "--kind", "observation", "--json",
                         "--db", str(db), cwd=folder, env=env).stdout)["hits"]
    assert only and {h["kind"] for h in only} <= {"reflection", "observation"}
    assert [h["rank"] for h in only] == list(range(1, len(only) + 1))
    expected = [h["memory_id"] for h in everything if h["kind"] in ("reflection", "observation")]
    assert [h["memory_id"] for h in only] == expected[:len(only)]
    bad = om("search", "watermark", "--kind", "bogus", "--db", str(db), cwd=folder, env=env)
    assert bad.returncode == 2 and "'bogus' is not one of" in bad.stderr


@pytest.mark.prefect
@pytest.mark.parametrize("columns", [120, 72])
def test_om_search_prints_one_block_per_hit_within_the_width(demo, columns):
    db, env, _, folder = demo
    env = {**env, "COLUMNS": str(columns)}
    hits = json.loads(om("search", "watermark", "--json", "--db", str(db), cwd=folder, env=env).stdout)["hits"]
    assert {h["kind"] for h in hits} >= {"entry", "observation"}
    done = om("search", "watermark", "--db", str(db), cwd=folder, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns, max(lines, key=len)
    blocks = [block.replace("\n   ", " ") for block in done.stdout.strip().split("\n\n")]  # one per hit
    assert len(blocks) == len(hits)
    for hit, block in zip(hits, blocks):
        assert block.startswith(f"{hit['rank']}. {hit['kind']} · "), block
        assert (hit["memory_id"] or hit["entry_id"]) in block, block
        if hit["session_id"]:
            assert hit["session_id"][:8] in block and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", block), block
    # each hit's text below its header, the match in it
    assert sum("watermark" in block.lower() for block in blocks) >= len(hits) // 2


@pytest.mark.prefect
@pytest.mark.real_sessions
def test_the_offline_memory_of_the_five_sample_files_reads_as_whole_sentences(tmp_path, prefect_api):
    from conftest import shared_session

    folder = tmp_path / "sessions"
    shutil.copytree(EXAMPLES, folder)
    for name in ("before-compaction.jsonl", "large-session.jsonl"):
        shutil.copy(shared_session(name), folder / name)
    env = env_for(tmp_path / "home", PREFECT_API_URL=prefect_api, **DEMO_ENV)
    done = om("run", str(folder), "--db", "om.duckdb", cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    notes = []
    for session in sorted(folder.glob("*.jsonl")):
        view = om("view", str(session), "--full", "--db", "om.duckdb", cwd=tmp_path, env=env)
        assert view.returncode == 0, view.stderr
        notes += re.findall(r"^\[[0-9a-f]{12}\] (.*)$", view.stdout, re.MULTILINE)
    assert len(notes) > 300
    for note in notes:
        assert not re.search(r"\s[.,;:]$", note), note  # a sentence cut at a dotted token (".env")
        assert not re.search(r"\b(and|or|but|the|to|of|with) …$", note), note  # a cut after a connective
    constraints = [n.split(": ", 1)[1] for n in notes if n.startswith("Standing user constraint: ")]
    assert constraints
    for said in constraints:
        assert not re.match(r"(and|but|or|so)\b", said, re.IGNORECASE), said  # a fragment without its antecedent
        # a report of what happened ("... never showed up") is no constraint
        assert not re.search(r"\bnever (\w+ed|showed|came|ran|got|went|did|was|were)\b", said, re.IGNORECASE), said
    assert any(".env files" in said for said in constraints)


# In the page once it is laid out: the cards' values, the lines that say why some are missing, and how
# many lines each file name takes in the overview.
_LOOKED_AT = """<script>window.addEventListener('load', () => {
  const overview = document.querySelector('#overview');
  const said = sel => [...overview.querySelectorAll(sel)].map(p => p.textContent.trim());
  const p = document.createElement('pre'); p.id = 'looked-at';
  p.textContent = JSON.stringify({
    cards: [...document.querySelectorAll('.card .value')].map(v => v.textContent.trim()),
    calls: said('.no-model-calls'), everywhere: said('.everywhere'),
    files: [...overview.querySelectorAll('td .file')].map(f =>
      Math.round(f.getBoundingClientRect().height / parseFloat(getComputedStyle(f).lineHeight)))});
  document.body.appendChild(p); });</script>"""


@pytest.mark.prefect
def test_the_report_looked_at_in_chromium_shows_no_empty_card_and_says_why(demo, tmp_path):
    """`om report` on the offline demo, in a real headless Chromium: no card of 0 or n/a, a line saying
    the offline baseline made no model call, the difference from `om run`'s counts said up front, file
    names on one line, and a screenshot of the window's size."""
    browser = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if browser is None:
        pytest.skip("no headless Chromium on this machine (apt-get install chromium)")
    db, env, _, folder = demo
    done = om("report", "--out", str(tmp_path / "report"), "--db", str(db), cwd=folder, env=env)
    assert done.returncode == 0, done.stderr
    index = tmp_path / "report" / "index.html"
    page = index.with_name("looked-at.html")
    page.write_text(index.read_text(encoding="utf-8").replace("</body>", _LOOKED_AT + "</body>"), encoding="utf-8")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600",
             "--virtual-time-budget=5000"]
    dom = subprocess.run([*flags, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    assert '<pre id="looked-at">' in dom.stdout, (dom.stdout + dom.stderr)[-2000:]
    seen = json.loads(dom.stdout.split('<pre id="looked-at">', 1)[1].split("</pre>", 1)[0])
    assert seen["cards"] and not {"0", "n/a", "0 / 0"} & set(seen["cards"]), seen["cards"]
    assert seen["calls"] == ["No model calls: the offline baseline (extractive rules, no model) wrote the memory: no "
                             "tokens, no cost."]
    [everywhere] = seen["everywhere"]  # budgetbox-duckdb has two branches: its other one's records
    assert everywhere.startswith("Why these counts are not om run's: it counts every record it appends, on every "
                                 "branch"), everywhere
    assert len(seen["files"]) == 3 and set(seen["files"]) == {1}, seen["files"]
    png = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={png}", index.resolve().as_uri()], capture_output=True, timeout=120)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert struct.unpack(">II", data[16:24]) == (1280, 1600)  # the IHDR chunk: the window's size
