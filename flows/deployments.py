"""Prefect deployments for om (``om serve`` serves them; ``python -m deployments`` registers them).

* ``archive``: process an archive directory once (ingest, replay, drain).
* ``maintain``: keep a live sessions directory up to date on a schedule (new lines are ingested and
  due stages run; nothing is drained, since a live session may still grow).

Locally, ``om serve`` serves both from this process, on a local Prefect server it starts when
PREFECT_API_URL is unset (the ephemeral API runs no schedules). On a Prefect server with a work pool
and a worker, ``python -m deployments --pool NAME ...`` registers them (docs/operating.md).

Both carry the user's resolved settings (defaults, Pi settings files, om.toml or --config, OM_*) as
the flow's ``settings`` parameter, resolved where the deployment is made: a scheduled run happens in
another process, later, and must not depend on that process's directory or environment.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from om_core.settings import Settings

if TYPE_CHECKING:
    from om_core.workers.run_config import ModelConfig

# a live folder's runs must not overlap: a tick still running when the next is due skips that one
_ONE_AT_A_TIME = {"limit": 1, "collision_strategy": "CANCEL_NEW"}


def resolved_inputs(settings: Settings, model: str | None = None,
                    api_base: str | None = None) -> tuple[Any, dict[str, Any]]:
    """The flow's ``model`` (a ModelConfig) and ``settings`` (JSON) parameters from the user's resolved
    settings (a workspace's)."""
    from om_core.workers.run_config import ModelConfig  # the workers' modules: only when a deployment is made

    # deployments run on workers in several processes: the model-call limit is Prefect's global one
    return ModelConfig.from_settings(settings, model, api_base, limit="prefect"), settings.model_dump(mode="json")


def _model_json(model: ModelConfig | dict[str, Any]) -> dict[str, Any]:
    """A deployment carries the ModelConfig as JSON (no API key: a worker reads its own credentials)."""
    from om_core.workers.run_config import ModelConfig

    return ModelConfig.model_validate(model).model_dump(mode="json")


def _module_entrypoint():
    # "flows.pipeline.<flow>": a worker with the package installed imports it, from any directory
    from prefect.deployments.runner import EntrypointType

    return EntrypointType.MODULE_PATH


def _archive(directory: Path, db_path: str, model: ModelConfig | dict[str, Any], settings: dict[str, Any],
             exclude: list[str] | None = None) -> tuple[Any, dict[str, Any]]:
    from flows.pipeline import process_sessions

    return process_sessions, dict(
        name="om-archive",
        parameters={"targets": [str(Path(directory).resolve())], "db_path": db_path, "model": _model_json(model),
                    "settings": settings, "exclude": exclude or []},
        description="Ingest and replay an archive of Pi sessions, draining finished branches.",
        tags=["om", "archive"], entrypoint_type=_module_entrypoint(),
    )


def _maintenance(directory: Path, db_path: str, model: ModelConfig | dict[str, Any], settings: dict[str, Any],
                 every_seconds: int = 600, exclude: list[str] | None = None) -> tuple[Any, dict[str, Any]]:
    from prefect.client.schemas.objects import ConcurrencyLimitConfig

    from flows.pipeline import maintain_sessions

    return maintain_sessions, dict(
        name="om-maintain",
        parameters={"directory": str(Path(directory).resolve()), "db_path": db_path, "model": _model_json(model),
                    "settings": settings, "exclude": exclude or [], "every_seconds": every_seconds},
        interval=timedelta(seconds=every_seconds),
        concurrency_limit=ConcurrencyLimitConfig(**_ONE_AT_A_TIME),
        description="Ingest new lines of live Pi sessions and run the memory stages that are due.",
        tags=["om", "maintenance"], entrypoint_type=_module_entrypoint(),
    )


def archive_deployment(directory: Path, db_path: str, model: ModelConfig | dict[str, Any], settings: dict[str, Any],
                       exclude: list[str] | None = None):
    flow, options = _archive(directory, db_path, model, settings, exclude)
    return flow.to_deployment(**options)


def maintenance_deployment(directory: Path, db_path: str, model: ModelConfig | dict[str, Any], settings: dict[str, Any],
                           every_seconds: int = 600, exclude: list[str] | None = None):
    flow, options = _maintenance(directory, db_path, model, settings, every_seconds, exclude)
    return flow.to_deployment(**options)


def serve_locally(db_path: str, archive: Path | None, live: Path | None, model: ModelConfig | dict[str, Any],
                  settings: dict[str, Any], every_seconds: int = 600, exclude: list[str] | None = None) -> None:
    """Serve the deployments from this process until it is stopped. Every parameter of theirs is pinned
    here (flows.served): a flow run asking for others is refused."""
    from prefect import serve

    from flows.served import all_parameters, pin

    served = []
    if archive is not None:
        served.append(_archive(archive, db_path, model, settings, exclude))
    if live is not None:
        served.append(_maintenance(live, db_path, model, settings, every_seconds, exclude))
    pin({flow.name: all_parameters(flow.fn, options["parameters"]) for flow, options in served})
    if live is not None:
        _first_tick_now(*served[-1])
    # one flow run at a time: every run writes the one database file; a schedule shorter than
    # Prefect's default poll (10 s) is polled as often as it fires
    serve(*(flow.to_deployment(**options) for flow, options in served), limit=1, print_starting_message=False,
          query_seconds=min(10.0, max(1.0, every_seconds)))


def _first_tick_now(flow: Any, options: dict[str, Any]) -> None:
    """The maintenance's first tick at once: Prefect's interval schedule starts its first run one whole
    interval after the deployment is made (an hour with --every 3600). The deployment is made here,
    and a run of it created for now (serve's own apply keeps it: it replaces only the runs the
    schedule made); the served runner starts it with its first poll."""
    from prefect import get_client

    deployment_id = flow.to_deployment(**options).apply()
    with get_client(sync_client=True) as client:
        client.create_flow_run_from_deployment(deployment_id)
