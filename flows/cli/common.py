"""What every `om` command shares: the app and its global options (--db, --config), the one
workspace a command builds from them, the consoles, the help epilog of examples, and the output
helpers (JSON for scripts, tables whose values are never cut).

A command module holds one thin function per command: parse, build the workspace, call the
library, print.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.cells import cell_len
from rich.table import Table

from flows.cli.placeholders import Group, Typer
from om_core.store.db_path import default_db_path, resolve_db_path

if TYPE_CHECKING:  # loaded by the commands that use them: `om live compact` may only ask an endpoint
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace
    from om_core.workers.run_config import ModelConfig

# The options several commands take, declared once.
SessionArg = Annotated[str, typer.Argument(help="Session id, unique id prefix, or ingested file path.")]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", envvar="OM_MODEL", help="litellm model string (openai/…, anthropic/…, openrouter/…, ollama/…), or "
    "'offline'")]
ExcludeOpt = Annotated[Optional[list[str]], typer.Option(
    "--exclude", metavar="GLOB", help="Leave out the files a directory walk finds whose name or path below the "
    "directory matches GLOB (repeatable; a file named on the command line is always read).")]
ApiBaseOpt = Annotated[Optional[str], typer.Option("--api-base", envvar="OM_API_BASE",
                                                   help="Base URL of an OpenAI-compatible server.")]

app = Typer(
    name="om",
    help="Observational memory for Pi sessions: ingest session files into DuckDB, keep a memory "
    "ledger, fold it into compactions, and recall the evidence behind any memory id.",
    epilog="Examples:\n  om ingest ~/.pi/agent/sessions\n  om run ~/.pi/agent/sessions --model openai/gpt-4o-mini\n"
    "  om sessions\n  om view SESSION\n  om recall ID\n\nom COMMAND --help shows each command's options.",
    cls=Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)


class _State:
    db: Path = Path("om.duckdb")  # set by the callback: --db, OM_DB, or the user's data directory
    db_existed: Optional[bool] = None  # whether the database was there before the command
    db_named: bool = False  # --db or OM_DB named it (else om's default; `om live` may find the endpoint's)
    config: Optional[Path] = None
    project_settings: bool = True  # the working folder's .pi/settings.json and om.toml count


state = _State()


def mount(group: Typer, name: str) -> None:
    """``group`` as `om NAME`, once (the entry point mounts `om live` alone, then maybe the whole app)."""
    if not any(info.name == name for info in app.registered_groups):
        app.add_typer(group, name=name)


@app.callback()
def _global(
    db: Optional[str] = typer.Option(
        None, "--db", envvar="OM_DB", help="DuckDB file (default: om.duckdb in the user's data directory, "
        "$XDG_DATA_HOME/om or ~/.local/share/om; env OM_DB).", show_default=False
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", help="Settings file (TOML; default ./om.toml when present).", show_default=False
    ),
    project_settings: bool = typer.Option(
        True, "--project-settings/--no-project-settings", help="Read the working folder's own settings "
        "(.pi/settings.json, om.toml); the Pi extension passes --no-project-settings for a folder Pi does not trust.",
        show_default=False),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=lambda on: _print_version(on),
                                 help="Print om's version and exit."),
) -> None:
    state.project_settings = project_settings
    state.db = resolve_db_path(db)
    state.db_existed = state.db.exists()
    state.db_named = bool(db)
    state.config = config
    for console in (out, err):
        if not console.is_terminal:
            console.width = 100_000  # piped: whole values in tables and one-line messages, never folded at 80


def text_width() -> int:
    """The columns output may take: the terminal's, else COLUMNS when set (a pipe to a pager or a
    log), else 100."""
    if out.is_terminal:
        return out.size.width
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else 100


def _print_version(on: bool) -> None:
    if on:
        from om_core import __version__

        sys.stdout.write(f"om {__version__}\n")
        raise typer.Exit()


def db_source() -> str:
    """Where the database in use was named: --db, OM_DB, or om's default."""
    if os.environ.get("OM_DB") and Path(os.environ["OM_DB"]) == state.db:
        return "OM_DB"
    return "om's default, in the user's data directory" if state.db == default_db_path() else "--db"


def warn_exposure(db: Path) -> None:
    """The lines saying what would let others read the database (a git work tree that does not ignore
    it, a file others can read), on stderr."""
    from om_core.store.private_files import exposure_warnings

    for line in exposure_warnings(db):
        err.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)


def warn_if_created() -> None:
    """Once, when this command created the database: warned where a `git add .` would commit it."""
    if state.db_existed is False and state.db.exists():
        warn_exposure(state.db)


def examples(*lines: str) -> str:
    """A command's help epilog: its examples, one per line."""
    return "Examples:\n" + "\n".join(f"  {escape(line)}" for line in lines)


def workspace(flags: Mapping[str, Any] | None = None) -> Workspace:
    """The command's one workspace: the --db file, and the settings from every source (defaults, Pi's
    settings files, om.toml or --config, OM_* variables, then the command's own ``flags``), resolved
    when the command first uses them."""
    from om_core.store.workspace import Workspace

    return Workspace.open(state.db, config=state.config, flags=flags, project=state.project_settings)


def model_config(settings: Settings, model: str | None, api_base: str | None, as_json: bool, *,
                 announce: bool = True, **run: Any):
    """The workers' model from --model/--api-base and the settings (``run``: om run's model-call limit and
    --max-cost), checked before any work (credentials, provider, base URL); says so when it is the offline
    baseline (``announce`` false: the caller does, with ``announce_model``, once its targets are checked)."""
    from om_core.workers.run_config import ModelConfig  # the workers' modules: only for commands that run them

    config = ModelConfig.from_settings(settings, model, api_base, **run)
    config.preflight(settings)
    if announce and not as_json:
        announce_model(config)
    return config


def announce_model(config: ModelConfig) -> None:
    """One line when the workers run on the offline baseline (no model configured)."""
    if config.offline:
        err.print("[yellow]using the offline baseline (extractive rules, no model): set --model or OM_MODEL "
                  "to use a model[/]")


def counted(n: int, word: str, plural: str | None = None) -> str:
    """``1 entry``, ``8 entries``: a count and its noun in the right number."""
    return f"{n} {word if n == 1 else plural or word + 's'}"


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


NUMBER = re.compile(r"(?=.*\d)[-+]?\$?(\d[\d,]*)?(\.\d+)?%?")  # 12, 1,234, -0.5, $0.0012, 37%


def print_rows(columns: list[str], rows: list[list[str]], fold: set[str] = frozenset(),
               title: str | None = None, *, wrap: set[str] = frozenset(), short: set[str] = frozenset(),
               drop: Sequence[str] = (), bold_last: bool = False, console: Console | None = None) -> None:
    """A table of plain text whose values are never cut (only the columns in ``fold``, paths, may fold;
    those in ``wrap`` wrap between words), numbers right-aligned. On a terminal too narrow for it, in
    this order until it fits: the ids in the
    ``short`` columns become their shortest unique prefix (8 characters at least: a unique prefix is
    what a SESSION argument takes), then the columns in ``drop`` go, one at a time (a line under the
    table says what was left out); if it still does not fit, each row prints as a block of
    (column, value) lines. ``bold_last``: the last row is a total."""
    console = console or out
    numeric = {name for i, name in enumerate(columns)
               if any(row[i] for row in rows) and all(NUMBER.fullmatch(row[i]) for row in rows if row[i])}

    def table(names: list[str], body: list[list[str]]) -> Table:
        shown = Table(title=title)
        for name in names:
            shown.add_column(escape(name), no_wrap=name not in fold | wrap, overflow="fold",
                             justify="right" if name in numeric else "left")
        for n, row in enumerate(body):
            shown.add_row(*(escape(v) for v in row), style="bold" if bold_last and n == len(body) - 1 else None)
        return shown

    if not console.is_terminal:  # piped: the whole table (the console is as wide as it needs)
        console.print(table(columns, rows))
        return
    names, body, left_out = list(columns), [list(row) for row in rows], []
    shortened = [i for i, name in enumerate(columns) if name in short]
    for step in [None, "short", *drop]:
        if step == "short":
            if not shortened:
                continue
            for i in shortened:
                for row, prefix in zip(body, unique_prefixes([row[i] for row in body])):
                    row[i] = prefix
        elif step is not None:
            i = names.index(step)
            names.pop(i)
            for row in body:
                row.pop(i)
            left_out.append(step)
        if _table_width(names, body, fold, wrap) <= console.width:
            console.print(table(names, body))
            notes = (["ids shortened to unique prefixes"] if step is not None and shortened else []) + (
                [f"not shown at this width: {', '.join(left_out)}"] if left_out else [])
            if notes:
                console.print(f"[dim]({'; '.join(notes)}; --json has everything)[/]", highlight=False)
            return
    if title:
        console.print(escape(title))
    for n, row in enumerate(rows, 1):
        console.print(f"[bold]-- row {n}[/]")
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for name, value in zip(columns, row):
            grid.add_row(escape(name), escape(value))
        console.print(grid)
    if not rows:
        console.print("(no rows)")


def _table_width(names: list[str], body: list[list[str]], fold: set[str], wrap: set[str], folded: int = 20) -> int:
    """How narrow a table of these cells can be with no value cut: each column as wide as its widest
    cell, a column in ``fold`` down to ``folded`` and one in ``wrap`` to its longest word, plus Rich's
    padding and borders."""
    def width(i: int, name: str) -> int:
        cells = [name, *(row[i] for row in body)]
        if name in wrap:
            return max(cell_len(word) for cell in cells for word in cell.split() or [""])
        widest = max(cell_len(cell) for cell in cells)
        return min(widest, folded) if name in fold else widest

    return sum(width(i, name) for i, name in enumerate(names)) + 3 * len(names) + 1


def unique_prefixes(values: list[str], least: int = 8) -> list[str]:
    """Each value's shortest prefix (``least`` characters at least) that no other value here shares."""
    distinct = sorted(set(values))
    out = {}
    for k, value in enumerate(distinct):
        size = least
        for other in distinct[max(k - 1, 0):k + 2]:  # in sorted order, the neighbours share the longest prefixes
            if other != value:
                common = next((j for j, (a, b) in enumerate(zip(value, other)) if a != b), min(len(value), len(other)))
                size = max(size, common + 1)
        out[value] = value[:size]
    return [out[v] for v in values]
