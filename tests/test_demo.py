"""`make demo` as a new user runs it: the pipeline on examples/sessions with the offline baseline, then
a compaction summary (the replay's latest simulated compaction, labelled as replayed) and the recall
of its first observation, with that observation's source message."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.prefect

REPO = Path(__file__).resolve().parent.parent


def test_make_demo_shows_a_compaction_summary_and_a_recall(prefect_api, tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OM_")}
    env.update({"PREFECT_API_URL": prefect_api, "HOME": str(tmp_path), "COLUMNS": "100"})
    # the project's own environment (no venv is built here) and a database of the test's own
    done = subprocess.run(["make", "--no-print-directory", "demo", f"BIN={Path(sys.executable).parent}", "STAMP=",
                           f"DEMO_DB={tmp_path / 'demo.duckdb'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out, err = done.stdout, done.stderr
    summary = out.split("== a compaction summary", 1)[1].split("== the evidence behind", 1)[0]
    assert re.search(r"replayed memory \(simulated compaction [0-9a-f]{8}\): what the extension would have shown, "
                     r"not what the agent saw", err)  # labelled as replayed, never as what the agent saw
    assert "is empty" not in err
    assert "## Observations" in summary
    ids = re.findall(r"^\[([0-9a-f]{12})\] \d{4}-\d{2}-\d{2} \d{2}:\d{2} \[", summary, re.MULTILINE)
    assert len(ids) > 10
    recall = out.split("== the evidence behind its first observation (om recall) ==", 1)[1]
    assert f"observation (active) [{ids[0]}]" in recall and "--- source " in recall
