"""`om ingest`, `om sessions`, `om sql`, `om cutpoint`: what the database holds, and where Pi
would cut; no model and no orchestrator."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from flows.cli.common import (ExcludeOpt, SessionArg, app, counted, err, examples, out, print_json, print_rows,
                              workspace)
from om_core.errors import InvalidArgument, OmError


@app.command(epilog=examples('om ingest ~/.pi/agent/sessions', 'om ingest session.jsonl other.jsonl --json',
                            "om ingest ~/sessions --exclude '*.log.jsonl' --exclude 'scratch/*'"))
def ingest(
    paths: list[Path] = typer.Argument(..., help="Session files, or directories searched recursively for *.jsonl."),
    exclude: ExcludeOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print the ingest report as JSON."),
) -> None:
    """Ingest Pi session files (lossless, idempotent, incremental) and any memory ledger they hold.

    A file a directory walk finds that is no Pi session (no session header in its lines) is skipped
    with a note; a file named on the command line that is none is an error (exit 1, its lines kept in
    quarantine)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from om_core.ingest import discover, ingest as run_ingest, total_bytes

    ws = workspace()
    files, missing = discover(paths, exclude or ())
    if not files:  # nothing to read: say so, and do not create an empty database
        if missing:
            raise OmError("no such file or directory: " + ", ".join(missing))
        raise OmError("no *.jsonl session files found in " + ", ".join(str(p) for p in paths))
    progress = Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True, disable=as_json or not err.is_terminal,
    )
    with progress:
        task = progress.add_task(f"ingesting {len(files)} file(s)", total=total_bytes(files))
        with ws.one_writer("ingest"):
            report = run_ingest(ws, paths, progress=lambda n: progress.advance(task, n), exclude=exclude or ())
    if as_json:
        print_json({**report.summary(), "files": [f.model_dump() for f in report.files]})
    else:
        s = report.summary()
        ingested = sum(1 for f in report.files if not f.error)  # a file that is no session is not ingested
        refused = len(report.files) - ingested
        out.print(
            (f"ingested {counted(ingested, 'file')}" if ingested else "no session file ingested")
            + f" into {escape(str(ws.path))}: {s['entries_added']} entries added, "
            f"{s['lines_quarantined']} line(s) quarantined ({s['seconds']} s)"
            + (f"; {counted(refused, 'file')} not ingested (below)" if refused else ""), highlight=False
        )
        for status, count in sorted(s["by_status"].items()):
            out.print(f"  {status}: {count}")
        for f in report.files:
            for done in f.followed:  # Pi migrated the file (or forked it): om's memory re-anchored to its ids
                out.print(escape(f"  {f.path}: {done.describe()}"), highlight=False)
            for loss in f.replaced:  # what a rewrite took away; nothing of the ledger was deleted
                err.print(f"[yellow]warning[/] {escape(f'{f.path}: {loss.describe()}')}", highlight=False)
            for note in f.notes[:5]:
                err.print(f"  [yellow]note[/] {escape(f'{f.path}: {note}')}")
            if f.error:
                err.print(f"[red]error:[/] {escape(f'{f.path}: {f.error}')}", highlight=False)
        for missing in report.missing_paths:
            err.print(f"[red]not found[/] {escape(str(missing))}")
    if report.missing_paths or any(f.error for f in report.files):
        raise typer.Exit(1)


@app.command(epilog=examples('om sessions', 'om sessions --json'))
def sessions(as_json: bool = typer.Option(False, "--json", help="Print sessions as JSON.")) -> None:
    """List ingested sessions."""
    from om_core.store.catalog import sessions as list_sessions

    rows = list_sessions(workspace())
    if as_json:
        print_json([r.model_dump(mode="json") for r in rows])
        return
    if not rows:
        out.print(escape(f"no sessions in {workspace().path} (om run PATH ingests and processes them)"),
                  highlight=False)
        return
    print_rows(["session", "file", "version", "entries", "source", "leaves", "tokens (pi)", "current leaf"],
               [[r.session_id, r.file_path, str(r.version), str(r.entry_count), str(r.source_count),
                 str(r.leaf_count), str(r.tokens_pi or 0), r.leaf_id or ""] for r in rows],
               fold={"file"})


@app.command(epilog=examples(
    'om sql .tables', 'om sql ".schema entry_texts"',
    'om sql "SELECT class, count(*) FROM compaction_gaps GROUP BY ALL"',
    'om sql --csv "SELECT stage, sum(cost) FROM llm_calls GROUP BY ALL" > cost.csv',
    "om sql - < report.sql",
    "om sql --allow-files \"SELECT * FROM read_json('notes.jsonl')\"",
))
def sql(
    statement: str = typer.Argument(..., metavar="QUERY", help="SQL queries (several separated by ';'), or - to "
                                    "read them from standard input."),
    as_json: bool = typer.Option(False, "--json", help="Print an array of row objects (one statement)."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV with a header row (one statement)."),
    allow_files: bool = typer.Option(False, "--allow-files", help="Let queries read files on disk (read_csv, "
                                     "read_json, read_text, ...); off by default."),
) -> None:
    """Run read-only SQL queries against the ledger (its views and macros: docs/reference/schema.md).

    .tables lists the views and macros; .schema [NAME] gives their columns and types (a macro: its
    parameters). Each entry's text, as om recall prints it, is in the view entry_texts.

    Only queries run: writes (COPY, EXPORT, ATTACH, INSERT, ...), INSTALL/LOAD and SET are refused.

    BLOBs print as hex; on a narrow terminal, wide results print one block per row.
    """
    from om_core.store.catalog import run_sql

    if statement == "-":
        statement = sys.stdin.read()
    if as_json and as_csv:
        raise InvalidArgument("--json and --csv cannot be combined")
    results = run_sql(workspace(), statement, allow_files=allow_files)
    if (as_json or as_csv) and len(results) > 1:
        raise InvalidArgument(f"--{'json' if as_json else 'csv'} prints one result: give one statement, "
                              f"not {len(results)}")
    if as_json:
        print_json(results[0].json_rows())
    elif as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(results[0].columns)
        writer.writerows(results[0].text_rows())
    else:
        for i, result in enumerate(results):
            if i:
                out.print()
            print_rows(result.columns, result.text_rows())


@app.command(epilog=examples('om cutpoint SESSION', 'om cutpoint SESSION --leaf ID --keep-recent 8000 --json'))
def cutpoint(
    session: SessionArg,
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Compact as if the branch ended at this entry."),
    keep_recent: Optional[int] = typer.Option(None, "--keep-recent", min=0, help="Pi's keepRecentTokens "
                                              "(default: the setting, 20000 unless configured)."),
    rules: Optional[str] = typer.Option(None, "--rules", help="Pi's compaction rules: pi-1.6 or legacy "
                                        "(default: the cutPointRules setting, pi-1.6)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Where Pi's own compaction would cut this branch (prepareCompaction's cut point), and the
    tokensBefore it would record. Where Pi would not compact, exits 1 with the reason (with --json:
    {"compacts": false, "reason": ...})."""
    from om_core.store.catalog import PiDeclines, cut_point

    ws = workspace({"keepRecentTokens": keep_recent, "cutPointRules": rules})
    ws.settings  # noqa: B018  (a bad --rules or setting is reported before the database is read)
    try:
        result = cut_point(ws, session, leaf)
    except PiDeclines as declined:
        if not as_json:
            raise
        print_json({"compacts": False, "reason": declined.reason, "session_id": declined.session_id,
                    "leaf": declined.tip, "cut_point_rules": declined.rules})
        raise typer.Exit(declined.exit_code) from None
    if as_json:
        print_json(result.as_json())
    else:
        out.print(
            f"first kept entry {result.firstKeptEntryId} at position {result.firstKeptPosition}; "
            + (f"split turn starting at {result.turnStartPosition}" if result.isSplitTurn else "not a split turn")
            + f"; tokensBefore {result.tokensBefore} ({result.cutPointRules} rules)"
        )
