"""Register om's deployments on a Prefect server, to run on a work pool's workers.

    prefect server start                                   # or point PREFECT_API_URL at a server
    prefect work-pool create om-pool --type process
    python -m deployments --pool om-pool --live ~/.pi/agent/sessions --db /data/om.duckdb
    prefect worker start --pool om-pool
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deployments import archive_deployment, maintenance_deployment


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", required=True, help="work pool the deployments run on")
    parser.add_argument("--db", required=True, help="DuckDB file the workers write to")
    parser.add_argument("--archive", type=Path, help="archive directory to process")
    parser.add_argument("--live", type=Path, help="live sessions directory to maintain")
    parser.add_argument("--every", type=int, default=600, help="seconds between maintenance runs")
    parser.add_argument("--model", help="litellm model string (default: the offline baseline)")
    args = parser.parse_args()
    from prefect.deployments import deploy

    deployments = []
    if args.archive:
        deployments.append(archive_deployment(args.archive, args.db, args.model))
    if args.live:
        deployments.append(maintenance_deployment(args.live, args.db, args.every, args.model))
    if not deployments:
        parser.error("give --archive and/or --live")
    deploy(*deployments, work_pool_name=args.pool)


if __name__ == "__main__":
    main()
