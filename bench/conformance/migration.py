#!/usr/bin/env python3
"""Memory through Pi's migration, on the two real sessions.

For each real session (v1) and each settings profile (the defaults, and lower thresholds that make
the offline baseline record much more): a copy of the session (its header's cwd moved to a folder
that exists: Pi's RPC mode needs it; the entries are the real ones) is maintained by om (ingest, the
offline baseline's replay in process, the replay recorded as `om run` records it); the memory at
EVERY point of its branch (plain fold, full, replayed and compaction projections, the compactions on
the branch, the four clocks) and recall of every memory id are read; the real Pi 1.6.0 opens the file
in RPC mode, which migrates it in place; om ingests it again. Figures per run:

* records / simulated compactions om had appended;
* orphaned without following the migration (the same ingest with follow_migration switched off, on a
  copy of the database: what om did before it followed Pi's migration);
* re-anchored and orphaned now;
* points of the branch where memory equals the memory before (through the id map), of all points;
* recall equal for how many ids; whether `om run` would replay the session again.

Needs Pi and node in .ci/pi/node_modules (`cd .ci/pi && npm install --no-audit --no-fund`).

    .venv/bin/python bench/conformance/migration.py [--out DIR]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for bench.harness
from bench import harness  # noqa: E402

from memory_points import memory_at_every_point, recalls, translate  # noqa: E402
from pi_rpc import RpcPi, agent_dir, missing, os_env  # noqa: E402

import om_core.ingest.file_ingest as file_ingest  # noqa: E402
from om_core.store import db as dbmod  # noqa: E402
from om_core.ingest import ingest  # noqa: E402
from om_core.replay.engine import replay_session  # noqa: E402
from om_core.replay.plan import due_sessions, fingerprints, record_replay  # noqa: E402
from om_core.settings import Settings  # noqa: E402
from om_core.workers.run_config import ModelConfig, make_brain  # noqa: E402
from om_core.store.workspace import Workspace  # noqa: E402

SESSIONS = harness.SHARED_SESSIONS
PROFILES = {
    "defaults": Settings(),
    "low thresholds": Settings(observeAfterTokens=2000, reflectAfterTokens=4000, compactAfterTokens=20000,
                               keepRecentTokens=3000, observationsPoolMaxTokens=4000,
                               observationsPoolTargetTokens=2000),
}


def copy_with_cwd(source: Path, folder: Path) -> Path:
    lines = source.read_bytes().split(b"\n")
    header = json.loads(lines[0])
    header["cwd"] = str(folder / "cwd")
    (folder / "cwd").mkdir(parents=True, exist_ok=True)
    lines[0] = json.dumps(header).encode()
    path = folder / source.name
    path.write_bytes(b"\n".join(lines))
    return path


def pi_opens(path: Path, home: Path) -> None:
    agent_dir(home, "http://127.0.0.1:9/v1", {})
    cwd = Path(json.loads(path.read_text().split("\n", 1)[0])["cwd"])
    pi = RpcPi(home, cwd, os_env(), session_file=path, extensions=())
    try:
        assert pi.call({"type": "get_state"})["success"]
    finally:
        pi.close()


def scalar(db: Path, sql: str, params: list | None = None):
    with dbmod.reading(db) as con:
        return con.execute(sql, params or []).fetchone()[0]


def run(name: str, profile: str, settings: Settings, root: Path, sessions: Path = SESSIONS) -> dict:
    folder = root / f"{Path(name).stem}-{profile.replace(' ', '-')}"
    folder.mkdir(parents=True)
    path = copy_with_cwd(sessions / name, folder)
    db = folder / "om.duckdb"
    ingest(Workspace.open(db, settings=settings), [path])
    con = dbmod.connect(db)
    try:
        [sid] = [r[0] for r in con.execute("SELECT session_id FROM sessions").fetchall()]
        cpu = time.process_time()
        replay_session(Workspace.on_connection(con, settings), sid, make_brain(ModelConfig(model="offline"), settings))
        replay_cpu = time.process_time() - cpu
        [(_, printed)] = fingerprints(con, [sid], settings, "offline", True).items()
        record_replay(con, sid, printed.now, "bench")
        before = memory_at_every_point(con, sid, settings)
        recalled = recalls(con, sid)
    finally:
        con.close()
    records = scalar(db, "SELECT count(*) FROM ledger WHERE origin = 'pipeline'")
    simulated = scalar(db, "SELECT count(*) FROM compactions WHERE origin = 'simulated'")
    pi_opens(path, folder / "home")
    migrated = json.loads(path.read_text().split("\n", 1)[0]).get("version")

    # what om did before it followed Pi's migration: the same ingest, the migration not followed (a copy of the database)
    unfollowed = folder / "unfollowed.duckdb"
    shutil.copy(db, unfollowed)
    real = file_ingest.follow_migration
    file_ingest.follow_migration = lambda *a, **k: None
    try:
        ingest(Workspace.open(unfollowed, settings=settings), [path])
    finally:
        file_ingest.follow_migration = real
    orphaned_unfollowed = scalar(unfollowed, "SELECT count(*) FROM orphaned_records")

    cpu = time.process_time()
    [report] = ingest(Workspace.open(db, settings=settings), [path]).files
    ingest_cpu = time.process_time() - cpu
    done = report.followed[0] if report.followed else None
    con = dbmod.connect(db)
    try:
        mapping = dict(con.execute("SELECT old_id, new_id FROM entry_id_map").fetchall())
        after = memory_at_every_point(con, sid, settings)
        recalled_after = recalls(con, sid)
        due = due_sessions(con, [sid], settings, "offline", True)[0]
    finally:
        con.close()
    expected = translate(before, mapping)
    equal_points = sum(a == b for a, b in zip(after, expected)) if len(after) == len(expected) else 0
    expected_recall = translate(recalled, mapping)
    return {
        "session": name, "profile": profile, "pi_version_after": migrated, "entries": done.entries if done else None,
        "records": records, "simulated_compactions": simulated,
        "orphaned_not_following": orphaned_unfollowed,
        "records_reanchored": done.records_reanchored if done else 0,
        "compactions_reanchored": done.compactions_reanchored if done else 0,
        "orphaned_now": scalar(db, "SELECT count(*) FROM orphaned_records"),
        "points_equal": equal_points, "points": len(expected),
        "recall_equal": sum(recalled_after.get(k) == v for k, v in expected_recall.items()), "recall_ids": len(recalled),
        "replays_again": bool(due), "replay_cpu_s": round(replay_cpu, 2), "reingest_cpu_s": round(ingest_cpu, 2),
    }


def main() -> int:
    parser = harness.parser(__doc__.split("\n", 1)[0], json_flag=False,
                            smoke="the smallest example session at the defaults only")
    parser.add_argument("--out", type=Path, default=None, help="Folder for the copies and databases (default: a temp one).")
    args = parser.parse_args()
    why = missing()
    if why:
        print(f"skipped: {why}")
        return 0
    root = args.out or Path(tempfile.mkdtemp(prefix="om-migration-"))
    if args.smoke:
        rows = [run("tidewatch-units.jsonl", "defaults", PROFILES["defaults"], root, harness.EXAMPLES)]
    else:
        rows = [run(name, profile, settings, root) for name in ("before-compaction.jsonl", "large-session.jsonl")
                for profile, settings in PROFILES.items()]
    header = ("session", "profile", "records", "simulated_compactions", "orphaned_not_following", "records_reanchored",
              "compactions_reanchored", "orphaned_now", "points_equal", "points", "recall_equal", "recall_ids",
              "replays_again")
    print(" | ".join(header))
    for r in rows:
        print(" | ".join(str(r[h]) for h in header))
    (root / "migration.json").write_text(json.dumps(rows, indent=2))
    print(f"(all figures: {root / 'migration.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
