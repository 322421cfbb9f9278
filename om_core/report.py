"""`om report`: a static HTML page about memory, compactions and model spend, for reading offline.

One self-contained file (``index.html``): inline CSS and inline SVG charts, no scripts, no fonts or
images from elsewhere. Hovering a point or a compaction marker shows its details (SVG ``<title>``).
The page is XHTML-compatible (every element closed, only XML's own entities), so an XML parser can
check it.

Everything comes from the database through the library and the SQL views and macros: sessions from
the catalog, each session's current branch (``branch_detail``), the memory at each position where a
ledger record is anchored (``ledger_at``), compactions with their gap class (``om_core.gaps``), and
model calls (the ``llm_calls`` view). Counts are those of the current branch of each session.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb

from om_core.catalog import SessionInfo, list_sessions, resolve_session
from om_core import db as dbmod
from om_core.db import reading
from om_core.errors import InvalidArgument
from om_core.gaps import CompactionGap, gaps
from om_core.settings import Settings
from om_core.sqlfiles import query

GAP_CLASSES = ("cross_boundary", "observer_lag", "no_gap", "native_fallback")
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


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


# ------------------------------------------------------------------ data


@dataclass
class MemoryPoint:
    """The ledger as it stands at one branch position (``ledger_at`` through that entry)."""

    position: int
    entry_id: str
    recorded: int  # observations recorded on the branch so far (distinct ids)
    active: int  # not dropped
    dropped: int
    reflections: int
    pool_tokens: float  # active observations' tokenCount
    reflection_tokens: float


@dataclass
class CallStats:
    stage: str
    calls: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost: float | None = None
    unpriced: int = 0  # calls whose cost litellm did not know
    models: str = ""

    def add(self, other: CallStats) -> None:
        self.calls += other.calls
        self.errors += other.errors
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens
        self.unpriced += other.unpriced
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost


@dataclass
class SessionReport:
    info: SessionInfo
    tip: str | None = None
    tip_position: int | None = None
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    times: list[datetime | None] = field(default_factory=list)  # by position, carried forward
    source_cumulative: list[tuple[int, int]] = field(default_factory=list)  # (position, source tokens so far)
    branch_source_tokens: int = 0
    timeline: list[MemoryPoint] = field(default_factory=list)
    compactions: list[CompactionGap] = field(default_factory=list)
    visible: tuple[int, int] = (0, 0)  # (observations, reflections) of the file's own latest om.folded compaction
    replayed: tuple[int, int] = (0, 0)  # the same with the replay's simulated compactions counted
    calls_by_stage: list[CallStats] = field(default_factory=list)

    @property
    def sid(self) -> str:
        return self.info.session_id

    @property
    def final(self) -> MemoryPoint | None:
        return self.timeline[-1] if self.timeline else None

    @property
    def calls(self) -> CallStats:
        total = CallStats("all")
        for stats in self.calls_by_stage:
            total.add(stats)
        return total

    @property
    def file_compactions(self) -> int:
        """Compactions the session file holds (Pi's and the extension's)."""
        return sum(c.origin != "simulated" for c in self.compactions)

    @property
    def replayed_compactions(self) -> int:
        """Compactions the replay simulated: what the extension would have done, not what happened."""
        return sum(c.origin == "simulated" for c in self.compactions)

    def class_counts(self) -> dict[str, int]:
        out = dict.fromkeys(GAP_CLASSES, 0)
        for c in self.compactions:
            out[c.class_] = out.get(c.class_, 0) + 1
        return out


def _current_branch(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    sid, leaf = report.sid, report.info.leaf_id
    if leaf is None:
        return
    report.tip = leaf
    rows = con.execute(query("report_branch"), {"session_id": sid, "tip": leaf}).fetchall()
    if not rows:
        return
    report.tip_position = rows[-1][0]
    stamps = [r[1] for r in rows if r[1] is not None]
    report.first_ts, report.last_ts = (min(stamps), max(stamps)) if stamps else (None, None)
    last: datetime | None = None
    total = 0
    for position, ts, is_source, tokens in rows:
        last = ts if ts is not None else last
        report.times.append(last)
        if is_source:
            total += int(tokens)
        report.source_cumulative.append((position, total))
    report.branch_source_tokens = total


def _memory_timeline(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    if report.tip is None:
        return
    for row in con.execute(query("report_memory_timeline"), {"session_id": report.sid, "tip": report.tip}).fetchall():
        report.timeline.append(MemoryPoint(row[0], row[1], int(row[2]), int(row[3]), int(row[4]), int(row[5]),
                                           float(row[6]), float(row[7])))


def _folded_memory(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    if report.tip is None:
        return
    row = con.execute(query("report_folded_memory"), {"session_id": report.sid, "tip": report.tip}).fetchone()
    report.visible, report.replayed = (int(row[0]), int(row[1])), (int(row[2]), int(row[3]))


def _model_calls(con: duckdb.DuckDBPyConnection, report: SessionReport) -> None:
    for row in con.execute(query("report_calls_by_stage"), {"session_id": report.sid}).fetchall():
        report.calls_by_stage.append(CallStats(row[0], int(row[1]), int(row[2]), int(row[3]), int(row[4]),
                                               int(row[5]), None if row[6] is None else float(row[6]), int(row[7]),
                                               row[8] or ""))


def _via_leaf(con: duckdb.DuckDBPyConnection, session_id: str, tip: str) -> str | None:
    row = dbmod.one(con, "leaf_of", {"session_id": session_id, "entry_id": tip})
    return row[0] if row else None


def collect(db_path: str | os.PathLike, sessions: list[str] | None) -> list[SessionReport]:
    """Everything the page shows, read on read-only connections (the gap classes through ``gaps``)."""
    with reading(db_path) as con:
        infos = list_sessions(con)
        if sessions:
            wanted = list(dict.fromkeys(resolve_session(con, s) for s in sessions))
            by_id = {i.session_id: i for i in infos}
            infos = [by_id[sid] for sid in wanted]
    if not infos:
        return []
    gap_report = gaps(db_path, [i.session_id for i in infos])
    reports = [SessionReport(info) for info in infos]
    with reading(db_path) as con:
        for report in reports:
            _current_branch(con, report)
            _memory_timeline(con, report)
            _folded_memory(con, report)
            _model_calls(con, report)
            if report.tip is None:
                continue
            leaf = _via_leaf(con, report.sid, report.tip)
            found = [c for c in gap_report.compactions if c.session_id == report.sid and c.leaf_id == leaf
                     and report.tip_position is not None and c.compaction_position <= report.tip_position]
            report.compactions = sorted(found, key=lambda c: c.compaction_position)
    return reports


# ------------------------------------------------------------------ formatting


def fmt_int(value: float | int | None) -> str:
    if value is None:
        return "n/a"
    return f"{int(round(value)):,}"


def fmt_short(value: float) -> str:
    """Axis labels: 1.5k, 20k, 1.2M."""
    value = float(value)
    if abs(value) >= 1_000_000:
        text = f"{value / 1_000_000:.1f}".rstrip("0").rstrip(".") + "M"
    elif abs(value) >= 1_000:
        text = f"{value / 1_000:.1f}".rstrip("0").rstrip(".") + "k"
    else:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
    return text


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


# ------------------------------------------------------------------ SVG charts


def nice_step(span: float, target: int) -> float:
    if span <= 0:
        return 1.0
    raw = span / max(target, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * magnitude >= raw:
            return m * magnitude
    return 10 * magnitude


def ticks(low: float, high: float, target: int = 6, integer: bool = False) -> list[float]:
    step = nice_step(high - low, target)
    if integer:
        step = max(1.0, math.ceil(step))
    first = math.ceil(low / step) * step
    out = []
    value = first
    while value <= high + step * 1e-9:
        out.append(round(value, 10))
        value += step
    return out


def nice_max(value: float, target: int = 5) -> float:
    if value <= 0:
        return 1.0
    step = nice_step(value, target)
    return math.ceil(value / step - 1e-9) * step


@dataclass
class Series:
    name: str
    color: str
    points: list[tuple[float, float]]
    step: bool = True
    dash: str | None = None
    width: float = 2.0
    fill: bool = False
    dots: list[tuple[float, float, str]] | None = None  # hover points (x, y, text), drawn as small dots


@dataclass
class HLine:
    name: str
    value: float
    color: str
    dash: str = "6 4"


@dataclass
class Marker:
    """A vertical line across the plot. ``legend`` groups markers by color (a gap class), ``style`` by
    line style (solid with a triangle on top, or dashed with a triangle on the axis)."""

    x: float
    color: str
    title: str
    dash: str | None = None
    legend: str = ""
    style: str = ""


def _text_width(text: str, size: float = 12) -> float:
    return len(text) * size * 0.54


def _legend(items: list[tuple[str, str, str | None, str]], x0: float, y0: float, width: float) -> tuple[str, float]:
    """Flowing legend: items are (kind line|area|marker, color, dash, label). Returns svg and height."""
    parts: list[str] = []
    x, y = x0, y0
    for kind, color, dash, label in items:
        item_width = 26 + _text_width(label) + 18
        if x + item_width > x0 + width and x > x0:
            x, y = x0, y + 18
        dash_attr = f' stroke-dasharray="{esc(dash)}"' if dash else ""
        if kind == "bar":
            parts.append(f'<rect x="{x:.1f}" y="{y - 5:.1f}" width="20" height="10" fill="{esc(color)}"/>')
        elif kind == "marker":
            parts.append(f'<line x1="{x + 10:.1f}" y1="{y - 6:.1f}" x2="{x + 10:.1f}" y2="{y + 6:.1f}" '
                         f'stroke="{esc(color)}" stroke-width="2.5"{dash_attr}/>')
        elif kind == "area":
            parts.append(f'<rect x="{x:.1f}" y="{y - 5:.1f}" width="20" height="10" fill="{esc(color)}" '
                         f'fill-opacity="0.25" stroke="{esc(color)}" stroke-width="1.5"/>')
        else:
            parts.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x + 20:.1f}" y2="{y:.1f}" stroke="{esc(color)}" '
                         f'stroke-width="2.5"{dash_attr}/>')
        parts.append(f'<text x="{x + 26:.1f}" y="{y + 4:.1f}" class="legend">{esc(label)}</text>')
        x += item_width
    return "".join(parts), (y - y0) + 18


def _chart_frame(css_class: str, width: float, height: float, title: str, legend_svg: str,
                 left: float, top: float, plot_w: float, plot_h: float) -> list[str]:
    """The opening of every chart: the svg element, its title, the legend and the plot background."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" class="{esc(css_class)}" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}">',
            f'<title>{esc(title)}</title>',
            f'<text x="{left}" y="24" class="chart-title">{esc(title)}</text>',
            legend_svg,
            f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot-bg"/>']


def line_chart(*, title: str, y_label: str, x_label: str, x_max: float, series: Sequence[Series],
               hlines: Sequence[HLine] = (), markers: Sequence[Marker] = (),
               time_of: Callable[[int], str] | None = None, integer_y: bool = False,
               width: int = 1040, height: int = 300, css_class: str = "chart") -> str:
    """A line chart with axes, ticks, gridlines, legend, horizontal reference lines and vertical markers."""
    left, right = 72, 24
    legend_items: list[tuple[str, str, str | None, str]] = []
    for s in series:
        if s.name:
            legend_items.append(("area" if s.fill else "line", s.color, s.dash, s.name))
    for h in hlines:
        legend_items.append(("line", h.color, h.dash, f"{h.name} ({fmt_int(h.value)})"))
    seen: set[str] = set()
    for m in markers:
        if m.legend and m.legend not in seen:
            seen.add(m.legend)
            legend_items.append(("marker", m.color, None, m.legend))
    for m in markers:
        if m.style and m.style not in seen:
            seen.add(m.style)
            legend_items.append(("marker", "#6b7280", m.dash, m.style))
    legend_svg, legend_height = _legend(legend_items, left, 44, width - left - right)
    top = 44 + legend_height + 6
    bottom = 58 if time_of else 44
    plot_w, plot_h = width - left - right, height - top - bottom
    total_height = height

    x_max = max(float(x_max), 1.0)
    y_top = max([p[1] for s in series for p in s.points] + [h.value for h in hlines] + [0.0])
    y_max = nice_max(y_top * 1.04 if y_top > 0 else 1.0)
    if integer_y:
        y_max = max(y_max, 4.0)

    def sx(x: float) -> float:
        return left + plot_w * (x / x_max)

    def sy(y: float) -> float:
        return top + plot_h * (1 - y / y_max)

    out = _chart_frame(css_class, width, total_height, title, legend_svg, left, top, plot_w, plot_h)
    # y grid and ticks
    for value in ticks(0, y_max, 5, integer_y):
        y = sy(value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
                   f'{esc(fmt_short(value))}</text>')
    # x ticks
    for value in ticks(0, x_max, 10, True):
        x = sx(value)
        out.append(f'<line x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" y2="{top + plot_h + 5}" class="axis"/>')
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 18}" class="tick" text-anchor="middle">{int(value)}</text>')
        if time_of:
            anchor = "end" if x > left + plot_w - 30 else "middle"
            out.append(f'<text x="{x + (4 if anchor == "end" else 0):.1f}" y="{top + plot_h + 31}" class="tick time" '
                       f'text-anchor="{anchor}">{esc(time_of(int(value)))}</text>')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{total_height - 8}" class="axis-label" '
               f'text-anchor="middle">{esc(x_label)}</text>')
    cy = top + plot_h / 2
    out.append(f'<text x="16" y="{cy:.1f}" class="axis-label" text-anchor="middle" '
               f'transform="rotate(-90 16 {cy:.1f})">{esc(y_label)}</text>')
    # vertical markers under the data: dashed ones first, so solid ones at the same place stay visible
    for m in sorted(markers, key=lambda m: m.dash is None):
        x = sx(m.x)
        if m.dash:
            line = (f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{top + plot_h:.1f}" stroke="{esc(m.color)}" '
                    f'stroke-width="1.4" stroke-opacity="0.8" stroke-dasharray="{esc(m.dash)}"/>')
            base = top + plot_h
            head = f'M{x - 4:.1f},{base:.1f} L{x + 4:.1f},{base:.1f} L{x:.1f},{base - 7:.1f} Z'
        else:
            line = (f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{top + plot_h:.1f}" stroke="{esc(m.color)}" '
                    f'stroke-width="2.2"/>')
            head = f'M{x - 5:.1f},{top - 9:.1f} L{x + 5:.1f},{top - 9:.1f} L{x:.1f},{top - 1:.1f} Z'
        out.append(f'<g class="marker"><title>{esc(m.title)}</title>{line}<path d="{head}" fill="{esc(m.color)}"/></g>')
    # reference lines
    for h in hlines:
        y = sy(h.value)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="{esc(h.color)}" '
                   f'stroke-width="1.5" stroke-dasharray="{esc(h.dash)}"/>')
        out.append(f'<text x="{left + plot_w - 4}" y="{y - 5:.1f}" class="ref-label" text-anchor="end" '
                   f'fill="{esc(h.color)}">{esc(h.name)} {esc(fmt_short(h.value))}</text>')
    # series
    for s in series:
        if not s.points:
            continue
        coords: list[tuple[float, float]] = []
        previous: float | None = None
        for x, y in s.points:
            if s.step and previous is not None:
                coords.append((sx(x), sy(previous)))
            coords.append((sx(x), sy(y)))
            previous = y
        text = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        if s.fill:
            base = sy(0)
            d = (f"M{coords[0][0]:.1f},{base:.1f} " + " ".join(f"L{x:.1f},{y:.1f}" for x, y in coords)
                 + f" L{coords[-1][0]:.1f},{base:.1f} Z")
            out.append(f'<path d="{d}" fill="{esc(s.color)}" fill-opacity="0.14" stroke="none"/>')
        dash_attr = f' stroke-dasharray="{esc(s.dash)}"' if s.dash else ""
        out.append(f'<polyline points="{text}" fill="none" stroke="{esc(s.color)}" stroke-width="{s.width}" '
                   f'stroke-linejoin="round"{dash_attr}><title>{esc(s.name)}</title></polyline>')
        for x, y, tip in s.dots or ():
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{esc(s.color)}" class="dot">'
                           f'<title>{esc(tip)}</title></circle>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(*, title: str, rows: Sequence[tuple[str, Sequence[float]]], segments: Sequence[tuple[str, str]],
              x_label: str, value_format: Callable[[float], str] = fmt_int, width: int = 1040,
              integer_x: bool = False) -> str:
    """Horizontal stacked bars, one row per label, with a value axis, legend and totals."""
    left, right = 190, 90
    legend_svg, legend_height = _legend([("bar", c, None, n) for n, c in segments], left, 44, width - left - right)
    top = 44 + legend_height + 6
    bar_h, gap = 20, 10
    plot_h = len(rows) * (bar_h + gap) + gap
    height = top + plot_h + 48
    plot_w = width - left - right
    total_max = max([sum(v) for _, v in rows] + [0.0])
    x_max = nice_max(total_max if total_max > 0 else 1.0)
    if integer_x:
        x_max = max(x_max, 4.0)

    def sx(v: float) -> float:
        return left + plot_w * (v / x_max)

    out = _chart_frame("chart", width, height, title, legend_svg, left, top, plot_w, plot_h)
    for value in ticks(0, x_max, 6, integer_x):
        x = sx(value)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" class="grid"/>')
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 18}" class="tick" text-anchor="middle">'
                   f'{esc(fmt_short(value))}</text>')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" class="axis"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" class="axis"/>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 10}" class="axis-label" text-anchor="middle">'
               f'{esc(x_label)}</text>')
    for i, (label, values) in enumerate(rows):
        y = top + gap + i * (bar_h + gap)
        shown = label if len(label) <= 26 else label[:25] + "…"
        out.append(f'<text x="{left - 8}" y="{y + bar_h / 2 + 4:.1f}" class="tick" text-anchor="end">'
                   f'<title>{esc(label)}</title>{esc(shown)}</text>')
        x = float(left)
        for (name, color), value in zip(segments, values):
            if value <= 0:
                continue
            w = plot_w * value / x_max
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{esc(color)}" class="bar">'
                       f'<title>{esc(label)}: {esc(name)} {esc(value_format(value))}</title></rect>')
            x += w
        out.append(f'<text x="{x + 6:.1f}" y="{y + bar_h / 2 + 4:.1f}" class="tick">{esc(value_format(sum(values)))}'
                   f'</text>')
    out.append("</svg>")
    return "".join(out)


# ------------------------------------------------------------------ page


CSS = """
:root { --ink: #1f2937; --muted: #6b7280; --line: #e5e7eb; --bg: #f8fafc; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color: var(--ink); background: var(--bg); }
main { max-width: 1140px; margin: 0 auto; padding: 24px 28px 64px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 0 0 2px; word-break: break-all; }
h3 { font-size: 15px; margin: 22px 0 8px; }
p.meta, .meta { color: var(--muted); margin: 2px 0; }
section { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 20px 22px; margin: 22px 0; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px; margin: 14px 0; }
.card { border: 1px solid var(--line); border-radius: 8px; padding: 10px 12px; background: #fbfdff; }
.card .value { font-size: 20px; font-weight: 600; }
.card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
table { border-collapse: collapse; width: 100%; margin: 8px 0 4px; font-size: 13px; }
th, td { padding: 5px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #f3f4f6; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
tr:nth-child(even) td { background: #fafafa; }
.nowrap { white-space: nowrap; }
tr.total td { font-weight: 600; border-top: 2px solid #d1d5db; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-size: 12px;
         white-space: nowrap; }
.empty { padding: 14px 16px; border: 1px dashed #cbd5e1; border-radius: 8px; color: var(--muted);
         background: #f9fafb; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 10px 0 4px; }
svg .chart-title { font-size: 15px; font-weight: 600; fill: var(--ink); }
svg .legend { font-size: 12px; fill: var(--ink); }
svg .tick { font-size: 11px; fill: #4b5563; }
svg .tick.time { fill: #9ca3af; font-size: 10px; }
svg .axis-label { font-size: 12px; fill: #374151; }
svg .ref-label { font-size: 11px; }
svg .plot-bg { fill: #fcfcfd; stroke: none; }
svg .grid { stroke: #eceef1; stroke-width: 1; }
svg .axis { stroke: #9ca3af; stroke-width: 1; }
svg .marker:hover line { stroke-width: 3; }
footer { color: var(--muted); font-size: 12px; margin-top: 30px; }
"""


def _cards(items: Sequence[tuple[str, str]]) -> str:
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="value">{esc(v)}</div><div class="label">{esc(k)}</div></div>'
        for k, v in items) + "</div>"


def _badge(cls: str) -> str:
    color = CLASS_COLORS.get(cls, "#6b7280")
    return f'<span class="badge cls-{esc(cls)}" style="background:{esc(color)}">{esc(cls)}</span>'


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[int] = (),
           raw: Collection[int] = (), total: bool = False) -> str:
    """A table; cells are escaped unless their column is in ``raw`` (pre-built markup)."""
    head = "".join(f'<th class="num">{esc(h)}</th>' if i in numeric else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            content = cell if i in raw else esc(cell)
            cells.append(f'<td class="num">{content}</td>' if i in numeric else f"<td>{content}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if total and body:
        body[-1] = '<tr class="total">' + body[-1][4:]
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


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
        return '<h3>Model calls</h3><p class="empty no-calls">No model calls recorded for this session.</p>'
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
            'the extension would have done; never in the file); hover for details. '
            'C is the last position the included observations cover.</p>' + f'<div class="compactions">{table}</div>')


def _session_html(index: int, report: SessionReport, settings: Settings) -> str:
    info = report.info
    final = report.final
    classes = report.class_counts()
    calls = report.calls
    parts = [f'<section class="session" id="{anchor_id(index, report.sid)}" data-session="{esc(report.sid)}">',
             f"<h2>Session <code>{esc(report.sid)}</code></h2>",
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
    parts.append(f'<p class="meta">Observations shown as active / recorded. Visible memory is what the session '
                 f'file shows the agent (its latest om.folded compaction): {report.visible[0]} observations, '
                 f'{report.visible[1]} reflections; the replayed view (with the replay\'s simulated compactions) '
                 f'holds {report.replayed[0]} observations, {report.replayed[1]} reflections. Compactions by class: '
                 f'{esc(compaction_text)}.</p>')
    if report.timeline:
        parts.append('<h3>Memory</h3>')
        parts.append(_memory_charts(report, settings))
        pressure = (final.pool_tokens / settings.observationsPoolMaxTokens) if final else 0
        parts.append(f'<p class="meta">{len(report.timeline)} positions carry ledger records; at the tip the pool '
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
    calls = CallStats("all")
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
    parts = ['<section class="overview" id="overview"><h2>Overview</h2>',
             '<p class="meta">Counts are those at the tip of each session\'s current branch.</p>',
             _cards([("sessions", fmt_int(len(reports))), ("observations", fmt_int(observations)),
                     ("reflections", fmt_int(reflections)), ("dropped", fmt_int(dropped)),
                     ("compactions in the files", fmt_int(compactions - replayed)),
                     ("replayed compactions", fmt_int(replayed)), ("model calls", fmt_int(calls.calls)),
                     ("input tokens", fmt_int(calls.input_tokens)), ("output tokens", fmt_int(calls.output_tokens)),
                     ("cached tokens", fmt_int(calls.cached_tokens)),
                     (_cost_label(calls), fmt_cost(calls.cost)),
                     ("cost per 1M source tokens",
                      fmt_cost_per_million(calls.cost, sum(r.info.tokens_pi or 0 for r in reports)))])]
    class_rows = [[_badge(c), fmt_int(n), CLASS_NOTES[c]] for c, n in classes.items()]
    parts.append('<h3>Compactions by gap class</h3>')
    parts.append(_table(["class", "compactions", "meaning"], class_rows, numeric={1}, raw={0}))
    if compactions:
        parts.append(bar_chart(
            title="Compactions per session by gap class",
            rows=[(r.sid[:8] + " " + Path(r.info.file_path).name, [r.class_counts()[c] for c in GAP_CLASSES])
                  for r in reports],
            segments=[(c, CLASS_COLORS[c]) for c in GAP_CLASSES], x_label="compactions on the current branch",
            integer_x=True))
    if calls.calls:
        parts.append(bar_chart(
            title="Model tokens per session",
            rows=[(r.sid[:8] + " " + Path(r.info.file_path).name, (r.calls.input_tokens, r.calls.output_tokens))
                  for r in reports],
            segments=[("input tokens", INPUT_COLOR), ("output tokens", OUTPUT_COLOR)], x_label="tokens"))
    rows = []
    for i, r in enumerate(reports):
        link = f'<a href="#{anchor_id(i, r.sid)}" title="{esc(r.sid)}"><code>{esc(r.sid[:8])}</code></a>'
        final = r.final
        rows.append([link, Path(r.info.file_path).name, fmt_int((r.tip_position or -1) + 1), fmt_int(r.info.tokens_pi),
                     fmt_int(final.recorded if final else 0), fmt_int(final.reflections if final else 0),
                     fmt_int(final.dropped if final else 0), fmt_int(final.pool_tokens if final else 0),
                     fmt_int(r.file_compactions), fmt_int(r.replayed_compactions), fmt_int(r.calls.calls),
                     fmt_int(r.calls.input_tokens + r.calls.output_tokens), fmt_cost(r.calls.cost, r.calls.unpriced),
                     fmt_cost_per_million(r.calls.cost, r.info.tokens_pi)])
    parts.append('<h3>Sessions</h3>')
    parts.append(_table(["session", "file", "branch entries", "source tokens", "observations", "reflections",
                         "dropped", "pool tokens", "compactions in the file", "replayed compactions", "model calls",
                         "model tokens", "cost", "cost / 1M source tokens"],
                        rows, numeric=set(range(2, 14)), raw={0}))
    parts.append(f'<p class="meta">Pool budget {fmt_int(settings.observationsPoolMaxTokens)} tokens, target '
                 f'{fmt_int(settings.pool_target_tokens)} (observationsPoolMaxTokens, observationsPoolTargetTokens).'
                 '</p></section>')
    return "".join(parts)


def render_page(reports: list[SessionReport], settings: Settings, db_path: str | os.PathLike) -> str:
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = ["<h1>Observational memory report</h1>",
            f'<p class="meta">Database <code>{esc(Path(db_path))}</code> · generated {esc(generated)} · '
            f'{len(reports)} session{"s" if len(reports) != 1 else ""}</p>']
    if not reports:
        body.append('<section><p class="empty no-sessions">No sessions in this database: run '
                    '<code>om ingest PATH</code> first.</p></section>')
    else:
        body.append(_overview_html(reports, settings))
        body.extend(_session_html(i, r, settings) for i, r in enumerate(reports))
    body.append('<footer>Made by <code>om report</code>: inline SVG, no scripts; hover a point or a marker for '
                'details.</footer>')
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
            f"<title>om report</title><style>{CSS}</style></head><body><main>"
            + "".join(body) + "</main></body></html>\n")


def build_report(db_path: str | os.PathLike, sessions: list[str] | None, out_dir: str | os.PathLike,
                 settings: Settings | None = None) -> Path:
    """Write ``out_dir/index.html`` about ``sessions`` (references as `om` accepts them; None: all)."""
    settings = settings or Settings()
    reports = collect(db_path, sessions)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{out} is a file; --out takes a directory for index.html")
    out.mkdir(parents=True, exist_ok=True)
    index = out / "index.html"
    index.write_text(render_page(reports, settings, db_path), encoding="utf-8")
    return index
