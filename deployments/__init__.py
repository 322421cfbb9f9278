"""Prefect deployments for om.

* ``archive``: process an archive directory once (ingest, replay, drain).
* ``maintain``: keep a live sessions directory up to date on a schedule (new lines are ingested and
  due stages run; nothing is drained, since a live session may still grow).

Locally, ``om serve`` serves both from this process. On a Prefect server with a work pool and a
worker, ``python -m deployments --pool NAME ...`` registers them (see the README).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any


def _model(model: str | None) -> dict[str, Any]:
    # deployments run on workers in several processes: the limit must be Prefect's global one
    return {"model": model or "offline", "limit": "prefect"}


def archive_deployment(directory: Path, db_path: str, model: str | None = None):
    from flows.pipeline import process_sessions

    return process_sessions.to_deployment(
        name="om-archive",
        parameters={"targets": [str(Path(directory).resolve())], "db_path": db_path, "model": _model(model)},
        description="Ingest and replay an archive of Pi sessions, draining finished branches.",
        tags=["om", "archive"],
    )


def maintenance_deployment(directory: Path, db_path: str, every_seconds: int = 600, model: str | None = None):
    from flows.pipeline import maintain_sessions

    return maintain_sessions.to_deployment(
        name="om-maintain",
        parameters={"directory": str(Path(directory).resolve()), "db_path": db_path, "model": _model(model)},
        interval=timedelta(seconds=every_seconds),
        description="Ingest new lines of live Pi sessions and run the memory stages that are due.",
        tags=["om", "maintenance"],
    )


def serve_locally(db_path: str, archive: Path | None, live: Path | None, every_seconds: int = 600,
                  model: str | None = None) -> None:
    from prefect import serve

    deployments = []
    if archive is not None:
        deployments.append(archive_deployment(archive, db_path, model))
    if live is not None:
        deployments.append(maintenance_deployment(live, db_path, every_seconds, model))
    serve(*deployments)
