"""Register om's deployments on a Prefect server, to run on a work pool's workers.

    prefect server start                                   # or point PREFECT_API_URL at a server
    prefect work-pool create om-pool --type process
    python -m deployments --pool om-pool --live ~/.pi/agent/sessions --db /data/om.duckdb
    prefect worker start --pool om-pool

The deployments carry the settings resolved here (defaults, Pi settings files, om.toml or --config,
OM_* variables): the workers that run them later need only the installed package.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.deployments import archive_deployment, maintenance_deployment, resolved_inputs
from om_core.errors import OmError
from om_core.store.private_files import use_private_umask
from om_core.store.workspace import Workspace


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", required=True, help="work pool the deployments run on")
    parser.add_argument("--db", required=True, help="DuckDB file the workers write to")
    parser.add_argument("--archive", type=Path, help="archive directory to process")
    parser.add_argument("--live", type=Path, help="live sessions directory to maintain")
    parser.add_argument("--every", type=int, default=600, help="seconds between maintenance runs")
    parser.add_argument("--model", help="litellm model string (default: the model setting, else the offline baseline)")
    parser.add_argument("--api-base", help="base URL of an OpenAI-compatible server (default: the apiBase setting)")
    parser.add_argument("--config", type=Path, help="settings file (TOML; default ./om.toml when present)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="leave out the files the directory walk finds that match GLOB (repeatable)")
    args = parser.parse_args(argv)
    use_private_umask()  # what it creates (a database, a Prefect home) is this user's only
    if not (args.archive or args.live):
        parser.error("give --archive and/or --live")
    try:
        model, settings = resolved_inputs(Workspace.open(args.db, config=args.config).settings, args.model,
                                          args.api_base)
    except OmError as exc:
        parser.exit(2, f"error: {exc}\n")
    from prefect.deployments import deploy

    db = str(Path(args.db).resolve())
    deployments = []
    if args.archive:
        deployments.append(archive_deployment(args.archive, db, model, settings, args.exclude))
    if args.live:
        deployments.append(maintenance_deployment(args.live, db, model, settings, args.every, args.exclude))
    deploy(*deployments, work_pool_name=args.pool, print_next_steps_message=False, ignore_warnings=True)


if __name__ == "__main__":
    main()
