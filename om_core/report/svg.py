"""A tiny SVG chart library for static pages: line charts (steps, areas, reference lines, vertical
markers with hover titles) and horizontal stacked bar charts, with axes, ticks, gridlines and a
flowing legend. It knows nothing of om: callers pass plain series, numbers and strings, and every
string is escaped here, so the markup stays well-formed XML.

Styling is by class (``chart-title``, ``legend``, ``tick``, ``grid``, ``axis``, ``plot-bg``, …): the
page that embeds the charts brings the stylesheet.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def esc(value: Any) -> str:
    """Text or an attribute value for XML/HTML: ``None`` is empty, quotes are escaped."""
    return html.escape("" if value is None else str(value), quote=True)


# ------------------------------------------------------------------ number labels


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


# ------------------------------------------------------------------ scales


def nice_step(span: float, target: int) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten) that cuts ``span`` into about ``target`` parts."""
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


# ------------------------------------------------------------------ charts


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
    """A vertical line across the plot. ``legend`` names the markers of one color, ``style`` those of
    one line style (solid with a triangle on top, or dashed with a triangle on the axis)."""

    x: float
    color: str
    title: str
    dash: str | None = None
    legend: str = ""
    style: str = ""


def _text_width(text: str, size: float = 12) -> float:
    return len(text) * size * 0.54


def _legend(items: list[tuple[str, str, str | None, str]], x0: float, y0: float, width: float) -> tuple[str, float]:
    """Flowing legend: items are (kind line|area|bar|marker, color, dash, label). Returns svg and height."""
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
    """A line chart with axes, ticks, gridlines, legend, horizontal reference lines and vertical markers.
    ``time_of`` labels each x tick a second time, below its number (a time, say)."""
    left, right = 72, 24
    legend_items: list[tuple[str, str, str | None, str]] = []
    for s in series:
        if s.name:
            legend_items.append(("area" if s.fill else "line", s.color, s.dash, s.name))
    data_top = max([p[1] for s in series for p in s.points] + [0.0])
    # the y axis is scaled to the data: a reference line far above it (a 20k budget over a 2k pool) would
    # flatten the data to the bottom edge, so it is named in the legend as above the chart instead
    drawn = [h for h in hlines if data_top <= 0 or h.value <= 2 * data_top]
    for h in hlines:
        legend_items.append(("line", h.color, h.dash, f"{h.name} ({fmt_int(h.value)})"
                             + ("" if h in drawn else ": above the chart")))
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
    y_top = max([data_top] + [h.value for h in drawn])
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
    # markers at one position (Pi's compaction and the one the replay simulated there) stand side by side
    # rather than on top of each other
    at: dict[float, list[Marker]] = {}
    for m in markers:
        at.setdefault(m.x, []).append(m)
    shift = {id(m): (i - (len(group) - 1) / 2) * 5 for group in at.values() for i, m in enumerate(group)}
    for m in sorted(markers, key=lambda m: m.dash is None):
        x = sx(m.x) + shift[id(m)]
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
    for h in drawn:
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

