"""Every SQL statement lives in ``sql/``; this module finds and loads it.

* ``sql/schema/current.sql``: the schema as it stands, which builds every new database.
* ``sql/migrations/NNN_name.sql``: schema changes, applied once each, in order, and recorded; they
  upgrade a database that already exists.
* ``sql/views/NNN_name.sql``: views and macros, re-created whenever their text changes.
* ``sql/queries/*.sql``: named statements (``-- name: x`` starts statement ``x``) used by Python.
* ``sql/queries/tables/*.sql``: one statement each, the same for several tables: ``{table}`` stands for
  a table of ``om_internal``, named by a member of an enum (``table_query``), never by input.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from functools import cache
from pathlib import Path

_NAME = re.compile(r"^--\s*name:\s*([A-Za-z0-9_]+)\s*$", re.MULTILINE)
_TABLE = re.compile(r"^[a-z_]+$")


@cache
def sql_dir() -> Path:
    """``om_core/sql`` in an installed wheel, else the ``sql/`` folder of the source tree."""
    here = Path(__file__).resolve().parent  # om_core/store
    for candidate in (here.parent / "sql", here.parents[1] / "sql"):
        if (candidate / "migrations").is_dir():
            return candidate
    raise FileNotFoundError(f"the sql/ folder was not found next to {here}")


@cache
def migrations() -> tuple[tuple[int, str, str], ...]:
    """(version, name, script) for every migration, in version order."""
    out = []
    for path in sorted((sql_dir() / "migrations").glob("*.sql")):
        number, _, name = path.stem.partition("_")
        out.append((int(number), name, path.read_text()))
    return tuple(out)


@cache
def schema_snapshot() -> str:
    """The script that creates every table and sequence of a new database (the schema as it stands)."""
    return (sql_dir() / "schema" / "current.sql").read_text()


@cache
def view_scripts() -> tuple[tuple[str, str], ...]:
    return tuple((p.stem, p.read_text()) for p in sorted((sql_dir() / "views").glob("*.sql")))


@cache
def views_fingerprint() -> str:
    """Changes with the views' text and with the schema under them (a view of ``SELECT *`` is
    bound to its table's columns when it is created)."""
    digest = hashlib.sha256()
    for version, name, _ in migrations():
        digest.update(f"{version}:{name}".encode() + b"\0")
    for name, script in view_scripts():
        digest.update(name.encode() + b"\0" + script.encode() + b"\0")
    return digest.hexdigest()[:16]


@cache
def _queries() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted((sql_dir() / "queries").glob("*.sql")):
        text = path.read_text()
        marks = list(_NAME.finditer(text))
        for i, mark in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
            name = mark.group(1)
            if name in found:
                raise ValueError(f"query {name!r} is defined twice (second time in {path.name})")
            found[name] = text[mark.end() : end].strip()
    return found


def query(name: str) -> str:
    """The text of the named statement from ``sql/queries``."""
    try:
        return _queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in {sql_dir() / 'queries'}") from None


@cache
def _table_template(name: str) -> str:
    text = (sql_dir() / "queries" / "tables" / f"{name}.sql").read_text()
    return "\n".join(line for line in text.splitlines() if not line.startswith("--")).strip()


def table_query(template: str, table: StrEnum) -> str:
    """The statement of ``sql/queries/tables/<template>.sql`` for one table of ``om_internal``."""
    if not _TABLE.match(table.value):
        raise ValueError(f"not a table name: {table.value!r}")
    return _table_template(template).replace("{table}", table.value)
