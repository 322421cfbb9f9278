"""What every bench script sets up the same way: the paths, the import path, no network, a work
folder, the sample sessions, generated sessions, the fake model (in this process or one of its own),
timing and the arguments every script shares (--json, --keep, --smoke).

A script in bench/perf, bench/cost or bench/conformance starts with::

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
    from bench import harness  # noqa: E402  (puts tests/ on the path, keeps litellm offline)

Importing this module puts the repository and tests/ (the fake model, the session builders) on the
import path and keeps litellm from fetching its cost map (nothing downloads at run time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from om_core.workers.run_config import ModelConfig

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
BENCH = REPO / "bench"
SHARED_SESSIONS = (REPO.parent / "shared" / "sessions").resolve()
SAMPLES = [SHARED_SESSIONS / "before-compaction.jsonl", SHARED_SESSIONS / "large-session.jsonl"]
EXAMPLES = REPO / "examples" / "sessions"
PI_MODULES = REPO / ".ci" / "pi" / "node_modules"
FAKE_MODEL = "openai/fake-model"

for _extra in (TESTS, REPO):
    if str(_extra) not in sys.path:
        sys.path.insert(0, str(_extra))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network here


# ------------------------------------------------------------------ arguments


def parser(doc: str | None, *, json_flag: bool = True, smoke: str | None = None) -> argparse.ArgumentParser:
    """The script's parser: its docstring's first paragraph as description, --json, and --smoke
    (``smoke`` says what the tiny run does) when the script has one."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if json_flag:
        p.add_argument("--json", action="store_true", help="print the figures as JSON")
    if smoke:
        p.add_argument("--smoke", action="store_true", help=f"a tiny run that only shows the script works: {smoke}")
    return p


def setting_overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs as settings overrides, each value as JSON where it parses."""
    overrides: dict[str, object] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


# ------------------------------------------------------------------ sessions and folders


def present(paths: Sequence[Path]) -> list[Path]:
    """The session files that exist; a line on stderr for each that does not."""
    for path in paths:
        if not path.is_file():
            print(f"skipping {path}: absent (../shared is only present in CI and the team's checkout)",
                  file=sys.stderr)
    return [p for p in paths if p.is_file()]


@contextlib.contextmanager
def work_dir(prefix: str, keep: Path | None = None) -> Iterator[Path]:
    """A folder for the run's files: ``keep`` (created, left in place) or a temporary one, removed."""
    folder = keep or Path(tempfile.mkdtemp(prefix=prefix))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def generated_sessions(folder: Path, count: int) -> Path:
    """``count`` small Pi sessions (tests/builders.SessionBuilder) of 4 to 9 work turns, in ``folder``."""
    from builders import SessionBuilder

    folder.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        b = SessionBuilder(session_id=f"{n:08x}-cccc-bbbb-cccc-dddddddddddd",
                           start=f"2026-05-{1 + n % 28:02d}T09:00:00")
        b.work_turns(4 + n % 6, f"topic{n}")
        b.write(folder / f"s{n:03d}.jsonl")
    return folder


def copy_archive(folder: Path, copies: int, sources: Sequence[Path] | None = None) -> Path:
    """The real sessions (or ``sources``), each ``copies`` times under a new session id (the header's id)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in sources if sources is not None else sorted(SHARED_SESSIONS.glob("*.jsonl")):
        lines = source.read_text().splitlines(keepends=True)
        for n in range(copies):
            header = json.loads(lines[0])
            header["id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"om-bench/{source.name}/{n}"))
            (folder / f"{source.stem}-{n}.jsonl").write_text(json.dumps(header) + "\n" + "".join(lines[1:]))
    return folder


# ------------------------------------------------------------------ the fake model


def fake_model_config(base_url: str) -> ModelConfig:
    """The model configuration that sends the workers to the fake server at ``base_url``."""
    from om_core.workers.run_config import ModelConfig

    return ModelConfig(model=FAKE_MODEL, api_base=base_url)


def fake_model_process(delay: float = 0.0, repo: Path = REPO) -> tuple[subprocess.Popen, str]:
    """The scripted fake model (tests/fake_brains.ScriptedWorkers answering after ``delay`` seconds) in
    a process of its own, so that its CPU is not the measured process's. Stop it with ``stop_process``.
    ``repo``: the checkout whose scripted model answers (it knows that checkout's prompts)."""
    code = ("import sys; sys.path[:0] = [sys.argv[2], sys.argv[3]]\n"
            "from fake_brains import ScriptedWorkers; from fake_openai import FakeOpenAI\n"
            "server = FakeOpenAI(responder=ScriptedWorkers(delay=float(sys.argv[1]))); server.start()\n"
            "print(server.base_url, flush=True)\n"
            "sys.stdin.read()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(delay), str(repo / "tests"), str(repo)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def stop_process(proc: subprocess.Popen) -> None:
    """Ends a ``fake_model_process`` (it stops when its stdin closes)."""
    proc.stdin.close()
    proc.wait(timeout=10)


# ------------------------------------------------------------------ timing


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pct(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def spread_ms(seconds: Sequence[float]) -> dict[str, float]:
    """Median, min and max of durations in seconds, as milliseconds."""
    return {"median_ms": round(1000 * statistics.median(seconds), 1), "min_ms": round(1000 * min(seconds), 1),
            "max_ms": round(1000 * max(seconds), 1)}


# ------------------------------------------------------------------ texts


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
