"""`om report`: the static HTML page is well-formed XHTML, shows every session with
its memory charts, compaction markers by gap class and model-call totals, says so when a session has
no memory yet, and renders to PNG when a headless Chromium is at hand."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

import pytest

from builders import SessionBuilder
from conftest import workspace
from om_core.store import db as dbmod
from om_core.errors import SessionNotFound
from om_core.ingest import ingest
from om_core.replay.engine import replay_session
from om_core.report import GAP_CLASSES, build_report, fmt_cost, fmt_short, nice_max, ticks
from om_core.settings import Settings
from om_core.store.workspace import Workspace
from om_core.workers.run_config import ModelConfig, make_brain

WORKED = "a0000000-0000-4000-8000-00000000000a"
QUIET = "b0000000-0000-4000-8000-00000000000b"
SVG = "{http://www.w3.org/2000/svg}"
SETTINGS = Settings(observeAfterTokens=150, reflectAfterTokens=400, compactAfterTokens=900, keepRecentTokens=200,
                    observationsPoolMaxTokens=600, observationsPoolTargetTokens=300)


def worked_session() -> SessionBuilder:
    """A session the offline baseline has plenty to say about, with one compaction of Pi's own."""
    b = SessionBuilder(WORKED, cwd="/home/dev/<orders> & co")
    b.user("We must always use PostgreSQL 16 for the orders service.")
    kept = None
    for n in range(1, 25):
        b.user(f"Please make step {n} of the migration: rename column c{n} in table orders_{n}.")
        b.assistant(None, tool_calls=[(f"c{n}", "edit", {"path": f"src/orders_{n}.py", "oldText": f"c{n}",
                                                         "newText": f"col_{n}"})])
        if n % 5 == 0:
            b.tool_result(f"c{n}", "edit", f"Error: could not find the exact text in src/orders_{n}.py",
                          is_error=True)
        else:
            b.tool_result(f"c{n}", "edit", "Applied 1 edit.")
        b.bash(f"pytest -q tests/test_orders_{n}.py", f"{n} failed, 3 passed" if n % 4 == 0 else "4 passed",
               1 if n % 4 == 0 else 0)
        b.assistant(f"Renamed c{n} to col_{n} in src/orders_{n}.py and ran the tests for step {n}.")
        if n == 12:
            kept = b.user("No, that's wrong: the column must be called col_12_new, fix it.")
            b.assistant("Understood, col_12_new it is.")
        if n == 16:
            b.compaction("Earlier: steps 1 to 15 of the migration.", kept, tokens_before=4_000)
    return b


def quiet_session() -> SessionBuilder:
    b = SessionBuilder(QUIET, start="2026-02-01T09:00:00")
    b.user("Hello there.")
    b.assistant("Hi.")
    return b


def add_model_calls(path: Path) -> None:
    """The offline baseline makes no model calls: record a few as a model brain would."""
    rows = [("k1", "observer", 1200, 300, 100, 0.0125, "ok"), ("k2", "observer", 800, 200, None, None, "error"),
            ("k3", "reflector", 2000, 500, 400, 0.03, "ok")]
    with dbmod.writing(path) as con:
        for call_id, stage, tin, tout, cached, cost, status in rows:
            con.execute(
                "INSERT INTO om_internal.llm_calls (call_id, run_id, stage_run_id, session_id, stage, model, turn, input_tokens, "
                "output_tokens, cached_tokens, cost, latency_ms, status, attempt, started_at) "
                "VALUES (?, 'run', 'stage-run', ?, ?, 'anthropic/claude-haiku-4-5', 1, ?, ?, ?, ?, 900, ?, 1, ?)",
                [call_id, WORKED, stage, tin, tout, cached, cost, status, datetime.now(timezone.utc)])


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("report")
    path = root / "om.duckdb"
    ingest(workspace(path), [worked_session().write(root / "worked.jsonl"), quiet_session().write(root / "quiet.jsonl")])
    con = dbmod.connect(path)
    try:
        brain = make_brain(ModelConfig(model="offline"), SETTINGS)
        replay_session(Workspace.on_connection(con, SETTINGS), WORKED, brain)
    finally:
        con.close()
    add_model_calls(path)
    index = build_report(Workspace.open(path, settings=SETTINGS), None, root / "out")
    return path, index, index.read_text(encoding="utf-8")


def sections(page: ET.Element) -> dict[str, ET.Element]:
    return {s.get("data-session"): s for s in page.iter("section") if s.get("data-session")}


def text_of(element: ET.Element) -> str:
    return " ".join(" ".join(element.itertext()).split())


def test_report_is_well_formed_and_shows_every_session(built):
    path, index, html = built
    assert index.name == "index.html" and index.is_file()
    page = ET.fromstring(html.split("\n", 1)[1])  # after the doctype line: XHTML-compatible markup
    assert page.tag == "html"
    assert set(sections(page)) == {WORKED, QUIET}
    for sid in (WORKED, QUIET):
        assert sid in html
    # self-contained: no scripts, no external resources
    assert page.find(".//script") is None and "<link" not in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html
    # text from the session file is escaped, not markup
    assert "/home/dev/&lt;orders&gt; &amp; co" in html


def test_worked_session_has_memory_charts_compaction_markers_and_totals(built):
    _, _, html = built
    page = ET.fromstring(html.split("\n", 1)[1])
    section = sections(page)[WORKED]
    charts = list(section.iter(f"{SVG}svg"))
    titles = [c.findtext(f"{SVG}title") for c in charts]
    assert "Active observation pool against its budget" in titles
    assert "Memory items over the branch" in titles
    for chart in charts:
        assert list(chart.iter(f"{SVG}polyline")) or list(chart.iter(f"{SVG}path")) or list(chart.iter(f"{SVG}rect"))
    pool = charts[titles.index("Active observation pool against its budget")]
    assert list(pool.iter(f"{SVG}polyline")) and list(pool.iter(f"{SVG}path"))
    chart_text = text_of(pool)
    assert "pool budget (600)" in chart_text and "pool target (300)" in chart_text
    assert "position on the current branch" in chart_text

    # compaction markers (one <g class="marker"> each, titled with the class) and the table
    markers = [g for g in pool.iter(f"{SVG}g") if g.get("class") == "marker"]
    rows = section.find(".//div[@class='compactions']/table/tbody")
    assert rows is not None and len(markers) == len(rows) >= 2
    marker_titles = [g.findtext(f"{SVG}title") for g in markers]
    assert any(t.startswith("Pi's compaction") for t in marker_titles)
    assert any(t.startswith("simulated compaction (replayed") for t in marker_titles)
    origins = [text_of(tr.findall("td")[4]) for tr in rows]
    assert "pi" in origins and "simulated (replayed)" in origins
    # visible memory counts only the file's compactions: Pi's own compaction folds nothing, so nothing is
    # visible, while the replay's simulated compactions are counted apart as the replayed view
    cards = {c.find("div[@class='label']").text: c.find("div[@class='value']").text
             for c in section.iter("div") if c.get("class") == "card"}
    assert "visible observations" not in cards  # 0: no card; the line under them says it
    assert "Visible memory is what the session file shows the agent (its latest om.folded compaction): 0 " \
        "observations" in text_of(section)
    assert (cards["compactions in the file"], int(cards["replayed compactions"])) == ("1", len(rows) - 1)
    assert "the replayed view" in text_of(section)
    classes = {span.text for span in section.iter("span") if "badge" in (span.get("class") or "")}
    assert classes and classes <= set(GAP_CLASSES)
    for cls in classes:
        assert any(f": {cls};" in t for t in marker_titles)
        assert f"gap: {cls}" in chart_text  # legend

    # model-call totals: 3 calls, 4,000 in, 1,000 out, 500 cached, $0.0425 with one call unpriced
    calls = text_of(section.find(".//div[@class='calls']"))
    assert "total 3 1 4,000 500 1,000 $0.0425 (+1 unpriced)" in calls
    assert "observer" in calls and "reflector" in calls
    assert "Model tokens by stage" in [c.findtext(f"{SVG}title") for c in charts]
    assert "no-memory" not in ET.tostring(section, encoding="unicode")


def test_quiet_session_says_no_memory_yet(built):
    _, _, html = built
    section = sections(ET.fromstring(html.split("\n", 1)[1]))[QUIET]
    empty = {p.get("class"): text_of(p) for p in section.iter("p") if "empty" in (p.get("class") or "")}
    assert empty["empty no-memory"].startswith("No memory yet")
    assert "No compactions" in empty["empty no-compactions"]
    assert "No model calls" in empty["empty no-calls"]
    cards = text_of(section.find(".//div[@class='cards']"))
    assert "cost" not in cards and "n/a" not in cards  # no card of nothing: the line below says why
    no_calls = next(p for p in section.iter("p") if "no-model-calls" in (p.get("class") or ""))
    assert text_of(no_calls) == "No model calls: none recorded."
    # the branch's source tokens are still charted
    assert list(section.iter(f"{SVG}polyline"))


def test_overview_totals(built):
    _, _, html = built
    page = ET.fromstring(html.split("\n", 1)[1])
    overview = next(s for s in page.iter("section") if s.get("id") == "overview")
    cards = {c.find("div[@class='label']").text: c.find("div[@class='value']").text
             for c in overview.iter("div") if c.get("class") == "card"}
    assert cards["sessions"] == "2"
    assert int(cards["observations"]) > 0
    # the files' own compactions and the replay's simulated ones are counted apart
    assert int(cards["compactions in the files"]) >= 1 and int(cards["replayed compactions"]) >= 1
    assert (cards["model calls"], cards["input tokens"], cards["output tokens"]) == ("3", "4,000", "1,000")
    assert cards["cost (1 call unpriced)"] == "$0.0425"
    with dbmod.reading(built[0]) as con:
        source = con.execute("SELECT sum(tokens_pi) FROM entries WHERE is_source").fetchone()[0]
        [(per_million,)] = con.execute("SELECT usd_per_1m_source_tokens FROM session_costs WHERE session_id = ?",
                                       [WORKED]).fetchall()
        worked = con.execute("SELECT sum(tokens_pi) FROM entries WHERE is_source AND session_id = ?",
                             [WORKED]).fetchone()[0]
    assert cards["cost per 1M source tokens"] == f"${0.0425 * 1e6 / source:,.4f}"
    assert per_million == pytest.approx(0.0425 * 1e6 / worked)  # the analyst's view agrees with the report
    assert "Compactions per session by gap class" in [c.findtext(f"{SVG}title") for c in overview.iter(f"{SVG}svg")]
    links = {a.get("href") for a in overview.iter("a")}
    assert all(any(a.startswith("#s") and sid in a for a in links) for sid in (WORKED, QUIET))


def test_report_for_chosen_sessions_and_errors(built, tmp_path):
    path, _, _ = built
    html = build_report(Workspace.open(path, settings=Settings()), [QUIET[:8]], tmp_path / "one").read_text(encoding="utf-8")
    assert set(sections(ET.fromstring(html.split("\n", 1)[1]))) == {QUIET}
    with pytest.raises(SessionNotFound):
        build_report(Workspace.open(path, settings=Settings()), ["no-such-session"], tmp_path / "none")
    empty_db = tmp_path / "empty.duckdb"
    dbmod.connect(empty_db).close()
    html = build_report(Workspace.open(empty_db, settings=Settings()), None, tmp_path / "empty").read_text(encoding="utf-8")
    ET.fromstring(html.split("\n", 1)[1])
    assert "No sessions in this database" in html


def test_chart_helpers():
    assert ticks(0, 1000, 10, True) == [0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
    assert ticks(0, 7, 10, True) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert nice_max(5938 * 1.04) == 8000 and nice_max(20_000 * 1.04) == 25_000 and nice_max(0) == 1.0
    assert (fmt_short(20_000), fmt_short(1_500), fmt_short(2_500_000), fmt_short(12)) == ("20k", "1.5k", "2.5M", "12")
    assert (fmt_cost(None), fmt_cost(0.5), fmt_cost(0.5, 2)) == ("n/a", "$0.5000", "$0.5000 (+2 unpriced)")


def _chromium() -> str | None:
    names = ("chromium", "chromium-browser", "google-chrome", "chromium-headless-shell")
    return next((p for p in map(shutil.which, names) if p), None)


# Run in the page once it is laid out: each table's right edge against its card's inner right edge.
_MEASURE = """<script>window.addEventListener('load', () => {
  const out = [...document.querySelectorAll('table')].map(t => {
    const card = t.closest('section'), edge = card.getBoundingClientRect().right - parseFloat(getComputedStyle(card)
      .paddingRight) - parseFloat(getComputedStyle(card).borderRightWidth);
    return (card.id || card.dataset.session) + ' ' + Math.ceil(t.getBoundingClientRect().right - edge); });
  const p = document.createElement('pre'); p.id = 'measured'; p.textContent = out.join('\\n');
  document.body.appendChild(p); });</script>"""


def test_every_table_fits_its_card_at_1400_px(built, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no headless Chromium on this machine")
    _, index, html = built
    page = index.with_name("measured.html")
    page.write_text(html.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,2400",
                           "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=90, check=False)
    measured = done.stdout.split('<pre id="measured">', 1)[1].split("</pre>", 1)[0].splitlines()
    assert len(measured) >= 3, done.stdout[-2000:]
    over = [line for line in measured if int(line.rsplit(" ", 1)[1]) > 0]
    assert over == [], over  # pixels past the card's inner edge, per table


# Each session's file name in the overview's table: its width in characters and the lines it takes.
_FILE_CELLS = """<script>window.addEventListener('load', () => {
  const out = [...document.querySelectorAll('#overview td .file')].map(f => {
    const lines = Math.round(f.getBoundingClientRect().height / parseFloat(getComputedStyle(f).lineHeight));
    return f.textContent.length + ' ' + lines; });
  const p = document.createElement('pre'); p.id = 'measured'; p.textContent = out.join('\\n');
  document.body.appendChild(p); });</script>"""


def test_a_pi_file_name_in_the_overview_keeps_a_readable_width_in_a_narrow_window(tmp_path):
    """In a window about 80 columns wide (640 px), the overview's file column broke a Pi
    file name after every character or two (28 lines for one name): it took the width left by twelve
    numeric columns. The name now sits under the session's id, less the id it repeats, at least 12
    characters wide (8 or more to a line in the page's proportional font)."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no headless Chromium on this machine")
    sid = "019b0a7e-5c3d-7f21-9a8e-3d2c1b0a9f8e"
    b = SessionBuilder(sid)
    b.work_turns(2, "alpha")
    path = tmp_path / "om.duckdb"
    ingest(workspace(path), [b.write(tmp_path / f"2026-02-03T09-12-44-120Z_{sid}.jsonl")])
    index = build_report(Workspace.open(path, settings=SETTINGS), None, tmp_path / "out")
    page = index.with_name("measured.html")
    page.write_text(index.read_text(encoding="utf-8").replace("</body>", _FILE_CELLS + "</body>"), encoding="utf-8")
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--window-size=640,1600",
                           "--virtual-time-budget=5000", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=90, check=False)
    assert '<pre id="measured">' in done.stdout, (done.stdout + done.stderr)[-2000:]
    measured = done.stdout.split('<pre id="measured">', 1)[1].split("</pre>", 1)[0].split()
    assert measured, done.stdout[-2000:]
    length, lines = map(int, measured)
    assert length == len("2026-02-03T09-12-44-120Z")  # the name less the session id it repeats
    assert length / lines >= 8, (length, lines)  # at least 8 characters a line (it was 2.4)
    assert f'title="{tmp_path / f"2026-02-03T09-12-44-120Z_{sid}.jsonl"}"' in index.read_text()  # the whole path


def test_report_renders_to_png(built, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no headless Chromium on this machine")
    _, index, _ = built
    png = tmp_path / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                    f"--screenshot={png}", "--window-size=1400,2400", index.resolve().as_uri()],
                   capture_output=True, timeout=90, check=False)
    assert png.is_file() and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("source", ["pi-global", "pi-project", "om.toml", "--config", "env"])
def test_om_report_honours_settings_from_every_source(built, tmp_path, isolated_home, monkeypatch, source):
    """`om report` resolves settings like every other command (defaults < Pi files < om.toml or
    --config < OM_*): the pool budget it draws comes from the chosen source."""
    import json as jsonlib

    from typer.testing import CliRunner

    from flows.cli.main import app

    path, _, _ = built
    budget = 4321
    args = ["--db", str(path)]
    if source == "pi-global":
        pi = tmp_path / "home" / ".pi" / "agent" / "settings.json"
        pi.parent.mkdir(parents=True)
        pi.write_text(jsonlib.dumps({"observational-memory": {"observationsPoolMaxTokens": budget}}))
    elif source == "pi-project":
        (tmp_path / ".pi").mkdir()
        (tmp_path / ".pi" / "settings.json").write_text(
            jsonlib.dumps({"observational-memory": {"observationsPoolMaxTokens": budget}}))
    elif source == "om.toml":
        (tmp_path / "om.toml").write_text(f"observationsPoolMaxTokens = {budget}\n")
    elif source == "--config":
        (tmp_path / "elsewhere.toml").write_text(f"observations_pool_max_tokens = {budget}\n")
        (tmp_path / "om.toml").write_text("observationsPoolMaxTokens = 999\n")  # --config wins over ./om.toml
        args += ["--config", str(tmp_path / "elsewhere.toml")]
    else:
        (tmp_path / "om.toml").write_text("observationsPoolMaxTokens = 999\n")  # the environment wins
        monkeypatch.setenv("OM_OBSERVATIONS_POOL_MAX_TOKENS", str(budget))
    result = CliRunner().invoke(app, args + ["report", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert f"Pool budget {budget:,} tokens" in html, source
    assert f"target {budget // 2:,}" in html


def test_stylesheet_is_a_package_file(built):
    """The CSS ships as om_core/report/report.css (the wheel takes every file of the package) and is
    inlined whole."""
    from importlib import resources

    css = resources.files("om_core.report").joinpath("report.css")
    assert css.is_file()
    assert f"<style>\n{css.read_text(encoding='utf-8')}</style>" in built[2]


# ---------------------------------------------------------------- the report a newcomer reads


def test_the_pool_chart_scales_to_the_data_and_names_a_budget_far_above_it(built):
    from om_core.report.svg import HLine, Series, line_chart

    small = line_chart(title="pool", y_label="tokens", x_label="position", x_max=10,
                       series=[Series("pool", "#000", [(0, 0), (5, 900), (10, 1200)])],
                       hlines=[HLine("pool budget", 20_000, "#b91c1c", "7 4"), HLine("pool target", 1_000, "#6b7280",
                                                                                    "2 3")])
    chart = ET.fromstring(small)
    ticks_shown = [t.text for t in chart.iter(f"{SVG}text") if t.get("class") == "tick" and t.get("text-anchor") == "end"]
    assert ticks_shown[-1] in ("1.2k", "1.4k", "1.5k"), ticks_shown  # the axis ends near the data, not at 20k
    legend = text_of(chart)
    assert "pool budget (20,000): above the chart" in legend and "pool target (1,000)" in legend
    assert "above the chart" not in legend.split("pool target", 1)[1]  # within the data's range: drawn
    labels = [t.text for t in chart.iter(f"{SVG}text") if t.get("class") == "ref-label"]
    assert labels == ["pool target 1k"]


def test_two_compaction_markers_at_one_position_stand_side_by_side():
    from om_core.report.svg import Marker, Series, line_chart

    chart = ET.fromstring(line_chart(
        title="t", y_label="y", x_label="x", x_max=100, series=[Series("s", "#000", [(0, 1), (100, 2)])],
        markers=[Marker(40, "#16a34a", "Pi's compaction", legend="gap: none", style="session's compaction"),
                 Marker(40, "#16a34a", "simulated compaction", dash="4 3", legend="gap: none",
                        style="replayed (simulated) compaction")]))
    xs = {g.findtext(f"{SVG}title"): float(g.find(f"{SVG}line").get("x1"))
          for g in chart.iter(f"{SVG}g") if g.get("class") == "marker"}
    assert abs(xs["Pi's compaction"] - xs["simulated compaction"]) >= 4, xs


def test_one_position_is_said_in_the_singular(built):
    _, _, html = built
    assert "1 positions" not in html
    assert re.search(r"\b1 position carries ledger records", html) or "positions carry" in html


_DETAILS = """<script>window.addEventListener('load', () => {
  const files = [...document.querySelectorAll('#overview td .file')].map(f =>
    Math.round(f.getBoundingClientRect().height / parseFloat(getComputedStyle(f).lineHeight)));
  const points = [...document.querySelectorAll('details.points')].map(d =>
    d.open + ' ' + d.querySelectorAll('tbody tr').length + ' ' + Math.round(d.getBoundingClientRect().height));
  const p = document.createElement('pre'); p.id = 'measured';
  p.textContent = JSON.stringify({files, points, offline: document.querySelectorAll('.offline-note').length});
  document.body.appendChild(p); });</script>"""


def test_the_report_in_chromium_shows_its_details_without_tooltips(built, tmp_path):
    """Looked at in a real browser: file names on one line, the charts' points in a visible table (a
    printout or a screenshot loses SVG tooltips), the offline baseline said, and a screenshot of the
    window's size."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no headless Chromium on this machine (apt-get install chromium)")
    _, index, html = built
    page = index.with_name("details.html")
    page.write_text(html.replace("</body>", _DETAILS + "</body>"), encoding="utf-8")
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1800",
             "--virtual-time-budget=5000"]
    done = subprocess.run([*flags, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=90,
                          check=False)
    assert '<pre id="measured">' in done.stdout, (done.stdout + done.stderr)[-2000:]
    measured = json.loads(done.stdout.split('<pre id="measured">', 1)[1].split("</pre>", 1)[0])
    assert measured["files"] and all(lines == 1 for lines in measured["files"]), measured
    opened, rows, height = measured["points"][0].split()
    assert opened == "true" and int(rows) >= 1 and int(height) > 60, measured
    assert measured["offline"] == 1
    png = tmp_path / "report.png"
    subprocess.run([*flags, f"--screenshot={png}", index.resolve().as_uri()], capture_output=True, timeout=90,
                   check=False)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk: the screenshot is the window
    assert (width, height) == (1200, 1800)
