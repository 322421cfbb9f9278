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
from rich.markup import escape
from rich.table import Table
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from om_core.db import resolve_db_path
from om_core.errors import InvalidArgument, OmError

# Placeholders in help and usage lines are the names users type (SESSION, --leaf ID, PATHS...), not
# Typer's {session} and <str>; flags show none.
_OPTION_METAVARS = {"leaf": "ID", "first_kept": "ID", "session": "SESSION", "model": "MODEL", "api_base": "URL",
                    "dask_address": "URL", "db": "PATH", "config": "FILE", "out_file": "FILE", "out_dir": "DIR",
                    "archive": "DIR", "live": "DIR", "every": "SECONDS", "runner": "NAME", "model_limit": "WHERE",
                    "reader": "MODEL", "judge": "MODEL"}


class _Argument(TyperArgument):
    def display_type_rich(self, ctx) -> None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw + ("..." if self.nargs != 1 else "")
        return name if self.required else f"[{name}]"


def _name_placeholders(params) -> None:
    for param in params:
        if isinstance(param, TyperArgument):
            if param.metavar is None:
                param.metavar = param.name.upper()
            param.__class__ = _Argument
        elif isinstance(param, TyperOption) and param.metavar is None:
            by_type = {"int": "N", "float": "N", "Path": "PATH"}.get(param.bare_type(), "TEXT")
            param.metavar = "" if param.is_flag else _OPTION_METAVARS.get(param.name, by_type)


class _Command(TyperCommand):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_placeholders(self.params)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        _name_placeholders([option] if option is not None else [])
        return option


class _Group(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_placeholders(self.params)
        for command in self.commands.values():  # sub-apps (`om eval`) built by their own Typer
            _adopt(command)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        _name_placeholders([option] if option is not None else [])
        return option


def _adopt(command: Any) -> None:
    """Give a plain Typer command or group (and its commands) the same placeholders."""
    if type(command) is TyperCommand:
        command.__class__ = _Command
    elif type(command) is TyperGroup:
        command.__class__ = _Group
        for sub in command.commands.values():
            _adopt(sub)
    else:
        return
    _name_placeholders(command.params)


class _Typer(typer.Typer):
    def command(self, *args: Any, cls: Any = None, **kwargs: Any):
        return super().command(*args, cls=cls or _Command, **kwargs)


app = _Typer(
    name="om",
    help="Observational memory for Pi sessions: ingest session files into DuckDB, keep a memory "
    "ledger, fold it into compactions, and recall the evidence behind any memory id.",
    epilog="Examples:\n  om ingest ~/.pi/agent/sessions\n  om run ~/.pi/agent/sessions --model openai/gpt-4o-mini\n"
    "  om sessions\n  om view SESSION\n  om recall ID\n\nom COMMAND --help shows each command's options.",
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


class _State:
    db: Path = Path("om.duckdb")
    config: Optional[Path] = None


state = _State()


@app.callback()
def _global(
    db: Optional[str] = typer.Option(
        None, "--db", envvar="OM_DB", help="DuckDB file (default ./om.duckdb; env OM_DB).", show_default=False
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", help="Settings file (TOML; default ./om.toml when present).", show_default=False
    ),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=lambda on: _print_version(on),
                                 help="Print om's version and exit."),
) -> None:
    state.db = resolve_db_path(db)
    state.config = config
    for console in (out, err):
        if not console.is_terminal:
            console.width = 100_000  # piped: whole values in tables and one-line messages, never folded at 80


def _print_version(on: bool) -> None:
    if on:
        from om_core import __version__

        sys.stdout.write(f"om {__version__}\n")
        raise typer.Exit()


def _examples(*lines: str) -> str:
    """A command's help epilog: its examples, one per line."""
    return "Examples:\n" + "\n".join(f"  {escape(line)}" for line in lines)


def workspace():
    """The command's workspace: the --db file and the settings resolved from every source."""
    from om_core.workspace import Workspace

    return Workspace.open(state.db, config=state.config)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


# ------------------------------------------------------------------ ingest


@app.command(epilog=_examples('om ingest ~/.pi/agent/sessions', 'om ingest session.jsonl other.jsonl --json'))
def ingest(
    paths: list[Path] = typer.Argument(..., help="Session files, or directories searched recursively for *.jsonl."),
    as_json: bool = typer.Option(False, "--json", help="Print the ingest report as JSON."),
) -> None:
    """Ingest Pi session files (lossless, idempotent, incremental) and any memory ledger they hold."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    from om_core.ingest import discover, ingest as run_ingest, total_bytes

    files, missing = discover(paths)
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
        report = run_ingest(state.db, paths, progress=lambda n: progress.advance(task, n))
    if as_json:
        _print_json({**report.summary(), "files": [f.model_dump() for f in report.files]})
    else:
        s = report.summary()
        out.print(
            f"ingested {s['files']} file(s) into {escape(str(state.db))}: {s['entries_added']} entries added, "
            f"{s['lines_quarantined']} line(s) quarantined ({s['seconds']} s)"
        )
        for status, count in sorted(s["by_status"].items()):
            out.print(f"  {status}: {count}")
        for f in report.files:
            for note in f.notes[:5]:
                err.print(f"  [yellow]note[/] {escape(f'{f.path}: {note}')}")
            if f.error:
                err.print(f"[red]error:[/] {escape(f'{f.path}: {f.error}')}", highlight=False)
        for missing in report.missing_paths:
            err.print(f"[red]not found[/] {escape(str(missing))}")
    if report.missing_paths or any(f.error for f in report.files):
        raise typer.Exit(1)


# ------------------------------------------------------------------ sessions, sql, cutpoint


@app.command(epilog=_examples('om sessions', 'om sessions --json'))
def sessions(as_json: bool = typer.Option(False, "--json", help="Print sessions as JSON.")) -> None:
    """List ingested sessions."""
    from om_core.catalog import sessions as list_sessions

    rows = list_sessions(state.db)
    if as_json:
        _print_json([r.model_dump(mode="json") for r in rows])
        return
    _print_rows(["session", "file", "version", "entries", "source", "leaves", "tokens (pi)", "current leaf"],
                [[r.session_id, r.file_path, str(r.version), str(r.entry_count), str(r.source_count),
                  str(r.leaf_count), str(r.tokens_pi or 0), r.leaf_id or ""] for r in rows],
                fold={"file"})


@app.command(epilog=_examples(
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
    """Run read-only SQL queries against the ledger (tables and views are listed in the README).

    Only queries run: writes (COPY, EXPORT, ATTACH, INSERT, ...), INSTALL/LOAD and SET are refused.

    BLOBs print as hex; on a narrow terminal, wide results print one block per row.
    """
    from om_core.catalog import run_sql

    if statement == "-":
        statement = sys.stdin.read()
    if as_json and as_csv:
        raise InvalidArgument("--json and --csv cannot be combined")
    results = run_sql(state.db, statement, allow_files=allow_files)
    if (as_json or as_csv) and len(results) > 1:
        raise InvalidArgument(f"--{'json' if as_json else 'csv'} prints one result: give one statement, "
                              f"not {len(results)}")
    if as_json:
        _print_json(results[0].json_rows())
    elif as_csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(results[0].columns)
        writer.writerows(results[0].text_rows())
    else:
        for i, result in enumerate(results):
            if i:
                out.print()
            _print_rows(result.columns, result.text_rows())


def _print_rows(columns: list[str], rows: list[list[str]], fold: set[str] = frozenset(),
                title: str | None = None) -> None:
    """A table of plain text whose values are never cut: only the columns in ``fold`` (paths) may fold.
    On a terminal too narrow for that, one block per row (column, value) instead."""
    table = Table(title=title)
    for name in columns:
        table.add_column(escape(name), no_wrap=name not in fold, overflow="fold")
    for row in rows:
        table.add_row(*(escape(v) for v in row))
    if not out.is_terminal:
        out.print(table)
        return
    with out.capture() as captured:
        out.print(table)
    text = captured.get()
    whole = [i for i, name in enumerate(columns) if name not in fold]
    if all(row[i] in text for row in rows for i in whole):
        out.file.write(text)
        out.file.flush()
        return
    if title:
        out.print(escape(title))
    for n, row in enumerate(rows, 1):
        out.print(f"[bold]-- row {n}[/]")
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in zip(columns, row):
            grid.add_row(escape(name), escape(value))
        out.print(grid)
    if not rows:
        out.print("(no rows)")


@app.command(epilog=_examples('om cutpoint SESSION', 'om cutpoint SESSION --leaf ID --keep-recent 8000 --json'))
def cutpoint(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
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
    from om_core.catalog import PiDeclines, cut_point
    from om_core.settings import load_settings

    settings = load_settings(state.config, {"keepRecentTokens": keep_recent, "cutPointRules": rules}).settings
    try:
        result = cut_point(state.db, session, leaf, settings.keepRecentTokens, settings.cutPointRules)
    except PiDeclines as declined:
        if not as_json:
            raise
        _print_json({"compacts": False, "reason": declined.reason, "sessionId": declined.session_id,
                     "leaf": declined.tip, "cutPointRules": declined.rules})
        raise typer.Exit(declined.exit_code) from None
    if as_json:
        _print_json(result.model_dump())
    else:
        out.print(
            f"first kept entry {result.firstKeptEntryId} at position {result.firstKeptPosition}; "
            + (f"split turn starting at {result.turnStartPosition}" if result.isSplitTurn else "not a split turn")
            + f"; tokensBefore {result.tokensBefore} ({result.cutPointRules} rules)"
        )


# ------------------------------------------------------------------ memory: view, compact, recall, status


@app.command(epilog=_examples('om view SESSION', 'om view SESSION --full', 'om view SESSION --leaf ID --json'))
def view(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Any entry id: memory as of that point on its branch."),
    full: bool = typer.Option(False, "--full", help="Full memory at the tip (the whole ledger), not visible memory."),
    replayed: bool = typer.Option(False, "--replayed", help="The replayed view: the latest folded compaction "
                                  "including the replay's simulated ones (what the extension would have shown)."),
    as_json: bool = typer.Option(False, "--json", help='Print {"observations": [...], "reflections": [...]}.'),
) -> None:
    """Show visible memory (the latest om.folded compaction the session file holds: what the agent saw),
    full memory (--full), or the replayed view of simulated compactions (--replayed)."""
    from om_core.memory import view as memory_view

    result = memory_view(state.db, session, leaf, full, replayed)
    if as_json:
        _print_json(result.memory.wire())
        return
    summary = result.memory.summary()
    if result.which == "replayed" and result.compaction is not None:
        source = "simulated" if result.compaction.origin == "simulated" else "the session file's own"
        err.print(f"replayed memory ({source} compaction {result.compaction.compactionId}): what the extension "
                  "would have shown, not what the agent saw")
    if summary is None:
        what = {"full": "full memory", "replayed": "replayed memory (no folded compaction, simulated or not, on "
                "this branch)", "visible": "visible memory"}[result.which]
        err.print(f"{what} is empty at {result.tip}")
        if result.which == "visible":
            err.print("the session file holds no om.folded compaction on this branch" if result.compaction is None
                      else f"its latest om.folded compaction {result.compaction.compactionId} holds no items")
            if result.fullCounts and any(result.fullCounts):
                err.print(f"full memory holds {result.fullCounts[0]} observation(s) and {result.fullCounts[1]} "
                          "reflection(s): om view --full")
            if result.replayedCounts and any(result.replayedCounts):
                err.print(f"the replay's simulated compactions show {result.replayedCounts[0]} observation(s) and "
                          f"{result.replayedCounts[1]} reflection(s): om view --replayed")
        return
    sys.stdout.write(summary + "\n")


@app.command(epilog=_examples(
    'om compact SESSION', 'om compact SESSION --first-kept ID --gap-safe', 'om compact SESSION --json'))
def compact(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
    first_kept: Optional[str] = typer.Option(None, "--first-kept", help="F: the first entry Pi keeps verbatim "
                                             "(default: Pi's own cut point)."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Compact as of this entry (default: current leaf)."),
    pool_max: Optional[int] = typer.Option(None, "--pool-max", min=1, help="observationsPoolMaxTokens (default: the "
                                           "setting, 20000 unless configured)."),
    gap_safe: bool = typer.Option(False, "--gap-safe", help="Move F back so no raw message falls in the gap "
                                  "(neither summarized nor kept); reports how much the kept tail grew."),
    as_json: bool = typer.Option(False, "--json", help="Print fullFold, ids, summary and the om.folded details."),
) -> None:
    """The compaction the ledger gives at F (the first entry Pi keeps): deterministic and model-free.

    Without --first-kept, F is Pi's own cut point (as `om cutpoint` shows), and the command says so.
    """
    from om_core.memory import compact as run_compact

    from om_core.settings import load_settings

    settings = load_settings(state.config).settings
    cut = None
    if first_kept is None:
        from om_core.catalog import cut_point

        cut = cut_point(state.db, session, leaf, settings.keepRecentTokens)
        first_kept = cut.firstKeptEntryId
        if not as_json:
            err.print(f"no --first-kept: using Pi's cut point, first kept entry {cut.firstKeptEntryId} (position "
                      f"{cut.firstKeptPosition} on the branch, keepRecentTokens {settings.keepRecentTokens})",
                      highlight=False)
    boundary = None
    if gap_safe:
        from om_core.gaps import gap_safe_at

        boundary = gap_safe_at(state.db, session, first_kept, leaf, settings)
        first_kept = boundary.first_kept
    pool = pool_max if pool_max is not None else settings.observationsPoolMaxTokens
    result = run_compact(state.db, session, first_kept, leaf, pool)
    if as_json:
        _print_json({**result.as_json(), **({"cutPoint": cut.model_dump()} if cut else {}),
                     **({"gapSafe": boundary.as_json()} if boundary else {})})
        return
    if boundary is not None:
        err.print(f"gap-safe first kept entry: {boundary.first_kept} (plain {boundary.plain_first_kept}; the kept "
                  f"tail grew by {boundary.kept_tail_growth_tokens} tokens)" + (f"; {boundary.guard}" if boundary.guard else ""))
    if result.summary is None:
        err.print("the projection is empty: Pi's native summarizer would run instead")
        return
    sys.stdout.write(result.summary + "\n")
    err.print(f"fullFold={str(result.fullFold).lower()}  observations={len(result.memory.observations)}  "
              f"reflections={len(result.memory.reflections)}")


@app.command(epilog=_examples('om recall 3f9a0c1b2d4e', 'om recall 3f9a0c1b2d4e --session SESSION --json'))
def recall(
    memory_id: str = typer.Argument(..., metavar="ID", help="A 12-hex observation or reflection id."),
    session: Optional[str] = typer.Option(None, "--session", help="Limit to one session (default: all sessions)."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Branch ending at this entry (needs --session)."),
    as_json: bool = typer.Option(False, "--json", help="Print the recall result as JSON."),
) -> None:
    """The exact evidence behind a memory id: records, status, and the original source messages."""
    from om_core.recall import recall as run_recall

    if leaf is not None and session is None:
        raise InvalidArgument("--leaf needs --session")
    result = run_recall(state.db, memory_id, session, leaf)
    if as_json:
        _print_json(result.as_json())
    else:
        _print_recall(result)
    if result.status == "invalid_id":
        raise typer.Exit(2)
    if result.status != "found":
        raise typer.Exit(1)


def _print_recall(result) -> None:
    if result.status != "found":
        err.print("error: " + escape(result.message or result.status), highlight=False)
        return

    def flagged(x) -> str:
        flags = [f for f, on in (("collision", x.collision), ("partial", x.partial)) if on]
        return f"{x.kind}" + (f" ({', '.join(flags)})" if flags else "")

    out.print(f"[bold]{result.id}[/]: {flagged(result)} in {', '.join(result.sessionIds)}")

    def exact(text: str) -> None:
        # recorded text goes out byte for byte: Rich would wrap it, expand tabs and strip control codes
        out.file.write(text + "\n")
        out.file.flush()

    for group in result.sessions:  # each session's branch on its own (SPEC §6)
        if len(result.sessions) > 1:
            out.print(f"\n[bold]session {escape(group.sessionId)}[/] at {escape(group.tip)}: {flagged(group)}")
        for r in group.reflections:
            out.print("\n[bold]reflection[/] ", end="")
            exact(f"[{r.id}] {r.content}")
            out.print(f"  supported by {', '.join(r.supportingObservationIds)}")
        for o in group.observations:
            label = "observation" if o.matched else "supporting observation"
            out.print(f"\n[bold]{label}[/] ({o.status}) ", end="")
            exact(f"[{o.id}] {o.timestamp} [{o.relevance}] {o.content}")
            for src in o.sources:
                # the source entry's text exactly as Pi holds it (SPEC §6): not indented, not wrapped
                out.print(f"[dim]--- source {escape(src.entryId)} {escape(src.role or '')} "
                          f"@ {escape(src.timestamp or '')}[/]")
                exact(src.text)
            if o.missingSourceEntryIds:
                out.print(f"  [yellow]missing from branch:[/] {', '.join(o.missingSourceEntryIds)}")
            if o.nonSourceEntryIds:
                out.print(f"  [yellow]not source entries:[/] {', '.join(o.nonSourceEntryIds)}")
        if group.missingSupportingObservationIds:
            out.print(f"[yellow]supporting ids never recorded:[/] {', '.join(group.missingSupportingObservationIds)}")


@app.command(epilog=_examples('om status SESSION', 'om status SESSION --leaf ID --json'))
def status(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Status as of this entry (default: current leaf)."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON."),
) -> None:
    """Memory status: observation and reflection counts, drift, the four clocks, pool pressure, errors."""
    from om_core.memory import status as memory_status
    from om_core.settings import load_settings

    s = memory_status(state.db, session, leaf, load_settings(state.config).settings)
    if as_json:
        _print_json(s.model_dump(mode="json"))
        return
    o, r, p = s.observations, s.reflections, s.pools
    out.print(f"[bold]{s.session_id}[/] at {s.tip}")
    out.print(f"observations: {o['recorded']} recorded, {o['active']} active, {o['dropped']} dropped, "
              f"{o['visible']} visible")
    out.print(f"reflections: {r['recorded']} recorded, {r['visible']} visible")
    out.print(f"drift: {len(s.drift.observationsOnlyInFull)} observation(s) and {len(s.drift.reflectionsOnlyInFull)} "
              f"reflection(s) only in full memory; {len(s.drift.visibleNoLongerActive)} visible but no longer active")
    if s.visibleCompaction is None and (o["active"] or r["recorded"]):
        out.print("visible: nothing (the session file holds no om.folded compaction on this branch; "
                  "full memory: om view --full)")
    x = s.replayed
    if x.simulatedCompactions and x.compaction is not None:
        out.print(f"replayed (the replay's simulated compactions, not what the agent saw): {x.observations} "
                  f"observations, {x.reflections} reflections from {x.compaction.origin} compaction "
                  f"{x.compaction.compactionId}; {x.drift.total} item(s) of drift: om view --replayed")
    _print_rows(["clock", "tokens", "basis", "threshold", "due", "since"],
                [[c.name, str(c.tokens), c.basis + (f" (fallback: {c.fallback})" if c.fallback else ""),
                  "" if c.threshold is None else str(c.threshold),
                  "" if c.due is None else ("yes" if c.due else "no"), c.watermark_entry_id or "start"]
                 for c in s.clocks.values()])
    out.print(f"pools: active {p['activeTokens']} / target {p['targetTokens']} / max {p['maxTokens']} tokens "
              f"({p['activePressure']:.0%}); visible {p['visibleTokens']} ({p['visiblePressure']:.0%})")
    for e in s.lastErrors:
        out.print(f"[yellow]{e.get('source')}[/]: " + escape(f"{e.get('reason')} {e.get('detail') or ''}"),
                  highlight=False)


# ------------------------------------------------------------------ gaps, export, report


@app.command(epilog=_examples('om gaps', 'om gaps SESSION --gap-safe', 'om gaps --json'))
def gaps(
    sessions: Optional[list[str]] = typer.Argument(None, help="Sessions (default: all)."),
    gap_safe: bool = typer.Option(False, "--gap-safe", help="Report the same for the gap-safe boundaries."),
    as_json: bool = typer.Option(False, "--json", help='Print {"compactions": [...], "totals": {class: count}}.'),
) -> None:
    """Compaction gaps: raw messages in neither the summary nor the kept tail, per compaction
    (Pi's own, the extension's, simulated) on every branch it appears on, with totals per class."""
    from om_core.gaps import gaps as run_gaps
    from om_core.settings import load_settings

    report = run_gaps(state.db, sessions or None, gap_safe, load_settings(state.config).settings)
    if as_json:
        _print_json(report.as_json())
        return
    _print_rows(["session", "compaction", "origin", "F", "C", "gap msgs", "gap tokens", "class"],
                [[c.session_id, c.compaction_id, c.origin + (f"/{c.trigger}" if c.trigger else ""),
                  str(c.first_kept_position), str(c.c_position), str(c.gap_messages), str(c.gap_tokens), c.class_]
                 for c in report.compactions],
                title="compaction gaps" + (" (gap-safe boundaries)" if gap_safe else ""))
    out.print("totals: " + ", ".join(f"{k} {v}" for k, v in report.totals().items()))


@app.command(epilog=_examples(
    'om export SESSION --out continued.jsonl', 'om export SESSION --out continued.jsonl --force --json'))
def export(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
    out_file: Path = typer.Option(..., "--out", help="The new session file to write (never the input)."),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists."),
    compact: bool = typer.Option(False, "--compact", help="Also append at the tip a compaction entry Pi reads: the "
                                 "memory summary at Pi's cut point (so plain Pi resumes from it)."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as JSON."),
) -> None:
    """Write a new Pi session file holding this project's ledger records as the extension's custom
    entries, so Pi with the extension continues with this memory."""
    from om_core.export import export_session
    from om_core.settings import load_settings

    settings = load_settings(state.config).settings if compact else None
    report = export_session(state.db, session, out_file, overwrite=force, compact=compact, settings=settings)
    if as_json:
        _print_json(report.as_json())
    else:
        out.print(f"wrote {escape(str(report.out))}: {report.entries} entries and {report.records} ledger record(s); "
                  f"{report.relinked} entr(ies) re-linked after records")
        if report.compaction is not None:
            c = report.compaction
            out.print(f"compaction {c['id']} at the tip: first kept entry {c['firstKeptEntryId']}, "
                      f"tokensBefore {c['tokensBefore']}")
        elif report.compaction_skipped:
            err.print(f"[yellow]no compaction written[/]: {escape(report.compaction_skipped)}")


@app.command(epilog=_examples('om report', 'om report SESSION --out report-dir'))
def report(
    sessions: Optional[list[str]] = typer.Argument(None, help="Sessions (default: all)."),
    out_dir: Path = typer.Option(Path("report"), "--out", help="Directory for index.html."),
) -> None:
    """A static HTML report that opens offline: memory over each session's timeline, compaction
    points with their gap class, token and cost totals."""
    from om_core.report import build_report

    page = build_report(workspace(), sessions or None, out_dir)
    out.print(f"wrote {escape(str(page))}", highlight=False)


# ------------------------------------------------------------------ workers: observe, reflect


def _model_options_help() -> str:
    return "litellm model string (openai/…, anthropic/…, openrouter/…, ollama/…), or 'offline'"


def _print_stage(outcome, as_json: bool) -> None:
    if as_json:
        return
    if outcome.outcome == "skipped":
        out.print(f"{outcome.stage}: nothing to do ({outcome.reason})")
    elif outcome.outcome == "failed":
        err.print(f"[red]{outcome.stage} failed[/] ({outcome.error_kind}): {escape(str(outcome.error))}",
                  highlight=False)
    elif outcome.outcome == "empty":
        out.print(f"{outcome.stage}: recorded nothing (deliberately empty; {outcome.rejected} rejected)")
    else:
        extra = f", {outcome.duplicates} duplicate(s)" if outcome.duplicates else ""
        out.print(f"{outcome.stage}: appended {outcome.items} item(s) as record {outcome.ledger_id} "
                  f"(covers up to {outcome.covers_up_to_id}; {outcome.rejected} rejected{extra})")
    if outcome.turn_cap_reached:
        err.print(f"[yellow]{outcome.stage} stopped at the turn cap ({outcome.turns} model calls)[/]")


def _stage_setup(model: Optional[str], api_base: Optional[str], as_json: bool):
    from om_core.workers.stages import ModelConfig

    ws = workspace()
    config = ModelConfig.from_settings(ws.settings, model, api_base)
    config.preflight()
    if config.offline and not as_json:
        err.print("[yellow]using the offline baseline (extractive rules, no model): set --model or OM_MODEL "
                  "to use a model[/]")
    return ws, config


@app.command(epilog=_examples('om observe SESSION', 'om observe SESSION --model openai/gpt-4o-mini'))
def observe(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Observe the branch ending at this entry."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL", help=_model_options_help()),
    api_base: Optional[str] = typer.Option(None, "--api-base", envvar="OM_API_BASE",
                                           help="Base URL of an OpenAI-compatible server."),
    as_json: bool = typer.Option(False, "--json", help="Print the stage outcome as JSON."),
) -> None:
    """Run one observer stage now on the oldest uncovered chunk, even below the threshold."""
    from om_core.workers.stages import observe_now

    ws, config = _stage_setup(model, api_base, as_json)
    outcome = observe_now(ws, session, leaf, config)
    if as_json:
        _print_json({**outcome.as_json(), "offline": config.offline})
    _print_stage(outcome, as_json)
    if outcome.outcome == "failed":
        raise typer.Exit(1)


@app.command(epilog=_examples('om reflect SESSION', 'om reflect SESSION --model anthropic/claude-sonnet-4-5 --json'))
def reflect(
    session: str = typer.Argument(..., help="Session id, unique id prefix, or ingested file path."),
    leaf: Optional[str] = typer.Option(None, "--leaf", help="Reflect on the branch ending at this entry."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL", help=_model_options_help()),
    api_base: Optional[str] = typer.Option(None, "--api-base", envvar="OM_API_BASE",
                                           help="Base URL of an OpenAI-compatible server."),
    as_json: bool = typer.Option(False, "--json", help="Print the stage outcomes as JSON."),
) -> None:
    """Run the reflector now, then the dropper if it added reflections and the pool is over target."""
    from om_core.workers.stages import reflect_now

    ws, config = _stage_setup(model, api_base, as_json)
    outcomes = reflect_now(ws, session, leaf, config)
    if as_json:
        _print_json({"stages": [o.as_json() for o in outcomes], "offline": config.offline})
    for outcome in outcomes:
        _print_stage(outcome, as_json)
    if any(o.outcome == "failed" for o in outcomes):
        raise typer.Exit(1)


@app.command(epilog=_examples(
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

    calls = model_call_log(state.db, session=session, stage=stage, limit=limit, full=full)
    if as_json:
        _print_json([c.model_dump(mode="json", exclude=None if full else {"request", "response", "text_stored"})
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


# ------------------------------------------------------------------ the pipeline: run, serve


@app.command(epilog=_examples(
    'om run ~/.pi/agent/sessions', 'om run session.jsonl --model openai/gpt-4o-mini --concurrency 2',
    'om run SESSION --model offline --json'))
def run(
    targets: list[str] = typer.Argument(..., help="Session files, directories, or ingested session ids."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL", help=_model_options_help()),
    api_base: Optional[str] = typer.Option(None, "--api-base", envvar="OM_API_BASE",
                                           help="Base URL of an OpenAI-compatible server."),
    concurrency: int = typer.Option(4, "--concurrency", min=1, help="Sessions processed in parallel."),
    no_drain: bool = typer.Option(False, "--no-drain", help="Live sessions: do not drain branches at their end."),
    runner: str = typer.Option("threads", "--task-runner", help="threads, or dask (a local cluster, or --dask-address)."),
    model_limit: Optional[str] = typer.Option(
        None, "--model-limit", help="How the model-call limit (modelConcurrency) is shared: 'process' (this "
        "process; the default for local runs) or 'prefect' (Prefect's global concurrency limit; the default with "
        "--dask-address)."),
    dask_address: Optional[str] = typer.Option(None, "--dask-address", help="Scheduler of a running Dask cluster."),
    verbose: bool = typer.Option(False, "--verbose", help="Show Prefect's own logs."),
    max_cost: Optional[float] = typer.Option(
        None, "--max-cost", min=0, metavar="USD",
        help="Stop before a model call could take this run's cost past USD (litellm's price of the model; each "
        "call's worst case is reserved first). Nothing half-done is kept: rerun to resume. Exit code 4 when it "
        "stopped the run."),
    as_json: bool = typer.Option(False, "--json", help="Print the run summary as JSON."),
) -> None:
    """Process sessions with the Prefect pipeline on a local ephemeral API: ingest, replay every
    branch with the memory workers when their clocks are due, simulate compactions, drain.

    With a model litellm has a price for, the estimated cost is printed before the run (source
    tokens still to observe × the prompt ratio bench/workers.py measured) and the real cost (from
    the provider's usage) after it.

    Sessions unchanged since their last complete replay (same settings and model) are skipped, so a
    rerun of a finished archive starts nothing. Ctrl-C (or SIGTERM) stops the run within seconds;
    rerunning the same command resumes it without repeating a model call already made."""
    if runner not in ("threads", "dask"):
        raise InvalidArgument(f"unknown --task-runner {runner!r}: use threads or dask")
    if dask_address:
        runner = "dask"  # an address names a Dask cluster: no other runner can use it
    if dask_address:  # before any work (no database opened): workers elsewhere need a server and shared results
        import os

        from flows.preflight import check_cluster_run
        from om_core.settings import load_settings

        check_cluster_run(dask_address, os.environ.get("PREFECT_API_URL"),
                          load_settings(state.config).settings.resultStorage)
    ws = workspace()
    settings = ws.settings
    from om_core.workers.stages import ModelConfig

    config = ModelConfig.from_settings(settings, model, api_base)
    config.preflight()  # before Prefect starts: credentials, provider, base URL
    if config.offline and not as_json:
        err.print("[yellow]using the offline baseline (extractive rules, no model): set --model or OM_MODEL "
                  "to use a model[/]")
    limit = model_limit or ("prefect" if dask_address else "process")
    if limit not in ("process", "prefect"):
        raise InvalidArgument("--model-limit must be 'process' or 'prefect'")
    model_dict = {"model": config.model or "offline", "api_base": config.api_base, "thinking": config.thinking,
                  "timeout": config.timeout, "limit": limit, "max_cost": max_cost}
    say = (lambda text: None) if as_json or not err.is_terminal else (lambda text: err.print(text, highlight=False))
    say("checking the targets and ingesting new lines…")
    from om_core.run_plan import plan_run

    plan = plan_run(ws, targets, model=model_dict["model"], drain=not no_drain)
    estimate = None
    if settings.passive or not plan.due:  # nothing to replay: no orchestrator starts
        summary = {"run_id": None, "sessions": [], "errors": plan.errors}
    else:
        estimate = _cost_estimate(plan.due, config, max_cost, as_json)
        say(f"{len(plan.due)} of {len(plan.session_ids)} session(s) to replay; starting the orchestrator (Prefect)…")
        summary = _run_with_display(ws, plan.due, model_dict, settings.model_dump(), concurrency, not no_drain,
                                    runner, dask_address, as_json, verbose)
        summary["errors"] = plan.errors + summary["errors"]
    due = set(plan.due) if not settings.passive else set()
    skipped = [sid for sid in plan.session_ids if sid not in due]
    rows, failures = _run_rows(summary), _run_failures(summary)
    cost = _run_cost(summary, max_cost, estimate)
    if as_json:
        _print_json({"run_id": summary["run_id"], "sessions": rows, "errors": summary["errors"],
                     "failures": failures, "skipped": skipped, "passive": settings.passive, "cost": cost})
    else:
        if summary["run_id"] is None:
            why = "passive is set: ingest only" if settings.passive else "nothing changed since the last replay"
            out.print(f"{len(plan.session_ids)} session(s), none to replay ({why})", highlight=False)
        else:
            _print_run_table(summary, rows, skipped)
        _print_failures(summary, failures)
        _print_cost(cost)
    if summary["errors"] or failures or any(r["error"] for r in summary["sessions"]):
        raise typer.Exit(1)
    if cost.get("stopped_by_max_cost"):
        raise typer.Exit(4)


def _cost_estimate(targets, config, max_cost, as_json: bool):
    """Print (and return) the run's estimated cost; --max-cost needs a model litellm can price."""
    if config.offline:
        if max_cost is not None:
            raise InvalidArgument("--max-cost needs a model (the offline baseline costs nothing)")
        return None
    from om_core.cost import estimate_for_targets

    estimate, backlog = estimate_for_targets(state.db, targets, config.model)
    if estimate.usd is None:  # a model litellm has no price for: no estimate to print
        if max_cost is not None:
            raise InvalidArgument(f"--max-cost needs the model's price, and litellm has none for {config.model!r}")
        return estimate
    if not as_json:
        basis = " (partly from file sizes)" if backlog.from_file_size else ""
        err.print(f"estimate: {backlog.source_tokens:,} source tokens to observe{basis} → about "
                  f"{estimate.prompt_tokens:,} prompt tokens ({estimate.uncached_tokens:,} uncached) and "
                  f"${estimate.usd:.4f} with {escape(config.model)}"
                  + (f"; stops before ${max_cost:.4f} (--max-cost)" if max_cost is not None else ""), highlight=False)
    return estimate


def _run_cost(summary: dict, max_cost, estimate) -> dict:
    """The run's real cost from the provider's usage, and whether --max-cost stopped it."""
    from om_core.cost import finished_budget
    from om_core.db import reading, rows_as_dicts
    from om_core.sqlfiles import query

    run_id = summary["run_id"]
    budget = finished_budget(run_id)  # this process's budget (the threads runner)
    stopped = (budget is not None and budget.exhausted) or any(s.get("budget_stop") for s in summary["sessions"])
    try:
        with reading(state.db) as con:
            [row] = rows_as_dicts(con.execute(query("run_cost"), {"run_id": run_id}))
    except Exception:  # no database (nothing ingested)
        row = {"model_calls": 0, "cost_usd": None}
    return {**row, "estimated_usd": None if estimate is None else estimate.usd, "max_cost": max_cost,
            "stopped_by_max_cost": bool(stopped)}


def _print_cost(cost: dict) -> None:
    if not cost.get("model_calls") and cost.get("estimated_usd") is None:
        return
    real = "unknown (litellm has no price)" if cost.get("cost_usd") is None else f"${cost['cost_usd']:.4f}"
    cached = f", {cost['cached_tokens']:,} of them cached" if cost.get("cached_tokens") else ""
    err.print(f"cost: {real} for {cost.get('model_calls') or 0} model calls "
              f"({cost.get('input_tokens') or 0:,} prompt tokens{cached}, {cost.get('output_tokens') or 0:,} output)"
              + ("" if cost.get("estimated_usd") is None else f"; estimated ${cost['estimated_usd']:.4f}"),
              highlight=False)
    if cost.get("stopped_by_max_cost"):
        err.print(f"[yellow]stopped by --max-cost ${cost['max_cost']:.4f}: nothing half-done was kept; "
                  "rerun to resume where it stopped[/]")


def _run_with_display(ws, session_ids, model_dict, settings_dict, concurrency, drain, runner, dask_address, quiet,
                      verbose):
    from flows.runner import prepare_environment

    prepare_environment(verbose)  # before Prefect is imported
    from rich.live import Live

    from flows import progress
    from flows.interrupt import RunInterrupted, run_interruptibly
    from flows.runner import run_pipeline
    from om_core.db import new_run_id

    run_id = new_run_id()

    def board() -> Table:
        table = Table("session", "state", "entry", "stages", "compactions", "failures", "last", title="om run")
        for row in progress.snapshot():
            table.add_row(row["session_id"], row["state"], f"{row['position']}/{row['of']}", str(row["stages"]),
                          str(row["compactions"]), str(row["failures"]), row["last"])
        return table

    def work():
        return run_pipeline(session_ids, db_path=str(state.db), model=model_dict, settings=settings_dict,
                            concurrency=concurrency, drain=drain, runner=runner, dask_address=dask_address,
                            run_id=run_id)

    try:
        if quiet or not err.is_terminal:
            return run_interruptibly(ws, run_id, work)
        with Live(board(), console=err, refresh_per_second=4, transient=True) as live:
            return run_interruptibly(ws, run_id, work, on_tick=lambda: live.update(board()))
    except RunInterrupted as exc:  # not Prefect's shutdown: the flow's thread is abandoned
        from flows.interrupt import say_and_exit

        say_and_exit(exc.interruption.stderr, exc.interruption.line, exc.interruption.exit_code)


def _run_failures(summary) -> list[dict]:
    """The run's failed stages, grouped by stage, session and error."""
    from om_core.db import reading, rows_as_dicts
    from om_core.sqlfiles import query

    if summary["run_id"] is None:
        return []
    with reading(state.db) as con:
        return rows_as_dicts(con.execute(query("run_failures"), {"run_id": summary["run_id"]}))


def _print_failures(summary, failures) -> None:
    """Under the closing table: the failed stages, then the run's errors, one line each. A run the
    circuit breaker stopped gets its one line only: every failure then has that one cause."""
    if failures and not summary.get("stopped"):
        table = Table("stage", "session", "error", "count", title="failed stages")
        for f in failures:
            table.add_row(f["stage"], f["session_id"], escape(f["error"]), str(f["count"]))
        err.print(table)
    for e in summary["errors"]:
        err.print(f"[red]error:[/] {escape(str(e))}", highlight=False)
    for s in summary["sessions"]:
        if s["error"] and not s.get("stopped"):  # stopped: the run's one error line says why
            err.print(f"[red]session {escape(s['session_id'])} failed:[/] {escape(str(s['error']))}", highlight=False)


def _run_rows(summary) -> list[dict]:
    from om_core.db import reading, rows_as_dicts
    from om_core.sqlfiles import query

    ids = [s["session_id"] for s in summary["sessions"]]
    if not ids or summary["run_id"] is None:
        return []
    with reading(state.db) as con:
        rows = rows_as_dicts(con.execute(query("run_summary"), {"run_id": summary["run_id"], "session_ids": ids}))
    errors = {s["session_id"]: s["error"] for s in summary["sessions"]}
    for row in rows:
        row["error"] = errors.get(row["session_id"])
    return rows


def _print_run_table(summary, rows, skipped=()) -> None:
    table = Table("session", "observations", "reflections", "drops", "compactions", "model calls", "tokens", "cost",
                  "errors", title=f"run {summary['run_id']}")
    totals = {k: 0 for k in ("observations", "reflections", "drops", "compactions", "model_calls", "tokens", "errors")}
    cost = 0.0
    for r in rows:
        for k in totals:
            totals[k] += r[k] or 0
        cost += r["cost"] or 0
        table.add_row(r["session_id"], *(str(r[k]) for k in ("observations", "reflections", "drops", "compactions",
                                                            "model_calls", "tokens")),
                      "" if r["cost"] is None else f"${r['cost']:.4f}",
                      str(r["errors"]) + (" + session error" if r["error"] else ""))
    table.add_row("total", *(str(totals[k]) for k in ("observations", "reflections", "drops", "compactions",
                                                      "model_calls", "tokens")), f"${cost:.4f}", str(totals["errors"]),
                  style="bold")
    out.print(table)
    if skipped:
        out.print(f"{len(skipped)} more session(s) unchanged since their last replay: skipped", highlight=False)


@app.command(epilog=_examples(
    'om serve --live ~/.pi/agent/sessions --every 600', 'om --db /data/om.duckdb serve --archive ~/pi-archive'))
def serve(
    archive: Optional[Path] = typer.Option(None, "--archive", help="Directory of archived sessions to process."),
    live: Optional[Path] = typer.Option(None, "--live", help="Live sessions directory to maintain on a schedule."),
    every: int = typer.Option(600, "--every", min=1, help="Seconds between maintenance runs of the live directory."),
    model: Optional[str] = typer.Option(None, "--model", envvar="OM_MODEL", help=_model_options_help()),
    api_base: Optional[str] = typer.Option(None, "--api-base", envvar="OM_API_BASE",
                                           help="Base URL of an OpenAI-compatible server."),
) -> None:
    """Serve the Prefect deployments from this process: archive processing and scheduled live
    maintenance, with the resolved settings. With no PREFECT_API_URL, a local Prefect server (with its
    scheduler and UI) is reused or started, and stopped again with this command."""
    import os

    from flows.server import local_server

    if archive is None and live is None:
        raise InvalidArgument("give --archive DIR and/or --live DIR")
    for path in (archive, live):
        if path is not None and not path.is_dir():
            raise InvalidArgument(f"{path} is not a directory")
    from deployments import resolved_inputs

    model_dict, settings_dict = resolved_inputs(state.config, model, api_base)
    server = None
    if not os.environ.get("PREFECT_API_URL"):  # the ephemeral API runs no schedules: use a real server
        home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
        err.print("starting a local Prefect server (PREFECT_API_URL is not set) ...")
        server = local_server(log=home / "om-serve-server.log")
        os.environ["PREFECT_API_URL"] = server.api_url
        how = "started by om serve; it stops with it" if server.started_here else "already running; reused"
        err.print(f"Prefect UI: {server.ui_url} ({how})", highlight=False)
    else:
        err.print(f"Prefect API: {os.environ['PREFECT_API_URL']}", highlight=False)
    from flows.runner import prepare_environment

    prepare_environment()
    from deployments import serve_locally

    what = ", ".join(f"{name} {escape(str(p))}" for name, p in (("archive", archive), ("live", live)) if p)
    err.print(f"serving {what}" + (f" every {every} s" if live else "") + "; Ctrl-C stops", highlight=False)
    from flows.interrupt import serve_until_signal

    # on a signal it exits at once: not Prefect's own shutdown, which pauses schedules and waits for runs
    serve_until_signal(
        lambda: serve_locally(db_path=str(state.db.resolve()), archive=archive, live=live, model=model_dict,
                              settings=settings_dict, every_seconds=every),
        cleanup=lambda: server.stop() if server is not None else None,
        farewell=lambda code: (f"stopped ({'SIGINT' if code == 130 else 'SIGTERM'}); a maintenance run in "
                               "progress was ended and its next tick redoes it"))


@app.command("config", epilog=_examples('om config', 'om --config team.toml config --json'))
def show_config(as_json: bool = typer.Option(False, "--json", help="Print settings and sources as JSON.")) -> None:
    """Print the resolved settings and where each value came from (defaults, Pi settings files,
    om.toml or --config, OM_* environment variables)."""
    from om_core.settings import load_settings

    resolved = load_settings(state.config)
    if as_json:
        rows = resolved.rows()
        _print_json({"settings": resolved.settings.model_dump(mode="json"),
                     "effective": {k: value for k, value, _ in rows},
                     "sources": {k: src for k, _, src in rows}, "notes": resolved.notes})
        return
    _print_rows(["setting", "value", "source"],
                [[key, json.dumps(value), source] for key, value, source in resolved.rows()], fold={"source"})
    for note in resolved.notes:
        err.print(f"[yellow]note:[/] {escape(str(note))}")


# ------------------------------------------------------------------ evaluations (om_core/eval)

from om_core.eval.cli import eval_app  # noqa: E402  (typer and rich only; the evaluation loads inside)

app.add_typer(eval_app, name="eval")


def main() -> None:
    """Console entry point: one error handler for every command."""
    try:
        code = app(prog_name="om", standalone_mode=False)
    except typer.TyperException as exc:  # a usage error: unknown option, missing argument, bad value
        _print_usage_error(exc)
        sys.exit(exc.exit_code)
    except typer.Abort:
        err.print("error: aborted")
        sys.exit(1)
    except OmError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _print_usage_error(exc: typer.TyperException) -> None:
    """Typer's boxed usage message on a terminal; one line (``error: …``) when stderr is not one."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # `om` or `om eval` alone: the help is already printed
        return
    if err.is_terminal:
        from typer import rich_utils

        rich_utils.rich_format_error(exc)
        return
    ctx = getattr(exc, "ctx", None)
    hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    message = " ".join(exc.format_message().split())
    err.print(f"error: {escape(message)}{hint}", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
