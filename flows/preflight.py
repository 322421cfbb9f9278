"""Checks before a cluster run does any work (nothing here imports Prefect or Dask).

Workers on other machines reach neither this process's ephemeral Prefect API nor its local files, so
a run with ``--dask-address`` needs a Prefect server that they reach (PREFECT_API_URL) and a result
storage that they share; without them it would start model calls it cannot finish or record."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

from flows.server import api_healthy, api_refuses
from om_core.errors import InvalidArgument, OmError


class ClusterNotReady(OmError):
    """A cluster run's prerequisites are missing; nothing was started."""


class PrefectRefused(ClusterNotReady):
    """The Prefect API om was pointed at refuses its credential; nothing was started."""


def check_credential(api_url: str) -> None:
    """Raise a one-line PrefectRefused when the API at ``api_url`` answers this process's credential
    (PREFECT_API_AUTH_STRING, or none) with 401."""
    auth = os.environ.get("PREFECT_API_AUTH_STRING") or None
    if api_refuses(api_url, auth):
        how = "refuses the credential in PREFECT_API_AUTH_STRING" if auth else \
            "requires a credential: set PREFECT_API_AUTH_STRING"
        raise PrefectRefused(f"the Prefect API at {api_url} (PREFECT_API_URL) {how} (a server om serve started: "
                             "its om-server.env, docs/security.md)")


def _scheduler_reachable(address: str, timeout: float = 3.0) -> bool:
    parsed = urlparse(address if "://" in address else f"tcp://{address}")
    if not parsed.hostname or not parsed.port:
        raise InvalidArgument(f"--dask-address {address!r} is not host:port or tcp://host:port")
    try:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=timeout):
            return True
    except OSError:
        return False


def check_cluster_run(dask_address: str, api_url: str | None, result_storage: str | None) -> None:
    """Raise a one-line ClusterNotReady unless a cluster run can work; return quietly otherwise."""
    if not api_url:
        raise ClusterNotReady("--dask-address needs a Prefect server the workers reach: start one (prefect server "
                              "start) and set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api) here and on the workers")
    if not api_healthy(api_url, timeout=5.0):
        raise ClusterNotReady(f"the Prefect API at {api_url} (PREFECT_API_URL) does not answer: start it "
                              "(prefect server start) or fix the address")
    check_credential(api_url)
    if not result_storage:
        raise ClusterNotReady("--dask-address needs a result storage every worker shares: set resultStorage "
                              "(OM_RESULT_STORAGE, om.toml) to a shared path, an fsspec URL or a storage block")
    if not _scheduler_reachable(dask_address):
        raise ClusterNotReady(f"no Dask scheduler answers at {dask_address}: start one (dask scheduler) or fix "
                              "--dask-address")
