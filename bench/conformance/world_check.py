#!/usr/bin/env python3
"""Does `om compact` answer in the session file's world? A check on real sessions.

The sessions are replayed with the offline baseline and a small pool (observationsPoolMaxTokens
3000 by default, so the replay simulates full folds), exported with `om export`, and the export is
re-ingested into a database of its own. Then:

* cut points: for every distinct first kept entry Pi chooses on the exported file (its cut at
  keepRecentTokens 1,000 … 200,000), `om compact --first-kept F` in the replay database against the
  same command on the re-ingested export (they must be equal), and against `--replayed` (which may
  differ: the replayed world counts the simulated compactions);
* export --compact: for keepRecentTokens 5,000 … 195,000, the compaction `om export --compact` wrote
  against `om compact` on the written file re-ingested, at its own first kept entry with the branch
  ending before it (what the extension would have made of that file).

Usage (from the repository root; the replay takes minutes):

    .venv/bin/python bench/conformance/world_check.py                       # both sample sessions
    .venv/bin/python bench/conformance/world_check.py --work /tmp/wc --keep  # keep the databases for a rerun

Prints the counts and a JSON summary; exit 1 when the file's world differs anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from om_core.store.catalog import PiDeclines, cut_point  # noqa: E402
from om_core.errors import OmError  # noqa: E402
from om_core.usecases.export import export_session  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.memory.compaction import compact  # noqa: E402
from om_core.replay.engine import replay_session  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.workers.run_config import ModelConfig, make_brain  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

DEFAULT_SESSIONS = sorted(harness.SHARED_SESSIONS.glob("*.jsonl"))


def answer(ws: Workspace, sid: str, first_kept: str, leaf: str | None = None, replayed: bool = False) -> object:
    try:
        result = compact(ws, sid, first_kept, leaf, **({"replayed": True} if replayed else {}))
    except OmError as exc:
        return f"error: {exc}"
    data = result.as_json()
    data.pop("world", None)  # the label is not the memory
    return data


def check_session(work: Path, replay: Workspace, sid: str, settings: Settings) -> dict:
    exported = work / f"{sid}.export.jsonl"
    export_session(replay, sid, exported, overwrite=True)
    fresh = Workspace.open(work / f"{sid}.fresh.duckdb", settings=settings)
    ingest(fresh, [exported])
    points: list[str] = []
    for keep in range(1_000, 200_001, 5_000):
        try:
            f = cut_point(fresh, sid, keep_recent_tokens=keep).firstKeptEntryId
        except PiDeclines:
            continue
        if f not in points:
            points.append(f)
    cut_differs = [f for f in points if answer(replay, sid, f) != answer(fresh, sid, f)]
    replayed_differs = [f for f in points if answer(replay, sid, f, replayed=True) != answer(fresh, sid, f)]
    written = written_differs = 0
    for keep in range(5_000, 195_001, 5_000):
        ws = Workspace(replay.db, settings.model_copy(update={"keepRecentTokens": keep}))
        out = work / f"{sid}.compact.jsonl"
        report = export_session(ws, sid, out, overwrite=True, compact=True)
        if report.compaction is None:
            continue
        written += 1
        entry = json.loads(out.read_text().splitlines()[-1])
        db = work / f"{sid}.compact.duckdb"
        db.unlink(missing_ok=True)
        again = Workspace.open(db, settings=settings)
        ingest(again, [out])
        got = compact(again, sid, entry["firstKeptEntryId"], entry["parentId"])
        written_differs += (got.summary, got.details()) != (entry["summary"], entry["details"])
    return {"session_id": sid, "cut_points": len(points), "cut_points_differ": len(cut_differs),
            "examples": cut_differs[:3], "replayed_differs": len(replayed_differs),
            "export_compactions": written, "export_compactions_differ": written_differs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", nargs="*", type=Path, default=DEFAULT_SESSIONS)
    parser.add_argument("--pool", type=int, default=3000, help="observationsPoolMaxTokens (default 3000)")
    parser.add_argument("--work", type=Path, help="folder for the databases (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="reuse --work's replay database when it is there")
    args = parser.parse_args()
    settings = Settings(observationsPoolMaxTokens=args.pool)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        db = work / "replay.duckdb"
        reuse = args.keep and db.exists()
        replay = Workspace.open(db, settings=settings)
        if not reuse:
            db.unlink(missing_ok=True)
        files = ingest(replay, args.sessions).files
        results = []
        for f in files:
            if not reuse:
                replay_session(replay, f.session_id, make_brain(ModelConfig(model="offline"), settings))
            row = check_session(work, replay, f.session_id, settings)
            results.append(row)
            print(f"{Path(f.path).name}: {row['cut_points_differ']} of {row['cut_points']} cut points differ "
                  f"(--replayed: {row['replayed_differs']}); {row['export_compactions_differ']} of "
                  f"{row['export_compactions']} export --compact compactions differ")
    print(json.dumps(results, indent=2))
    sys.exit(1 if any(r["cut_points_differ"] or r["export_compactions_differ"] for r in results) else 0)


if __name__ == "__main__":
    main()
