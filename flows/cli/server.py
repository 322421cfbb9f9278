"""`om server status|stop`: the local Prefect server `om run` keeps between runs (flows.server.kept_server)."""

from __future__ import annotations

import typer
from rich.markup import escape

from flows.cli.common import err, examples, out, print_json
from flows.cli.placeholders import Typer

server_app = Typer(name="server", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                   help="The local Prefect server om run keeps between runs: show it, stop it.",
                   epilog=examples("om server status", "om server stop"))


@server_app.command("status", epilog=examples("om server status", "om server status --json"))
def status(as_json: bool = typer.Option(False, "--json", help="Print the status as JSON.")) -> None:
    """Show the Prefect server om runs keep (when PREFECT_API_URL is unset): its API, its process, the
    runs using it now and how long it has been idle (it stops itself after prefectServerIdleSeconds).
    Exit code 1 when none runs."""
    from flows.kept_server import kept_status
    from flows.server import server_home

    found = kept_status(server_home())
    if as_json:
        print_json({"running": found.api_url is not None, "api_url": found.api_url, "pid": found.pid,
                    "runs": found.runs, "idle_seconds": found.idle_seconds, "home": str(found.home)})
    elif found.api_url is None:
        out.print(f"no Prefect server of om's runs is running (home {escape(str(found.home))})", highlight=False)
    else:
        use = (f"used by {len(found.runs)} run(s) now" if found.runs
               else f"idle for {found.idle_seconds:.0f} s")
        out.print(f"Prefect API {escape(found.api_url)} (process {found.pid}; {use}; credentials in "
                  f"{escape(str(found.home / 'om-server.env'))})", highlight=False)
    if found.api_url is None:
        raise typer.Exit(1)


@server_app.command("stop", epilog=examples("om server stop"))
def stop() -> None:
    """Stop the Prefect server om runs keep (runs using it now lose their API: they fail, and a rerun
    resumes them). The next om run starts a new one."""
    from flows.kept_server import stop_kept
    from flows.server import server_home

    found = stop_kept(server_home())
    (out if found else err).print("stopped om's Prefect server" if found else "no Prefect server of om's runs was running")
