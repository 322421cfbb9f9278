"""The Prefect server `om run` keeps between runs: the first run without PREFECT_API_URL starts it
(``kept_server``), later runs reuse it and pay only their work; it stops itself once no run has used it
for ``prefectServerIdleSeconds``; `om server status|stop` show and end it.

Locked as `om serve`'s server (flows.server): 127.0.0.1 only, a new random credential in ``om-server.env``
(0600) under a 0700 PREFECT_HOME (``server_home``), no cross-origin caller; a run reuses only a server
whose credentials that file holds, listening in a process of this user's, accepting the credential and
refusing a caller without it. It runs Prefect's API as Prefect's temporary server does for one run (its
services, no UI) in a process of its own, detached from the run that started it:

    python -m flows.kept_server [--detach] HOME PORT IDLE_SECONDS

--detach: fork at once and return (the server is then no child of the om run that starts it: that run's
end, its Ctrl-C, or the next run's clean-up of a killed run's helpers must not reach it), in a session of
its own; it writes its process id to HOME/om-server.pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from flows.runner import LEAN_SERVER, lock_environment, new_auth_string
from flows.server import (CREDENTIALS, DEFAULT_HOST, KEEPER_PID, PrefectServer, _server_of_ours, _server_pid,
                          api_healthy, free_port, read_credentials, server_home, write_credentials)
from om_core.store.private_files import private_dir, use_private_umask, write_private


# In the server's home (beside om-server.env): the kept server's process id (what `om server stop` ends),
# one lease file per om run that uses it (named by the run's process id), the time the last run ended
# (this file's mtime), the lock under which a run finds or starts it and the server decides to stop,
# and its log.
LEASES = "om-server.runs"
LAST_USED = "om-server.last-used"
LOCK = "om-server.lock"
KEPT_LOG = "om-server.log"


@dataclass
class KeptServerStatus:
    """What `om server status` shows of the server om runs keep in ``home``."""
    home: Path
    api_url: str | None  # None: no server of ours answers there
    pid: int | None
    runs: list[int]  # the om runs using it now (their process ids)
    idle_seconds: float | None  # since its last run ended (None: a run uses it, or no server)


@contextmanager
def _home_lock(home: Path) -> Iterator[None]:
    """The lock under which a run finds or starts the kept server, and the server decides to stop: so a
    run never reuses a server that is stopping."""
    import fcntl

    fd = os.open(home / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process took the id: not a run of ours
        return False
    return True


def live_leases(home: Path) -> list[int]:
    """The process ids of the om runs that use the kept server now; a lease whose run is gone (killed)
    is removed."""
    folder = home / LEASES
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        if _alive(int(name)):
            found.append(int(name))
        else:
            (folder / name).unlink(missing_ok=True)
    return sorted(found)


def idle_for(home: Path, since: float) -> float:
    """Seconds since the last run of the kept server ended (or since ``since``, its start, when later)."""
    try:
        last = max(since, (home / LAST_USED).stat().st_mtime)
    except OSError:
        last = since
    return max(0.0, time.time() - last)


def stop_if_idle(home: Path, api_url: str, idle_seconds: float, started: float) -> bool:
    """True when the kept server at ``api_url`` is to stop now: no run holds a lease and none ended for
    ``idle_seconds``. Its credentials are removed first, under the home's lock, so no run finds it
    afterwards (a run takes its lease before it looks)."""
    if live_leases(home) or idle_for(home, started) < idle_seconds:
        return False
    with _home_lock(home):
        if live_leases(home) or idle_for(home, started) < idle_seconds:
            return False
        if read_credentials(home).get("PREFECT_API_URL") == api_url:
            (home / CREDENTIALS).unlink(missing_ok=True)
        return True


@contextmanager
def run_lease(home: Path) -> Iterator[None]:
    """This process uses the kept server of ``home`` while the block runs: it does not stop then, and its
    idle time counts from the block's end."""
    private_dir(home / LEASES)
    lease = home / LEASES / str(os.getpid())
    write_private(lease, b"")
    try:
        yield
    finally:
        lease.unlink(missing_ok=True)
        write_private(home / LAST_USED, b"")


def kept_server(home: Path, idle_seconds: float, timeout: float = 120.0) -> tuple[PrefectServer, bool]:
    """The Prefect server for an `om run` (call it inside ``run_lease(home)``): the one an earlier om
    started in ``home`` when it still answers to its credential and to nobody else (``_server_of_ours``),
    else a new one, locked as `om serve`'s (127.0.0.1 only, a new random credential, no cross-origin
    caller), left running for the next run and stopping itself after ``idle_seconds`` without one
    (``main``). The same API Prefect starts for one run (its UI off), on a free port. Returns it,
    and whether it was started now."""
    private_dir(home)
    with _home_lock(home):
        reused = _server_of_ours(home)
        if reused is not None:
            return reused, False
        return _start_kept(home, idle_seconds, timeout), True


def _start_kept(home: Path, idle_seconds: float, timeout: float) -> PrefectServer:
    port = free_port(DEFAULT_HOST)
    api_url = f"http://{DEFAULT_HOST}:{port}/api"
    auth_string = new_auth_string()
    # the API Prefect's own temporary server runs for a run (PREFECT__SERVER_EPHEMERAL: its services, no
    # UI); it records no task run, as om's temporary API did not (flows.runner.prepare_environment); a
    # user's own setting wins
    env = {**LEAN_SERVER, "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED": "false", **os.environ,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1", "PREFECT_HOME": str(home), **lock_environment(auth_string, "https://om.invalid")}
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_API_AUTH_STRING", None)
    log = home / KEPT_LOG
    (home / KEEPER_PID).unlink(missing_ok=True)  # the server writes its own once it runs
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # the server forks away at once (--detach): no child of this run, whose end (or its
        # Ctrl-C, or the next run's clean-up of a killed run's helpers) must not reach it
        launcher = subprocess.Popen([sys.executable, "-m", "flows.kept_server", "--detach", str(home), str(port),
                                     str(idle_seconds)], env=env, stdin=subprocess.DEVNULL, stdout=fd,
                                    stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parent.parent))
    finally:
        os.close(fd)
    server = PrefectServer(api_url, None, log, auth_string, home)
    if launcher.wait(timeout) != 0:
        raise RuntimeError(f"om's Prefect server did not start (code {launcher.returncode}): {server.log_tail()}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _server_pid(home)
        if pid is None and (home / KEEPER_PID).exists() or pid is not None and not _alive(pid):
            raise RuntimeError(f"om's Prefect server exited: {server.log_tail()}")
        if pid is not None and api_healthy(api_url, timeout=1.0):
            write_credentials(home, server)
            return server
        time.sleep(0.2)
    if (pid := _server_pid(home)) is not None:
        os.killpg(pid, signal.SIGKILL)
    raise RuntimeError(f"om's Prefect server at {api_url} did not answer within {timeout:.0f} s: {server.log_tail()}")


def kept_status(home: Path) -> KeptServerStatus:
    server = _server_of_ours(home)
    pid = _server_pid(home)
    runs = live_leases(home)
    idle = None if server is None or runs else idle_for(home, 0.0)
    return KeptServerStatus(home, server.api_url if server else None, pid, runs, idle)


def stop_kept(home: Path, timeout: float = 20.0) -> bool:
    """End the kept server of ``home`` (SIGTERM to its process group, then SIGKILL); True when one ran."""
    pid = _server_pid(home)
    if pid is None:
        return False
    with _home_lock(home):
        (home / CREDENTIALS).unlink(missing_ok=True)
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid) and not _reaped(pid):
        time.sleep(0.1)
    if _alive(pid) and not _reaped(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (home / KEEPER_PID).unlink(missing_ok=True)
    return True


def _reaped(pid: int) -> bool:
    """True when ``pid`` is a child of this process that has exited (reaped now), or a zombie."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@contextmanager
def api_for_run(idle_seconds: float, say=lambda text: None) -> Iterator[PrefectServer | None]:  # noqa: ANN001
    """The Prefect API of one `om run`, for the block: the kept server (``kept_server``; this process its
    client, leased while the block runs), or None where the run uses what it did before: the user's
    PREFECT_API_URL (it wins), Prefect's temporary API for this run alone when ``idle_seconds`` is 0, and
    a process that imported Prefect already (its settings are read once). When the kept server cannot be
    started, the run falls back to Prefect's temporary API, and says so."""
    if os.environ.get("PREFECT_API_URL") or idle_seconds <= 0 or "prefect" in sys.modules:
        yield None
        return
    home = server_home()
    with run_lease(private_dir(home)):
        try:
            server, started = kept_server(home, idle_seconds)
        except (RuntimeError, OSError) as exc:
            say(f"om's Prefect server did not start ({exc}); this run uses a temporary one (a fallback)")
            yield None
            return
        say(f"Prefect API: {server.api_url} ("
            + ("started; it stays for the next run" if started else "om's, already running") + ")")
        os.environ.update(server.client_env)
        yield server


def watch(home: Path, api_url: str, idle_seconds: float, server, started: float) -> None:  # noqa: ANN001
    """Ask uvicorn to exit once the home's leases say the server is idle (``stop_if_idle``)."""
    step = min(5.0, max(0.2, idle_seconds / 4))
    while not server.should_exit:
        time.sleep(step)
        if not home.is_dir():  # its home was removed: no run can find it again, and nothing would stop it
            server.should_exit = True
        elif stop_if_idle(home, api_url, idle_seconds, started):
            server.should_exit = True


def main(argv: list[str]) -> int:
    if argv[:1] == ["--detach"]:
        argv = argv[1:]
        if os.fork() != 0:  # one thread here: nothing imported yet
            os._exit(0)
        os.setsid()
    home, port, idle_seconds = Path(argv[0]), int(argv[1]), float(argv[2])
    use_private_umask()  # its database and logs: this user's only
    write_private(home / KEEPER_PID, f"{os.getpid()}\n".encode())
    import uvicorn

    config = uvicorn.Config("prefect.server.api.server:create_app", factory=True, host="127.0.0.1", port=port,
                            log_level="error", lifespan="on")
    server = uvicorn.Server(config)
    api_url = f"http://127.0.0.1:{port}/api"
    threading.Thread(target=watch, args=(home, api_url, idle_seconds, server, time.time()), daemon=True).start()
    server.run()
    pid_file = home / KEEPER_PID
    try:
        if pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
