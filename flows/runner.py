"""Running the pipeline locally (nothing to install or start): on the Prefect server om runs keep
(flows.kept_server, which sets PREFECT_API_URL first), or on Prefect's ephemeral API of one run.

Call ``prepare_environment()`` before anything imports Prefect: it quiets Prefect's logging and
turns off its telemetry (there is no network here) unless the user set those themselves, and locks the
local API Prefect starts for a run (a credential of the run's own; flows/server.py's server uses the same
settings).
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flows.run_result import RunResult
    from om_core.replay.plan import RunPlan
    from om_core.store.workspace import WorkspaceSpec
    from om_core.workers.run_config import ModelConfig, RunGuards


# What om's Prefect API keeps of a run: the flow run, its task runs (named and tagged: what the UI
# shows of what a run did) and its logs; not Prefect's event feed, which per model call
# is ~3 events and ~10 event-resource rows (~17 KB, bench/perf/run_cpu.py; ~40 GB per 100k sessions in the
# user's Prefect home, kept 7 days) that nothing om runs reads. A user's own setting wins (docs/operating.md,
# "What Prefect keeps").
LEAN_SERVER = {"PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false"}


# what a browser may send from another origin: nothing (the UI is served from the API's own origin)
CORS_METHODS = "GET,POST,PUT,PATCH,DELETE"
CORS_HEADERS = "authorization,content-type,x-prefect-api-version,x-csrf-token,x-prefect-ui"


def new_auth_string() -> str:
    """A credential for Prefect's basic auth ("user:password"; the UI asks for the two halves)."""
    return "om:" + secrets.token_urlsafe(32)


def lock_environment(auth_string: str, origin: str) -> dict[str, str]:
    """The settings that lock a Prefect API server: its credential, and cross-origin calls only from ``origin``."""
    return {"PREFECT_SERVER_API_AUTH_STRING": auth_string, "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS": origin,
            "PREFECT_SERVER_API_CORS_ALLOWED_METHODS": CORS_METHODS,
            "PREFECT_SERVER_API_CORS_ALLOWED_HEADERS": CORS_HEADERS}


def prepare_environment(verbose: bool = False) -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    for name, value in LEAN_SERVER.items():  # for the local API this run starts (a server's own: flows/server.py)
        os.environ.setdefault(name, value)
    if not os.environ.get("PREFECT_API_URL"):
        # The ephemeral API lives only as long as this run: recording every task run into its
        # SQLite database costs a third of the CPU of a busy run and nobody reads it afterwards.
        os.environ.setdefault("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED", "false")
        lock_ephemeral_api()
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def lock_ephemeral_api() -> None:
    """The local API Prefect starts for this run (``prefect.server.api.server.SubprocessASGIServer``: a
    uvicorn on 127.0.0.1:8000-8999 that inherits this environment) requires a credential of this run's
    own and takes no cross-origin call, as the server `om serve` starts does (flows.server): without
    it, any local user or web page could read the run's parameters and logs and set its states. Only
    before Prefect is imported (it reads its settings once, and the server and this process must agree).
    A server credential the user set is kept (and given to this process as the client's)."""
    if "prefect" in sys.modules:
        return
    auth = os.environ.get("PREFECT_SERVER_API_AUTH_STRING") or new_auth_string()
    # no browser page is its client (its UI is off): an origin that cannot exist
    os.environ.update({**lock_environment(auth, "https://om.invalid"), "PREFECT_API_AUTH_STRING": auth})


def task_runner(kind: str, concurrency: int, dask_address: str | None = None):
    """Threads by default; Dask (prefect-dask) for a cluster, or a local one when no address is given."""
    if kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=concurrency)
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if dask_address:
            return DaskTaskRunner(address=dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": 2, "threads_per_worker": max(1, concurrency // 2),
                                              "processes": False, "dashboard_address": None})
    raise ValueError(f"unknown task runner {kind!r}: use threads or dask")


def run_pipeline(targets: list[str], *, model: ModelConfig | dict[str, Any], db_path: str | None = None,
                 settings: dict[str, Any] | None = None, spec: WorkspaceSpec | None = None, plan: RunPlan | None = None,
                 guards: RunGuards | None = None,
                 concurrency: int = 4, drain: bool = True, runner: str = "threads", dask_address: str | None = None,
                 window: int | None = None,
                 task_runner_override: Any = None, run_id: str | None = None,
                 on_tick: Callable[[], None] | None = None, heartbeats: bool = True) -> RunResult:
    """Run ``process_sessions``; ``on_tick`` is called about twice a second while it runs.

    ``model`` is a ModelConfig (om run's, built once) or its JSON form (a dict, validated once by the flow).
    ``spec`` (a WorkspaceSpec), ``plan`` (the caller's RunPlan) and ``guards`` (the run's RunGuards) go
    to the flow as values; without them the flow builds the spec from ``db_path`` and ``settings``,
    ingests and plans the run itself, and makes the run's guards.
    ``window``: sessions in flight at once (their payloads are read just before they start;
    default twice the concurrency).
    ``heartbeats=False``: the flow run sends Prefect no heartbeats (``without_heartbeats``)."""
    from flows.pipeline import process_sessions
    from om_core.store.db_path import resolve_db_path

    flow = process_sessions.with_options(task_runner=task_runner_override or task_runner(runner, concurrency,
                                                                                         dask_address))
    done = threading.Event()

    def ticker() -> None:
        while not done.wait(0.5):
            on_tick()

    thread = threading.Thread(target=ticker, daemon=True) if on_tick else None
    if thread:
        thread.start()
    try:
        with nullcontext() if heartbeats else without_heartbeats():
            return flow(targets, db_path=str(resolve_db_path(db_path)), model=model, settings=settings, drain=drain,
                        spec=spec, plan=plan, guards=guards, window=window or 2 * concurrency, run_id=run_id)
    finally:
        done.set()
        if thread:
            thread.join()


@contextmanager
def without_heartbeats() -> Iterator[None]:
    """Flow runs started in this thread inside the block send no heartbeat. Prefect's heartbeat thread
    sleeps in one-second steps and the flow run's end waits for it: up to a second (half on average) of
    every run's wall time, for an event that only an automation on a server would read, and om's kept
    server has none (nor keeps events). Prefect takes no "off" from the environment (its setting is
    an integer of at least 30 there), so the run's own settings context carries it."""
    from prefect.context import SettingsContext
    from prefect.settings import get_current_settings

    current = get_current_settings()
    lean = current.model_copy(update={"flows": current.flows.model_copy(update={"heartbeat_frequency": None})})
    with SettingsContext(profile=SettingsContext.get().profile, settings=lean):
        yield
