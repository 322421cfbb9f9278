"""`om report`: a static HTML page about memory, compactions and model spend, for reading offline.

One self-contained file (``index.html``): inline CSS (``report.css``, a file of this package) and
inline SVG charts (``svg``), no scripts, no fonts or images from elsewhere. Hovering a point or a
compaction marker shows its details (SVG ``<title>``). The page is XHTML-compatible (every element
closed, only XML's own entities), so an XML parser can check it.

What the page shows is read by ``data``; this module only lays it out: an overview, then one section a
session (cards, memory charts, source tokens, compactions, model calls).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from om_core.errors import InvalidArgument
from om_core.memory.gaps import CompactionGap
from om_core.report.data import GAP_CLASSES, CallStats, MemoryPoint, SessionReport, collect
from om_core.report.svg import HLine, Marker, Series, bar_chart, esc, fmt_int, line_chart
from om_core.pi.session import file_label
from om_core.settings import Settings

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace

CLASS_COLORS = {"cross_boundary": "#d62728", "observer_lag": "#ff7f0e", "no_gap": "#2ca02c",
                "native_fallback": "#9467bd"}
CLASS_NOTES = {
    "cross_boundary": "observations reach past the first kept entry, yet raw messages before it are unobserved",
    "observer_lag": "the observer had not caught up: raw messages before the first kept entry are unobserved",
    "no_gap": "every raw message before the first kept entry is covered by an observation",
    "native_fallback": "the memory was empty: Pi's own summary is all there is",
}
POOL_COLOR = "#1f77b4"
RECORDED_COLOR = "#7f7f7f"
REFLECTION_COLOR = "#17a2b8"
DROPPED_COLOR = "#e377c2"
SOURCE_COLOR = "#4b5563"
INPUT_COLOR = "#4e79a7"
OUTPUT_COLOR = "#f28e2b"


@cache
def stylesheet() -> str:
    """The page's CSS, a file shipped in this package."""
    return resources.files("om_core.report").joinpath("report.css").read_text(encoding="utf-8")


# ------------------------------------------------------------------ formatting


def fmt_cost(cost: float | None, unpriced: int = 0) -> str:
    if cost is None:
        return "n/a"
    text = f"${cost:,.4f}" if cost < 100 else f"${cost:,.2f}"
    return f"{text} (+{unpriced} unpriced)" if unpriced else text


def fmt_cost_per_million(cost: float | None, source_tokens: int | None) -> str:
    """Cost per 1M source tokens (Pi's estimate): what memory costs per unit of conversation."""
    if cost is None or not source_tokens:
        return "n/a"
    return fmt_cost(cost * 1_000_000 / source_tokens)


def _cost_label(calls: CallStats) -> str:
    if not calls.unpriced:
        return "cost"
    return f"cost ({calls.unpriced} call{'' if calls.unpriced == 1 else 's'} unpriced)"


def fmt_ts(ts: datetime | None) -> str:
    if ts is None:
        return "n/a"
    if ts.tzinfo is not None:
        ts = ts.astimezone(timezone.utc)
    return ts.strftime("%Y-%m-%d %H:%M UTC")


def fmt_duration(first: datetime | None, last: datetime | None) -> str:
    if first is None or last is None:
        return ""
    seconds = int((last - first).total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes = rest // 60
    if hours >= 48:
        return f"{hours // 24} d {hours % 24} h"
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def anchor_id(index: int, session_id: str) -> str:
    return f"s{index}-" + re.sub(r"[^A-Za-z0-9_-]", "", session_id)[:40]


# ------------------------------------------------------------------ page parts


_SAYS_NOTHING = ("0", "n/a", "0 / 0")


def _cards(items: Sequence[tuple[str, str]]) -> str:
    """The cards that say something: a 0 or n/a card is left out (the lines beside them say what is
    missing, e.g. that the offline baseline made no model call)."""
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="value">{esc(v)}</div><div class="label">{esc(k)}</div></div>'
        for k, v in items if v not in _SAYS_NOTHING) + "</div>"


def _no_calls_line(offline: bool, what: str) -> str:
    """Where the model-call cards would be: why there are none."""
    why = (f"the offline baseline (extractive rules, no model) wrote {what}: no tokens, no cost"
           if offline else "none recorded")
    return f'<p class="meta no-model-calls">No model calls: {why}.</p>'


def _everywhere_line(observations: int, reflections: int, on_branch: tuple[int, int], whose: str) -> str:
    """How the counts of `om run`'s summary (every branch, repeats included) relate to the current
    branch's shown here; empty when they agree."""
    if (observations, reflections) == on_branch:
        return ""
    return (f'<p class="meta everywhere">Why these counts are not <code>om run</code>\'s: it counts every '
            f'record it appends, on every branch ({whose} {fmt_int(observations)} observations and '
            f'{fmt_int(reflections)} reflections in all); the counts here are those at the tip of the current '
            f'branch ({fmt_int(on_branch[0])} and {fmt_int(on_branch[1])}). The rest lie on other branches, or '
            'repeat an id recorded before.</p>')


def _badge(cls: str) -> str:
    color = CLASS_COLORS.get(cls, "#6b7280")
    return f'<span class="badge cls-{esc(cls)}" style="background:{esc(color)}">{esc(cls)}</span>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[int] = (),
           raw: Collection[int] = (), total: bool = False, paths: Collection[int] = ()) -> str:
    """A table; cells are escaped unless their column is in ``raw`` (pre-built markup); a cell of a
    column in ``paths`` (file names) may break anywhere, so a long name never widens the table."""
    head = "".join(f'<th class="num">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            content = cell if i in raw else esc(cell)
            kind = ' class="num"' if i in numeric else ' class="path"' if i in paths else ""
            cells.append(f"<td{kind}>{content}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if total and body:
        body[-1] = '<tr class="total">' + body[-1][4:]
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _named(report: SessionReport) -> str:
    """A session in a chart: its short id and its file name less the id the name repeats."""
    return f"{report.sid[:8]} {file_label(Path(report.info.file_path).name, report.sid)}".rstrip()


def _time_axis(report: SessionReport) -> Callable[[int], str] | None:
    if not report.times or report.first_ts is None:
        return None
    same_day = report.first_ts.astimezone(timezone.utc).date() == report.last_ts.astimezone(timezone.utc).date()

    def time_of(position: int) -> str:
        if not 0 <= position < len(report.times) or report.times[position] is None:
            return ""
        ts = report.times[position].astimezone(timezone.utc)
        return ts.strftime("%H:%M") if same_day else ts.strftime("%m-%d %H:%M")

    return time_of


def _compaction_label(c: CompactionGap) -> str:
    if c.origin == "pi":
        return "Pi's compaction"
    if c.origin == "imported":
        return "the extension's compaction"
    return "simulated compaction (replayed" + (f", {c.trigger})" if c.trigger else ")")


def _markers(report: SessionReport) -> list[Marker]:
    """Compaction markers colored by gap class: solid for the session's own compactions (Pi's or the
    extension's), dashed for simulated ones."""
    out = []
    for c in report.compactions:
        title = (f"{_compaction_label(c)} {c.compaction_id} at position {c.compaction_position}: {c.class_}; "
                 f"first kept entry at {c.first_kept_position}; gap {c.gap_messages} messages, {c.gap_tokens} tokens")
        native = c.origin != "simulated"
        out.append(Marker(c.compaction_position, CLASS_COLORS.get(c.class_, "#6b7280"), title,
                          dash=None if native else "4 3", legend=f"gap: {c.class_}",
                          style="session's compaction" if native else "replayed (simulated) compaction"))
    order = {f"gap: {cls}": i for i, cls in enumerate(GAP_CLASSES)}
    return sorted(out, key=lambda m: (order.get(m.legend, 99), m.dash is not None))


X_LABEL = "position on the current branch (entries from the root; times in UTC below)"


def _memory_charts(report: SessionReport, settings: Settings) -> str:
    x_max = report.tip_position or 0
    time_of = _time_axis(report)
    markers = _markers(report)
    tl = report.timeline

    def steps(value: Callable[[MemoryPoint], float]) -> list[tuple[float, float]]:
        points = [(0.0, 0.0)] + [(float(p.position), float(value(p))) for p in tl]
        if points[-1][0] < x_max:
            points.append((float(x_max), points[-1][1]))
        return points

    def where(p: MemoryPoint) -> str:
        when = time_of(p.position) if time_of else ""
        return f"position {p.position}" + (f" ({when} UTC)" if when else "")

    pool = Series("active observation pool", POOL_COLOR, steps(lambda p: p.pool_tokens), fill=True, width=2.2,
                  dots=[(p.position, p.pool_tokens,
                         f"{where(p)}: {fmt_int(p.pool_tokens)} tokens in {p.active} active observations")
                        for p in tl])
    pool_chart = line_chart(
        title="Active observation pool against its budget", y_label="tokens (tokenCount)", x_label=X_LABEL,
        x_max=x_max, series=[pool],
        hlines=[HLine("pool budget", settings.observationsPoolMaxTokens, "#b91c1c", "7 4"),
                HLine("pool target", settings.pool_target_tokens, "#6b7280", "2 3")],
        markers=markers, time_of=time_of)

    items = [Series("active observations", POOL_COLOR, steps(lambda p: p.active), width=2.6),
             Series("recorded observations", RECORDED_COLOR, steps(lambda p: p.recorded), dash="5 3", width=1.6),
             Series("reflections", REFLECTION_COLOR, steps(lambda p: p.reflections), width=2.2,
                    dots=[(p.position, p.reflections,
                           f"{where(p)}: {p.recorded} recorded, {p.active} active, {p.dropped} dropped "
                           f"observations; {p.reflections} reflections") for p in tl])]
    if any(p.dropped for p in tl):
        items.append(Series("dropped observations", DROPPED_COLOR, steps(lambda p: p.dropped), width=1.8))
    counts_chart = line_chart(title="Memory items over the branch", y_label="items", x_label=X_LABEL, x_max=x_max,
                              series=items, markers=markers, time_of=time_of, integer_y=True, height=280)
    return pool_chart + counts_chart


POINTS_SHOWN = 12


def _points_html(report: SessionReport) -> str:
    """The charts' points as a table a printout or a screenshot keeps (the charts' details are SVG
    tooltips): the latest positions that carry ledger records."""
    time_of = _time_axis(report)
    shown = report.timeline[-POINTS_SHOWN:]
    rows = [[str(p.position), f'<span class="nowrap">{esc(time_of(p.position) if time_of else "")}</span>',
             fmt_int(p.pool_tokens), fmt_int(p.active), fmt_int(p.recorded), fmt_int(p.dropped),
             fmt_int(p.reflections)] for p in shown]
    note = ("" if len(shown) == len(report.timeline) else
            f'<p class="meta">The latest {len(shown)} of {len(report.timeline)} positions.</p>')
    return ('<details class="points" open="open"><summary>Memory at each position that carries ledger records'
            '</summary>' + _table(["position", "time (UTC)", "pool tokens", "active observations",
                                   "recorded observations", "dropped", "reflections"], rows,
                                  numeric={0, 2, 3, 4, 5, 6}, raw={1}) + note + '</details>')


def _source_chart(report: SessionReport) -> str:
    points = [(float(p), float(t)) for p, t in report.source_cumulative]
    return line_chart(
        title="Source tokens on the branch (cumulative, Pi's estimate)", y_label="tokens", x_label=X_LABEL,
        x_max=report.tip_position or 0,
        series=[Series("source tokens so far", SOURCE_COLOR, points, step=False, fill=True, width=1.8)],
        markers=_markers(report), time_of=_time_axis(report), height=250)


def _calls_html(report: SessionReport) -> str:
    stats = report.calls_by_stage
    if not stats:
        return ('<h3>Model calls</h3><p class="empty no-calls">No model calls recorded for this session'
                + (" (the offline baseline makes none)" if report.offline else "") + ".</p>")
    total = report.calls
    rows = [[s.stage, s.models, fmt_int(s.calls), fmt_int(s.errors), fmt_int(s.input_tokens), fmt_int(s.cached_tokens),
             fmt_int(s.output_tokens), fmt_cost(s.cost, s.unpriced)] for s in stats]
    rows.append(["total", "", fmt_int(total.calls), fmt_int(total.errors), fmt_int(total.input_tokens),
                 fmt_int(total.cached_tokens), fmt_int(total.output_tokens), fmt_cost(total.cost, total.unpriced)])
    chart = bar_chart(title="Model tokens by stage", rows=[(s.stage, (s.input_tokens, s.output_tokens)) for s in stats],
                      segments=[("input tokens", INPUT_COLOR), ("output tokens", OUTPUT_COLOR)], x_label="tokens")
    table = _table(["stage", "model", "calls", "errors", "input tokens", "cached tokens", "output tokens", "cost"],
                   rows, numeric={2, 3, 4, 5, 6, 7}, total=True)
    return f'<h3>Model calls</h3>{chart}<div class="calls">{table}</div>'


def _compactions_html(report: SessionReport) -> str:
    if not report.compactions:
        return '<h3>Compactions</h3><p class="empty no-compactions">No compactions on the current branch.</p>'
    rows = []
    for i, c in enumerate(report.compactions, 1):
        at = report.times[c.compaction_position] if c.compaction_position < len(report.times) else None
        rows.append([str(i), str(c.compaction_position), f'<span class="nowrap">{esc(fmt_ts(at))}</span>', f"<code>{esc(c.compaction_id)}</code>",
                     esc("simulated (replayed)" if c.origin == "simulated" else c.origin), esc(c.trigger or ""), str(c.first_kept_position),
                     "none" if c.c_position < 0 else str(c.c_position), fmt_int(c.gap_messages),
                     fmt_int(c.gap_tokens), _badge(c.class_)])
    table = _table(["#", "position", "time", "compaction", "origin", "trigger", "first kept at",
                    "observed through (C)", "gap messages", "gap tokens", "class"], rows,
                   numeric={0, 1, 6, 7, 8, 9}, raw={2, 3, 4, 5, 10})
    return ('<h3>Compactions</h3><p class="meta">Markers in the charts, colored by gap class: solid for the '
            'session\'s own compactions (Pi\'s or the extension\'s), dashed for the ones the replay simulated (what '
            'the extension would have done; never in the file); two at one position stand side by side. '
            'C is the last position the included observations cover.</p>' + f'<div class="compactions">{table}</div>')


def _session_html(index: int, report: SessionReport, settings: Settings) -> str:
    info = report.info
    final = report.final
    classes = report.class_counts()
    calls = report.calls
    parts = [f'<section class="session" id="{anchor_id(index, report.sid)}" data-session="{esc(report.sid)}">',
             f"<h2>Session <code>{esc(report.sid)}</code>"
             + (' <span class="tag offline">offline baseline</span>' if report.offline else "") + "</h2>",
             f'<p class="meta">{esc(info.file_path)}' + (f" · cwd {esc(info.cwd)}" if info.cwd else "") + "</p>"]
    if report.tip is None or report.tip_position is None:
        parts.append('<p class="empty no-entries">This session has no entries.</p></section>')
        return "".join(parts)
    span = fmt_duration(report.first_ts, report.last_ts)
    leaves = f'{info.leaf_count} {"leaf" if info.leaf_count == 1 else "leaves"}'
    parts.append(f'<p class="meta">Current branch to <code>{esc(report.tip)}</code>: positions 0–'
                 f'{report.tip_position} ({report.tip_position + 1} of {info.entry_count} entries, {leaves}) · '
                 f'{esc(fmt_ts(report.first_ts))} to {esc(fmt_ts(report.last_ts))}'
                 + (f" ({esc(span)})" if span else "") + "</p>")
    compaction_text = ", ".join(f"{n} {cls}" for cls, n in classes.items() if n) or "none"
    parts.append(_everywhere_line(*report.everywhere, (final.recorded, final.reflections) if final else (0, 0),
                                  "this session holds"))
    parts.append(_cards([
        ("source tokens (session)", fmt_int(info.tokens_pi)),
        ("source tokens (branch)", fmt_int(report.branch_source_tokens)),
        ("observations", f"{final.active} / {final.recorded}" if final else "0"),
        ("reflections", fmt_int(final.reflections if final else 0)),
        ("dropped", fmt_int(final.dropped if final else 0)),
        ("pool tokens", fmt_int(final.pool_tokens if final else 0)),
        ("visible observations", fmt_int(report.visible[0])),
        ("compactions in the file", fmt_int(report.file_compactions)),
        ("replayed compactions", fmt_int(report.replayed_compactions)),
        ("model calls", fmt_int(calls.calls)),
        ("model tokens", fmt_int(calls.input_tokens + calls.output_tokens)),
        (_cost_label(calls), fmt_cost(calls.cost)),
        ("cost per 1M source tokens", fmt_cost_per_million(calls.cost, info.tokens_pi)),
    ]))
    if not calls.calls:
        parts.append(_no_calls_line(report.offline, "this session's memory"))
    parts.append(f'<p class="meta">Observations shown as active / recorded. Visible memory is what the session '
                 f'file shows the agent (its latest om.folded compaction): {report.visible[0]} observations, '
                 f'{report.visible[1]} reflections; the replayed view (with the replay\'s simulated compactions) '
                 f'holds {report.replayed[0]} observations, {report.replayed[1]} reflections. Compactions by class: '
                 f'{esc(compaction_text)}.</p>')
    if report.timeline:
        parts.append('<h3>Memory</h3>')
        parts.append(_memory_charts(report, settings))
        pressure = (final.pool_tokens / settings.observationsPoolMaxTokens) if final else 0
        parts.append(_points_html(report))
        one = len(report.timeline) == 1
        parts.append(f'<p class="meta">{len(report.timeline)} position{"" if one else "s"} '
                     f'carr{"ies" if one else "y"} ledger records; at the tip the pool '
                     f'holds {fmt_int(final.pool_tokens)} tokens, {pressure:.0%} of its '
                     f'{fmt_int(settings.observationsPoolMaxTokens)}-token budget; reflections hold '
                     f'{fmt_int(final.reflection_tokens)} tokens.</p>')
    else:
        parts.append('<h3>Memory</h3><p class="empty no-memory">No memory yet: no ledger records on the current '
                     'branch (run <code>om run</code> or <code>om observe</code>).</p>')
    parts.append(_source_chart(report))
    parts.append(_compactions_html(report))
    parts.append(_calls_html(report))
    parts.append("</section>")
    return "".join(parts)


def _overview_html(reports: list[SessionReport], settings: Settings) -> str:
    classes = dict.fromkeys(GAP_CLASSES, 0)
    calls = CallStats(stage="all")
    observations = reflections = dropped = 0
    for r in reports:
        for cls, n in r.class_counts().items():
            classes[cls] = classes.get(cls, 0) + n
        calls.add(r.calls)
        if r.final:
            observations += r.final.recorded
            reflections += r.final.reflections
            dropped += r.final.dropped
    compactions = sum(classes.values())
    replayed = sum(r.replayed_compactions for r in reports)
    on_branch = (observations, reflections)
    everywhere = tuple(sum(r.everywhere[i] for r in reports) for i in (0, 1))
    parts = ['<section class="overview" id="overview"><h2>Overview</h2>',
             _everywhere_line(*everywhere, on_branch, "the sessions hold")
             or '<p class="meta">Counts are those at the tip of each session\'s current branch.</p>',
             _cards([("sessions", fmt_int(len(reports))), ("observations", fmt_int(observations)),
                     ("reflections", fmt_int(reflections)), ("dropped", fmt_int(dropped)),
                     ("compactions in the files", fmt_int(compactions - replayed)),
                     ("replayed compactions", fmt_int(replayed)), ("model calls", fmt_int(calls.calls)),
                     ("input tokens", fmt_int(calls.input_tokens)), ("output tokens", fmt_int(calls.output_tokens)),
                     ("cached tokens", fmt_int(calls.cached_tokens)),
                     (_cost_label(calls), fmt_cost(calls.cost)),
                     ("cost per 1M source tokens",
                      fmt_cost_per_million(calls.cost, sum(r.info.tokens_pi or 0 for r in reports)))])]
    if not calls.calls:
        parts.append(_no_calls_line(any(r.offline for r in reports), "the memory"))
    class_rows = [[_badge(c), fmt_int(n), CLASS_NOTES[c]] for c, n in classes.items()]
    parts.append('<h3>Compactions by gap class</h3>')
    parts.append(_table(["class", "compactions", "meaning"], class_rows, numeric={1}, raw={0}))
    if compactions:
        parts.append(bar_chart(
            title="Compactions per session by gap class",
            rows=[(_named(r), [r.class_counts()[c] for c in GAP_CLASSES])
                  for r in reports],
            segments=[(c, CLASS_COLORS[c]) for c in GAP_CLASSES], x_label="compactions on the current branch",
            integer_x=True))
    if calls.calls:
        parts.append(bar_chart(
            title="Model tokens per session",
            rows=[(_named(r), (r.calls.input_tokens, r.calls.output_tokens))
                  for r in reports],
            segments=[("input tokens", INPUT_COLOR), ("output tokens", OUTPUT_COLOR)], x_label="tokens"))
    rows = []
    for i, r in enumerate(reports):
        name = Path(r.info.file_path).name
        # the file under the id, in one cell: a column of its own was squeezed to a character's width
        # beside twelve numeric ones (a long Pi file name broke after every character)
        session = (f'<a href="#{anchor_id(i, r.sid)}" title="{esc(r.sid)}"><code>{esc(r.sid[:8])}</code></a>'
                   f'<div class="file" title="{esc(r.info.file_path)}">{esc(file_label(name, r.sid) or name)}</div>')
        final = r.final
        row = [session, fmt_int((r.tip_position or -1) + 1), fmt_int(r.info.tokens_pi),
               fmt_int(final.recorded if final else 0), fmt_int(final.reflections if final else 0),
               fmt_int(final.dropped if final else 0), fmt_int(final.pool_tokens if final else 0),
               fmt_int(r.file_compactions), fmt_int(r.replayed_compactions)]
        if calls.calls:  # no model call anywhere: four columns of 0 and n/a say nothing (the line above says why)
            row += [fmt_int(r.calls.calls), fmt_int(r.calls.input_tokens + r.calls.output_tokens),
                    fmt_cost(r.calls.cost, r.calls.unpriced), fmt_cost_per_million(r.calls.cost, r.info.tokens_pi)]
        rows.append(row)
    headers = ["session · file", "branch entries", "source tokens", "observations", "reflections", "dropped",
               "pool tokens", "compactions in the file", "replayed compactions"]
    if calls.calls:
        headers += ["model calls", "model tokens", "cost", "cost / 1M source tokens"]
    parts.append('<h3>Sessions</h3>')
    parts.append(_table(headers, rows, numeric=set(range(1, len(headers))), raw={0}, paths={0}))
    parts.append(f'<p class="meta">Pool budget {fmt_int(settings.observationsPoolMaxTokens)} tokens, target '
                 f'{fmt_int(settings.pool_target_tokens)} (observationsPoolMaxTokens, observationsPoolTargetTokens).'
                 '</p></section>')
    return "".join(parts)


def render_page(reports: list[SessionReport], settings: Settings, database: str | Path) -> str:
    """The whole page; ``database`` names the database in the heading."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = ["<h1>Observational memory report</h1>",
            f'<p class="meta">Database <code>{esc(Path(database))}</code> · generated {esc(stamp)} · '
            f'{len(reports)} session{"s" if len(reports) != 1 else ""}</p>']
    if not reports:
        body.append('<section><p class="empty no-sessions">No sessions in this database: run '
                    '<code>om ingest PATH</code> first.</p></section>')
    else:
        offline = [r for r in reports if r.offline]
        if offline:  # its memory copies what was said: the reader must know before reading it
            body.append('<p class="offline-note">The memory of ' + (
                "every session" if len(offline) == len(reports) else
                f'{len(offline)} of {len(reports)} sessions') + ' below was written by the <strong>offline '
                'baseline</strong> (extractive rules, no model): excerpts of what was said, not a model\'s '
                'understanding. <code>om run --model MODEL</code> replaces it.</p>')
        body.append(_overview_html(reports, settings))
        body.extend(_session_html(i, r, settings) for i, r in enumerate(reports))
    body.append('<footer>Made by <code>om report</code>: inline SVG, no scripts; the tables hold what the charts '
                'show, and hovering a point or a marker repeats it.</footer>')
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
            f"<title>om report</title><style>\n{stylesheet()}</style></head><body><main>"
            + "".join(body) + "</main></body></html>\n")


def build_report(ws: Workspace, sessions: list[str] | None, out_dir: str | Path) -> Path:
    """Write ``out_dir/index.html`` about ``sessions`` (references as `om` accepts them; None: all),
    with the workspace's settings (the pool budget and target drawn in the charts)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{out} is a file; --out takes a directory for index.html")
    page = report_page(ws, sessions)
    out.mkdir(parents=True, exist_ok=True)
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def report_page(ws: Workspace, sessions: list[str] | None) -> str:
    """The report's one HTML page (``om report --out -`` prints it)."""
    settings = ws.settings  # resolved first: a bad settings source fails before any reading
    reports = collect(ws, sessions)
    database = ws.path if ws.has_file else "(an open connection)"
    return render_page(reports, settings, database)
