"""Read commands stay fast: they never import litellm, Prefect or tiktoken (each takes seconds)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from builders import SessionBuilder

from conftest import workspace
from om_core.ingest import ingest

PROBE = """
import sys
from flows.cli import main as cli
sys.argv = ["om", "--db", sys.argv[1], *sys.argv[2:]]
try:
    cli.app(standalone_mode=False)
except SystemExit:
    pass
heavy = [m for m in ("litellm", "prefect", "tiktoken", "dask") if m in sys.modules]
print("HEAVY=" + ",".join(heavy))
"""


@pytest.mark.parametrize("command", [["view", "1111"], ["view", "1111", "--full"], ["status", "1111"],
                                     ["recall", "0123456789ab"], ["sql", "SELECT count(*) FROM entries"],
                                     ["compact", "1111", "--first-kept", "00000001"], ["sessions"], ["gaps"],
                                     ["logs"], ["logs", "--full", "--json"], ["search", "hello"],
                                     ["search", "hello", "--json"], ["project", "--list"],
                                     ["project", "/home/dev/project", "--json"]])
def test_read_commands_import_no_heavy_library(tmp_path, command):
    b = SessionBuilder()
    b.user("hello")
    b.assistant("hi")
    db = tmp_path / "om.duckdb"
    ingest(workspace(db), [b.write(tmp_path / "s.jsonl")])
    result = subprocess.run([sys.executable, "-c", PROBE, str(db), *command], capture_output=True, text=True, timeout=60)
    assert "HEAVY=\n" in result.stdout, result.stdout + result.stderr
