"""Export to Pi: a new session file with this project's ledger records written the way the
TypeScript extension writes them, so Pi with the extension installed continues with this memory.

Each record becomes a ``custom`` entry placed right after the entry it is anchored to, as if the
extension had appended it live: it becomes that entry's child, and the entries that followed on the
branch (the anchor's children) are re-linked to the last record of the chain. Original entries are
written as they were; a v1 or v2 file is written migrated to v3 (ids, parentIds, firstKeptEntryId,
``hookMessage`` → ``custom``), exactly the entries ingest read. A record is stamped with the time it
was made, as the extension stamps its appends, never earlier than its parent entry. Simulated
compactions are not exported: they never happened in the session.

With ``compact``, a compaction entry that Pi itself reads is appended at the tip (the current leaf):
the model-free summary of SPEC §5 at Pi's cut point of the exported branch, with the ``om.folded``
details, written as the extension writes its compactions (``fromHook: true``, the branch's system
message, ``tokensBefore`` by Pi 1.6's estimate). Plain Pi resumes from that summary and the kept
tail; with the extension, its visible memory is that fold.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from om_core.store import db as dbmod
from om_core.store.catalog import resolve_session
from om_core.pi.branch_entry import branch_entry
from om_core.pi.cutpoint import NothingToCompact, compaction_cut_point
from om_core.errors import InvalidArgument, StorageError
from om_core.ledger.records import RECORD_MODELS
from om_core.memory.compaction import DeclineReason, World, compact_at
from om_core.pi.session import JS_WHITESPACE
from om_core.settings import Settings

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


@dataclass
class ExportReport:
    session_id: str
    out: str
    entries: int
    records: int
    relinked: int
    quarantined_lines_left_out: int
    compaction: dict[str, Any] | None = None  # --compact: the entry appended at the tip
    compaction_skipped: str | None = None  # --compact, but none was written: why

    def as_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _dumps(obj: dict[str, Any]) -> str:
    # JSON.stringify: compact, raw Unicode
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def record_payloads(con: duckdb.DuckDBPyConnection, session_id: str) -> list[dict[str, Any]]:
    """This project's records of a session, in append order, as wire ``data`` objects."""
    out = []
    for record in dbmod.named_rows(con, "pipeline_records", {"session_id": session_id}):
        kind = record["kind"]
        params = {"session_id": session_id, "ledger_id": record["ledger_id"]}
        if kind == "om.observations.recorded":
            data = {"observations": [{"id": o["obs_id"], "content": o["content"], "timestamp": o["ts"],
                                      "relevance": o["relevance"], "sourceEntryIds": list(o["source_entry_ids"]),
                                      "tokenCount": _number(o["token_count"])}
                                     for o in dbmod.named_rows(con, "record_observations", params)]}
        elif kind == "om.reflections.recorded":
            data = {"reflections": [{"id": r["refl_id"], "content": r["content"],
                                     "supportingObservationIds": list(r["supporting_observation_ids"]),
                                     "tokenCount": _number(r["token_count"])}
                                    for r in dbmod.named_rows(con, "record_reflections", params)]}
        elif kind == "om.reflections.dropped":
            items = dbmod.named_rows(con, "record_reflection_drops", params)
            data = {"reflectionIds": [d["refl_id"] for d in items]}
            for key, column in (("replacedBy", "replaced_by"), ("kind", "kind")):  # as read, when present
                if items and items[0][column] is not None:
                    data[key] = json.loads(items[0][column])
        else:
            data = {"observationIds": dbmod.named_column(con, "record_drops", params)}
        data["coversUpToId"] = record["covers_up_to_id"]
        RECORD_MODELS[kind].model_validate(data)  # what we write must import as valid
        out.append({"ledger_id": record["ledger_id"], "kind": kind, "anchor": record["anchor_entry_id"], "data": data,
                    "created": record["created_at"]})
    return out


def js_iso(moment: datetime) -> str:
    """``Date.prototype.toISOString``: UTC, milliseconds, ``Z``."""
    moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def record_timestamp(created: datetime | None, parent_text: str, parent_at: datetime | None) -> tuple[str, datetime | None]:
    """The timestamp of an exported record: the time it was made, as the extension stamps its appends
    (``new Date().toISOString()``), but never earlier than its parent entry. Returns the text and the
    moment it stands for (the parent's own text when the parent is not earlier, or the record has no
    time of its own)."""
    if created is not None:
        made = created.astimezone(timezone.utc).replace(microsecond=created.microsecond // 1000 * 1000)
        if parent_at is None or made > parent_at:
            return js_iso(made), made
    return parent_text, parent_at


def _migrated(raw: str, entry_id: str, parent_id: str | None, entry_type: str | None, role: str | None,
              first_kept: str | None, version: int) -> dict[str, Any]:
    obj = json.loads(raw)
    if version >= 3:
        return obj
    obj["id"], obj["parentId"] = entry_id, parent_id
    if entry_type == "compaction":
        obj.pop("firstKeptEntryIndex", None)
        if first_kept is not None:
            obj["firstKeptEntryId"] = first_kept
    if entry_type == "message" and role == "custom" and isinstance(obj.get("message"), dict):
        obj["message"] = {**obj["message"], "role": "custom"}
    return obj


def export_session(ws: Workspace, session: str, out: str | os.PathLike | None, overwrite: bool = False,
                   compact: bool = False, sink: Callable[[str], None] | None = None) -> ExportReport:
    """Write the new session file; with ``compact``, the tip compaction by the workspace's settings.
    ``out`` None: the file's text goes to ``sink`` instead (``om export --out -``: standard output)."""
    out_path = None if out is None else Path(out).resolve()
    settings = ws.settings if compact else None  # resolved only when used, before the database is read
    with ws.read() as con:
        sid = resolve_session(con, session)
        session_row = dbmod.named_row(con, "export_header", {"session_id": sid})
        file_path, version = session_row["file_path"], session_row["version"]
        if out_path is None:
            pass
        elif out_path == Path(file_path).resolve():
            raise InvalidArgument("refusing to overwrite the session file itself; choose another --out")
        elif out_path.is_dir():
            raise InvalidArgument(f"{out_path} is a directory; --out takes the path of the new session file")
        elif out_path.exists() and not overwrite:
            raise InvalidArgument(f"{out_path} exists; pass --force to replace it")
        entries = dbmod.named_rows(con, "export_entries", {"session_id": sid})
        records = record_payloads(con, sid)
        quarantined = dbmod.scalar(con, "quarantined_lines", {"file_path": file_path}) or 0
    chains: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        chains[record["anchor"]].append(record)
    header = json.loads(session_row["header"].lstrip(JS_WHITESPACE))  # as written, a leading BOM included
    header["version"] = 3
    lines = [_dumps(header)]
    relinked = 0
    for row in entries:
        entry_id, parent_id, raw = row["entry_id"], row["parent_id"], row["raw"]
        ts, at = row["ts_text"], row["ts"]
        obj = _migrated(raw, entry_id, parent_id, row["entry_type"], row["role"], row["first_kept_entry_id"], version)
        if parent_id in chains:
            obj["parentId"] = chains[parent_id][-1]["ledger_id"]  # the extension appended after the parent
            relinked += 1
            lines.append(_dumps(obj))
        else:
            lines.append(raw if version >= 3 else _dumps(obj))
        previous = entry_id
        for record in chains.get(entry_id, ()):
            ts, at = record_timestamp(record["created"], ts, at)
            lines.append(_dumps({"type": "custom", "customType": record["kind"], "data": record["data"],
                                 "id": record["ledger_id"], "parentId": previous, "timestamp": ts}))
            previous = record["ledger_id"]
    compaction, skipped = None, None
    if compact:
        with ws.read() as con:
            compaction, skipped = tip_compaction(con, sid, lines, settings)
        if compaction is not None:
            lines.append(_dumps(compaction))
    if out_path is None:
        (sink or (lambda text: None))("\n".join(lines) + "\n")
    else:
        _write_whole(out_path, "\n".join(lines) + "\n")
    # the entry appended, as om reports it (snake_case, like the columns it becomes once ingested)
    summary = None if compaction is None else {"id": compaction["id"], "parent_id": compaction["parentId"],
                                               "first_kept_entry_id": compaction["firstKeptEntryId"],
                                               "tokens_before": compaction["tokensBefore"]}
    return ExportReport(sid, "-" if out_path is None else str(out_path), len(entries), len(records), relinked, int(quarantined), summary, skipped)


def _write_whole(out_path: Path, text: str) -> None:
    """Write through a ``.partial`` file renamed into place: never a half-written session file."""
    tmp = out_path.with_name(out_path.name + ".partial")
    try:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out_path)
    except OSError as exc:
        with contextlib.suppress(OSError):  # a read-only filesystem refuses the cleanup too
            tmp.unlink(missing_ok=True)
        raise StorageError(f"cannot write {out_path}: {exc.strerror or exc}") from None


def tip_compaction(con: duckdb.DuckDBPyConnection, session_id: str, lines: list[str],
                   settings: Settings) -> tuple[dict[str, Any] | None, str | None]:
    """The compaction entry to append at the tip of the exported file (None and why where Pi would
    not compact there, or where the projection renders nothing: Pi's own summarizer would run)."""
    objs = [json.loads(line) for line in lines[1:]]
    by_id = {o["id"]: o for o in objs}
    tip = objs[-1]
    path, node, seen = [], tip, set()
    while node is not None and node["id"] not in seen:  # the exported branch, root first
        seen.add(node["id"])
        path.append(node)
        node = by_id.get(node.get("parentId"))
    path.reverse()
    branch = []
    for o in path:
        message = o.get("message") if o.get("type") == "message" else None
        role = message.get("role") if isinstance(message, dict) and isinstance(message.get("role"), str) else None
        first_kept = o.get("firstKeptEntryId") if o.get("type") == "compaction" else None
        branch.append(branch_entry(o["id"], o.get("type") or "", role, None, o,
                                   first_kept if isinstance(first_kept, str) else None))
    try:
        cut = compaction_cut_point(branch, settings.keepRecentTokens, rules=settings.cutPointRules)
    except NothingToCompact as exc:
        return None, f"Pi would not compact at the tip: {exc}"
    # The file's world: the compactions it holds, never the ones a replay simulated (not written).
    # F may be one of the records written into the file (absorbed onto the record chain before the
    # cut): the projection resolves it to the entry the record follows.
    leaf = dbmod.scalar(con, "session_leaf", {"session_id": session_id})
    result = compact_at(con, session_id, leaf, cut.firstKeptEntryId, settings, world=World.FILE)
    if result.summary is None:
        why = ("the compaction projection is empty" if result.declined is DeclineReason.EMPTY_PROJECTION else
               f"no memory record fits compactionSummaryMaxTokens {result.summaryMaxTokens}")
        return None, f"{why}: Pi's native summarizer would run (nothing written)"
    entry: dict[str, Any] = {
        "type": "compaction", "id": _fresh_id(session_id, tip["id"], by_id), "parentId": tip["id"],
        "timestamp": _not_before(tip.get("timestamp")), "summary": result.summary,
        "firstKeptEntryId": cut.firstKeptEntryId, "tokensBefore": cut.tokensBefore, "details": result.details(),
        "fromHook": True,
    }
    system = next((e.messages[0] for e in reversed(branch)
                   if e.entry_type == "message" and e.role == "system" and e.messages), None)
    if system is None:  # the system message a compaction already carries
        system = next((o.get("systemMessage") for o in reversed(path)
                       if o.get("type") == "compaction" and o.get("systemMessage") is not None), None)
    if system is not None:
        entry["systemMessage"] = system
    return entry, None


def _fresh_id(session_id: str, parent: str, taken: dict[str, Any]) -> str:
    """An 8-hex id like Pi's, the same for the same export (and never one the file already has)."""
    salt = 0
    while True:
        candidate = hashlib.sha256(f"{session_id}\x00compaction\x00{parent}\x00{salt}".encode()).hexdigest()[:8]
        if candidate not in taken:
            return candidate
        salt += 1


def _not_before(parent_ts: Any) -> str:
    """Now, as Pi stamps an append (ISO, milliseconds, Z), never earlier than the entry it follows."""
    now = datetime.now(timezone.utc)
    if isinstance(parent_ts, str):
        try:
            parent = datetime.fromisoformat(parent_ts.replace("Z", "+00:00"))
            if parent.tzinfo is not None and parent > now:
                now = parent
        except ValueError:
            pass
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
