"""Shared fixtures. The real sample sessions live in ../shared/sessions, which a user's clone lacks:
tests that need them are skipped there with a clear reason (CI always has them)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings


REPO = Path(__file__).resolve().parent.parent
SHARED_SESSIONS = (REPO.parent / "shared" / "sessions").resolve()
EXAMPLES = REPO / "examples" / "sessions"

# Property tests: about 50 examples a test for the inner loop, 300 in CI (.ci/run sets CI=true); the two
# fold tests, whose examples cost most, take at most 150 (their modules say why).
# HYPOTHESIS_PROFILE=ci (or dev) picks one explicitly; a test's own @settings still narrows it.
settings.register_profile("dev", max_examples=50, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("ci", settings.get_profile("dev"), max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

# Nothing in the tests may reach the network or a real model.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# The endpoints' announcements (flows.endpoint.endpoints_folder) go to a state folder of the test run's
# own, never the developer's: every process the tests start (om, Pi and its extension) inherits it.
_STATE = tempfile.mkdtemp(prefix="om-test-state-")
os.environ["XDG_STATE_HOME"] = _STATE
atexit.register(shutil.rmtree, _STATE, True)


@pytest.fixture(scope="session", autouse=True)
def _no_default_database_in_the_developer_s_home(tmp_path_factory):
    """A command run without --db or OM_DB writes om's default database in the user's data directory:
    in the tests (and their subprocesses), a folder of the test session's, never the developer's own."""
    previous = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("xdg-data"))
    yield
    _stop_kept_servers(tmp_path_factory.getbasetemp())
    if previous is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = previous


def _stop_kept_servers(root: Path) -> None:
    """The Prefect servers `om run` left for the next run under ``root`` (their homes hold om-server.pid):
    stopped when the tests are done with them, not after their idle time."""
    from flows.kept_server import KEEPER_PID, stop_kept

    for pid_file in Path(root).rglob(KEEPER_PID):
        stop_kept(pid_file.parent)


@pytest.fixture(autouse=True)
def _no_kept_server_outlives_its_test(request):
    """A test whose own HOME (its tmp_path) an `om run` started a Prefect server in: that server stops
    with the test (the test session's own, prefect_api's, stays for the next tests)."""
    yield
    if request.node.funcargs.get("tmp_path") is not None:
        _stop_kept_servers(request.node.funcargs["tmp_path"])


def workspace(db, values=None):
    """A workspace on the database file ``db``, or around the open connection ``db`` (as the library's
    entry points take one), with the given Settings, by default om's defaults: no settings file, no
    OM_* variable."""
    import duckdb

    from om_core.settings import Settings
    from om_core.store.workspace import Workspace

    settings = values if values is not None else Settings()
    if isinstance(db, duckdb.DuckDBPyConnection):
        return Workspace.on_connection(db, settings)
    return Workspace.open(db, settings=settings)


def shared_session(name: str) -> Path:
    path = SHARED_SESSIONS / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared is only present in CI and the team's checkout)")
    return path


@pytest.fixture
def large_session() -> Path:
    return shared_session("large-session.jsonl")


@pytest.fixture
def before_compaction() -> Path:
    return shared_session("before-compaction.jsonl")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "om.duckdb"


def replayed_offline(db: Path, path: Path, settings=None) -> tuple[Path, str]:
    """``path`` ingested into ``db`` and replayed in this process with the offline baseline (om's
    defaults unless ``settings``): (db, the session id)."""
    from om_core.store import db as dbmod
    from om_core.ingest import ingest
    from om_core.replay.engine import replay_session
    from om_core.settings import Settings
    from om_core.workers.run_config import ModelConfig, make_brain
    from om_core.store.workspace import Workspace

    settings = settings or Settings()
    session_id = ingest(workspace(db), [path]).files[0].session_id
    con = dbmod.connect(db)
    try:
        replay_session(Workspace.on_connection(con, settings), session_id,
                       make_brain(ModelConfig(model="offline"), settings))
    finally:
        con.close()
    return db, session_id


def _test_run_folder(tmp_path_factory) -> Path:
    """A folder every process of this test run shares (each xdist worker's basetemp is a child of it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def _before_compaction_offline(tmp_path_factory) -> tuple[Path, str, Path]:
    """before-compaction.jsonl ingested and replayed with the offline baseline on om's defaults: the
    same replay several tests read, made once per test run, by whichever xdist worker asks first (the
    others wait on a file lock: half a minute under load). The file replayed is a copy whose header's
    cwd is a folder that exists, as the real Pi needs to open it (tests/test_migration.py)."""
    import fcntl
    import json

    source = shared_session("before-compaction.jsonl")
    folder = _test_run_folder(tmp_path_factory) / "before-compaction-offline"
    path, db, done = folder / source.name, folder / "om.duckdb", folder / "session-id"
    with open(f"{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            (folder / "cwd").mkdir(parents=True)
            lines = source.read_bytes().split(b"\n")
            header = json.loads(lines[0])
            header["cwd"] = str(folder / "cwd")
            path.write_bytes(b"\n".join([json.dumps(header).encode(), *lines[1:]]))
            done.write_text(replayed_offline(db, path)[1])
    return db, done.read_text(), path


@pytest.fixture
def before_compaction_offline(_before_compaction_offline, tmp_path) -> tuple[Path, str]:
    """(this test's own copy of that database, the session id): a test may write to its copy."""
    source, session_id, _ = _before_compaction_offline
    copy = tmp_path / "om.duckdb"
    shutil.copyfile(source, copy)
    return copy, session_id


@pytest.fixture
def before_compaction_maintained(before_compaction_offline, _before_compaction_offline, tmp_path) -> tuple[Path, Path, str]:
    """(a copy of the replayed file in this test's folder, its copy of the database, the session id): the
    database names the copy, as if om had maintained the file where it is (a test may rewrite both)."""
    from om_core.store import db as dbmod

    db, session_id = before_compaction_offline
    path = tmp_path / _before_compaction_offline[2].name
    shutil.copyfile(_before_compaction_offline[2], path)
    with dbmod.writing(db) as con:
        for table in ("session_files", "sessions"):
            con.execute(f"UPDATE om_internal.{table} SET file_path = ?", [str(path.resolve())])
    return path, db, session_id

# Prefect: quiet, no telemetry (no network here), one ephemeral API for the whole test session.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
# The test harness's API keeps what om's does (flows/runner.LEAN_SERVER): the UI test reads it as it is.
from flows.runner import LEAN_SERVER  # noqa: E402

for _name, _value in LEAN_SERVER.items():
    os.environ.setdefault(_name, _value)
# ...and records task runs, which tests read (a server `om run` keeps records none unless told to, as its
# temporary API did not): whichever test's `om run` starts the session's server (prefect_api)
os.environ.setdefault("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED", "true")


@pytest.fixture
def isolated_home(monkeypatch, tmp_path: Path) -> None:
    """No settings, model or database from the developer's machine reach the code under test: an
    empty HOME, the test's own cwd, and no OM_* variables."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)  # om's default database: under this HOME
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("OM_")]:
        monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def shared_server():
    """One fake model server for the whole run: stopping one costs half a second (its poll interval)."""
    from fake_openai import FakeOpenAI

    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def server(shared_server):
    """The shared fake model server, with nothing scripted and no requests seen."""
    shared_server.reset()
    return shared_server


@pytest.fixture(scope="session")
def prefect_api(_no_default_database_in_the_developer_s_home):
    """The test session's Prefect API: the server `om run` keeps (flows.kept_server), started once per
    test session (per xdist worker; 10-25 s) in this session's data folder, where every `om run` of the
    tests without a PREFECT_API_URL of its own finds it and reuses it, as a user's second run does. Its
    credential is in this process's environment (PREFECT_API_AUTH_STRING, which the tests' subprocesses
    inherit) and settings; this process's lease keeps it for the whole session. It records task runs (the
    tests read them), as Prefect's test harness did."""
    import prefect.context
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    from flows.kept_server import kept_server, run_lease
    from flows.server import server_home

    home = server_home()
    with run_lease(home):
        server, _ = kept_server(home, idle_seconds=600, timeout=180)
        os.environ["PREFECT_API_AUTH_STRING"] = server.auth_string
        try:
            with temporary_settings(updates={PREFECT_API_URL: server.api_url,
                                             PREFECT_API_AUTH_STRING: server.auth_string}), \
                    prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
                yield server.api_url
                _drain_prefect_workers()
        finally:
            os.environ.pop("PREFECT_API_AUTH_STRING", None)


def _drain_prefect_workers() -> None:
    """What this process still sends to the API (logs, events), before the server stops."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            result = APILogWorker.instance().drain()
            if inspect.isawaitable(result):
                await result
        except RuntimeError:  # never started
            pass
        result = EventsWorker.drain_all()
        if inspect.isawaitable(result):
            await result

    run_coro_as_sync(drain())


# The real-cluster harness (a Prefect server, a Dask scheduler and workers): tests/cluster.py.
from cluster import dask_cluster, prefect_server  # noqa: E402,F401


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of a few MB (root only): the test gets its path and remounts it."""
    import subprocess

    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")

    def remount(options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(mount)], check=True)

    yield mount, remount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# `make test` runs the suite on every core with pytest-xdist (-n auto). Tests that share a costly
# fixture go to one worker, so that each worker does not build it again; everything else spreads test
# by test (a Prefect test harness per worker is cheaper than a queue behind one). The groups are
# named by node id here, because xdist's own xdist_group marks do not group anything under pytest 9
# (xdist 3.8 renames a test through an attribute pytest 9 no longer reads).
XDIST_GROUPS = {
    # the real Prefect server, the cluster module's Dask cluster and its reference run
    "tests/test_cluster.py::": "prefect-server",
    "tests/test_serve.py::test_a_deployment_run_honours_a_setting_from_every_source": "prefect-server",
    "tests/test_serve.py::test_ctrl_c_of_an_idle_om_serve_says_no_run_was_in_progress": "prefect-server",
    "tests/test_serve.py::test_om_serve_on_a_server_that_refuses_its_credential": "prefect-server",
    # the one om serve (with the Prefect server it starts) of test_serve's test_served_* tests, in order
    "tests/test_serve.py::test_served_": "om-serve",
    # Pi's live conversation, whose scenarios run in order on one Pi process
    "tests/test_pi_live.py::": "pi-live",
    # module fixtures of several seconds: a replay, a report, an uninterrupted om run
    "tests/test_compact_worlds.py::": "compact-worlds",
    "tests/test_report.py::": "report",
    "tests/test_flows.py::test_kill_9_then_resume": "flows-clean-run",
    "tests/test_flows.py::test_max_cost_stops_om_run_and_a_rerun_resumes_it": "flows-clean-run",
    "tests/test_faults.py::test_a_provider_down_for_good": "faults-reference-ledger",
    # module fixtures of a minute or more under load, built once per worker that runs one of their tests
    "tests/test_bounded_memory.py::": "bounded-memory-weeks",
    **{f"tests/test_first_hour.py::{name}": "first-hour-demo" for name in (
        "test_the_run_summary_", "test_om_run_piped_", "test_a_run_leaves_no_lock_file", "test_om_view_",
        "test_om_compact_", "test_the_report_", "test_om_export_out_dash", "test_the_offline_baseline_ends",
        "test_om_status_without_a_session", "test_om_search_")},
}

# The work units (a group above, or one test) that take longest, longest first, from a run's --durations
# (relative: seconds on a loaded 2-core machine). xdist hands out units in its own order (units with
# more tests first, then collection order), so a long unit reached late keeps one worker busy while the
# other has nothing left; handed out first, the short ones fill in around them and both end together.
LONGEST_FIRST = (
    "faults-reference-ledger",
    "tests/test_first_hour.py::test_the_offline_memory_of_the_five_sample_files",
    "flows-clean-run",
    "prefect-server",
    "pi-live",
    "first-hour-demo",
    "bounded-memory-weeks",
    "tests/test_faults.py::test_a_kill_9_after_the_prefect_server_started",
    "tests/test_ledger_properties.py::test_sql_matches_oracle",  # six shards; 300 examples in CI
    "tests/test_flows.py::test_om_run_on_a_real_session_with_the_offline_baseline",
    "tests/test_run_command.py::test_two_runs_started_at_once",
    "tests/test_run_command.py::test_sigint_mid_run",
    "tests/test_flows.py::test_same_flow_on_a_local_dask_cluster",
    "tests/test_faults.py::test_a_full_disk_stops_the_model_calls_at_once",
    "tests/test_flows.py::test_pipeline_with_429s_then_a_rerun_changes_nothing",
    "om-serve",
    "tests/test_serve.py::test_ctrl_c_of_om_serve_during_a_tick",
    "tests/test_demo.py::",
    "tests/test_flows.py::test_om_run_on_a_full_disk_ends_with_one_line",
    "tests/test_db.py::test_migration_00",
    "tests/test_circuit.py::test_om_run_stops_every_stage_on_a_rejected_key",
    "tests/test_faults.py::test_sigterm_in_a_retry_storm",
    "tests/test_project_fold_properties.py::",
)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's default distribution (--dist load, which -n implies) with XDIST_GROUPS kept together."""
    if config.getvalue("dist") != "load":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    def rank(scope: str) -> int:
        return next((n for n, prefix in enumerate(LONGEST_FIRST) if scope.startswith(prefix)), len(LONGEST_FIRST))

    class SharedFixtureScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return next((group for prefix, group in XDIST_GROUPS.items() if nodeid.startswith(prefix)), nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete before the first unit is handed out
                self.ordered = True
                self.workqueue = OrderedDict(sorted(self.workqueue.items(), key=lambda unit: rank(unit[0])))
            super()._assign_work_unit(node)

    return SharedFixtureScheduling(config, log)
