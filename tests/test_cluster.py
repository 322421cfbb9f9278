"""`om run` on a real cluster: a `prefect server start`, a `dask scheduler` and two
`dask worker` processes on 127.0.0.1, started from their own directories in mount namespaces where
the database's directory is an empty tmpfs (tests/cluster.py). The ledger must be the threads run's,
record for record, also when a worker is killed mid-run; without a reachable Prefect API the run
refuses in one line before any work."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import duckdb
import pytest
from builders import SessionBuilder
from cluster import REPO, _unshare_problem, basic_auth, cluster_env, ledger_snapshot, start_dask_cluster
from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI

from flows.server import PrefectServer, free_port

pytestmark = pytest.mark.cluster

SETTINGS_ENV = {"OM_OBSERVE_AFTER_TOKENS": "150", "OM_REFLECT_AFTER_TOKENS": "300", "OM_COMPACT_AFTER_TOKENS": "700",
                "OM_KEEP_RECENT_TOKENS": "200", "OM_OBSERVER_CHUNK_MAX_TOKENS": "400",
                "OM_OBSERVATIONS_POOL_MAX_TOKENS": "40", "OM_OBSERVATIONS_POOL_TARGET_TOKENS": "20",
                "OM_CLOCK_BASIS": "source"}  # the builder's assistant usage never grows (SPEC §7 clocks would not move)



def make_sessions(folder: Path, count: int = 8) -> Path:
    for n in range(count):
        b = SessionBuilder(session_id=f"c1a57e{n:02d}-aaaa-bbbb-cccc-dddddddddddd", start=f"2026-04-{n + 1:02d}T09:00:00")
        b.work_turns(4 + n % 2, f"topic{n}")
        if n == 1:  # one session with a second branch
            b.go(b.entries[-9]["id"])
            b.branch_summary("Tried another approach first; it was abandoned.")
            b.work_turns(2, "detour")
        b.write(folder / f"s{n}.jsonl")
    return folder


def om_run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def assert_no_duplicate_record(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT stage_key, count(*) FROM ledger WHERE origin = 'pipeline' GROUP BY ALL "
                           "HAVING count(*) > 1").fetchall() == []
    finally:
        con.close()


@pytest.fixture(scope="module")
def hidden_client(tmp_path_factory) -> Path:
    """The client's directory, hidden from the workers of every cluster of the module."""
    return tmp_path_factory.mktemp("client")


@pytest.fixture
def client_side(hidden_client, tmp_path) -> dict[str, Path]:
    """The client's directory (sessions and database), emptied for each test, hidden from the
    workers, and a result storage directory every worker shares (on real machines: a mount, a
    bucket, a storage block)."""
    for child in hidden_client.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    shared = tmp_path / "shared-results"
    shared.mkdir()
    return {"client": hidden_client, "sessions": make_sessions(hidden_client / "sessions"), "shared": shared}


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory, prefect_server, hidden_client):
    """One cluster (a scheduler, two workers) for the module: starting and stopping one is 20-30 s under
    load, and a fresh worker imports om and Prefect again at its first task. The harness's own test
    starts its own (it stops it)."""
    problem = _unshare_problem()
    if problem:
        pytest.skip(problem)
    cluster = start_dask_cluster(tmp_path_factory.mktemp("cluster"), prefect_server, [hidden_client])
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(module_cluster):
    """The module's cluster with two live workers: one a test killed is replaced first."""
    module_cluster.replace_lost_workers()
    return module_cluster


def run_env(api: PrefectServer | str, server: FakeOpenAI, shared: Path, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "client-home"
    home.mkdir(parents=True, exist_ok=True)
    # a lost worker's model-call slots come back after a minute, as docs/operating.md advises a cluster
    return cluster_env(api, HOME=str(home), OM_MODEL="openai/fake-model", OM_API_BASE=server.base_url,
                       OM_RESULT_STORAGE=str(shared), OPENAI_API_KEY="sk-fake", OM_MODEL_SLOT_LEASE_SECONDS="60",
                       **SETTINGS_ENV)


@pytest.fixture(scope="module")
def threads_ledger(tmp_path_factory, prefect_server) -> dict:
    """The reference: the same sessions, settings and scripted model on the threads runner."""
    root = tmp_path_factory.mktemp("threads")
    sessions = make_sessions(root / "sessions")
    db = root / "om.duckdb"
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        env = run_env(prefect_server, server, root / "results", root)
        result = om_run(["--db", str(db), "run", str(sessions), "--json", "--concurrency", "4", "--no-drain"], env, root)
    assert result.returncode == 0, result.stderr[-3000:]
    ledger = ledger_snapshot(db)
    assert ledger["records"] and ledger["compactions"]
    return ledger


def assert_workers_wrote_nothing_hidden(cluster, client: Path) -> None:
    for worker in cluster.workers:
        if worker.process.poll() is None:
            assert worker.sees(client) == [], f"{worker.name} created files where it cannot see the database"
        assert not list(worker.workdir.rglob("*.duckdb*")), f"{worker.name} opened a database of its own"


# ---------------------------------------------------------------- the harness itself


def test_the_workers_cannot_see_the_database_directory(cluster, client_side):
    client_dir = client_side["client"]
    (client_dir / "om.duckdb").write_bytes(b"the client's database")
    with cluster.client() as client:
        seen = client.run(lambda: (os.getcwd(), os.listdir(client_dir), os.path.exists(client_side["shared"])))
    assert len(seen) == 2
    cwds = {w.workdir for w in cluster.workers}
    for cwd, listing, shared_visible in seen.values():
        assert Path(cwd) in cwds and listing == [] and shared_visible
    assert (client_dir / "om.duckdb").is_file()  # the client still sees it
    for worker in cluster.workers:
        assert worker.sees(client_dir) == []


def test_a_prefect_flow_runs_on_the_dask_workers_against_the_server(cluster, prefect_server, client_side, tmp_path):
    script = textwrap.dedent(f"""
        import json, os
        from prefect import flow, task
        from prefect_dask import DaskTaskRunner

        @task
        def where(n):
            return [os.getpid(), os.getcwd(), sorted(os.listdir({str(client_side["client"])!r}))]

        @flow(task_runner=DaskTaskRunner(address={cluster.address!r}))
        def probe():
            return [f.result() for f in [where.submit(n) for n in range(6)]]

        print(json.dumps({{"client": os.getpid(), "tasks": probe()}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], env=cluster_env(prefect_server), cwd=tmp_path,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    pids = {pid for pid, _, _ in out["tasks"]}
    assert pids <= {w.pid for w in cluster.workers} and out["client"] not in pids
    assert all(listing == [] for _, _, listing in out["tasks"])
    import urllib.request

    request = urllib.request.Request(prefect_server.api_url + "/flow_runs/filter", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json", **basic_auth(prefect_server)})
    with urllib.request.urlopen(request, timeout=30) as response:
        runs = json.loads(response.read())
    assert any(r["name"] and r["state_type"] == "COMPLETED" for r in runs)


# ---------------------------------------------------------------- om run on the cluster


def test_a_cluster_run_gives_the_ledger_of_a_threads_run_also_when_a_worker_is_lost(cluster, prefect_server,
                                                                                      client_side, tmp_path,
                                                                                      threads_ledger):
    """A run on both workers of the module's cluster, one of them killed mid-run (a later test gets a new
    worker in its place): the ledger of the threads run, record for record, each record once. (One run
    for both: an undisturbed cluster run asserted the same things and cost a whole run more.) The
    scheduler notices a killed worker at once (its connection closes) and hands its sessions to the
    other; the lost worker's model-call slots (two of modelConcurrency's eight) are not needed by the
    two threads left. What the run takes after the kill is the rest of its work on half the threads."""
    script = ScriptedWorkers(delay=0.05)
    lost = threading.Event()

    def responder(body):
        if len(script.answered) >= 4 and not lost.is_set():  # a few stages in: more are in flight
            lost.set()
            cluster.workers[0].kill()  # kill -9 of a worker while stages are in flight
        return script(body)

    with FakeOpenAI(responder=responder) as server:
        env = run_env(prefect_server, server, client_side["shared"], tmp_path)
        db = client_side["client"] / "om.duckdb"
        result = om_run(["--db", str(db), "run", str(client_side["sessions"]), "--json", "--no-drain",
                         "--task-runner", "dask", "--dask-address", cluster.address], env, client_side["client"])
    assert lost.is_set(), "the run ended before a worker was lost"
    assert cluster.workers[0].process.returncode == -signal.SIGKILL
    assert result.returncode == 0, result.stderr[-3000:]
    assert ledger_snapshot(db) == threads_ledger
    assert_no_duplicate_record(db)
    assert_workers_wrote_nothing_hidden(cluster, client_side["client"])


@pytest.mark.parametrize("api", ["unset", "unreachable", "no-credential", "no-result-storage"])
def test_a_cluster_run_without_what_workers_need_refuses_in_one_line(api, client_side, tmp_path, request):
    with FakeOpenAI(responder=ScriptedWorkers()) as server:
        env = run_env("", server, client_side["shared"], tmp_path)
        if api == "unset":
            env.pop("PREFECT_API_URL")
        elif api == "unreachable":
            env["PREFECT_API_URL"] = f"http://127.0.0.1:{free_port()}/api"
        else:
            env.update(request.getfixturevalue("prefect_server").client_env)
            if api == "no-credential":  # a locked server (the test session's), no PREFECT_API_AUTH_STRING
                env.pop("PREFECT_API_AUTH_STRING")
            else:
                env.pop("OM_RESULT_STORAGE")
        db = client_side["client"] / "om.duckdb"
        result = om_run(["--db", str(db), "run", str(client_side["sessions"]), "--dask-address",
                         f"tcp://127.0.0.1:{free_port()}"], env, client_side["client"], timeout=60)
        assert server.requests == []  # no model call
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert {"no-credential": "requires a credential: set PREFECT_API_AUTH_STRING",
            "no-result-storage": "result storage"}.get(api, "PREFECT_API_URL") in lines[0]
    assert not db.exists()  # before any work: not even a database
    assert result.stdout == ""


def test_the_harness_stops_every_process_it_started(dask_cluster, client_side):
    cluster = dask_cluster(hidden=[client_side["client"]], workers=1)
    pids = [cluster.scheduler.pid] + [w.pid for w in cluster.workers]
    cluster.stop()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
