#!/usr/bin/env python3
"""The fault table, from faults injected for real into real `om` processes.

Each fault runs on sessions generated with tests/builders.SessionBuilder (tests/test_run_command.sessions)
in a folder of its own, against the fake provider of tests/fake_openai.py (answered by
tests/fake_brains.ScriptedWorkers when healthy). What is injected:

* provider faults: every call 500, every call 429, a server that never answers in time (60 s, with
  requestTimeoutSeconds 2); the run with the shipped settings (breakerFailures 12), then a healthy rerun;
* a full disk: the database and its result storage on a 64 MB tmpfs (root), filled after the run's
  third model call; then the filler is removed and the run is repeated;
* kill -9 of `om run` once its Prefect server is up and after 1, half and all but one of the model
  calls an uninterrupted run makes; then a rerun; the processes the killed run had started
  must be gone after the rerun;
* kill -9 of `om ingest` at 10 %, 30 % and 60 % of an uninterrupted ingest's time; then a rerun;
* SIGTERM of `om run` in a retry storm (500s, breaker off): the `interrupted` line, row and exit 143;
* a session file truncated to half, another replaced by a different session: `om ingest`, `om recall`
  of an orphaned id, then `om run` again (offline baseline);
* two `om run` started at once on one database with one fresh Prefect home;
* `om export` to a read-only filesystem (a file, and a new directory);
* `om eval longmemeval` on a file whose every instance is invalid;
* a maintenance tick (the flow `om serve` schedules, flows.pipeline.maintain_sessions, in a process of
  its own) that meets a copied session file.

Columns, per fault: tried (injections), survived (the rerun ended with the reference: the ledger of an
uninterrupted healthy run, the entries of an uninterrupted ingest, the ledger before a rewrite; for the
commands that write nothing, the expected one line and exit code with nothing written), lost (reference
rows missing at the end), hung (a process still running after its bound, or one om started still alive
after the rerun), traceback (injections with 'Traceback' on a stderr), calls (model calls after the
fault: made during the faulty run, after the fill or the signal, or asked again by the rerun).

Usage (root, for the tmpfs mounts; about 10 minutes on 2 loaded cores):
    .venv/bin/python bench/conformance/faults.py [--only NAME ...] [--json FILE] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402, F401 - its import sets the paths up

import psutil  # noqa: E402
from builders import SessionBuilder  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402
from test_faults import LEDGER, fill  # noqa: E402
from test_run_command import SETTINGS_ENV, sessions  # noqa: E402

from bench.conformance.fault_processes import BOUND, MODEL, OmProcesses, Provider, Row, mount_tmpfs  # noqa: E402

ENTRIES = "SELECT session_id, entry_id, line_no, entry_type FROM entries ORDER BY ALL"


class Bench(OmProcesses):
    """The faults, each injected for real, each giving its row."""

    # ---------------------------------------------------------------- the faults

    def make_reference(self) -> None:
        where = self.fault_dir("reference")
        self.provider.fresh()
        done = self.run(where, sessions(where / "sessions", count=2))
        assert done.code == 0, done.err[-2000:]
        self.reference = self.rows(where / "om.duckdb", LEDGER)
        self.reference_calls = self.provider.calls
        print(f"reference: {len(self.reference)} ledger rows, {self.reference_calls} model calls, "
              f"{done.seconds:.0f} s", flush=True)

    def provider_down(self, mode: str) -> Row:
        row = Row(f"provider {mode} forever")
        where = self.fault_dir(f"provider-{mode}")
        folder = sessions(where / "sessions", count=2)
        self.provider.fresh(mode)
        env = {**self.env, "OM_REQUEST_TIMEOUT_SECONDS": "2"} if mode == "hang" else None
        done = self.run(where, folder, env=env)
        calls = self.provider.calls
        status = self.rows(where / "om.duckdb", "SELECT status FROM runs WHERE command = 'run'")
        note = (f"exit {done.code} after {done.seconds:.0f} s, {len(done.lines)} stderr line(s): "
                f"{(done.lines or [''])[0][:110]!r}; row {[s for (s,) in status]}")
        self.healthy_rerun(where, folder, row, (done,), calls, note)
        return row

    def full_disk(self) -> Row:
        row = Row("full disk (DB + result storage)")
        where = self.fault_dir("full-disk")
        disk = where / "disk"
        disk.mkdir()
        if not mount_tmpfs(row, disk, "64m"):
            return row
        try:
            folder = sessions(where / "sessions", count=2)
            filled = {"at": None}

            def fill_at_third(n: int) -> None:
                if n == 3 and filled["at"] is None:
                    fill(disk)
                    filled["at"] = n

            self.provider.fresh(delay=0.2).on_call = fill_at_third
            db = disk / "om.duckdb"
            done = self.run(where, folder, "--concurrency", "2", db=db)
            after = self.provider.calls - (filled["at"] or self.provider.calls)
            self.provider.on_call = None
            (disk / "filler").unlink(missing_ok=True)
            note = (f"exit {done.code}, {len(done.lines)} stderr line(s): {(done.lines or [''])[0][:110]!r}")
            self.healthy_rerun(where, folder, row, (done,), after, note, db=db)
            status = self.rows(db, "SELECT status FROM runs WHERE command = 'run' ORDER BY started_at")
            row.notes[-1] += f"; the full run's row after the rerun's start: {status[0][0] if status else None}"
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)
        return row

    def kill_run(self) -> Row:
        row = Row("kill -9 of om run")
        n = self.reference_calls
        for moment in ["server up", 1, max(2, n // 2), max(3, n - 1)]:
            where = self.fault_dir(f"kill-run-{str(moment).replace(' ', '-')}")
            folder = sessions(where / "sessions", count=2)
            self.provider.fresh(delay=0.2)
            started = time.monotonic()
            proc = self.popen(where, ["--db", str(where / "om.duckdb"), "run", str(folder), *MODEL, "--api-base",
                                      self.server.base_url])

            def reached() -> bool:
                if moment == "server up":
                    try:
                        return bool(json.loads((where / "om.duckdb.lock").read_text() or "{}").get("helpers"))
                    except (OSError, ValueError):
                        return False
                return self.provider.calls >= moment

            while proc.poll() is None and not reached() and time.monotonic() - started < BOUND:
                time.sleep(0.05)
            try:
                helpers = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                helpers = []
            ended_first = proc.poll() is not None
            try:
                proc.send_signal(signal.SIGKILL)  # to om alone, as a user's kill -9: its helpers stay
            except ProcessLookupError:
                pass
            killed = self.wait(proc, started)
            note = f"at {moment}{' call(s)' if moment != 'server up' else ''}: {self.provider.calls} calls made" + (
                " (the run had ended first)" if ended_first else "")
            self.healthy_rerun(where, folder, row, (killed,), None, note)
            _, alive = psutil.wait_procs(helpers, timeout=10)
            if alive:  # something the killed run started outlived the rerun
                row.hung += 1
                row.notes[-1] += f"; {len(alive)} helper(s) of the killed run still alive after the rerun"
        return row

    def kill_ingest(self) -> Row:
        row = Row("kill -9 of om ingest")
        base = self.fault_dir("kill-ingest")
        folder = base / "sessions"
        for n in range(40):
            b = SessionBuilder(f"{n:08x}-aaaa-4bbb-8ccc-dddddddddddd", start=f"2026-03-{n % 28 + 1:02d}T09:00:00")
            b.work_turns(60, f"topic{n}")
            b.write(folder / f"s{n:02d}.jsonl")
        ref_dir = base / "reference"
        ref_dir.mkdir()
        reference_run = self.om(ref_dir, "ingest", str(folder))
        assert reference_run.code == 0, reference_run.err[-2000:]
        reference = self.rows(ref_dir / "om.duckdb", ENTRIES)
        for share in (0.1, 0.3, 0.6):
            where = base / f"at-{int(share * 100)}"
            where.mkdir()
            started = time.monotonic()
            proc = self.popen(where, ["--db", str(where / "om.duckdb"), "ingest", str(folder)])
            time.sleep(share * reference_run.seconds)
            ended_first = proc.poll() is not None
            proc.send_signal(signal.SIGKILL)
            killed = self.wait(proc, started)
            again = self.om(where, "ingest", str(folder))
            lost, extra = self.missing(where / "om.duckdb", reference, ENTRIES)
            note = (f"at {share:.0%} of {reference_run.seconds:.1f} s" + (" (it had ended first)" if ended_first else "")
                    + f"; rerun exit {again.code}" + (f", {extra} entries beyond the reference" if extra else ""))
            row.add(again.code == 0 and lost == 0 and extra == 0, lost, False, (killed, again), None, note)
        row.notes.insert(0, f"40 sessions, {len(reference)} entries")
        return row

    def sigterm_in_retry_storm(self) -> Row:
        row = Row("SIGTERM in a retry storm")
        where = self.fault_dir("sigterm")
        folder = sessions(where / "sessions", count=2)
        self.provider.fresh("500")
        env = {**self.env, "OM_BREAKER_FAILURES": "1000"}  # the breaker off: retries go on until the signal
        started = time.monotonic()
        proc = self.popen(where, ["--db", str(where / "om.duckdb"), "run", str(folder), *MODEL, "--api-base",
                                  self.server.base_url, "--concurrency", "3"], env)
        while proc.poll() is None and self.provider.calls < 4 and time.monotonic() - started < BOUND:
            time.sleep(0.05)
        helpers = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        at = self.provider.calls
        proc.send_signal(signal.SIGTERM)
        done = self.wait(proc, time.monotonic(), bound=60)
        after = self.provider.calls - at
        _, alive = psutil.wait_procs(helpers, timeout=10)
        status = [s for (s,) in self.rows(where / "om.duckdb", "SELECT status FROM runs WHERE command = 'run'")]
        last = (done.lines or [""])[-1]
        clean = done.code == 143 and last.startswith("interrupted (SIGTERM)") and status == ["interrupted"]
        note = f"exit {done.code}, last line {last[:80]!r}, row {status}, helpers alive {len(alive)}"
        before = (row.survived, row.tried)
        self.healthy_rerun(where, folder, row, (done,), after, note, hung=bool(alive))
        if not clean and row.survived > before[0]:  # survived means the interrupted row and line too
            row.survived -= 1
        return row

    def rewrites(self) -> list[Row]:
        truncated, replaced = Row("session file truncated to half"), Row("session file replaced by another session")
        where = self.fault_dir("rewrites")
        folder = sessions(where / "sessions", count=2)
        first = self.om(where, "run", str(folder), "--model", "offline")
        db = where / "om.duckdb"
        before = set(self.rows(db, "SELECT session_id, ledger_id FROM ledger"))
        s0, s1 = folder / "s0.jsonl", folder / "s1.jsonl"
        lines = s0.read_text().splitlines()
        s0.write_text("\n".join(lines[:len(lines) // 2]) + "\n")
        other = SessionBuilder("0be70000-5555-4666-8777-888888888888")
        other.user("hello")
        other.assistant("hi")
        other.write(s1)
        stat = s1.stat()
        os.utime(s1, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        ingest = self.om(where, "ingest", str(folder))
        orphaned = dict(self.rows(db, "SELECT session_id, count(*) FROM orphaned_records GROUP BY ALL"))
        again = self.om(where, "run", str(folder), "--model", "offline")
        after = set(self.rows(db, "SELECT session_id, ledger_id FROM ledger"))
        said = ingest.out + ingest.err
        for row, path, sid in ((truncated, s0, "00000000-cccc-bbbb-cccc-dddddddddddd"),
                               (replaced, s1, "00000001-cccc-bbbb-cccc-dddddddddddd")):
            mine = {r for r in before if r[0] == sid}
            lost = len(mine - after)
            reported = any(str(path) in line and "rewritten" in line for line in said.splitlines())
            recall_ok = None
            ids = self.rows(db, f"SELECT o.obs_id FROM observations o JOIN orphaned_records r USING (session_id, "
                                f"ledger_id) WHERE o.session_id = '{sid}' LIMIT 1")
            if ids:
                recalled = self.om(where, "recall", ids[0][0])
                recall_ok = "source is gone" in recalled.out + recalled.err
            ok = (first.code == 0 and ingest.code == 0 and again.code == 0 and lost == 0 and reported
                  and orphaned.get(sid, 0) > 0 and recall_ok is True)
            row.add(ok, lost, False, (first, ingest, again), None,
                    f"{len(mine)} records before, {orphaned.get(sid, 0)} marked orphaned, reported by name: {reported},"
                    f" recall says the source is gone: {recall_ok}; rerun exit {again.code}")
        return [truncated, replaced]

    def concurrent_runs(self) -> Row:
        row = Row("two om run at once")
        where = self.fault_dir("concurrent")
        folder = sessions(where / "sessions", count=2)
        env = {**self.env, "HOME": str(where / "home")}  # one fresh Prefect home for both
        (where / "home").mkdir()
        self.provider.fresh(delay=0.1)
        started = time.monotonic()
        args = ["--db", str(where / "om.duckdb"), "run", str(folder), *MODEL, "--api-base", self.server.base_url]
        procs = [self.popen(where, args, env), self.popen(where, args, env)]
        done = [self.wait(p, started) for p in procs]
        codes = sorted(d.code for d in done)
        lost, extra = self.missing(where / "om.duckdb", self.reference)
        refused = [d for d in done if d.code == 3]
        one_line = all(len(d.lines) == 1 and "another om process is writing" in d.lines[0] for d in refused)
        asked_twice = len(self.provider.script.asked_after_completion)
        row.add(codes in ([0, 0], [0, 3]) and one_line and lost == 0 and extra == 0, lost, False, tuple(done),
                asked_twice, f"exit codes {codes}; refused one's line: {(refused[0].lines if refused else [''])[0][:90]!r}")
        return row

    def export_read_only(self) -> Row:
        row = Row("om export to a read-only filesystem")
        where = self.fault_dir("export-ro")
        mount = where / "fs"
        mount.mkdir()
        if not mount_tmpfs(row, mount, "3m"):
            return row
        try:
            subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
            db = self.work / "reference" / "om.duckdb"
            for target in ("exported.jsonl", "new/dir/exported.jsonl"):
                out = mount / target
                done = self.om(where, "export", "00000000-cccc-bbbb-cccc-dddddddddddd", "--out", str(out), db=db)
                ok = done.code == 1 and done.lines == [f"error: cannot write {out}: Read-only file system"]
                row.add(ok and not out.exists(), 0, False, (done,), None, f"{target}: exit {done.code}, "
                        f"{len(done.lines)} line(s): {(done.lines or [''])[0][:90]!r}")
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)
        return row

    def eval_all_invalid(self) -> Row:
        row = Row("om eval on an all-invalid file")
        where = self.fault_dir("eval-invalid")
        data = where / "lme.json"
        data.write_text(json.dumps([{"question_id": "x"}, "not an object"]))
        self.provider.fresh()
        done = self.om(where, "eval", "longmemeval", "--data", str(data), "--model", "offline", "--reader",
                       "openai/fake-reader", "--api-base", self.server.base_url, "--out", str(where / "out"))
        ok = done.code == 1 and len(done.lines) == 1 and done.lines[0].startswith("error: none of the 2 instance(s)")
        row.add(ok and not (where / "out" / "report.json").exists(), 0, False, (done,), self.provider.calls,
                f"exit {done.code}, {len(done.lines)} line(s): {(done.lines or [''])[0][:90]!r}")
        return row

    def serve_tick_duplicate(self) -> Row:
        row = Row("serve tick meeting a copied session file")
        where = self.fault_dir("serve-duplicate")
        live = sessions(where / "live", count=1)
        settings = {_camel(k): float(v) if "." in v else int(v) for k, v in SETTINGS_ENV.items()}
        # the environment every om process gives Prefect first (no telemetry, quiet logs): flows.runner
        script = ("import json, shutil, sys\nfrom pathlib import Path\nfrom flows.runner import prepare_environment\n"
                  "prepare_environment()\nfrom flows.pipeline import maintain_sessions\n"
                  "live, db, settings = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])\n"
                  "tick = lambda: maintain_sessions(str(live), db_path=db, model={'model': 'offline'}, "
                  "settings=settings)\n"
                  "first = tick()\nshutil.copyfile(live / 's0.jsonl', live / 'copy.jsonl')\nsecond = tick()\n"
                  "print(json.dumps([first['errors'], second['errors'], [s['error'] for s in second['sessions']]]))\n")
        started = time.monotonic()
        proc = self.spawn([sys.executable, "-c", script, str(live), str(where / "om.duckdb"), json.dumps(settings)],
                          where)
        done = self.wait(proc, started)
        try:
            errors = json.loads(done.out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            errors = None
        status = self.rows(where / "om.duckdb", "SELECT status FROM runs ORDER BY started_at") if done.code == 0 else []
        ok = (done.code == 0 and errors is not None and errors[:2] == [[], []] and all(e is None for e in errors[2])
              and all(s == "ok" for (s,) in status))
        row.add(ok, 0, False, (done,), None, f"exit {done.code}, errors {errors}, run rows {[s for (s,) in status]}")
        return row


def _camel(variable: str) -> str:
    head, *rest = variable.removeprefix("OM_").lower().split("_")
    return head + "".join(w.capitalize() for w in rest)


FAULTS = ["provider", "full-disk", "kill-run", "kill-ingest", "sigterm", "rewrites", "concurrent", "export",
          "eval", "serve"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=FAULTS, default=FAULTS)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    parser.add_argument("--work", type=Path, help="a folder to work in (kept); default a temporary one (removed)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="om-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    provider = Provider()
    rows: list[Row] = []
    started = time.monotonic()
    with FakeOpenAI(responder=provider) as server:
        bench = Bench(work, server, provider)
        try:
            bench.make_reference()
            steps = {"provider": lambda: [bench.provider_down(m) for m in ("500", "429", "hang")],
                     "full-disk": lambda: [bench.full_disk()], "kill-run": lambda: [bench.kill_run()],
                     "kill-ingest": lambda: [bench.kill_ingest()], "sigterm": lambda: [bench.sigterm_in_retry_storm()],
                     "rewrites": bench.rewrites, "concurrent": lambda: [bench.concurrent_runs()],
                     "export": lambda: [bench.export_read_only()], "eval": lambda: [bench.eval_all_invalid()],
                     "serve": lambda: [bench.serve_tick_duplicate()]}
            for name in args.only:
                t = time.monotonic()
                for row in steps[name]():
                    rows.append(row)
                    print(f"{row.fault}: {row.survived}/{row.tried} survived ({time.monotonic() - t:.0f} s); "
                          + " | ".join(row.notes), flush=True)
        finally:
            bench.cleanup()
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
    print(f"\n{len(rows)} faults in {time.monotonic() - started:.0f} s (wall)\n")
    print("| fault | tried | survived | lost | hung | traceback | model calls after the fault |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        calls = "–" if not r.calls else (str(r.calls[0]) if len(r.calls) == 1 else f"{min(r.calls)}–{max(r.calls)} "
                                         f"({', '.join(map(str, r.calls))})")
        print(f"| {r.fault} | {r.tried} | {r.survived} | {r.lost} | {r.hung} | {r.traceback} | {calls} |")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
