"""`om`: the command line. Each command parses its options, calls one library function, prints.

Read commands (view, compact, recall, status, sql, sessions, cutpoint) import neither litellm nor
Prefect; commands that need them import them inside the command.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from om_core.db import resolve_db_path
from om_core.errors import OmError

app = typer.Typer(
    name="om",
    help="Observational memory for Pi sessions: ingest session files into DuckDB, keep a memory "
    "ledger, fold it into compactions, and recall the evidence behind any memory id.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


class _State:
    db: Path = Path("om.duckdb")


state = _State()


@app.callback()
def _global(
    db: Optional[str] = typer.Option(
        None, "--db", envvar="OM_DB", help="DuckDB file (default ./om.duckdb; env OM_DB).", show_default=False
    ),
) -> None:
    state.db = resolve_db_path(db)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


# ------------------------------------------------------------------ ingest


@app.command()
def ingest(
    paths: list[Path] = typer.Argument(..., help="Session files, or directories searched recursively for *.jsonl."),
    as_json: bool = typer.Option(False, "--json", help="Print the ingest report as JSON."),
) -> None:
    """Ingest Pi session files (lossless, idempotent, incremental) and any memory ledger they hold."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from om_core.ingest import discover, ingest as run_ingest, total_bytes

    files, _ = discover(paths)
    progress = Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True, disable=as_json or not err.is_terminal,
    )
    with progress:
        task = progress.add_task(f"ingesting {len(files)} file(s)", total=total_bytes(files))
        report = run_ingest(state.db, paths, progress=lambda n: progress.advance(task, n))
    if as_json:
        _print_json({**report.summary(), "files": [f.model_dump() for f in report.files]})
    else:
        s = report.summary()
        out.print(
            f"ingested {s['files']} file(s) into {state.db}: {s['entries_added']} entries added, "
            f"{s['lines_quarantined']} line(s) quarantined ({s['seconds']} s)"
        )
        for status, count in sorted(s["by_status"].items()):
            out.print(f"  {status}: {count}")
        for f in report.files:
            for note in f.notes[:5]:
                out.print(f"  [yellow]note[/] {f.path}: {note}")
            if f.error:
                err.print(f"[red]error[/] {f.path}: {f.error}")
        for missing in report.missing_paths:
            err.print(f"[red]not found[/] {missing}")
    if report.missing_paths or any(f.error for f in report.files):
        raise typer.Exit(1)


# ------------------------------------------------------------------ sessions, sql, cutpoint


@app.command()
def sessions(as_json: bool = typer.Option(False, "--json", help="Print sessions as JSON.")) -> None:
    """List ingested sessions."""
    from om_core.catalog import sessions as list_sessions

    rows = list_sessions(state.db)
    if as_json:
        _print_json([r.model_dump(mode="json") for r in rows])
        return
    table = Table("session", "file", "version", "entries", "source", "leaves", "tokens (pi)", "current leaf")
    for r in rows:
        table.add_row(r.session_id, r.file_path, str(r.version), str(r.entry_count), str(r.source_count),
                      str(r.leaf_count), str(r.tokens_pi or 0), r.leaf_id or "")
    out.print(table)


@app.command()
def sql(
    statement: str = typer.Argument(..., help="One SQL query; the database is opened read-only."),
    as_json: bool = typer.Option(False, "--json", help="Print an array of row objects."),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV with a header row."),
) -> None:
    """Run a read-only SQL query against the ledger (views are listed in the README)."""
    from om_core.catalog import run_sql

    result = run_sql(state.db, statement)
    if as_json:
        _print_json([dict(zip(result.columns, row)) for row in result.rows])
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(result.columns)
        writer.writerows(result.rows)
    else:
        table = Table(*result.columns)
        for row in result.rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        out.print(table)


@app.command()
def cutpoint(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Compact as if the branch ended at this entry."),
    keep_recent: int = typer.Option(20_000, "--keep-recent", help="Pi's keepRecentTokens."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Where Pi's own compaction would cut this branch (prepareCompaction's cut point)."""
    from om_core.catalog import cut_point

    result = cut_point(state.db, session, leaf, keep_recent)
    if as_json:
        _print_json(result.model_dump())
    else:
        out.print(
            f"first kept entry {result.firstKeptEntryId} at position {result.firstKeptPosition}; "
            + (f"split turn starting at {result.turnStartPosition}" if result.isSplitTurn else "not a split turn")
        )


def main() -> None:
    """Console entry point: one error handler for every command."""
    try:
        app()
    except OmError as exc:
        err.print(f"[red]error:[/] {exc}")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
