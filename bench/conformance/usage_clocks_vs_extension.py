#!/usr/bin/env python3
"""The replay's usage clocks (SPEC §7) against the extension's own code, measurement by measurement.

Step 1 (this script): replay the sessions with the offline baseline (observationsPoolMaxTokens
3000), record every observer and reflector clock the replay measures on provider usage (the entry,
how many records were appended there before the measurement, om's value), and export each session.
Step 2 (``bench/conformance/usage_clocks_vs_extension.mjs``, node): on each exported file, at the same point,
Pi 1.6.0's own getContextUsage and the extension's realTokensSinceAnchor, and the count that differ.

    .venv/bin/python bench/conformance/usage_clocks_vs_extension.py --out /tmp/uc [--sessions FILE...]
    npm install --prefix /tmp/pi @earendil-works/pi-coding-agent@1.6.0   # Pi 1.6.0 (brings jiti)
    # and a checkout of elpapi42/pi-observational-memory (read, never copied), then:
    node bench/conformance/usage_clocks_vs_extension.mjs /tmp/pi /path/to/pi-observational-memory /tmp/uc
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from om_core.replay import branch as R  # noqa: E402
from om_core.replay.stage_runner import StageRunner  # noqa: E402
from om_core.usecases.export import export_session  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.workers.run_config import ModelConfig, make_brain  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402


class RecordingReplayer(R.BranchReplayer):
    """The replay, noting each usage-clock measurement it makes and the records appended before it."""

    measures: list[dict] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.appended: dict[int, int] = {}

    def due(self, stage, t):
        if stage.kind in R.USAGE_CLOCKS and self.usage is not None:
            self.clocks(t)
            m = self.usage.clock(t, self._marks.get(stage.kind))
            self.measures.append({"session": self.session_id, "entry_id": self.branch[t].entry_id,
                                  "k": self.appended.get(t, 0), "kind": stage.kind, "om": m.tokens})
        return super().due(stage, t)

    def _stage(self, report, t, req):
        outcome = super()._stage(report, t, req)
        if outcome.ledger_id:
            self.appended[t] = self.appended.get(t, 0) + 1
        return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sessions", nargs="*", type=Path,
                        default=sorted(harness.SHARED_SESSIONS.glob("*.jsonl")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = Settings(observationsPoolMaxTokens=3000)
    db = args.out / "replay.duckdb"
    db.unlink(missing_ok=True)
    ws = Workspace.open(db, settings=settings)
    brain = make_brain(ModelConfig(model="offline"), settings)
    for f in ingest(ws, args.sessions).files:
        for leaf in R.session_leaves(ws, f.session_id):
            RecordingReplayer(ws, f.session_id, leaf, StageRunner(ws, brain)).run()
        export_session(ws, f.session_id, args.out / f"{f.session_id}.export.jsonl", overwrite=True)
    (args.out / "measures.json").write_text(json.dumps(RecordingReplayer.measures))
    print(f"{len(RecordingReplayer.measures)} measurements in {args.out / 'measures.json'}")


if __name__ == "__main__":
    main()
