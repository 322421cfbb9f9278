"""A local `prefect server start` that om owns: started (or reused) for `om serve`, and by the tests'
real-cluster harness.

Prefect's ephemeral API (what a run gets with no PREFECT_API_URL) runs no scheduler, so deployment
schedules never fire on it; a real server does. Nothing here imports Prefect: the health check is a
plain HTTP GET, so the server can be started before Prefect reads its settings in this process.

Locked: whoever reaches Prefect's API can run code as the user (a flow run's parameters, a
deployment's pull steps), so a server om starts binds 127.0.0.1 only, requires a random credential
(Prefect's own basic auth: PREFECT_SERVER_API_AUTH_STRING on the server, PREFECT_API_AUTH_STRING
on its clients) and allows no cross-origin caller but its own UI. Its PREFECT_HOME is this user's
only (0700), and holds the credentials in ``om-server.env`` (0600: PREFECT_API_URL and
PREFECT_API_AUTH_STRING, what om's own processes and a cluster's workers are given). Each server om
starts gets a new credential; a server is reused only when it accepts the credentials of that file
and refuses a caller without them.
"""

from __future__ import annotations

import base64
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from flows.runner import LEAN_SERVER, lock_environment, new_auth_string
from om_core.store.private_files import private_dir, write_private

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4200  # Prefect's own default (PREFECT_SERVER_API_PORT)
CREDENTIALS = "om-server.env"  # in the server's PREFECT_HOME
KEEPER_PID = "om-server.pid"  # beside it: the process id of the server `om run` keeps (flows.kept_server)


def api_healthy(api_url: str, timeout: float = 2.0) -> bool:
    """True when ``api_url`` (…/api) answers Prefect's health check."""
    try:
        with urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=timeout) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _status(api_url: str, path: str, auth_string: str | None, timeout: float = 5.0) -> int | None:
    """The HTTP status of POST ``path`` (a read: a filter), with or without the credential."""
    headers = {"Content-Type": "application/json"}
    if auth_string is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth_string.encode()).decode()
    request = urllib.request.Request(api_url.rstrip("/") + path, data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def api_locked(api_url: str, auth_string: str) -> bool:
    """True when the API at ``api_url`` accepts ``auth_string`` and refuses a caller without it."""
    return (_status(api_url, "/flows/filter", auth_string) == 200
            and _status(api_url, "/flows/filter", None) == 401)


def api_open(api_url: str) -> bool:
    """True when the API at ``api_url`` answers a caller without credentials (nobody locked it)."""
    return _status(api_url, "/flows/filter", None) == 200


def api_refuses(api_url: str, auth_string: str | None) -> bool:
    """True when the API at ``api_url`` answers ``auth_string`` (None: no credential) with 401."""
    return _status(api_url, "/flows/filter", auth_string) == 401


def _listener_uid(host: str, port: int) -> int | None:
    """The uid owning the socket that listens on ``host:port`` (Linux's /proc/net/tcp), or None."""
    local = f"{socket.inet_aton(host)[::-1].hex().upper()}:{port:04X}"
    try:
        with open("/proc/net/tcp") as table:
            for line in table.readlines()[1:]:
                fields = line.split()
                if fields[1] == local and fields[3] == "0A":  # 0A: LISTEN
                    return int(fields[7])
    except (OSError, IndexError, ValueError):
        return None
    return None


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
    process: subprocess.Popen | None  # None: a server another om process started, which we reuse
    log_path: Path | None = None
    auth_string: str | None = None  # its credential (PREFECT_API_AUTH_STRING for its clients)
    home: Path | None = None  # its PREFECT_HOME, which holds the credentials file

    @property
    def credentials_file(self) -> Path | None:
        return None if self.home is None else self.home / CREDENTIALS

    @property
    def ui_url(self) -> str:
        return self.api_url.removesuffix("/api")

    @property
    def client_env(self) -> dict[str, str]:
        """What a process needs to use this server: its API, and its credential."""
        return {"PREFECT_API_URL": self.api_url,
                **({"PREFECT_API_AUTH_STRING": self.auth_string} if self.auth_string else {})}

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
                 log: Path | None = None, timeout: float = 120.0, extra_env: dict[str, str] | None = None,
                 auth_string: str | None = None) -> PrefectServer:
    """Start `prefect server start` (API, UI and scheduler), locked (module docstring), and wait until it
    answers.

    ``home``: its PREFECT_HOME (its database and settings; created 0700), where its credentials are
    written (``om-server.env``); default: the user's own. ``auth_string``: its credential (default: a
    new random one). The server runs in its own process group, so stopping it stops everything it
    started."""
    port = port or free_port(host)
    api_url = f"http://{host}:{port}/api"
    auth_string = auth_string or new_auth_string()
    env = {**LEAN_SERVER, **os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(extra_env or {}),
           **lock_environment(auth_string, f"http://{host}:{port}")}
    env.pop("PREFECT_API_URL", None)  # the server is not a client of some other API
    env.pop("PREFECT_API_AUTH_STRING", None)
    if home is not None:
        private_dir(home)
        env["PREFECT_HOME"] = str(home)
    out: IO | int = subprocess.DEVNULL
    if log is not None:
        private_dir(log.parent)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        out = os.fdopen(fd, "ab")  # the child keeps it; closed below
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", host, "--port", str(port)],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    finally:
        if not isinstance(out, int):
            out.close()
    server = PrefectServer(api_url, process, log, auth_string, home)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prefect server start exited with code {process.returncode}: {server.log_tail()}")
        if api_healthy(api_url, timeout=1.0):
            if home is not None:
                write_credentials(home, server)
            return server
        time.sleep(0.3)
    server.stop()
    raise RuntimeError(f"the Prefect server at {api_url} did not answer within {timeout:.0f} s: {server.log_tail()}")


def write_credentials(home: Path, server: PrefectServer) -> Path:
    """``home/om-server.env`` (0600): the server's API and credential, in the form a shell sources
    (``set -a; . om-server.env; set +a``) and om reads back."""
    path = home / CREDENTIALS
    lines = "".join(f"{name}={shlex.quote(value)}\n" for name, value in server.client_env.items())
    write_private(path, lines.encode())
    return path


def read_credentials(home: Path) -> dict[str, str]:
    """The variables of ``home/om-server.env``, or {} when it is missing or not this user's only."""
    path = home / CREDENTIALS
    try:
        info = path.stat()
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return {}
        found = {}
        for line in path.read_text().splitlines():
            name, _, value = line.partition("=")
            words = shlex.split(value)
            if name.strip() and len(words) == 1:
                found[name.strip()] = words[0]
        return found
    except (OSError, ValueError):
        return {}


def server_home() -> Path:
    """The PREFECT_HOME of the server `om serve` starts: the user's PREFECT_HOME when set, else a folder
    of om's own in the user's data directory (``…/om/prefect``), so what the server stores (flow
    runs' parameters and logs) is this user's only."""
    from om_core.store.db_path import data_dir

    explicit = os.environ.get("PREFECT_HOME")
    return Path(explicit).expanduser() if explicit else data_dir() / "prefect"


def local_server(home: Path | None = None, log: Path | None = None) -> PrefectServer:
    """The server `om serve` uses when PREFECT_API_URL is unset: the one another om process started (its
    credentials in ``home``) when it still answers to them and to nobody else; otherwise a new one,
    locked, on 127.0.0.1:PREFECT_SERVER_API_PORT (4200 by default), or on a free port when something
    else holds that port (a server om did not start is never used, nor the one `om run` keeps: it runs no
    scheduler)."""
    home = home or server_home()
    reused = _server_of_ours(home)
    # not the server `om run` keeps between runs: it runs no scheduler (and stops when idle)
    if reused is not None and reused.api_url != kept_api_url(home):
        return reused
    port = int(os.environ.get("PREFECT_SERVER_API_PORT") or DEFAULT_PORT)
    if _port_in_use(DEFAULT_HOST, port):
        port = free_port(DEFAULT_HOST)
    return start_server(DEFAULT_HOST, port, home=home, log=log or home / "om-serve-server.log")


def _server_of_ours(home: Path) -> PrefectServer | None:
    """The server whose credentials ``home`` holds, when it still runs: listening on 127.0.0.1 in a
    process of this user's (not a process that took its port since), accepting that credential and
    refusing a caller without it."""
    known = read_credentials(home)
    url, auth = known.get("PREFECT_API_URL"), known.get("PREFECT_API_AUTH_STRING")
    prefix = f"http://{DEFAULT_HOST}:"
    if not (url and auth and url.startswith(prefix) and url.endswith("/api")):
        return None
    try:
        port = int(url.removeprefix(prefix).removesuffix("/api"))
    except ValueError:
        return None
    if _listener_uid(DEFAULT_HOST, port) != os.geteuid() or not api_locked(url, auth):
        return None
    return PrefectServer(url, None, auth_string=auth, home=home)


def _server_pid(home: Path) -> int | None:
    """The process id in ``home/om-server.pid`` when that process is this user's kept server (flows.kept_server)."""
    try:
        path = home / KEEPER_PID
        if path.stat().st_uid != os.geteuid():
            return None
        pid = int(path.read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
        if os.stat(f"/proc/{pid}").st_uid != os.geteuid() or b"flows.kept_server" not in argv:
            return None
        return pid
    except (OSError, ValueError):
        return None


def kept_api_url(home: Path) -> str | None:
    """The API of the server om runs keep in ``home`` when it runs (its port is in its command line)."""
    pid = _server_pid(home)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            port = int(handle.read().split(b"\0")[-3])  # ... HOME PORT IDLE_SECONDS, then an empty string
    except (OSError, ValueError, IndexError):
        return None
    return f"http://{DEFAULT_HOST}:{port}/api"
