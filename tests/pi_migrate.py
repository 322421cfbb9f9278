"""Pi 1.6.0's migration of a session file, written out for fast tests (the real Pi does the same in
tests/test_migration.py's Pi tests): `loadEntriesFromFile` (lines that JSON.parse rejects are skipped),
`migrateV1ToV2` (a fresh 8-hex id on every entry, parentId the previous entry's, firstKeptEntryIndex
resolved against the list with the header at 0), `migrateV2ToV3` (hookMessage becomes custom), and
`_rewriteFile` (JSON.stringify of every entry, one per line). And `SessionManager.forkFrom`: the raw
entries under a new v3 header."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any


def load_entries(path: Path) -> list[Any]:
    entries = []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue
    return entries


def migrate_entries(entries: list[Any], rng: random.Random) -> bool:
    """Pi's migrateToCurrentVersion, in place; False when the file is v3 already."""
    header = next((e for e in entries if isinstance(e, dict) and e.get("type") == "session"), None)
    version = (header or {}).get("version") or 1
    if version >= 3:
        return False
    if version < 2:
        prev = None
        for entry in entries:
            if entry.get("type") == "session":
                entry["version"] = 2
                continue
            entry["id"] = f"{rng.getrandbits(32):08x}"
            entry["parentId"] = prev
            prev = entry["id"]
            if entry.get("type") == "compaction" and isinstance(entry.get("firstKeptEntryIndex"), (int, float)) \
                    and not isinstance(entry.get("firstKeptEntryIndex"), bool):
                index = entry["firstKeptEntryIndex"]
                target = entries[int(index)] if float(index).is_integer() and 0 <= index < len(entries) else None
                if target is not None and target.get("type") != "session":
                    if "id" in target:
                        entry["firstKeptEntryId"] = target["id"]
                    else:
                        entry.pop("firstKeptEntryId", None)  # JSON.stringify drops undefined
                del entry["firstKeptEntryIndex"]
    for entry in entries:
        if entry.get("type") == "session":
            entry["version"] = 3
            continue
        message = entry.get("message")
        if entry.get("type") == "message" and isinstance(message, dict) and message.get("role") == "hookMessage":
            message["role"] = "custom"
    return True


def stringify(entry: Any) -> str:
    return json.dumps(entry, ensure_ascii=False, separators=(",", ":"))


def migrate_file(path: Path, seed: int = 0) -> bool:
    """Open the file as Pi 1.6 does: migrate it and rewrite it whole, when it is older than v3."""
    entries = load_entries(path)
    if not migrate_entries(entries, random.Random(seed)):
        return False
    path.write_text("".join(stringify(e) + "\n" for e in entries), encoding="utf-8")
    return True


def fork_file(source: Path, target: Path, session_id: str, cwd: str = "/home/dev/fork") -> Path:
    """`pi --fork SOURCE`: a new v3 header naming the source, then the source's raw entries (unmigrated)."""
    entries = load_entries(source)
    header = {"type": "session", "version": 3, "id": session_id, "timestamp": "2026-03-01T10:00:00.000Z",
              "cwd": cwd, "parentSession": str(source.resolve())}
    lines = [stringify(header)] + [stringify(e) for e in entries if e.get("type") != "session"]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return target
