"""`om`'s console entry point: it loads the command line only as far as the command needs.

A live Pi waits for `om live compact` and `om live recall` when no endpoint runs: for them only the
global options and the `om live` group are assembled (flows.cli.common and flows.cli.live), not the
other groups' modules (catalog, memory, runs, serve: their imports cost a Python start more time
than the answer). `om run` gets its own command alone: its run imports Prefect and waits on every
import before it. Every other command, `om` alone and `om --help` get the whole app
(flows.cli.main). Both run under the one error handler of every command (``main``).
"""

from __future__ import annotations

import sys

# groups assembled on their own: their commands run without the other groups' modules
LIGHT_GROUPS = frozenset({"live"})
# commands registered on their own (their module registers them on the global options' app)
LIGHT_COMMANDS = {"run": "flows.cli.run"}

# The options of `om` itself, which a user may also write after the command (`om sessions --db X`):
# option -> whether it takes a value
GLOBAL_OPTIONS = {"--db": True, "--config": True, "--project-settings": False, "--no-project-settings": False}


def global_options_first(args: list[str]) -> list[str]:
    """``args`` with the global options found after the command moved before it, where click reads
    them; nothing after a ``--`` moves."""
    first, rest, moved = [], list(args), []
    while rest and rest[0].startswith("-") and rest[0] != "--":  # the options before the command
        token = rest.pop(0)
        first.append(token)
        if GLOBAL_OPTIONS.get(token) and rest:
            first.append(rest.pop(0))
    kept, i = [], 0
    while i < len(rest):
        token = rest[i]
        if token == "--":
            kept += rest[i:]
            break
        name = token.split("=", 1)[0]
        if name in GLOBAL_OPTIONS and i > 0:
            takes_value = GLOBAL_OPTIONS[name] and "=" not in token
            moved += rest[i:i + 2] if takes_value else [token]
            i += 2 if takes_value else 1
            continue
        kept.append(token)
        i += 1
    return first + moved + kept


def command_group(args: list[str]) -> str | None:
    """The command (or group) ``args`` run, after the global options (None: `om` alone, or an option
    such as --help or --version before any command)."""
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-"):
            return token
        if token == "--":
            return None
        i += 2 if GLOBAL_OPTIONS.get(token) and "=" not in token else 1
    return None


def _app(group: str | None):  # noqa: ANN202 - a typer app; typer is imported here, not at module load
    """The app for ``group``: the light group mounted on the global options alone, else the whole app."""
    if group in LIGHT_GROUPS:
        from flows.cli.common import app, mount
        from flows.cli.live import live_app

        mount(live_app, "live")
        return app
    if group in LIGHT_COMMANDS:
        import importlib

        from flows.cli.common import app

        importlib.import_module(LIGHT_COMMANDS[group])
        return app
    from flows.cli.main import app

    return app


def main() -> None:
    """Console entry point: one error handler for every command. Everything om creates from here on is
    this user's only (0600 files, 0700 folders: om_core.store.private_files)."""
    import typer
    from rich.markup import escape

    from flows.cli.common import err, warn_if_created
    from om_core.errors import OmError
    from om_core.store.private_files import use_private_umask

    use_private_umask()
    args = global_options_first(sys.argv[1:])
    try:
        try:
            code = _app(command_group(args))(args=args, prog_name="om", standalone_mode=False)
        finally:
            warn_if_created()
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


def _print_usage_error(exc) -> None:  # noqa: ANN001 - a typer.TyperException
    """Typer's boxed usage message on a terminal; one line (``error: …``) when stderr is not one."""
    from rich.markup import escape

    from flows.cli.common import err

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
