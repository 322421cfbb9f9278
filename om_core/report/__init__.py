"""`om report`: a static HTML page about memory, compactions and model spend (see ``page``).

* ``data``: what the page shows, read through the named queries of ``sql/queries/report.sql`` into typed rows.
* ``svg``: a small chart library (axes, line and bar charts, escaping) that knows nothing of om.
* ``page``: the HTML page assembled from the two, styled by ``report.css`` (a file of this package).
"""

from om_core.report.data import GAP_CLASSES, CallStats, MemoryPoint, SessionReport, collect
from om_core.report.page import build_report, fmt_cost, render_page
from om_core.report.svg import esc, fmt_int, fmt_short, nice_max, ticks

__all__ = ["GAP_CLASSES", "CallStats", "MemoryPoint", "SessionReport", "build_report", "collect", "esc", "fmt_cost",
           "fmt_int", "fmt_short", "nice_max", "render_page", "ticks"]
