"""`om`: the command line, assembled. Each command lives in the module of its group and is one thin
function: parse, build the workspace, call the library, print (flows/cli/common.py holds what they
share). ``main`` is the console entry point, with the one error handler of every command.

Read commands (view, compact, recall, status, sql, sessions, cutpoint) import neither litellm nor
Prefect; the commands that need them import them inside the command.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

# the command groups, in the order `om --help` lists them (each module registers its commands on app)
from flows.cli import catalog, memory, projects, reports, workers, run, serve  # noqa: F401
from flows.cli.common import app, err, warn_if_created
from flows.cli.eval import eval_app  # typer and rich only; the evaluation loads inside its command
from flows.cli.live import live_app  # what a live Pi's extension asks; no litellm, no Prefect
from flows.cli.server import server_app  # the Prefect server om run keeps; no Prefect import
from om_core.errors import OmError
from om_core.store.private_files import use_private_umask

app.add_typer(eval_app, name="eval")
app.add_typer(live_app, name="live")
app.add_typer(server_app, name="server")


def main() -> None:
    """Console entry point: one error handler for every command. Everything om creates from here on is
    this user's only (0600 files, 0700 folders: om_core.store.private_files)."""
    use_private_umask()
    try:
        code = _run()
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


def _run() -> int | None:
    try:
        return app(prog_name="om", standalone_mode=False)
    finally:
        warn_if_created()


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
