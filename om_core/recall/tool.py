"""The ``recall`` tool's result as the TypeScript extension shapes it (``src/tools/recall-observation.ts``):
``{"content": [{"type": "text", "text": …}], "details": {…}}``, built from om's recall (SPEC §6).

The model reads ``content``: the same text the extension gives for the same ledger on the same branch,
byte for byte (its recall format of each source entry: om_core.pi.source_text.recall_block; its sections
and sentences), so an agent that used the extension reads the same evidence. ``details`` carries the
fields the extension's tool returns (status, the matches with their source entries, what is
missing). Secrets are redacted by the rules of compaction summaries, in ``content`` and ``details``
alike (the one deliberate difference: the result goes to the model; ``om recall --raw`` prints the
exact text locally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from om_core.pi.js_length import js_len
from om_core.recall.evidence import RecallObservation, RecallResult, redacted
from om_core.redaction.redact import redact
from om_core.pi.session import entry_as_message, loads_line
from om_core.pi.source_text import js_blank, js_local_minute, recall_block, recall_block_content

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


def _origin(entry_type: str, obj: dict[str, Any]) -> tuple[str, str, list[str]]:
    """The extension's origin label of a source entry, its display time, and its qualifiers."""
    if entry_type == "custom_message":
        kind = obj.get("customType")
        return ("Custom message", js_local_minute(obj.get("timestamp")),
                [f"custom: {kind}"] if isinstance(kind, str) and kind else [])
    if entry_type == "branch_summary":
        return "Branch summary", js_local_minute(obj.get("timestamp")), []
    message = obj.get("message") if entry_type == "message" else entry_as_message(entry_type, obj)
    if not isinstance(message, dict):
        return entry_type or "Entry", js_local_minute(obj.get("timestamp")), []
    time = js_local_minute(message.get("timestamp"), obj.get("timestamp"))
    role = message.get("role")
    if role == "user":
        return "User", time, []
    if role == "assistant":
        names: list[str] = []
        for block in message.get("content") if isinstance(message.get("content"), list) else ():
            if isinstance(block, dict) and block.get("type") == "toolCall" and isinstance(block.get("name"), str):
                if block["name"] not in names:
                    names.append(block["name"])
        return "Assistant", time, [f"tool calls: {', '.join(names)}"] if names else []
    name = message.get("toolName")
    return f"Tool result: {name if isinstance(name, str) and name else 'unknown'}", time, []


class _Sources:
    """The source entries a recall cites, read once: each as the extension renders it (redacted) and
    as its source details."""

    def __init__(self, ws: Workspace, session_id: str, leaf: str, result: RecallResult) -> None:
        ids = sorted({s.entry_id for o in result.observations for s in o.sources})
        self.rows = {r["entry_id"]: r for r in ws.rows("resolve_entries", {
            "session_id": session_id, "tip": leaf, "ids": ids})} if ids else {}
        self._blocks: dict[str, str | None] = {}

    def block(self, entry_id: str) -> str | None:
        if entry_id not in self._blocks:
            row = self.rows[entry_id]
            rendered = recall_block(row["entry_type"], loads_line(row["raw"]))
            self._blocks[entry_id] = None if rendered is None else redact(rendered)
        return self._blocks[entry_id]

    def details(self, entry_id: str) -> dict[str, Any]:
        row = self.rows[entry_id]
        origin, time, qualifiers = _origin(row["entry_type"], loads_line(row["raw"]))
        found = {"id": entry_id, "origin": origin, "timestamp": time, "tokens": int(row["tokens_pi"] or 0),
                 "qualifiers": qualifiers}
        block = self.block(entry_id)
        content = recall_block_content(block) if block is not None else ""
        return {**found, "content": content} if content else found

    def rendered(self, entry_ids: list[str]) -> str:
        """The entries as the model reads them: one ``[Origin @ time]: text`` block each, blank ones left
        out, a blank line between."""
        blocks = (self.block(entry_id) for entry_id in entry_ids)
        return "\n\n".join(b for b in blocks if b is not None and not js_blank(b))


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
        "sourceCharacterCount": js_len(sources.rendered(ids)),
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


def _unavailable(o: RecallObservation) -> str:
    missing = f" missing: {', '.join(o.missing_source_entry_ids)}" if o.missing_source_entry_ids else ""
    non_source = f" non-source: {', '.join(o.non_source_entry_ids)}" if o.non_source_entry_ids else ""
    return (f"Observation {o.id} has source entries associated, but some are unavailable on the current branch "
            f"or are not source-renderable.{missing}{non_source}")


def _text(result: RecallResult, sources: _Sources, source_ids: list[str]) -> str:
    """The text the model reads: the extension's sections and sentences, in its order."""
    sections: list[str] = []
    if result.kind == "observation":
        if result.collision:
            sections.append(f"Memory id {result.id} matched multiple observations; returning all matching source "
                            "results from the current branch.")
        for o in (o for o in result.observations if o.matched):
            if o.status == "dropped":
                sections.append(f"Observation {o.id} is dropped from active memory but remains recallable.")
            if o.missing_source_entry_ids or o.non_source_entry_ids:
                sections.append(_unavailable(o))
            elif not o.sources:
                sections.append(f"Observation {o.id} has no source entries associated with it.")
            else:
                text = sources.rendered([s.entry_id for s in o.sources])
                sections.append(text if not js_blank(text) else
                                f"Observation {o.id} has source entries associated, but they rendered no text content.")
        return "\n\n".join(sections)
    if result.collision:
        sections.append(f"Memory id {result.id} matched multiple observations/reflections; returning all available "
                        "evidence from the current branch.")
    if result.reflections:
        sections.append("Reflections:\n" + "\n".join(f"[{r.id}] {r.content}" for r in result.reflections))
    if result.observations:
        sections.append("Observations:\n" + "\n".join(_observation_line(o) for o in result.observations))
    if result.missing_supporting_observation_ids:
        sections.append("Unavailable supporting observations:\n" + "\n".join(
            f"Supporting observation {i} is unavailable on the current branch."
            for i in result.missing_supporting_observation_ids))
    missing = _unique([i for o in result.observations for i in o.missing_source_entry_ids])
    non_source = _unique([i for o in result.observations for i in o.non_source_entry_ids])
    if missing or non_source:
        parts = ([f"missing: {', '.join(missing)}"] if missing else []) + (
            [f"non-source: {', '.join(non_source)}"] if non_source else [])
        sections.append("Unavailable source entries: " + "; ".join(parts))
    text = sources.rendered(source_ids)
    if not js_blank(text):
        sections.append("Sources:\n" + text)
    return "\n\n".join(sections) or f"Memory {result.id} was found, but no source evidence rendered."


def _project_text(result: RecallResult) -> str:
    """A project reflection's evidence for the model: the reflection, then each session memory line it
    rests on, with that line's source entries as its own session holds them."""
    sections: list[str] = []
    for project in result.projects:
        for r in project.reflections:
            state = "" if r.status == "current" else f" (retired: {r.retired_reason})"
            sections.append(f"Project reflection of {project.project_id}{state}:\n[{r.id}] {r.content}")
        for group in project.sessions:
            lines = [f"[{x.id}] reflection: {x.content}" for x in group.reflections]
            for o in group.observations:
                lines.append(_observation_line(o))
                lines += [f"--- {src.entry_id} {src.role} @ {src.ts}\n{src.text}" for src in o.sources]
            sections.append(f"From session {group.session_id}:\n" + "\n".join(lines))
        if project.missing_supporting_ids:
            sections.append("Recorded in none of the project's sessions now: " + ", ".join(project.missing_supporting_ids))
    return "\n\n".join(sections)


def tool_result(ws: Workspace, session_id: str, leaf: str, result: RecallResult) -> dict[str, Any]:
    """``{content, details}`` of the ``recall`` tool for one recall on the branch ending at ``leaf``."""
    if result.status == "invalid_id":
        return _empty("invalid_id", result.id, f"Memory id must be 12 lowercase hex characters. Received: {result.id}")
    if result.status == "not_found":
        return _empty("not_found", result.id,
                      f"No observation or reflection with id {result.id} was found on the current branch.")
    result = redacted(result)  # what reaches the model holds no secret (om_core.redaction.redact)
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
        "sourceCharacterCount": js_len(sources.rendered(source_ids)),
    }
    details = {"status": _status(details), **details}
    said = _text(result, sources, source_ids) if result.observations or result.reflections else ""
    if result.projects:  # a project reflection: its evidence lies in the project's other sessions
        details["projects"] = [p.model_dump(mode="json") for p in result.projects]
        said = "\n\n".join(part for part in (said, _project_text(result)) if part)
    return {"content": [{"type": "text", "text": said or f"Memory {result.id} was found, but none of its evidence has text."}],
            "details": details}
