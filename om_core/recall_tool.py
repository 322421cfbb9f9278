"""The ``recall`` tool's result as the TypeScript extension shapes it (``src/tools/recall-observation.ts``):
``{"content": [{"type": "text", "text": …}], "details": {…}}``, built from om's recall (SPEC §6).

The model reads ``content``; ``details`` carries the same fields the extension's tool returns
(status, the matches with their source entries, what is missing), so a Pi that used the extension
sees the same tool. Source text is om's text of the entry with its secrets redacted by the rules of
compaction summaries, in ``content`` and ``details`` alike: the result goes to the model
(``om recall --raw`` prints the exact text locally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from om_core.recall import RecallObservation, RecallResult, redacted
from om_core.redact import redact
from om_core.session import entry_as_message, loads_line
from om_core.source_text import entry_text, minute

if TYPE_CHECKING:
    from om_core.workspace import Workspace


def _origin(entry_type: str, obj: dict[str, Any]) -> tuple[str, list[str]]:
    """The extension's origin label of a source entry, and its qualifiers."""
    if entry_type == "custom_message":
        kind = obj.get("customType")
        return "Custom message", [f"custom: {kind}"] if isinstance(kind, str) and kind else []
    if entry_type == "branch_summary":
        return "Branch summary", []
    message = entry_as_message(entry_type, obj) or {}
    role = message.get("role")
    if role == "user":
        return "User", []
    if role == "assistant":
        names: list[str] = []
        for block in message.get("content") if isinstance(message.get("content"), list) else ():
            if isinstance(block, dict) and block.get("type") == "toolCall" and isinstance(block.get("name"), str):
                if block["name"] not in names:
                    names.append(block["name"])
        return "Assistant", [f"tool calls: {', '.join(names)}"] if names else []
    if role == "toolResult":
        return f"Tool result: {message.get('toolName') or 'unknown'}", []
    return {"bashExecution": "User command", "custom": "Custom message"}.get(role or "", role or entry_type), []


class _Sources:
    """The source entries a recall cites, read once: each as the extension's source details."""

    def __init__(self, ws: Workspace, session_id: str, leaf: str, result: RecallResult) -> None:
        ids = sorted({s.entry_id for o in result.observations for s in o.sources})
        self.rows = {r["entry_id"]: r for r in ws.rows("resolve_entries", {
            "session_id": session_id, "tip": leaf, "ids": ids})} if ids else {}

    def details(self, entry_id: str) -> dict[str, Any]:
        row = self.rows[entry_id]
        obj = loads_line(row["raw"])
        origin, qualifiers = _origin(row["entry_type"], obj)
        found = {"id": entry_id, "origin": origin, "timestamp": minute(obj.get("timestamp")) or "Unknown time",
                 "tokens": int(row["tokens_pi"] or 0), "qualifiers": qualifiers}
        text = redact(entry_text(row["entry_type"], obj))
        return {**found, "content": text} if text else found

    def rendered(self, entry_ids: list[str]) -> str:
        """The entries as the model reads them: ``[Origin @ time]: text``, one block each."""
        blocks = []
        for entry_id in entry_ids:
            d = self.details(entry_id)
            blocks.append(f"[{d['origin']} @ {d['timestamp']}]: {d.get('content', '')}")
        return "\n\n".join(blocks)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _match(o: RecallObservation, sources: _Sources) -> dict[str, Any]:
    ids = [s.entry_id for s in o.sources]
    if o.missing_source_entry_ids or o.non_source_entry_ids:
        status = "source_unavailable"
    else:
        status = "no_source" if not ids else o.status
    return {
        "status": status, "observationEntryId": o.ledger_id, "observationRecordIndex": o.item_index,
        "observation": {"id": o.id, "content": o.content, "timestamp": o.ts, "relevance": o.relevance,
                        "status": o.status},
        "sourceEntryIds": _unique(o.source_entry_ids), "sourceEntries": [sources.details(i) for i in ids],
        "missingSourceEntryIds": o.missing_source_entry_ids, "nonSourceEntryIds": o.non_source_entry_ids,
        "sourceCharacterCount": len(sources.rendered(ids)),
    }


def _empty(status: str, memory_id: str, message: str) -> dict[str, Any]:
    details = {"status": status, "memoryId": memory_id, "observationId": memory_id, "collision": False,
               "partial": False, "reflections": [], "directObservationMatches": [], "observations": [],
               "matches": [], "sourceEntries": [], "unavailableSupportingObservations": [],
               "missingSourceEntryIds": [], "nonSourceEntryIds": [], "message": message}
    return {"content": [{"type": "text", "text": message}], "details": details}


def _status(details: dict[str, Any]) -> str:
    """ok, or what keeps the evidence from being whole (the extension's order of precedence)."""
    only_observations = not details["reflections"] and not details["unavailableSupportingObservations"]
    if details["partial"]:
        return "partial"
    if only_observations and any(m["status"] == "source_unavailable" for m in details["observations"]):
        return "source_unavailable"
    if only_observations and details["observations"] and not details["sourceEntries"]:
        return "no_source"
    return "ok"


def _observation_line(o: RecallObservation) -> str:
    return f"[{o.id}]{' [dropped]' if o.status == 'dropped' else ''} {o.ts} [{o.relevance}] {o.content}"


def _text(result: RecallResult, sources: _Sources, source_ids: list[str]) -> str:
    sections: list[str] = []
    if result.collision:
        sections.append(f"The id {result.id} names more than one memory record on this branch; all of them follow.")
    if result.kind == "observation":
        for o in (o for o in result.observations if o.matched):
            if o.status == "dropped":
                sections.append(f"Observation {o.id} was dropped from active memory; its evidence is still here.")
            unavailable = o.missing_source_entry_ids + o.non_source_entry_ids
            if unavailable:
                sections.append(f"Observation {o.id} cites entries that are not source entries on this branch: "
                                f"{', '.join(unavailable)}.")
            elif not o.sources:
                sections.append(f"Observation {o.id} cites no source entries.")
            else:
                sections.append(sources.rendered([s.entry_id for s in o.sources]))
        return "\n\n".join(sections)
    if result.reflections:
        sections.append("Reflections:\n" + "\n".join(f"[{r.id}] {r.content}" for r in result.reflections))
    if result.observations:
        sections.append("Observations:\n" + "\n".join(_observation_line(o) for o in result.observations))
    if result.missing_supporting_observation_ids:
        sections.append("Supporting observations not on this branch:\n" + "\n".join(
            result.missing_supporting_observation_ids))
    missing = _unique([i for o in result.observations for i in o.missing_source_entry_ids])
    non_source = _unique([i for o in result.observations for i in o.non_source_entry_ids])
    if missing or non_source:
        sections.append("Source entries not available: " + "; ".join(
            part for part in (f"missing: {', '.join(missing)}" if missing else "",
                              f"not source entries: {', '.join(non_source)}" if non_source else "") if part))
    if source_ids:
        sections.append("Sources:\n" + sources.rendered(source_ids))
    return "\n\n".join(sections) or f"Memory {result.id} was found, but none of its evidence has text."


def tool_result(ws: Workspace, session_id: str, leaf: str, result: RecallResult) -> dict[str, Any]:
    """``{content, details}`` of the ``recall`` tool for one recall on the branch ending at ``leaf``."""
    if result.status == "invalid_id":
        return _empty("invalid_id", result.id, f"A memory id is 12 lowercase hex characters; got {result.id!r}.")
    if result.status == "not_found":
        return _empty("not_found", result.id, f"No observation or reflection {result.id} on this branch.")
    result = redacted(result)  # what reaches the model holds no secret (om_core.redact)
    sources = _Sources(ws, session_id, leaf, result)
    matches = [_match(o, sources) for o in result.observations]
    direct = [m for m, o in zip(matches, result.observations) if o.matched]
    source_ids = _unique([s.entry_id for o in result.observations for s in o.sources])
    details: dict[str, Any] = {
        "memoryId": result.id, "observationId": result.id, "collision": result.collision, "partial": result.partial,
        "reflections": [{"id": r.id, "content": r.content, "supportingObservationIds": r.supporting_observation_ids,
                         "reflectionIndex": r.item_index} for r in result.reflections],
        "directObservationMatches": direct, "observations": matches, "matches": direct,
        "sourceEntries": [sources.details(i) for i in source_ids],
        "unavailableSupportingObservations": [{"observationId": i} for i in result.missing_supporting_observation_ids],
        "missingSourceEntryIds": _unique([i for o in result.observations for i in o.missing_source_entry_ids]),
        "nonSourceEntryIds": _unique([i for o in result.observations for i in o.non_source_entry_ids]),
        "sourceCharacterCount": len(sources.rendered(source_ids)),
    }
    details = {"status": _status(details), **details}
    return {"content": [{"type": "text", "text": _text(result, sources, source_ids)}], "details": details}
