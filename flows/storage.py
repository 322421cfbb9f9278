"""Where stage results are kept (exactly-once across runs, machines and lost workers).

The ``resultStorage`` setting names it:
* unset: a folder next to the database (``<db>.stage-results``), right for runs on one machine;
* a path: that folder (on a cluster, one every worker mounts);
* an fsspec URL (``s3://…``, ``gs://…``, ``memory://…``, ``file://…``): Prefect's RemoteFileSystem;
* ``block-type/name``: a storage block saved on the Prefect server (e.g. ``s3-bucket/om-results``).
"""

from __future__ import annotations

import re
from pathlib import Path
from om_core.settings import Settings

_BLOCK_SLUG = re.compile(r"^[a-z0-9-]+/[A-Za-z0-9_.-]+$")


def describe_result_storage(settings: Settings, db_path: str) -> str:
    return settings.resultStorage or str(Path(f"{db_path}.stage-results"))


def stage_result_storage(settings: Settings, db_path: str) -> Path | str:
    """A Prefect result storage for stage results: a local path, or the slug of a saved block."""
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


def is_shared_storage(settings: Settings) -> bool:
    """Whether workers on other machines can reach the stage results (a cluster needs that)."""
    return bool(settings.resultStorage)


class PrefectStageResults:
    """Exactly-once for a flow run (om_core.replay.stage_runner.StageResults): a computed stage is
    written to Prefect's result storage under its stage key, as soon as it is computed, and found
    there again by a rerun, also on another worker of a cluster."""

    def __init__(self, storage: Path | str) -> None:
        self.storage = storage
        self._store = None

    @property
    def store(self):  # noqa: ANN201 - a Prefect ResultStore, resolved where the task runs
        if self._store is None:
            from prefect.results import ResultStore, resolve_result_storage

            self._store = ResultStore(result_storage=resolve_result_storage(self.storage, _sync=True),
                                      cache_result_in_memory=False)
        return self._store

    def get(self, prepared):  # noqa: ANN001, ANN201 - PreparedStage -> ComputedStage | None
        if not self.store.exists(prepared.stage_key):
            return None
        return self.store.read(prepared.stage_key).result

    def put(self, prepared, computed) -> None:  # noqa: ANN001 - PreparedStage, ComputedStage
        self.store.write(computed, key=prepared.stage_key)
