"""What a fresh om database costs to build: an in-memory one (``MemoryDatabase()``, each replay task's
database and most tests'), and a new file (``om_core.store.db.connect`` on a path that does not exist yet,
closed again). With --parts, also what the template saves: the process's one template build (once,
on first use), the snapshot built in place on a new in-memory connection (``build_schema``: what
every new database would cost without the template), and every migration run from 001 (what every
new database cost before the snapshot).

Each figure (wall-clock and the process's CPU time) is the median (and the spread) of --runs builds in this process, after one warm-up build
(the first pays for reading and caching the sql/ files). Timings are noisy on a shared machine: read
them as ratios between runs made under the same load.

Usage: python bench/perf/fresh_db.py [--runs 20] [--parts]
Prints one JSON object: milliseconds per build, median / min / max, wall and CPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402, F401 - its import sets the paths up

from om_core.store import db as dbmod  # noqa: E402
from om_core.store.workspace import MemoryDatabase  # noqa: E402


def _memory() -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    database = MemoryDatabase()
    elapsed = time.perf_counter() - wall, time.process_time() - cpu
    database.close()
    return elapsed


def _file(folder: Path, i: int) -> tuple[float, float]:
    path = folder / f"fresh-{i}.duckdb"
    wall, cpu = time.perf_counter(), time.process_time()
    dbmod.connect(path).close()
    elapsed = time.perf_counter() - wall, time.process_time() - cpu
    path.unlink()
    return elapsed


def _on_new_connection(build: Callable[[duckdb.DuckDBPyConnection], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    con = duckdb.connect(":memory:", config={"threads": 1})
    build(con)
    elapsed = time.perf_counter() - wall, time.process_time() - cpu
    con.close()
    return elapsed


def _migrations(con: duckdb.DuckDBPyConnection) -> None:
    dbmod.apply_migrations(con)
    dbmod.ensure_views(con)


def _summary(runs: list[tuple[float, float]]) -> dict[str, float]:
    out = {}
    for i, kind in enumerate(("wall", "cpu")):
        ms = [run[i] * 1000 for run in runs]
        out |= {f"{kind}_median_ms": round(statistics.median(ms), 1), f"{kind}_min_ms": round(min(ms), 1),
                f"{kind}_max_ms": round(max(ms), 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--parts", action="store_true", help="also the template build, the snapshot in place "
                        "and the migrations from 001")
    args = parser.parse_args()
    out: dict = {"runs": args.runs}
    if args.parts:
        wall, cpu = time.perf_counter(), time.process_time()
        dbmod.template_path()
        out["template_build"] = _summary([(time.perf_counter() - wall, time.process_time() - cpu)])
    _memory()
    memory = [_memory() for _ in range(args.runs)]
    with tempfile.TemporaryDirectory() as tmp:
        _file(Path(tmp), -1)
        files = [_file(Path(tmp), i) for i in range(args.runs)]
    out |= {"memory": _summary(memory), "file": _summary(files)}
    if args.parts:
        out["snapshot_in_place"] = _summary([_on_new_connection(dbmod.build_schema) for _ in range(args.runs)])
        out["migrations_from_001"] = _summary([_on_new_connection(_migrations) for _ in range(args.runs)])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
