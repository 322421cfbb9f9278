#!/usr/bin/env python3
"""How long a live Pi waits for om at compaction and recall, against the TypeScript extension's own
time for the same answers, and how answers for several sessions at once share the endpoint.

What it does:
1. Memory for each sample (../shared/sessions): ingest, replay with the offline baseline and drain
   (once; kept in --work), then `om export` it, so each live copy carries its memory in the file the
   way the TypeScript extension writes it.
2. Pi 1.6.0 (RPC mode, the fake model as provider, the om extension) on a copy of each export, its
   memory already ingested as `om serve` would have: --repeat times a new turn (about 3,000 tokens)
   then a compaction, first with `om live endpoint` running, then without it (the om command
   answers). Pi's keepRecentTokens is 2,000 here so that each turn can be compacted again (Pi 1.6
   looks for its cut only after the latest compaction); before each compaction the offline observer
   covers the new turn (as `om serve` would), so om moves F back to nothing and answers. (--no-pi leaves this out.)
3. A warm endpoint's answers, each after one new line of the file (as in Pi: the turn, or the tool
   call, was just written): compactions at Pi's cut for the last --repeat message entries, and recalls
   of --recalls memory ids; the time the client waits, the endpoint's own time (its log) and its CPU.
   With --extension CHECKOUT (pi-observational-memory's source, which npm does not serve here),
   the extension's own code on the same file (bench/conformance/extension_answers.mjs, node 22 with Pi's
   modules): its fold and summary at the same cuts, its recall of the same ids, and whether the
   texts are equal. (--no-warm leaves this out.)
4. --sessions copies of the larger sample, each one new line behind, compacted at once through the
   endpoint (each request ingests its new line first), and the same with as many om commands at
   once: each request's wall time, the slowest against one alone, and the CPU it took.

Needs Pi and node in .ci/pi/node_modules (`cd .ci/pi && npm install --no-audit --no-fund`).
Timings on a loaded machine are noisy: run it a few times; CPU figures and ratios side by side hold up.

Usage (from the repository root):

    .venv/bin/python bench/perf/live_compaction.py
    .venv/bin/python bench/perf/live_compaction.py --repeat 5 --sessions 1,2,4,8 --extension /tmp/pi-om --json
"""

from __future__ import annotations

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from fake_openai import FakeOpenAI, Reply  # noqa: E402
from pi_rpc import RpcPi, agent_dir, missing, os_env  # noqa: E402

from flows.endpoint import ask, running_endpoint  # noqa: E402
from om_core.store.catalog import cut_point  # noqa: E402
from om_core.usecases.export import export_session  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

SAMPLES = harness.SHARED_SESSIONS
BIN = Path(sys.executable).parent
KEEP_RECENT = 2000
MS = re.compile(r"in (\d+) ms, from (the endpoint|the om command)")


def exported(work: Path, name: str, samples: Path = SAMPLES) -> Path:
    """The sample with its memory in the file (cached in ``work``)."""
    out = work / "exported" / name
    if out.exists():
        return out
    from om_core.replay.engine import replay_session
    from om_core.workers.run_config import ModelConfig, make_brain

    out.parent.mkdir(parents=True, exist_ok=True)
    ws = Workspace.open(work / "memory.duckdb", settings=Settings())
    report = ingest(ws, [samples / name])
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


def _ms(value: float) -> float:
    return round(value, 2) if value < 10 else round(value)


def summary(values: list[float]) -> dict:
    return {"n": len(values), "median_ms": _ms(statistics.median(values)), "min_ms": _ms(min(values)),
            "max_ms": _ms(max(values))} if values else {"n": 0}


ANSWERED = re.compile(r"^compact \S+ at \S+: .* \((\d+) ms\)$")
RECALLED = re.compile(r"^recall \S+: \S+ \((\d+) ms\)$")


def cpu_ms(pid: int) -> float:
    """user + sys CPU of a process (and its reaped children) so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) * 1000 / os.sysconf("SC_CLK_TCK")


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

    def answered_ms(self, op: str = "compact") -> list[float]:
        """The endpoint's own time for each answer of ``op`` so far (its log lines)."""
        pattern = ANSWERED if op == "compact" else RECALLED
        return [float(m.group(1)) for m in map(pattern.match, self.log.read_text().splitlines()) if m]

    def cpu_ms(self) -> float:
        """The endpoint process's CPU so far (user + sys)."""
        return cpu_ms(self.process.pid)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(30)


def observed(db: Path, path: Path) -> None:
    """The offline observer over what the file holds, as `om serve` keeps it: without it the new turn is
    unobserved, F moves back to its start and om declines (keeping it would free nothing)."""
    from om_core.replay.stage_runner import observe_now
    from om_core.workers.run_config import ModelConfig

    ws = Workspace.open(db, settings=Settings(observerChunkMaxTokens=100_000))
    ingest(ws, [path])
    while observe_now(ws, str(path), None, ModelConfig(model="offline")).outcome == "recorded":
        pass  # until nothing is left uncovered


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
                            # each sentence its own (the offline observer records nothing for a repeated input)
                            tag = f"{via.split()[-1]}{files.index(path)}n{n}"
                            pi.prompt("".join(f"Step {tag}.{i}: the selectors of region {tag}x{i} move to table "
                                              f"sel_{tag}_{i}. " for i in range(100)))
                            observed(db, path)  # as `om serve` would: the turn is memory before Pi compacts
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


def extension_answers(extension: Path, file: Path, ids: list[str], cuts: list[str], pool: int, repeat: int) -> dict:
    """The extension's own answers and times on ``file`` (bench/conformance/extension_answers.mjs)."""
    from pi_rpc import NODE, PI_HOME

    request = file.with_suffix(".request.json")
    request.write_text(json.dumps({"file": str(file), "leaf": None, "ids": ids, "cuts": cuts, "poolMaxTokens": pool,
                                   "repeat": repeat}))
    done = subprocess.run([str(NODE), str(harness.BENCH / "conformance" / "extension_answers.mjs"), str(PI_HOME), str(extension),
                           str(request)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the extension's own answers failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def warm_answers(work: Path, source: Path, repeat: int, recalls: int, extension: Path | None) -> dict:
    """A warm endpoint answering compactions and recalls on ``source``, each after one new line of the
    file, against the extension's own code on the same file (when ``extension`` is given)."""
    folder = work / "warm" / source.stem
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    lines = source.read_text().splitlines()
    scratch = Workspace.open(folder / "scratch.duckdb", settings=Settings())
    full = live_copy(source, folder / "full.jsonl")
    ingest(scratch, [full])
    leaves = [e for e in map(json.loads, lines[1:]) if e.get("type") == "message"][-repeat:]
    cuts = {e["id"]: cut_point(scratch, str(full), e["id"]) for e in leaves}
    with scratch.read() as con:
        ids = [row[0] for row in con.execute(
            "SELECT id FROM (SELECT obs_id AS id, 0 AS k FROM om_internal.observations UNION ALL "
            "SELECT refl_id, 1 FROM om_internal.reflections) GROUP BY id ORDER BY min(k), id").fetchall()]
    ids = ids[:recalls // 2] + ids[-(recalls - recalls // 2):] if len(ids) > recalls else ids  # both kinds
    live = folder / "live.jsonl"
    cut_at = next(i for i, line in enumerate(lines) if line and json.loads(line).get("id") == leaves[0]["id"])
    tail = lines[cut_at:]  # the lines the endpoint sees arrive, one before each answer
    live.write_text("\n".join(lines[:cut_at]) + "\n")
    db = folder / "live.duckdb"
    ingest(Workspace.open(db, settings=Settings()), [live])
    endpoint = Endpoint(db, folder, os_env())
    client: dict[str, list[float]] = {"compact": [], "recall": []}
    texts: dict[str, str] = {}
    try:
        announcement = running_endpoint(db)
        cpu0 = endpoint.cpu_ms()
        for line in tail:  # compactions: at each leaf once its line is in the file
            with live.open("a") as handle:
                handle.write(line + "\n")
            entry = json.loads(line)
            if entry.get("id") not in cuts:
                continue
            cut = cuts[entry["id"]]
            started = time.perf_counter()
            ask(announcement, "compact", {"session_file": str(live), "leaf": entry["id"],
                                          "first_kept_entry_id": cut.firstKeptEntryId, "tokens_before": cut.tokensBefore})
            client["compact"].append((time.perf_counter() - started) * 1000)
        cpu1 = endpoint.cpu_ms()
        for memory_id in ids:  # recalls: each after one more line (the tool call's own entry)
            with live.open("a") as handle:
                handle.write(json.dumps({"type": "custom", "id": os.urandom(4).hex(), "parentId": json.loads(
                    live.read_text().splitlines()[-1]).get("id"), "timestamp": "2026-01-01T00:00:00.000Z",
                    "customType": "bench.turn", "data": {}}) + "\n")
            started = time.perf_counter()
            texts[memory_id] = ask(announcement, "recall", {"session_file": str(live), "id": memory_id})["content"][0]["text"]
            client["recall"].append((time.perf_counter() - started) * 1000)
        cpu2 = endpoint.cpu_ms()
        own = {op: endpoint.answered_ms(op) for op in client}
    finally:
        endpoint.stop()
    result = {"entries": len(lines) - 1, "compact": {"client": summary(client["compact"]), "endpoint": summary(own["compact"]),
                                                     "cpu_ms_each": round((cpu1 - cpu0) / max(1, len(client["compact"])))},
              "recall": {"client": summary(client["recall"]), "endpoint": summary(own["recall"]),
                         "cpu_ms_each": round((cpu2 - cpu1) / max(1, len(client["recall"])))}}
    if extension is not None:
        theirs = extension_answers(extension, full, ids, [c.firstKeptEntryId for c in cuts.values()],
                                   scratch.settings.observationsPoolMaxTokens, 5)
        # its first call of each answer (as a Pi session makes one compaction at a time), and warm (the
        # fastest of 5: the JIT has compiled its code)
        for op, key in (("compact", "compaction"), ("recall", "recall")):
            result[op]["extension"] = summary([v["ms"][0] for v in theirs[key].values()])
            result[op]["extension_warm"] = summary([min(v["ms"]) for v in theirs[key].values()])
        result["recall"]["texts_equal"] = sum(texts[i] == theirs["recall"][i]["text"] for i in ids)
        result["recall"]["texts"] = len(ids)
        for op in ("compact", "recall"):
            ext = result[op]["extension"]["median_ms"] or 1
            result[op]["ratio_endpoint_to_extension"] = round(result[op]["endpoint"]["median_ms"] / ext, 1)
    return result


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
            endpoint = Endpoint(db, folder, env) if via == "the endpoint" else None
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
            cpu0 = endpoint.cpu_ms() if endpoint is not None else _children_cpu_ms()
            try:
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                cpu = (endpoint.cpu_ms() if endpoint is not None else _children_cpu_ms()) - cpu0
            finally:
                if endpoint is not None:
                    endpoint.stop()
            results[via][str(k)] = {**summary(times), "cpu_ms": round(cpu)}
    for via in results:  # the slowest of k at once against one alone
        one_alone = results[via].get("1", {}).get("max_ms")
        for k, r in results[via].items():
            if one_alone:
                r["slowest_vs_one"] = round(r["max_ms"] / one_alone, 1)
    return results


def _children_cpu_ms() -> float:
    """The CPU of this process's finished children (the om commands) so far."""
    t = os.times()
    return (t.children_user + t.children_system) * 1000


def main() -> None:
    parser = harness.parser(__doc__, smoke="one example session, one compaction and one recall, one session at once")
    parser.add_argument("--work", type=Path, default=harness.BENCH / "out" / "live")
    parser.add_argument("--repeat", type=int, default=3, help="compactions per sample and path")
    parser.add_argument("--recalls", type=int, default=10, help="recalls per sample (step 3)")
    parser.add_argument("--sessions", default="1,2,4,8", help="sessions compacting at once (comma-separated)")
    parser.add_argument("--extension", type=Path, help="a checkout of pi-observational-memory: its own times")
    parser.add_argument("--no-pi", action="store_true", help="leave out step 2 (the real Pi's compactions)")
    parser.add_argument("--no-warm", action="store_true", help="leave out step 3 (a warm endpoint's answers)")
    args = parser.parse_args()
    samples = SAMPLES
    if args.smoke:
        samples = args.work / "samples"
        samples.mkdir(parents=True, exist_ok=True)
        shutil.copy(harness.EXAMPLES / "harbor-sync-long.jsonl", samples)  # enough past its compaction for a cut
        args.repeat, args.recalls, args.sessions = 1, 1, "1"
    why = missing()
    if why:
        raise SystemExit(why)
    if not samples.is_dir():
        raise SystemExit(f"the sample sessions are not in {samples}")
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("XDG_STATE_HOME", str(args.work / "state"))  # the endpoints' announcements: the bench's own
    names = sorted(p.name for p in samples.glob("*.jsonl"))
    sources = [exported(args.work, name, samples) for name in names]
    report: dict = {}
    if not args.no_pi:
        live_db = args.work / "live.duckdb"
        for stale in (live_db, Path(f"{live_db}.wal")):
            stale.unlink(missing_ok=True)
        files = [live_copy(s, args.work / f"live-{s.name}") for s in sources]
        ingest(Workspace.open(live_db, settings=Settings()), files)  # what `om serve` keeps up to date
        report["pi_compactions"] = pi_compactions(args.work, live_db, files, args.repeat)
    if not args.no_warm:
        report["warm"] = {s.name: warm_answers(args.work, s, args.repeat, args.recalls, args.extension)
                          for s in sources}
    report["at_once"] = at_once(args.work, max(sources, key=lambda p: p.stat().st_size),
                                [int(k) for k in args.sessions.split(",")])
    report.update(cpus=os.cpu_count(), load_average=os.getloadavg())
    if args.json:
        print(json.dumps(report, indent=2))
        return
    if "pi_compactions" in report:
        print("time from Pi's session_before_compact to the extension's answer (ms), per sample:")
        for via, per in report["pi_compactions"].items():
            for name, s in per.items():
                print(f"  {via:24} {name:26} median {s['median_ms']:6}  min {s['min_ms']:6}  max {s['max_ms']:6}  (n={s['n']})")
    if "warm" in report:
        print("a warm endpoint, one new line before each answer (ms; median, min-max):")
    for name, w in report.get("warm", {}).items():
        for op in ("compact", "recall"):
            r = w[op]
            line = (f"  {name:26} {op:7} client {r['client']['median_ms']:5} ({r['client']['min_ms']}-{r['client']['max_ms']})"
                    f"  endpoint {r['endpoint']['median_ms']:5}  cpu {r['cpu_ms_each']:4} each")
            if "extension" in r:
                line += (f"  extension first {r['extension']['median_ms']} ({r['extension']['min_ms']}-"
                         f"{r['extension']['max_ms']}), warm {r['extension_warm']['median_ms']}"
                         f"  endpoint/extension {r['ratio_endpoint_to_extension']}")
            if "texts_equal" in r:
                line += f"  texts equal {r['texts_equal']}/{r['texts']}"
            print(line)
    print("sessions compacting at once (each request's wall time, ms; CPU of the answering processes):")
    for via, per in report["at_once"].items():
        for k, s in per.items():
            print(f"  {via:15} {k:>2} at once: median {s['median_ms']:6}  max {s['max_ms']:6}  "
                  f"slowest/one {s.get('slowest_vs_one', 1.0):4}  cpu {s['cpu_ms']:6}")
    print(f"(load average {report['load_average'][0]:.1f} on {report['cpus']} CPUs)")


if __name__ == "__main__":
    main()
