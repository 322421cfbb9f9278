"""A real cluster on 127.0.0.1 for the tests: a `prefect server start` with its own PREFECT_HOME, a
`dask scheduler`, and `dask worker` processes started from their own working directories in a private
mount namespace (`unshare -m`) where a tmpfs hides chosen directories (the database's), as on other
machines. Every process is started in its own process group and stopped by pid in teardown, also
when the test fails.

Loaded by conftest (``pytest_plugins``); fixtures: ``prefect_server`` (one per test session),
``dask_cluster`` (a factory: ``dask_cluster(hidden=[dir], workers=2)``)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flows.server import PrefectServer, free_port, start_server, stop_process_group

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


def _unshare_problem() -> str | None:
    """Why workers cannot get a private mount namespace here, or None when they can."""
    if not sys.platform.startswith("linux"):
        return "unshare -m needs Linux"
    if shutil.which("unshare") is None:
        return "the unshare command is not installed (util-linux)"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True,
                           text=True, timeout=20)
    if probe.returncode != 0:
        return f"unshare -m with a tmpfs mount is not permitted here (needs root or CAP_SYS_ADMIN): " \
               f"{probe.stderr.strip()[:200]}"
    return None


def cluster_env(api: PrefectServer | str, **extra: str) -> dict[str, str]:
    """What a cluster process needs: the installed code (here: this checkout), the Prefect API (with the
    credential of a server om started: its ``client_env``), quiet logs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PREFECT_"))}
    env.update(api.client_env if isinstance(api, PrefectServer) else {"PREFECT_API_URL": api})
    env.update({"PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "WARNING", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}, **extra)
    return env


def basic_auth(server: PrefectServer) -> dict[str, str]:
    """The Authorization header of the server's credential (Prefect's basic auth), for plain HTTP calls."""
    import base64

    return {"Authorization": "Basic " + base64.b64encode(server.auth_string.encode()).decode()}


@dataclass
class Worker:
    name: str
    process: subprocess.Popen
    workdir: Path
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def sees(self, path: Path) -> list[str]:
        """The entries of ``path`` as this worker sees it (through its own mount namespace)."""
        return sorted(os.listdir(f"/proc/{self.pid}/root{Path(path).resolve()}"))

    def kill(self) -> None:
        """kill -9: a lost worker, as when a machine goes away."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(10)


@dataclass
class DaskCluster:
    address: str
    scheduler: subprocess.Popen
    workers: list[Worker] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    root: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    credentials: Path | None = None
    nthreads: int = 2

    def start_worker(self, name: str) -> Worker:
        """One worker process (no nanny: the pid is the worker) in its own mount namespace with an empty
        tmpfs over every hidden directory, from its own working directory under the cluster's root. It
        gets the Prefect server's address and credential as the README tells (``set -a; . om-server.env;
        set +a`` before ``dask worker``), not from this process."""
        workdir = self.root / name
        workdir.mkdir(exist_ok=True)
        log = self.root / f"{name}.log"
        mounts = " && ".join(f"mount -t tmpfs om-hidden {h}" for h in self.hidden) or "true"
        command = (f"{mounts} && set -a && . {shlex.quote(str(self.credentials))} && set +a && cd {workdir} && "
                   f"exec {sys.executable} -m dask worker {self.address} --name {name} "
                   f"--nthreads {self.nthreads} --no-nanny --no-dashboard --local-directory {workdir}")
        process = subprocess.Popen(["unshare", "-m", "sh", "-c", command], cwd=workdir, env=self.env,
                                   stdin=subprocess.DEVNULL, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                                   start_new_session=True)
        worker = Worker(name, process, workdir, log)
        self.workers.append(worker)
        return worker

    def replace_lost_workers(self) -> None:
        """A worker for every one that died (as a nanny or an autoscaler would start one): a test that
        kills a worker leaves the module's cluster whole for the next test."""
        lost = [w for w in self.workers if w.process.poll() is not None]
        if not lost:
            return
        self.workers = [w for w in self.workers if w not in lost]
        for worker in lost:
            self.start_worker(f"{worker.name}-again")
        _wait_for_workers(self, len(self.workers))

    def client(self):
        from distributed import Client

        return Client(self.address, timeout=30)

    def stop(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                stop_process_group(worker.process, timeout=10)
        if self.scheduler.poll() is None:
            stop_process_group(self.scheduler, timeout=10)


def _wait_for_workers(cluster: DaskCluster, count: int, timeout: float = 90.0) -> None:
    from distributed import Client

    deadline = time.monotonic() + timeout
    with Client(cluster.address, timeout=timeout) as client:
        while len(client.scheduler_info()["workers"]) < count:
            for w in cluster.workers:
                if w.process.poll() is not None:
                    raise RuntimeError(f"dask worker {w.name} exited ({w.process.returncode}): "
                                       f"{w.log.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(client.scheduler_info()['workers'])} of {count} dask workers joined")
            time.sleep(0.3)


def start_dask_cluster(root: Path, server: PrefectServer, hidden: list[Path], workers: int = 2, nthreads: int = 2,
                       env: dict[str, str] | None = None) -> DaskCluster:
    """A scheduler and ``workers`` worker processes (DaskCluster.start_worker), each in its own mount
    namespace that hides every ``hidden`` directory."""
    env = env or cluster_env(server.api_url)
    port = free_port(HOST)
    address = f"tcp://{HOST}:{port}"
    root.mkdir(parents=True, exist_ok=True)
    scheduler_dir = root / "scheduler"
    scheduler_dir.mkdir(exist_ok=True)
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "dask", "scheduler", "--host", HOST, "--port", str(port), "--no-dashboard"],
        cwd=scheduler_dir, env=env, stdin=subprocess.DEVNULL, stdout=open(root / "scheduler.log", "ab"),
        stderr=subprocess.STDOUT, start_new_session=True)
    cluster = DaskCluster(address, scheduler, hidden=[Path(h).resolve() for h in hidden], root=root, env=env,
                          credentials=server.credentials_file, nthreads=nthreads)
    try:
        for n in range(workers):
            cluster.start_worker(f"worker-{n}")
        _wait_for_workers(cluster, workers)
    except BaseException:
        cluster.stop()
        raise
    return cluster


# What the tests of a real server do not use, off: no test here has a schedule, a late or paused run, an
# automation or a work pool's health checked, or reads a task run back (the task-run recorder's SQLite
# writes also queue the model-call slots' writes behind them: seconds per stage, docs/operating.md "A
# lost worker"). The repossessor stays: it gives a lost worker's model-call slots back.
QUIET_SERVER = {f"PREFECT_SERVER_SERVICES_{service}_ENABLED": "false"
                for service in ("SCHEDULER", "LATE_RUNS", "PAUSE_EXPIRATIONS", "CANCELLATION_CLEANUP", "FOREMAN",
                                "TRIGGERS", "TASK_RUN_RECORDER")}


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """A real `prefect server start` (API and UI) on a free port, with its own PREFECT_HOME, without the
    services no test uses (QUIET_SERVER)."""
    root = tmp_path_factory.mktemp("prefect-server")
    server: PrefectServer = start_server(HOST, free_port(HOST), home=root / "home", log=root / "server.log",
                                         extra_env=QUIET_SERVER)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def dask_cluster(tmp_path, prefect_server):
    """``dask_cluster(hidden=[...], workers=2)`` starts a cluster; all of them stop after the test."""
    problem = _unshare_problem()
    if problem:
        pytest.skip(problem)
    started: list[DaskCluster] = []

    def start(hidden: list[Path], workers: int = 2, **kwargs) -> DaskCluster:
        cluster = start_dask_cluster(tmp_path / f"cluster{len(started)}", prefect_server, hidden, workers,
                                     **kwargs)
        started.append(cluster)
        return cluster

    try:
        yield start
    finally:
        for cluster in started:
            cluster.stop()


def ledger_snapshot(db: Path) -> dict[str, list]:
    """The ledger record for record, without what differs between equal runs (minted ids, run ids,
    times, append order across sessions): records with their items, and simulated compactions."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return {
            "records": con.execute(
                "SELECT session_id, kind, covers_up_to_id, anchor_entry_id, stage, stage_key FROM ledger "
                "WHERE origin = 'pipeline' ORDER BY ALL").fetchall(),
            "observations": con.execute(
                "SELECT session_id, covers_up_to_id, item_index, obs_id, content, ts, relevance, source_entry_ids, "
                "token_count FROM observations WHERE origin = 'pipeline' ORDER BY ALL").fetchall(),
            "reflections": con.execute(
                "SELECT session_id, covers_up_to_id, item_index, refl_id, content, supporting_observation_ids, "
                "token_count FROM reflections WHERE origin = 'pipeline' ORDER BY ALL").fetchall(),
            "drops": con.execute("SELECT session_id, covers_up_to_id, item_index, obs_id FROM drops "
                                 "WHERE origin = 'pipeline' ORDER BY ALL").fetchall(),
            "compactions": con.execute(
                "SELECT session_id, compaction_id, first_kept_entry_id, folded, full_fold FROM compactions "
                "WHERE origin = 'simulated' ORDER BY ALL").fetchall(),
        }
    finally:
        con.close()
