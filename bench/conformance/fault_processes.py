"""The fault bench's (bench/conformance/faults.py) records and processes: a process's end, a fault's
row, the fake provider switched per fault, and the `om` processes a fault starts, waits for within a
bound, reruns and ends, with what their database holds against the reference."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import psutil

from fake_brains import ScriptedWorkers
from fake_openai import FakeOpenAI, Reply, http_error
from test_faults import LEDGER
from test_run_command import env_for

BOUND = 240.0  # seconds a run may take before it counts as hung (the issue saw runs still going at 300 s)
MODEL = ["--model", "openai/fake-model"]


def mount_tmpfs(row: "Row", where: Path, size: str) -> bool:
    """A tmpfs of ``size`` at ``where`` (root only); without it the fault is noted as not tried."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        row.notes.append(f"not tried: cannot mount a tmpfs ({mounted.stderr.strip()})")
    return mounted.returncode == 0


@dataclass
class Done:
    code: int | None
    out: str
    err: str
    seconds: float
    hung: bool = False

    @property
    def lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip() and not line.startswith("cost:")]


@dataclass
class Row:
    fault: str
    tried: int = 0
    survived: int = 0
    lost: int = 0
    hung: int = 0
    traceback: int = 0
    calls: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, survived: bool, lost: int = 0, hung: bool = False, runs: tuple[Done, ...] = (),
            calls: int | None = None, note: str = "") -> None:
        self.tried += 1
        self.survived += bool(survived)
        self.lost += lost
        self.hung += bool(hung or any(d.hung for d in runs))
        self.traceback += any("Traceback" in d.err for d in runs)
        if calls is not None:
            self.calls.append(calls)
        if note:
            self.notes.append(note)


class Provider:
    """The fake provider's answers, switched per fault: healthy (scripted workers), 500, 429 or hang."""

    def __init__(self) -> None:
        self.mode = "healthy"
        self.script = ScriptedWorkers()
        self.calls = 0
        self.on_call = None

    def fresh(self, mode: str = "healthy", delay: float = 0.0) -> Provider:
        self.mode, self.script, self.calls, self.on_call = mode, ScriptedWorkers(delay=delay), 0, None
        return self

    def __call__(self, body: dict) -> Reply:
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self.calls)
        if self.mode == "500":
            return http_error(500, "upstream down")
        if self.mode == "429":
            return http_error(429, "slow down")
        if self.mode == "hang":
            return Reply(text="(never in time)", delay=60)
        return self.script(body)


class OmProcesses:
    """The `om` processes of the bench, in one work folder, against one fake provider."""

    def __init__(self, work: Path, server: FakeOpenAI, provider: Provider) -> None:
        self.work, self.server, self.provider = work, server, provider
        self.env = env_for(work)  # one Prefect home for the bench (its local API's database)
        self.started: list[psutil.Process] = []  # every om process and its helpers, ended at the end
        self.reference: list = []
        self.reference_calls = 0

    # ---------------------------------------------------------------- processes

    def popen(self, cwd: Path, args: list[str], env: dict | None = None) -> subprocess.Popen:
        return self.spawn([sys.executable, "-m", "flows.cli", *args], cwd, env)

    def spawn(self, argv: list[str], cwd: Path, env: dict | None = None) -> subprocess.Popen:
        """Output to files, not pipes: the helpers a kill -9 leaves behind keep a pipe open for good."""
        self._n = getattr(self, "_n", 0) + 1
        out, err = (open(self.work / f"p{self._n}.{kind}", "w+") for kind in ("out", "err"))
        proc = subprocess.Popen(argv, cwd=cwd, env=env or self.env, stdout=out, stderr=err, text=True,
                                start_new_session=True)
        proc.files = (out, err)
        self.started.append(psutil.Process(proc.pid))
        return proc

    def wait(self, proc: subprocess.Popen, started: float, bound: float = BOUND) -> Done:
        try:
            proc.wait(timeout=max(1.0, bound - (time.monotonic() - started)))
            hung = False
        except subprocess.TimeoutExpired:
            self.end_tree(proc.pid)
            proc.wait()
            hung = True
        texts = []
        for f in proc.files:
            f.seek(0)
            texts.append(f.read())
            f.close()
        done = Done(None if hung else proc.returncode, texts[0], texts[1], time.monotonic() - started, hung=hung)
        with open(self.work / "stderr.log", "a") as log:  # what each process said, to look into a row
            log.write(f"=== {' '.join(map(str, proc.args))[:300]}\nexit {done.code} after {done.seconds:.1f} s\n"
                      f"{done.err}\n")
        return done

    def om(self, cwd: Path, *args: str, db: Path | None = None, env: dict | None = None, bound: float = BOUND) -> Done:
        started = time.monotonic()
        proc = self.popen(cwd, ["--db", str(db or cwd / "om.duckdb"), *args], env)
        return self.wait(proc, started, bound)

    def run(self, cwd: Path, folder: Path, *extra: str, db: Path | None = None, env: dict | None = None) -> Done:
        return self.om(cwd, "run", str(folder), *MODEL, "--api-base", self.server.base_url, *extra, db=db, env=env)

    def end_tree(self, pid: int) -> None:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass

    def cleanup(self) -> None:
        for p in self.started:
            try:
                for child in p.children(recursive=True):
                    child.kill()
                p.kill()
            except psutil.Error:
                pass

    # ---------------------------------------------------------------- what a database holds

    @staticmethod
    def rows(db: Path, sql: str) -> list:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()

    def missing(self, db: Path, reference: list, sql: str = LEDGER) -> tuple[int, int]:
        """(reference rows missing, rows beyond the reference) in ``db``."""
        try:
            now = Counter(map(repr, self.rows(db, sql)))  # rows hold lists (an observation's items)
        except duckdb.Error:
            now = Counter()
        want = Counter(map(repr, reference))
        return sum((want - now).values()), sum((now - want).values())

    def fault_dir(self, name: str) -> Path:
        where = self.work / name
        where.mkdir(parents=True)
        return where

    def healthy_rerun(self, where: Path, folder: Path, row: Row, runs: tuple[Done, ...], calls: int | None,
                      note: str, db: Path | None = None, hung: bool = False) -> None:
        """The rerun after a fault, on a healthy provider: the row's survived/lost against the reference."""
        self.provider.mode = "healthy"
        asked_before = len(self.provider.script.asked_after_completion)
        again = self.run(where, folder, db=db)
        lost, extra = self.missing(db or where / "om.duckdb", self.reference)
        if calls is None:  # a kill: the calls the rerun asked again (answered before the kill)
            calls = len(self.provider.script.asked_after_completion) - asked_before
        note += f"; rerun exit {again.code}" + (f", {extra} rows beyond the reference" if extra else "")
        row.add(again.code == 0 and lost == 0 and extra == 0, lost, hung, (*runs, again), calls, note)
