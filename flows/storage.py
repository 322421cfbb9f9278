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
from typing import Any

from om_core.settings import Settings

_BLOCK_SLUG = re.compile(r"^[a-z0-9-]+/[A-Za-z0-9_.-]+$")


def describe_result_storage(settings: Settings, db_path: str) -> str:
    return settings.resultStorage or str(Path(f"{db_path}.stage-results"))


def stage_result_storage(settings: Settings, db_path: str) -> Any:
    """A Prefect result storage for stage results (a block, or a block's slug)."""
    from prefect.filesystems import LocalFileSystem, RemoteFileSystem

    where = settings.resultStorage
    if not where:
        return LocalFileSystem(basepath=str(Path(f"{db_path}.stage-results").resolve()))
    if "://" in where:
        return RemoteFileSystem(basepath=where)
    if _BLOCK_SLUG.match(where) and not Path(where).exists():
        return where  # Prefect loads the saved block by its slug
    return LocalFileSystem(basepath=str(Path(where).expanduser().resolve()))


def is_shared_storage(settings: Settings) -> bool:
    """Whether workers on other machines can reach the stage results (a cluster needs that)."""
    return bool(settings.resultStorage)
