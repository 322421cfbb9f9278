"""`om serve`: the Prefect deployments (archive processing, scheduled live maintenance) served from
this process with the resolved settings, on a local Prefect server it starts when PREFECT_API_URL is
unset; `om config`: those settings and where each came from."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from flows.deployments import resolved_inputs, serve_locally
from flows.cli.common import (ApiBaseOpt, ExcludeOpt, ModelOpt, app, db_source, err, examples, out, print_json, print_rows,
                              state, warn_exposure, workspace)
from flows.interrupt import serve_until_signal
from flows.preflight import check_credential
from flows.runner import prepare_environment
from flows.server import CREDENTIALS, api_open, local_server, server_home
from om_core.errors import InvalidArgument

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


@app.command(epilog=examples(
    'om serve --live ~/.pi/agent/sessions --every 600', 'om --db /data/om.duckdb serve --archive ~/pi-archive'))
def serve(
    archive: Optional[Path] = typer.Option(None, "--archive", help="Directory of archived sessions to process."),
    live: Optional[Path] = typer.Option(None, "--live", help="Live sessions directory to maintain on a schedule."),
    every: int = typer.Option(600, "--every", min=1, help="Seconds between maintenance runs of the live directory."),
    exclude: ExcludeOpt = None,
    model: ModelOpt = None,
    api_base: ApiBaseOpt = None,
    endpoint: bool = typer.Option(True, "--endpoint/--no-endpoint", help="Also answer live Pi sessions' "
                                  "compactions and recalls (the om extension) on 127.0.0.1, as `om live endpoint`."),
) -> None:
    """Serve the Prefect deployments from this process: archive processing and scheduled live
    maintenance, with the resolved settings. With no PREFECT_API_URL, a local Prefect server (with its
    scheduler and UI) is started, on 127.0.0.1 only and with a new credential (user and password in its
    om-server.env), and stopped again with this command; one another om serve started is reused. A flow
    run of these deployments with other parameters than this command gave them is refused. It also
    serves the live endpoint of this database (unless --no-endpoint, or one already runs)."""
    if archive is None and live is None:
        raise InvalidArgument("give --archive DIR and/or --live DIR")
    for path in (archive, live):
        if path is not None and not path.is_dir():
            raise InvalidArgument(f"{path} is not a directory")
    ws = workspace()
    if state.db_existed:  # a new one is warned about when this command creates it
        warn_exposure(ws.path)
    config, settings_dict = resolved_inputs(ws.settings, model, api_base)
    server = None
    if not os.environ.get("PREFECT_API_URL"):  # the ephemeral API runs no schedules: use a real server
        home = server_home()
        err.print("starting a local Prefect server (PREFECT_API_URL is not set) ...")
        server = local_server(home)
        # this process, the flow runs it starts and the endpoint are the server's clients: its credential
        os.environ.update(server.client_env)
        how = "started by om serve; it stops with it" if server.started_here else "already running; reused"
        err.print(f"Prefect UI: {server.ui_url} ({how}; 127.0.0.1 only, user and password in "
                  f"{escape(str(home / CREDENTIALS))})", highlight=False)
    else:
        api_url = os.environ["PREFECT_API_URL"]
        err.print(f"Prefect API: {escape(api_url)}", highlight=False)
        check_credential(api_url)
        if api_open(api_url):
            err.print("[yellow]warning:[/] this Prefect API answers without credentials: whoever reaches it reads "
                      "what om's runs record there (folders, settings, logs) and starts or stops them "
                      "(docs/security.md)", highlight=False)
    prepare_environment()
    answering = _live_endpoint(ws, live) if endpoint else None
    if config.offline:
        err.print("[yellow]using the offline baseline (extractive rules, no model): set --model or OM_MODEL "
                  "to use a model[/]")
    else:
        err.print(f"model: {escape(config.model)}"
                  + (f" at {escape(config.api_base)}" if config.api_base else ""), highlight=False)
    what = ", ".join(f"{name} {escape(str(p))}" for name, p in (("archive", archive), ("live", live)) if p)
    err.print(f"serving {what}" + (f" every {every} s" if live else "") + "; Ctrl-C stops", highlight=False)
    # on a signal it exits at once: not Prefect's own shutdown, which pauses schedules and waits for runs
    ended: dict[str, list[str]] = {}  # "runs": the maintenance runs the signal ended (none: unknown)
    serve_until_signal(
        lambda: serve_locally(db_path=str(ws.path.resolve()), archive=archive, live=live, model=config,
                              settings=settings_dict, every_seconds=every, exclude=exclude or []),
        cleanup=lambda: [part.stop() for part in (answering, server) if part is not None],
        stopped=lambda pids, signum: ended.update(runs=_mark_interrupted(ws, pids, signum)),
        farewell=lambda code: farewell_line(code, ended.get("runs")))


def farewell_line(code: int, ended: list[str] | None) -> str:
    """om serve's last line: whether the signal ended a maintenance run (``ended``: the runs it marked
    interrupted; None: unknown, the database could not be read)."""
    how = f"stopped ({'SIGINT' if code == 130 else 'SIGTERM'})"
    if ended is None:
        return f"{how}; a maintenance run in progress, if any, was ended and its next tick redoes it"
    if not ended:
        return f"{how}; no maintenance run was in progress"
    return f"{how}; the maintenance run in progress ({', '.join(ended)}) was ended and its next tick redoes it"


def _mark_interrupted(ws: Workspace, pids: list[int], signum: int) -> list[str]:
    """The maintenance runs a signal ended (their flow run's process was ours), marked ``interrupted``,
    not left ``running``."""
    import signal

    from om_core.store.runs import mark_interrupted_runs

    if not ws.has_file or not ws.path.exists():
        return []
    with ws.write() as con:
        return mark_interrupted_runs(con, pids, signal.Signals(signum).name)


def _live_endpoint(ws: Workspace, live: Path | None):
    """The live endpoint of this database in a thread, answering for the session files under the --live
    folder (without one, Pi's own), or None (and one line why) when another runs."""
    from flows.cli.live import project_settings
    from flows.endpoint import LiveEndpoint
    from om_core.errors import OmError

    try:
        answering = LiveEndpoint(ws, sessions=[live] if live is not None else None, settings_for=project_settings,
                                 on_answer=lambda line: err.print(escape(line), highlight=False)).start()
    except OmError as exc:
        err.print(f"live endpoint: not started here: {escape(str(exc))}", highlight=False)
        return None
    err.print(f"live endpoint: {answering.url} (Pi's om extension finds it)", highlight=False)
    return answering


@app.command("config", epilog=examples('om config', 'om --config team.toml config --json'))
def show_config(as_json: bool = typer.Option(False, "--json", help="Print settings and sources as JSON.")) -> None:
    """Print the resolved settings and where each value came from (defaults, Pi settings files,
    om.toml or --config, OM_* environment variables)."""
    ws = workspace()
    resolved = ws.resolved
    database = {"path": str(ws.path), "exists": ws.path.exists(), "source": db_source()}
    if as_json:
        rows = resolved.rows()
        print_json({"database": database, "settings": resolved.settings.model_dump(mode="json"),
                    "effective": {k: value for k, value, _ in rows},
                    "sources": {k: src for k, _, src in rows}, "notes": resolved.notes})
        return
    out.print(escape(f"database: {database['path']} ({database['source']}"
                     + ("" if database["exists"] else "; not created yet") + ")"), highlight=False)
    print_rows(["setting", "value", "source"],
               [[key, json.dumps(value), source] for key, value, source in resolved.rows()], fold={"source"})
    for note in resolved.notes:
        err.print(f"[yellow]note:[/] {escape(str(note))}")
