#!/usr/bin/env python3
"""Sessions written by the real Pi 1.6.0, and om against what Pi and the extension computed on them.

1. Pi 1.6.0 in RPC mode with the fake model (tests/fake_openai.py) as its provider holds several
   conversations of several turns in --out/sessions: tool calls, usage that grows, an error where
   no usage is usable (the first turn of one), compactions, a model change, and tool loadout changes
   (a new system message entry, from the probe extension bench/conformance/pi16_probe.ts). With --extension (a
   checkout of elpapi42/pi-observational-memory) the TypeScript extension runs in Pi too, the fake
   model answering its observer, reflector and dropper, so the files hold its records.
2. The probe noted, live at every agent_start and turn_end, Pi's getContextUsage and (--extension)
   the clocks the extension decides with: observer and reflector (usage, or the source-token
   fallback, and which), dropper and proactive compaction (source tokens). om's clocks (`om
   status`'s, memory.clocks) at the same entry of the file against them: "N of M live context /
   usage-clock / source-token clock values differ". The source-token clocks differ by design where a
   system prompt message lies in their range (SPEC §1).
3. Pi's own prepareCompaction (bench/conformance/pi16_cut_points.mjs) at every entry of every file for a grid of
   keepRecentTokens, against om's cut point and tokensBefore: "N of M cut points differ".

Needs Pi and node in .ci/pi/node_modules (`cd .ci/pi && npm install --no-audit --no-fund`).

    .venv/bin/python bench/conformance/pi16_sessions.py --out /tmp/pi16 --extension /path/to/pi-observational-memory
    # then the replay's own measurements on the same files:
    .venv/bin/python bench/conformance/usage_clocks_vs_extension.py --out /tmp/pi16/uc --sessions /tmp/pi16/sessions/*.jsonl
    .ci/pi/node_modules/node/bin/node bench/conformance/usage_clocks_vs_extension.mjs .ci/pi /path/to/pi-observational-memory /tmp/pi16/uc
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from fake_openai import FakeOpenAI, Reply, http_error, text, tool_call  # noqa: E402
from pi_rpc import NODE, RpcPi, agent_dir, missing, os_env  # noqa: E402

from om_core.pi.branch_entry import message_tokens  # noqa: E402
from om_core.store.catalog import branch_for_cut_point  # noqa: E402
from om_core.pi.cutpoint import NothingToCompact, compaction_cut_point  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.memory.views import clocks  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

PROBE = harness.BENCH / "conformance" / "pi16_probe.ts"
KEEP_RECENT = (100, 400, 1000, 2000, 3000, 5000, 20000)


def words(i: int, n: int) -> str:
    return f"Turn {i}: " + " ".join(f"detail{i}-{k} about the ledger service" for k in range(n))


class Model:
    """The fake model: the conversation's scripted replies in order; the extension's workers answered
    by their tools (an observation citing the chunk's first entries, a reflection citing two)."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.lock = threading.Lock()

    def add(self, *replies: Reply) -> None:
        with self.lock:
            self.script.extend(replies)

    def __call__(self, body: dict) -> Reply:
        tools = {t["function"]["name"] for t in body.get("tools") or []}
        messages = body.get("messages") or []
        if tools & {"record_observations", "record_reflections", "drop_observations"}:
            if messages and messages[-1].get("role") == "tool":
                return text("done")
            sent = json.dumps(messages)
            if "record_observations" in tools:
                ids = re.findall(r"Source entry id: ([0-9a-f]{8})", sent)[:3]
                return tool_call("record_observations", {"observations": [
                    {"timestamp": "2026-12-01 10:00", "content": f"The user works on the ledger ({k}, {i})",
                     "relevance": "high", "sourceEntryIds": [i]} for k, i in enumerate(ids)]})
            if "record_reflections" in tools:
                ids = re.findall(r"\[([0-9a-f]{12})\] \d{4}-", sent)[:2]
                return tool_call("record_reflections", {"reflections": [
                    {"content": "The ledger service is the project.", "supportingObservationIds": ids}]})
            return text("nothing to drop")
        with self.lock:
            if self.script:
                return self.script.pop(0)
        return text("Summary: the user builds a ledger service; notes.md was read.")  # Pi's summarizer


# name, turns, and per turn: a tool-calling turn, an error reply, a compaction or a model change before
# it, a marker for the probe's loadout change
CONVERSATIONS = [
    ("plain", 5, {}),
    ("tools", 6, {"tools": {0, 2, 4}}),
    ("first-turn-error", 5, {"tools": {2, 4}, "error": {0}}),
    ("loadout", 7, {"tools": {0, 2, 6}, "marks": {2: "[drop-edit] ", 4: "[add-edit] "}, "error": {4}}),
    ("loadout-before-usage", 4, {"tools": {2}, "marks": {1: "[drop-edit] "}, "error": {0, 1}}),
    ("compaction", 7, {"tools": {0, 2, 4, 6}, "compact": {4}}),
    ("model-change", 6, {"tools": {0, 2, 4}, "model": {3}}),
    ("compactions-and-model-change", 9, {"tools": {0, 2, 4, 6, 8}, "compact": {3, 6}, "model": {5}}),
]


def converse(args, model: Model, home: Path, project: Path, extensions: list[Path], env: dict) -> list[str]:
    files = []
    for name, turns, plan in CONVERSATIONS:
        pi = RpcPi(home, project, env, session_dir=args.out / "sessions", extensions=extensions)
        try:
            for i in range(turns):
                if i in plan.get("compact", ()):
                    time.sleep(args.settle)  # the extension's workers run in the background
                    pi.call({"type": "compact"}, timeout=180)
                if i in plan.get("model", ()):
                    pi.call({"type": "set_model", "provider": "fake", "modelId": "fake-model-2"})
                if i in plan.get("error", ()):
                    model.add(http_error(400, "the request was refused"))
                elif i in plan.get("tools", ()):
                    model.add(tool_call("bash", {"command": f"echo step {i}; seq 1 {20 * (i + 1)}"}),
                              tool_call("read", {"path": "notes.md"}), text(words(i, 20)))
                else:
                    model.add(text(words(i, 60)))
                pi.prompt(plan.get("marks", {}).get(i, "") + words(i, 30 + 10 * i))
                time.sleep(args.settle)
            files.append(pi.call({"type": "get_state"})["data"]["sessionFile"])
        finally:
            pi.close()
        print(f"{name}: {files[-1]}", flush=True)
    return files


def compare_live(out: Path, ws: Workspace) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """om's clocks at each entry the probe noted against Pi's context and the extension's clocks, counted
    as context values, usage-clock values (observer and reflector where either side measures on usage:
    the basis must agree too) and source-token values (their fallbacks, the dropper and compaction).
    A source-token value that differs by exactly the system prompt messages in the clock's range
    counts as "system" (SPEC §1: om does not count them)."""
    compared: dict[str, int] = {}
    differ: dict[str, int] = {}
    lines = []
    with ws.read() as con:
        for line in (out / "probe.jsonl").read_text().splitlines():
            probe = json.loads(line)
            om = clocks(con, probe["session"], probe["leaf"], ws.settings)
            branch = branch_for_cut_point(con, probe["session"], probe["leaf"])
            pairs = [("context", "context", probe["context"], om["observer"].context_tokens)]
            for name in ("observer", "reflector", "dropper", "compaction"):
                if name not in probe:
                    continue
                theirs, ours = probe[name], om[name].tokens
                if name in ("observer", "reflector"):
                    theirs, ours = (theirs, probe[f"{name}_basis"]), (ours, om[name].basis)
                    if "usage" in (theirs[1], ours[1]):
                        pairs.append(("usage", name, theirs, ours))
                        continue
                    theirs, ours = theirs[0], ours[0]
                system = sum(message_tokens(e.context_messages()[0]) for e in branch[om[name].from_position:]
                             if e.entry_type == "message" and e.role == "system")
                pairs.append(("system" if theirs != ours and theirs == ours + system else "source", name, theirs, ours))
            for kind, name, theirs, ours in pairs:
                compared[kind] = compared.get(kind, 0) + 1
                if theirs != ours:
                    differ[kind] = differ.get(kind, 0) + 1
                if theirs != ours and kind != "system":
                    lines.append(f"{probe['event']} {probe['session']} {probe['leaf']} {name}: om {ours}, "
                                 f"Pi/extension {theirs}")
    return compared, differ, lines


def compare_cut_points(out: Path, ws: Workspace, node: Path) -> tuple[int, int, list[str]]:
    """Pi's prepareCompaction at every entry against om's cut point there."""
    theirs = out / "pi_cut_points.json"
    subprocess.run([str(node), str(harness.BENCH / "conformance" / "pi16_cut_points.mjs"), str(harness.REPO / ".ci" / "pi"),
                    str(out / "sessions"), str(theirs), ",".join(map(str, KEEP_RECENT))], check=True)
    rows = json.loads(theirs.read_text())
    differ, lines, branches = 0, [], {}
    with ws.read() as con:
        for row in rows:
            key = (row["session"], row["tip"])
            if key not in branches:
                branches[key] = branch_for_cut_point(con, *key)
            try:
                cut = compaction_cut_point(branches[key], row["keep"])
                ours = (cut.firstKeptEntryId, cut.tokensBefore)
            except NothingToCompact:
                ours = (None, None)
            if ours != (row["firstKept"], row["tokensBefore"]):
                differ += 1
                lines.append(f"{row['session']} {row['tip']} keepRecentTokens {row['keep']}: om {ours}, "
                             f"Pi {(row['firstKept'], row['tokensBefore'])}")
    return len(rows), differ, lines


def generate(args: argparse.Namespace) -> list[Path]:
    shutil.rmtree(args.out, ignore_errors=True)
    project = args.out / "project"
    project.mkdir(parents=True)
    (project / "notes.md").write_text("\n".join(f"line {k}: the ledger keeps entries" for k in range(80)))
    model = Model()
    extensions = [PROBE] + ([args.extension / "src" / "index.ts"] if args.extension else [])
    env = os_env(PROBE_OUT=str(args.out / "probe.jsonl"),
                 **({"PROBE_EXTENSION": str(args.extension)} if args.extension else {}))
    with FakeOpenAI(responder=model) as server:
        agent_dir(args.out / "home", server.base_url, {
            "compaction": {"keepRecentTokens": 400},
            "observational-memory": {"observeAfterTokens": 800, "reflectAfterTokens": 2500,
                                     "showWorkerNotifications": False}}, models=("fake-model", "fake-model-2"))
        return [Path(f) for f in converse(args, model, args.out / "home", project, extensions, env)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a directory (replaced unless --again)")
    parser.add_argument("--extension", type=Path, help="a checkout of elpapi42/pi-observational-memory")
    parser.add_argument("--settle", type=float, default=1.5, help="seconds for the extension's workers after a turn")
    parser.add_argument("--again", action="store_true", help="compare the sessions already in --out again")
    args = parser.parse_args()
    if (why := missing()) is not None:
        sys.exit(f"error: {why}")
    if args.again:
        files = sorted((args.out / "sessions").glob("*.jsonl"))
    else:
        files = generate(args)
    (args.out / "om.duckdb").unlink(missing_ok=True)
    ws = Workspace.open(args.out / "om.duckdb", settings=Settings())
    ingest(ws, files)
    compared, differ, lines = compare_live(args.out, ws)
    print(f"{differ.get('context', 0)} of {compared.get('context', 0)} live context values (Pi's getContextUsage) differ")
    print(f"{differ.get('usage', 0)} of {compared.get('usage', 0)} live usage-clock values (observer and reflector, "
          "with their basis) differ")
    source = compared.get("source", 0) + compared.get("system", 0)
    print(f"{differ.get('source', 0)} of {source} live source-token clock values (the fallbacks, dropper and "
          f"compaction) differ, and {differ.get('system', 0)} by exactly the system prompt messages in their "
          "range (SPEC §1: no source entries for om; the extension counts them)")
    for line in lines[:10]:
        print("  " + line)
    compared, differ, lines = compare_cut_points(args.out, ws, NODE)
    print(f"{differ} of {compared} cut points differ")
    for line in lines[:10]:
        print("  " + line)


if __name__ == "__main__":
    main()
