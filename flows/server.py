"""A local `prefect server start` that om owns: started (or reused) for `om serve`, and by the tests'
real-cluster harness.

Prefect's ephemeral API (what a run gets with no PREFECT_API_URL) runs no scheduler, so deployment
schedules never fire on it; a real server does. Nothing here imports Prefect: the health check is a
plain HTTP GET, so the server can be started before Prefect reads its settings in this process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from flows.runner import LEAN_SERVER

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200  # Prefect's own default (PREFECT_SERVER_API_PORT)


def api_healthy(api_url: str, timeout: float = 2.0) -> bool:
    """True when ``api_url`` (…/api) answers Prefect's health check."""
    try:
        with urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=timeout) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the server gets SIGTERM if the process that started it dies (even by kill -9)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class PrefectServer:
    api_url: str
    process: subprocess.Popen | None  # None: a server someone else started, which we reuse
    log_path: Path | None = None

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")

    @property
    def started_here(self) -> bool:
        return self.process is not None

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout: float = 15.0) -> None:
        """Stop a server started here (its whole process group); a reused one is left running."""
        if self.process is None or self.process.poll() is not None:
            return
        stop_process_group(self.process, timeout)


def stop_process_group(process: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the group led by ``process`` (started with start_new_session), then SIGKILL."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(5)


def start_server(host: str = DEFAULT_HOST, port: int | None = None, *, home: Path | None = None,
                 log: Path | None = None, timeout: float = 120.0, extra_env: dict[str, str] | None = None) -> PrefectServer:
    """Start `prefect server start` (API, UI and scheduler) and wait until it answers.

    ``home``: its PREFECT_HOME (its database and settings); default: the user's own. The server runs
    in its own process group, so stopping it stops everything it started."""
    port = port or free_port(host)
    api_url = f"http://{host}:{port}/api"
    env = {**LEAN_SERVER, **os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(extra_env or {})}
    env.pop("PREFECT_API_URL", None)  # the server is not a client of some other API
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
        env["PREFECT_HOME"] = str(home)
    out: IO | int = subprocess.DEVNULL
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")  # noqa: SIM115 - the child keeps it; closed below
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    finally:
        if not isinstance(out, int):
            out.close()
    server = PrefectServer(api_url, process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prefect server start exited with code {process.returncode}: {server.log_tail()}")
        if api_healthy(api_url, timeout=1.0):
            return server
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"the Prefect server at {api_url} did not answer within {timeout:.0f} s: {server.log_tail()}")


def local_server(home: Path | None = None, log: Path | None = None) -> PrefectServer:
    """The server `om serve` uses when PREFECT_API_URL is unset: one already answering on
    PREFECT_SERVER_API_HOST:PREFECT_SERVER_API_PORT (127.0.0.1:4200 by default) is reused; otherwise
    one is started there (or on a free port when something else holds that port)."""
    host = os.environ.get("PREFECT_SERVER_API_HOST") or DEFAULT_HOST
    port = int(os.environ.get("PREFECT_SERVER_API_PORT") or DEFAULT_PORT)
    api_url = f"http://{host}:{port}/api"
    if api_healthy(api_url):
        return PrefectServer(api_url, None)
    if _port_in_use(host, port):
        port = free_port(host)
    return start_server(host, port, home=home, log=log)


@contextmanager
def running_server(**kwargs) -> Iterator[PrefectServer]:
    server = start_server(**kwargs)
    try:
        yield server
    finally:
        server.stop()
