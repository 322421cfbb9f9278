#!/usr/bin/env python3
"""How long a live Pi waits for om at compaction: the time from Pi's ``session_before_compact`` to the
om extension's answer (what the extension reports in its line "compacted from memory … in N ms"),
with the live endpoint and with the om command (one process per compaction), on the two real sample
sessions; then several live sessions compacting at once against one endpoint.

What it does:
1. Memory for each sample (../shared/sessions): ingest, replay with the offline baseline and drain
   (once; kept in --work), then `om export` it, so each live copy carries its memory in the file the
   way the TypeScript extension writes it.
2. Pi 1.6.0 (RPC mode, the fake model as provider, the om extension) on a copy of each export, its
   memory already ingested as `om serve` would have: --repeat times a new turn (about 3,000 tokens)
   then a compaction, first with `om live endpoint` running, then without it (the om command
   answers). Pi's keepRecentTokens is 2,000 here so that each turn can be compacted again (Pi 1.6
   looks for its cut only after the latest compaction).
3. --sessions copies of the larger sample, each one new line behind, compacted at once through the
   endpoint (each request ingests its new line first), and the same with as many om commands at once.

Needs Pi and node in .ci/pi/node_modules (`cd .ci/pi && npm install --no-audit --no-fund`).

Usage (from the repository root):

    .venv/bin/python bench/live_compaction.py
    .venv/bin/python bench/live_compaction.py --repeat 5 --sessions 1,2,4,8 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network here

from fake_openai import FakeOpenAI, Reply  # noqa: E402
from pi_rpc import RpcPi, agent_dir, missing, os_env  # noqa: E402

from flows.endpoint import ask, running_endpoint  # noqa: E402
from om_core.catalog import cut_point  # noqa: E402
from om_core.export import export_session  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.workspace import Workspace  # noqa: E402

SAMPLES = REPO.parent / "shared" / "sessions"
BIN = Path(sys.executable).parent
KEEP_RECENT = 2000
MS = re.compile(r"in (\d+) ms, from (the endpoint|the om command)")


def exported(work: Path, name: str) -> Path:
    """The sample with its memory in the file (cached in ``work``)."""
    out = work / "exported" / name
    if out.exists():
        return out
    from om_core.replay.engine import replay_session
    from om_core.workers.stages import ModelConfig, make_brain

    out.parent.mkdir(parents=True, exist_ok=True)
    ws = Workspace.open(work / "memory.duckdb", settings=Settings())
    report = ingest(ws, [SAMPLES / name])
    sid = report.files[0].session_id
    print(f"replaying {name} with the offline baseline (once; minutes)...", file=sys.stderr)
    replay_session(ws, sid, make_brain(ModelConfig(model="offline"), ws.settings), drain=True)
    export_session(ws, sid, out)
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    header["cwd"] = str(work)  # Pi in RPC mode refuses a session whose directory does not exist
    out.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    return out


def live_copy(source: Path, dest: Path, session_id: str | None = None) -> Path:
    lines = source.read_text().splitlines()
    if session_id:
        header = json.loads(lines[0])
        header["id"] = session_id
        lines[0] = json.dumps(header)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def summary(values: list[float]) -> dict:
    return {"n": len(values), "median_ms": round(statistics.median(values)), "min_ms": round(min(values)),
            "max_ms": round(max(values))} if values else {"n": 0}


ANSWERED = re.compile(r"^compact \S+ at \S+: .* \((\d+) ms\)$")


class Endpoint:
    def __init__(self, db: Path, cwd: Path, env: dict[str, str]) -> None:
        self.log = cwd / "endpoint.log"
        self.process = subprocess.Popen([str(BIN / "om"), "--db", str(db), "live", "endpoint", "--sessions", str(cwd)],
                                        cwd=cwd, env=env,
                                        stderr=self.log.open("w"))
        deadline = time.monotonic() + 60
        while running_endpoint(db) is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the endpoint did not start")
            time.sleep(0.1)

    def answered_ms(self) -> list[float]:
        """The endpoint's own time for each compaction it answered so far (its log lines)."""
        return [float(m.group(1)) for m in map(ANSWERED.match, self.log.read_text().splitlines()) if m]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(30)


def pi_compactions(work: Path, db: Path, files: list[Path], repeat: int) -> dict:
    """Each file in its own Pi: ``repeat`` times a turn and a compaction, with the endpoint, then without."""
    server = FakeOpenAI(default=Reply(text="Noted; continuing with the refactor of the selectors. " * 100))
    server.start()
    home = work / "home"
    # Pi 1.6 looks for its cut only after the latest compaction: with a budget of 2,000 tokens, each new
    # turn of about 3,000 gives it something to summarize again
    agent_dir(home, server.base_url, {"compaction": {"keepRecentTokens": KEEP_RECENT}, "om": {"timeoutMs": 60000}})
    env = os_env(PATH=f"{BIN}:{os.environ['PATH']}", OM_DB=str(db))
    results: dict = {}
    try:
        for via in ("the endpoint", "the om command"):
            endpoint = Endpoint(db, work, env) if via == "the endpoint" else None
            try:
                for path in files:
                    pi = RpcPi(home, work, env, session_file=path)
                    try:
                        pi.wait_for(lambda r: r.get("method") == "notify", timeout=120)  # om's line at start
                        times = []
                        for n in range(repeat):
                            pi.prompt(f"Next step {n}: keep going with the refactor of the selectors. " * 100)
                            since = pi.mark()
                            response = pi.call({"type": "compact"}, timeout=300)
                            lines = pi.notes(since)
                            found = [MS.search(line) for line in lines]
                            if not response.get("success") or not found or not found[-1]:
                                raise SystemExit(f"{path.name}: no om compaction: {response.get('error')} {lines}")
                            assert found[-1].group(2) == via, lines
                            times.append(float(found[-1].group(1)))
                        results.setdefault(via, {})[path.name] = summary(times)
                        if endpoint is not None:  # om's own share of Pi's wait
                            results.setdefault("the endpoint's own time", {})[path.name] = summary(
                                endpoint.answered_ms()[-repeat:])
                    finally:
                        pi.close()
            finally:
                if endpoint is not None:
                    endpoint.stop()
    finally:
        server.stop()
    return results


def at_once(work: Path, source: Path, counts: list[int]) -> dict:
    """``k`` copies of ``source``, each one new line behind, compacted at the same moment."""
    results: dict = {"the endpoint": {}, "the om command": {}}
    for k in counts:
        for via in results:
            db = work / f"at-once-{via.split()[-1]}-{k}.duckdb"
            for stale in (db, Path(f"{db}.wal")):
                stale.unlink(missing_ok=True)
            folder = work / f"at-once-{k}"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            files = [live_copy(source, folder / f"s{i}.jsonl", f"{i:08x}-0000-4000-8000-000000000000") for i in range(k)]
            lines = [f.read_text().splitlines() for f in files]
            for f, text in zip(files, lines):
                f.write_text("\n".join(text[:-1]) + "\n")  # the last line arrives just before the compaction
            ws = Workspace.open(db, settings=Settings())
            ingest(ws, files)
            cut = cut_point(ws, str(files[0]), json.loads(lines[0][-1])["parentId"])
            for f, text in zip(files, lines):
                with f.open("a") as handle:
                    handle.write(text[-1] + "\n")
            leaf = json.loads(lines[0][-1])["id"]
            payload = {"leaf": leaf, "first_kept_entry_id": cut.firstKeptEntryId, "tokens_before": cut.tokensBefore}
            env = os_env()
            endpoint = Endpoint(db, work, env) if via == "the endpoint" else None
            times: list[float] = []

            def one(path: Path) -> None:
                started = time.perf_counter()
                if endpoint is not None:
                    ask(running_endpoint(db), "compact", {"session_file": str(path), **payload}, timeout=300)
                else:
                    subprocess.run([str(BIN / "om"), "--db", str(db), "live", "compact", str(path), "--leaf", leaf,
                                    "--first-kept", cut.firstKeptEntryId, "--wait", "120", "--json"],
                                   check=True, capture_output=True, env=env, timeout=300)
                times.append((time.perf_counter() - started) * 1000)

            threads = [threading.Thread(target=one, args=(f,)) for f in files]
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                if endpoint is not None:
                    endpoint.stop()
            results[via][str(k)] = summary(times)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "live")
    parser.add_argument("--repeat", type=int, default=3, help="compactions per sample and path")
    parser.add_argument("--sessions", default="1,2,4", help="sessions compacting at once (comma-separated)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    why = missing()
    if why:
        raise SystemExit(why)
    if not SAMPLES.is_dir():
        raise SystemExit(f"the sample sessions are not in {SAMPLES}")
    args.work.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in SAMPLES.glob("*.jsonl"))
    sources = [exported(args.work, name) for name in names]
    live_db = args.work / "live.duckdb"
    for stale in (live_db, Path(f"{live_db}.wal")):
        stale.unlink(missing_ok=True)
    files = [live_copy(s, args.work / f"live-{s.name}") for s in sources]
    ingest(Workspace.open(live_db, settings=Settings()), files)  # what `om serve` keeps up to date
    report = {"pi_compactions": pi_compactions(args.work, live_db, files, args.repeat),
              "at_once": at_once(args.work, max(sources, key=lambda p: p.stat().st_size),
                                 [int(k) for k in args.sessions.split(",")]),
              "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print("time from Pi's session_before_compact to the extension's answer (ms), per sample:")
    for via, per in report["pi_compactions"].items():
        for name, s in per.items():
            print(f"  {via:15} {name:26} median {s['median_ms']:6}  min {s['min_ms']:6}  max {s['max_ms']:6}  (n={s['n']})")
    print("sessions compacting at once (each request's wall time, ms):")
    for via, per in report["at_once"].items():
        for k, s in per.items():
            print(f"  {via:15} {k:>2} at once: median {s['median_ms']:6}  max {s['max_ms']:6}")
    print(f"(load average {report['load_average'][0]:.1f} on {report['cpus']} CPUs)")


if __name__ == "__main__":
    main()
