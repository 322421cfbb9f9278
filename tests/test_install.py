"""om as a tool on PATH, as the README says: `pipx install .` (or `uv tool install .`) from a clone puts
an `om` that works from any folder: its SQL files, its Pi extension and every command come with it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples" / "sessions"


def _installer() -> list[str] | None:
    """The tool installer at hand: pipx (the test extra brings it), else uv."""
    # --no-compile: pip's byte-compiling of every dependency is most of an install's CPU, and Python
    # compiles what om imports on first use anyway (uv compiles nothing unless asked)
    if importlib.util.find_spec("pipx") is not None:
        return [sys.executable, "-m", "pipx", "install", "--pip-args=--no-compile"]
    if shutil.which("pipx"):
        return [shutil.which("pipx"), "install", "--pip-args=--no-compile"]
    if shutil.which("uv"):
        return [shutil.which("uv"), "tool", "install"]
    return None


def test_pipx_install_puts_a_working_om_on_path(tmp_path):
    installer = _installer()
    if installer is None:
        pytest.skip("neither pipx nor uv is installed (pip install pipx)")
    bin_dir = tmp_path / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OM_", "PIPX_", "UV_", "VIRTUAL_ENV"))}
    env.update({"HOME": str(tmp_path / "home"), "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(bin_dir),
                "PIPX_MAN_DIR": str(tmp_path / "man"), "UV_TOOL_DIR": str(tmp_path / "uv"),
                "UV_TOOL_BIN_DIR": str(bin_dir), "XDG_DATA_HOME": str(tmp_path / "data")})
    (tmp_path / "home").mkdir()
    done = subprocess.run([*installer, str(REPO)], env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    om = bin_dir / "om"
    assert om.is_file()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    elsewhere = tmp_path / "work"  # far from the clone: nothing may come from its folders
    elsewhere.mkdir()

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["om", *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)

    assert run("--version").stdout.startswith("om ")
    ingest = run("ingest", str(EXAMPLES))
    assert ingest.returncode == 0 and "ingested 3 files" in ingest.stdout, ingest.stderr
    assert (tmp_path / "data" / "om" / "om.duckdb").is_file()  # the user's data directory, not the folder
    tables = run("sql", ".tables")
    assert "entry_texts" in tables.stdout and "search_memory" in tables.stdout, tables.stderr
    package = Path(run("live", "info", "--package").stdout.strip())
    assert (package / "om-memory.ts").is_file() and (package / "package.json").is_file()
    assert str(package).startswith(str(tmp_path))  # the installed copy, not the clone's
