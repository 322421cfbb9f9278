"""`om gaps`, `om export`, `om report`: what the ledger makes of the sessions, as a table, a new session
file, or an HTML page."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from flows.cli.common import SessionArg, app, counted, err, examples, out, print_json, print_rows, workspace


@app.command(epilog=examples('om gaps', 'om gaps SESSION --gap-safe', 'om gaps --json'))
def gaps(
    sessions: Optional[list[str]] = typer.Argument(None, help="Sessions (default: all)."),
    gap_safe: bool = typer.Option(False, "--gap-safe", help="Report the same for the gap-safe boundaries."),
    as_json: bool = typer.Option(False, "--json", help='Print {"compactions": [...], "totals": {class: count}}.'),
) -> None:
    """Compaction gaps: raw messages in neither the summary nor the kept tail, per compaction
    (Pi's own, the extension's, simulated) on every branch it appears on, with totals per class.

    \b
    Columns (positions are 0-based on the branch):
      F           position of the first kept entry: the first entry kept verbatim
      C           largest watermark of the observations in its summary (-1: none)
      gap msgs    raw messages after C and before F: neither summarized nor kept
      gap tokens  their source tokens

    \b
    Classes:
      no_gap           no raw message lies between C and F
      cross_boundary   messages lie between C and F, and an observation record
                       reaching past F was left out (--gap-safe moves F back)
      observer_lag     messages lie between C and F; no record reaches that far
      native_fallback  memory rendered nothing: Pi's own summarizer would run"""
    from om_core.memory.gaps import gaps as run_gaps

    report = run_gaps(workspace(), sessions or None, gap_safe)
    if as_json:
        print_json(report.as_json())
        return
    print_rows(["session", "compaction", "origin", "F", "C", "gap msgs", "gap tokens", "class"],
               [[c.session_id, c.compaction_id, c.origin + (f"/{c.trigger}" if c.trigger else ""),
                 str(c.first_kept_position), str(c.c_position), str(c.gap_messages), str(c.gap_tokens), c.class_]
                for c in report.compactions],
               title="compaction gaps" + (" (gap-safe boundaries)" if gap_safe else ""), short={"session"},
               drop=["F", "C", "gap msgs"])
    out.print("totals: " + ", ".join(f"{k} {v}" for k, v in report.totals().items()))


@app.command(epilog=examples(
    'om export SESSION --out continued.jsonl', 'om export SESSION --out continued.jsonl --force --json'))
def export(
    session: SessionArg,
    out_file: Path = typer.Option(..., "--out", help="The new session file to write (never the input); - writes it to standard output."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
    compact: bool = typer.Option(False, "--compact", help="Also append at the tip a compaction entry Pi reads: the "
                                 "memory summary at Pi's cut point (so plain Pi resumes from it)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a new Pi session file holding this project's ledger records as the extension's custom
    entries, so Pi with the extension continues with this memory."""
    from om_core.usecases.export import export_session

    to_stdout = str(out_file) == "-"
    report = export_session(workspace(), session, None if to_stdout else out_file, overwrite=force,
                            compact=compact, sink=sys.stdout.write)
    if to_stdout:  # the file is the output: what a summary would say goes to stderr
        err.print(f"exported {counted(report.entries, 'entry', 'entries')} and "
                  f"{counted(report.records, 'ledger record')} to standard output", highlight=False)
        return
    if as_json:
        print_json(report.as_json())
    else:
        out.print(f"wrote {escape(str(report.out))}: {counted(report.entries, 'entry', 'entries')} and "
                  f"{counted(report.records, 'ledger record')}; {counted(report.relinked, 'entry', 'entries')} "
                  "re-linked after records")
        if report.compaction is not None:
            c = report.compaction
            out.print(f"compaction {c['id']} at the tip: first kept entry {c['first_kept_entry_id']}, "
                      f"tokensBefore {c['tokens_before']}")
        elif report.compaction_skipped:
            err.print(f"[yellow]no compaction written[/]: {escape(report.compaction_skipped)}")


@app.command(epilog=examples('om report', 'om report SESSION --out report-dir'))
def report(
    sessions: Optional[list[str]] = typer.Argument(None, help="Sessions (default: all)."),
    out_dir: Path = typer.Option(Path("report"), "--out", help="Directory for index.html; - prints the page to standard output."),
) -> None:
    """A static HTML report that opens offline: memory over each session's timeline, compaction
    points with their gap class, token and cost totals."""
    from om_core.report.page import build_report, report_page

    if str(out_dir) == "-":
        sys.stdout.write(report_page(workspace(), sessions or None))
        return
    page = build_report(workspace(), sessions or None, out_dir)
    out.print(f"wrote {escape(str(page))}", highlight=False)
