"""Where stage results are kept (exactly-once across runs, machines and lost workers), and in what form.

The ``resultStorage`` setting names it:
* unset: a folder next to the database (``<db>.stage-results``, this user's only), right for runs on one machine;
* a path: that folder (on a cluster, one every worker mounts);
* an fsspec URL (``s3://…``, ``gs://…``, ``memory://…``, ``file://…``): Prefect's RemoteFileSystem;
* ``block-type/name``: a storage block saved on the Prefect server (e.g. ``s3-bucket/om-results``).

The form is om's own JSON (``dump_stage_result``/``load_stage_result``, the one place it is defined):
reading a result parses data, it never runs code. Prefect's result records are not used: their
metadata names the serializer to read them with (cloudpickle by default), so a record written by
someone else would choose to be unpickled. A file that does not parse, or that holds another stage's
result, is a miss (the stage is computed again); records of the pickled form are never opened.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from om_core.store.private_files import private_dir, write_private
from om_core.settings import Settings

_BLOCK_SLUG = re.compile(r"^[a-z0-9-]+/[A-Za-z0-9_.-]+$")
STAGE_RESULT_FORMAT = "om-stage-result/1"
_SUFFIX = ".json"  # results of the pickled form were named by the bare stage key: never read


def stage_result_storage(settings: Settings, db_path: str) -> Path | str:
    """A result storage for stage results: a local path, or the slug of a saved Prefect storage block."""
    where = settings.resultStorage
    if not where:
        return Path(f"{db_path}.stage-results").resolve()
    if "://" in where:
        # Prefect takes remote storage as a saved block: save one named after the URL (idempotent)
        import hashlib

        from prefect.filesystems import RemoteFileSystem

        name = "om-stage-results-" + hashlib.sha256(where.encode()).hexdigest()[:12]
        RemoteFileSystem(basepath=where).save(name, overwrite=True)
        return f"remote-file-system/{name}"
    if _BLOCK_SLUG.match(where) and not Path(where).exists():
        return where  # Prefect loads the saved block by its slug
    return Path(where).expanduser().resolve()


# ------------------------------------------------------------------ the format


def _adapters() -> tuple[TypeAdapter, dict[str, Any]]:
    from om_core.workers.stage_kinds import STAGES, StageOutcome

    return TypeAdapter(StageOutcome), {kind: stage.payload for kind, stage in STAGES.items()}


def stage_result_name(stage_key: str) -> str:
    """The file (or object) a stage key's result is kept in."""
    return stage_key + _SUFFIX


def dump_stage_result(prepared: Any, computed: Any) -> bytes:
    """A computed stage (PreparedStage, ComputedStage) as JSON: the format's name, the stage key, the
    outcome with its model calls, and the accepted payload."""
    outcome, _ = _adapters()
    payload = computed.payload
    return json.dumps({"format": STAGE_RESULT_FORMAT, "stage_key": prepared.stage_key,
                       "outcome": outcome.dump_python(computed.outcome, mode="json"),
                       "payload": None if payload is None else payload.model_dump(mode="json")},
                      ensure_ascii=False, separators=(",", ":")).encode()


def load_stage_result(prepared: Any, data: bytes) -> Any:
    """The ComputedStage kept in ``data`` for ``prepared``'s stage key, or None (a miss) when ``data`` is
    not this format, not this stage's result, or does not validate."""
    from om_core.workers.stages import ComputedStage

    outcome_type, payloads = _adapters()
    try:
        found = json.loads(data)
        if not isinstance(found, dict) or found.get("format") != STAGE_RESULT_FORMAT:
            return None
        if found.get("stage_key") != prepared.stage_key:
            return None
        outcome = outcome_type.validate_python(found.get("outcome"))
        if outcome.stage != prepared.request.stage or outcome.stage_key != prepared.stage_key:
            return None
        raw = found.get("payload")
        payload = None if raw is None else payloads[outcome.stage].model_validate(raw)
    except (ValueError, TypeError, KeyError, RecursionError, ValidationError):
        return None
    return ComputedStage(outcome, payload)


# ------------------------------------------------------------------ the storage


class PrefectStageResults:
    """Exactly-once for a flow run (om_core.replay.stage_runner.StageResults): a computed stage is
    written to the result storage under its stage key, as soon as it is computed, and found there
    again by a rerun, also on another worker of a cluster. A local folder is written directly (this
    user's only); remote storage through its Prefect storage block."""

    def __init__(self, storage: Path | str) -> None:
        self.storage = storage
        self._block = None

    @property
    def block(self):  # noqa: ANN201 - a Prefect WritableFileSystem, resolved where the task runs
        if self._block is None:
            from prefect.results import resolve_result_storage

            self._block = resolve_result_storage(self.storage, _sync=True)
        return self._block

    def _read(self, name: str) -> bytes | None:
        if isinstance(self.storage, Path):
            try:
                return (self.storage / name).read_bytes()
            except FileNotFoundError:
                return None
        try:
            return self.block.read_path(name, _sync=True)
        except Exception:  # missing (each filesystem says so its own way) or unreadable: a miss, as Prefect's own
            return None

    def _write(self, name: str, data: bytes) -> None:
        if isinstance(self.storage, Path):
            private_dir(self.storage)
            write_private(self.storage / name, data)
            return
        self.block.write_path(name, data, _sync=True)

    def get(self, prepared):  # noqa: ANN001, ANN201 - PreparedStage -> ComputedStage | None
        data = self._read(stage_result_name(prepared.stage_key))
        return None if data is None else load_stage_result(prepared, data)

    def put(self, prepared, computed) -> None:  # noqa: ANN001 - PreparedStage, ComputedStage
        self._write(stage_result_name(prepared.stage_key), dump_stage_result(prepared, computed))

    def forget(self, stage_keys: list[str]) -> int:
        """Delete the kept results of stages whose records are committed (nothing asks for them again),
        so that the storage holds only what an interrupted run left: ~7 KB a stage otherwise, forever.
        A local folder only: a remote storage block keeps them (its bucket's lifecycle rules can expire
        them). Returns how many were deleted."""
        if not isinstance(self.storage, Path):
            return 0
        gone = 0
        for key in stage_keys:
            try:
                (self.storage / stage_result_name(key)).unlink()
                gone += 1
            except FileNotFoundError:
                pass
        return gone

    def tidy(self) -> None:
        """Remove a local folder the run's commits left empty (the next stage to keep a result makes it
        again): no empty ``<db>.stage-results`` beside the database after a run."""
        if isinstance(self.storage, Path):
            try:
                self.storage.rmdir()
            except OSError:  # not empty (an interrupted run's results wait for its rerun), or gone
                pass
