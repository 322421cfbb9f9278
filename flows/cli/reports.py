"""`om gaps`, `om export`, `om report`, `om logs`: reports on what the ledger and the runs hold."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli.common import SESSION_HELP, app, err, examples, out, print_json, print_rows, workspace


@app.command(epilog=examples('om gaps', 'om gaps SESSION --gap-safe', 'om gaps --json'))
def gaps(
    sessions: Optional[list[str]] = typer.Argument(None, help="Sessions (default: all)."),
    gap_safe: bool = typer.Option(False, "--gap-safe", help="Report the same for the gap-safe boundaries."),
    as_json: bool = typer.Option(False, "--json", help='Print {"compactions": [...], "totals": {class: count}}.'),
) -> None:
    """Compaction gaps: raw messages in neither the summary nor the kept tail, per compaction
    (Pi's own, the extension's, simulated) on every branch it appears on, with totals per class."""
    from om_core.gaps import gaps as run_gaps

    report = run_gaps(workspace(), sessions or None, gap_safe)
    if as_json:
        print_json(report.as_json())
        return
    print_rows(["session", "compaction", "origin", "F", "C", "gap msgs", "gap tokens", "class"],
               [[c.session_id, c.compaction_id, c.origin + (f"/{c.trigger}" if c.trigger else ""),
                 str(c.first_kept_position), str(c.c_position), str(c.gap_messages), str(c.gap_tokens), c.class_]
                for c in report.compactions],
               title="compaction gaps" + (" (gap-safe boundaries)" if gap_safe else ""))
    out.print("totals: " + ", ".join(f"{k} {v}" for k, v in report.totals().items()))


@app.command(epilog=examples(
    'om export SESSION --out continued.jsonl', 'om export SESSION --out continued.jsonl --force --json'))
def export(
    session: str = typer.Argument(..., help=SESSION_HELP),
    out_file: Path = typer.Option(..., "--out", help="The new session file to write (never the input)."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
    compact: bool = typer.Option(False, "--compact", help="Also append at the tip a compaction entry Pi reads: the "
                                 "memory summary at Pi's cut point (so plain Pi resumes from it)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a new Pi session file holding this project's ledger records as the extension's custom
    entries, so Pi with the extension continues with this memory."""
    from om_core.export import export_session

    report = export_session(workspace(), session, out_file, overwrite=force, compact=compact)
    if as_json:
        print_json(report.as_json())
    else:
        out.print(f"wrote {escape(str(report.out))}: {report.entries} entries and {report.records} ledger record(s); "
                  f"{report.relinked} entr(ies) re-linked after records")
        if report.compaction is not None:
            c = report.compaction
            out.print(f"compaction {c['id']} at the tip: first kept entry {c['firstKeptEntryId']}, "
                      f"tokensBefore {c['tokensBefore']}")
        elif report.compaction_skipped:
            err.print(f"[yellow]no compaction written[/]: {escape(report.compaction_skipped)}")


@app.command(epilog=examples('om report', 'om report SESSION --out report-dir'))
def report(
    sessions: Optional[list[str]] = typer.Argument(None, help="Sessions (default: all)."),
    out_dir: Path = typer.Option(Path("report"), "--out", help="Directory for index.html."),
) -> None:
    """A static HTML report that opens offline: memory over each session's timeline, compaction
    points with their gap class, token and cost totals."""
    from om_core.report import build_report

    page = build_report(workspace(), sessions or None, out_dir)
    out.print(f"wrote {escape(str(page))}", highlight=False)


@app.command(epilog=examples(
    "om logs",
    "om logs --session 0b5e --stage observer --limit 5",
    "om logs --full --limit 1",
    "om logs --json --full --limit 0 > calls.json",
))
def logs(
    session: Optional[str] = typer.Option(None, "--session", help="Only this session (id, unique prefix, or "
                                          "ingested file path)."),
    stage: Optional[str] = typer.Option(None, "--stage", help="Only this stage: observer, reflector or dropper."),
    limit: int = typer.Option(20, "--limit", "-n", min=0, help="How many calls, newest first (0: all)."),
    full: bool = typer.Option(False, "--full", help="Also each call's request as sent (after redaction) and its "
                              "response."),
    as_json: bool = typer.Option(False, "--json", help="Print an array of call objects."),
) -> None:
    """The model calls, newest first: time, session, stage, model, status, tokens (input, output,
    cached), cost and latency. Request and response texts are kept unless storePrompts is off."""
    from om_core.logs import model_call_log

    calls = model_call_log(workspace(), session=session, stage=stage, limit=limit, full=full)
    if as_json:
        print_json([c.model_dump(mode="json", exclude=None if full else {"request", "response", "text_stored"})
                    for c in calls])
        return
    if not calls:
        err.print("no model calls recorded" + (" for these filters" if session or stage else ""))
        return
    if full:
        for c in calls:
            _print_call_text(c)
        return
    table = Table("time", "session", "stage", "model", "status", "in", "out", "cached", "cost", "ms")
    for c in calls:
        status = c.status if c.status == "ok" else f"{c.status} ({c.error_kind})"
        table.add_row(c.started_at.strftime("%Y-%m-%d %H:%M:%S"), (c.session_id or "")[:8], c.stage or "",
                      escape(c.model), status, *("" if v is None else str(v) for v in
                                                 (c.input_tokens, c.output_tokens, c.cached_tokens)),
                      "" if c.cost is None else f"${c.cost:.4f}", f"{c.latency_ms:.0f}")
    out.print(table)


def _print_call_text(c) -> None:
    """One call as text: a header line, the messages sent, the reply (written as they are, not wrapped)."""
    write = sys.stdout.write
    tokens = "/".join("-" if v is None else str(v) for v in (c.input_tokens, c.output_tokens, c.cached_tokens))
    write(f"## {c.started_at:%Y-%m-%d %H:%M:%S} {c.session_id or ''} {c.stage or ''} turn {c.turn} "
          f"attempt {c.attempt} {c.status} {c.model} tokens {tokens} (in/out/cached) "
          f"{'' if c.cost is None else f'${c.cost:.4f} '}{c.latency_ms:.0f} ms call {c.call_id}\n")
    if c.error:
        write(f"error: {c.error}\n")
    if not c.text_stored:
        write("(no text stored for this call)\n\n")
        return
    for m in c.request.get("messages", []):
        write(f"--- {m.get('role')}{' ' + m['tool_call_id'] if m.get('tool_call_id') else ''}\n")
        content = m.get("content")
        if content:
            write((content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)) + "\n")
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            write(f"[tool call {fn.get('name')}] {fn.get('arguments')}\n")
    names = [t.get("function", {}).get("name") for t in c.request.get("tools", [])]
    if names:
        write(f"--- tools: {', '.join(str(n) for n in names)}\n")
    if c.response is not None:
        write("--- response\n")
        if c.response.get("content"):
            write(c.response["content"] + "\n")
        for call in c.response.get("tool_calls", []):
            write(f"[tool call {call.get('name')}] {call.get('arguments')}\n")
    write("\n")
    sys.stdout.flush()
