"""bench/ stays runnable: every script is in the smoke list that `make bench-smoke` (and CI) runs, every
other bench file is named with the script that runs it, and no bench file grows past 500 lines."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
MAX_LINES = 500
CODE = (".py", ".mjs", ".ts")


def _smoke_module():
    spec = importlib.util.spec_from_file_location("bench_smoke", BENCH / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


smoke = _smoke_module()


def bench_files() -> list[Path]:
    """Every file of bench/ but caches and the scripts' own output (bench/out, gitignored)."""
    return sorted(p for p in BENCH.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.relative_to(BENCH).parts[0] != "out")


def test_no_bench_file_is_over_500_lines():
    long = {str(p.relative_to(BENCH)): n for p in bench_files()
            if (n := len(p.read_text(errors="replace").splitlines())) > MAX_LINES}
    assert long == {}


def test_every_bench_script_is_in_the_smoke_list_or_named_as_part_of_one():
    code = {str(p.relative_to(BENCH)) for p in bench_files() if p.suffix in CODE and p.name != "__init__.py"}
    scripts = [s.script for s in smoke.SMOKES]
    assert len(scripts) == len(set(scripts)), "a script is listed twice"
    assert code - set(scripts) - set(smoke.PARTS) == set(), "add it to SMOKES (or PARTS) in bench/smoke.py"
    assert set(scripts) | set(smoke.PARTS) <= code, "a listed script is not in bench/"
    assert set(scripts).isdisjoint(smoke.PARTS)


def test_every_part_is_run_by_a_listed_script():
    scripts = {s.script for s in smoke.SMOKES}
    for part, runner in smoke.PARTS.items():
        assert runner in scripts | {"every script", "make bench-smoke"}, (part, runner)


@pytest.mark.parametrize("entry", smoke.SMOKES, ids=lambda s: s.script)
def test_each_smoke_command_is_whole(entry, tmp_path):
    """Every placeholder of its arguments is known and the command names the script itself."""
    argv = smoke.command(entry, tmp_path)
    assert argv[1] == str(BENCH / entry.script) and Path(argv[1]).is_file()
    assert not any(re.search(r"\{\w+\}", a) for a in argv)


def test_make_bench_smoke_runs_the_list_and_ci_runs_it_after_the_tests():
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^bench-smoke:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target and "bench/smoke.py" in target.group(1)
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test\n(?:.*\n)*?make bench-smoke$", ci, re.MULTILINE), ci
