"""How much the usage clocks (SPEC §7, clockBasis usage) cost the replay of the real sample sessions,
against the source-token clocks (clockBasis source).

Two measurements per session and basis, best of --runs:
* ``walk``: the replay with a stage runner that does nothing (events, clocks, cut points only), where
  the clocks' own cost shows;
* ``offline``: the replay with the offline workers (a whole replay, stages included), on a fresh copy
  of the database each run.

Usage: python bench/perf/replay_clocks.py [--runs 3] [--sessions ../shared/sessions/*.jsonl]
Prints one line per session and a JSON summary with the usage/source ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from om_core.store import db as dbmod  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.replay.branch import replay_branches  # noqa: E402
from om_core.replay.engine import replay_session  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.workers.stages import StageOutcome
from om_core.workers.run_config import ModelConfig, make_brain  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

DEFAULT_SESSIONS = sorted(harness.SHARED_SESSIONS.glob("*.jsonl"))


class _SkipEveryStage:
    """A stage runner that runs nothing: the walk's own cost (events and clocks) alone."""

    def check(self) -> None:
        pass

    def __call__(self, req):  # noqa: ANN001, ANN204 - StageRequest -> StageOutcome
        return StageOutcome(req.stage, "skipped", req.session_id, req.tip, "none")


def _walk(base: Path, work: Path, session_id: str, settings: Settings) -> float:
    shutil.copy(base, work)  # simulated compactions are written: every run starts from the same file
    con = dbmod.connect(work)
    try:
        start = time.perf_counter()
        replay_branches(Workspace.on_connection(con, settings), session_id, _SkipEveryStage(), drain=False)
        return time.perf_counter() - start
    finally:
        con.close()
        work.unlink(missing_ok=True)


def _offline(base: Path, work: Path, session_id: str, settings: Settings) -> float:
    shutil.copy(base, work)
    con = dbmod.connect(work)
    try:
        brain = make_brain(ModelConfig(model="offline"), settings)
        start = time.perf_counter()
        replay_session(Workspace.on_connection(con, settings), session_id, brain)
        return time.perf_counter() - start
    finally:
        con.close()
        work.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sessions", nargs="*", type=Path, default=DEFAULT_SESSIONS)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.duckdb"
        report = ingest(Workspace.open(base, settings=Settings()), args.sessions)
        for f in report.files:
            row = {"session": Path(f.path).name}
            for basis in ("source", "usage"):
                settings = Settings(clockBasis=basis)
                row[f"walk_{basis}"] = min(_walk(base, Path(tmp) / "run.duckdb", f.session_id, settings)
                                           for _ in range(args.runs))
                row[f"offline_{basis}"] = min(_offline(base, Path(tmp) / "run.duckdb", f.session_id, settings)
                                              for _ in range(args.runs))
            row["walk_ratio"] = round(row["walk_usage"] / row["walk_source"], 3)
            row["offline_ratio"] = round(row["offline_usage"] / row["offline_source"], 3)
            results.append(row)
            print(f"{row['session']}: walk {row['walk_source']:.3f} s (source) / {row['walk_usage']:.3f} s (usage), "
                  f"ratio {row['walk_ratio']}; offline replay {row['offline_source']:.2f} s / {row['offline_usage']:.2f} s, "
                  f"ratio {row['offline_ratio']}")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
