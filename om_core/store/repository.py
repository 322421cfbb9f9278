"""Projects: the repository a session worked in, from its header's ``cwd``.

A session's project is, in this order:
1. ``setting``: the ``projects`` setting maps a folder to a project id; a session whose cwd is that
   folder or below it belongs to that project (the longest such folder wins);
2. ``git_remote``: the remote (``origin`` first) of the git work tree holding cwd, credentials and
   ``.git`` removed (``github.com/acme/app``): clones of one repository are one project;
3. ``git_root``: that work tree's top folder, when it has no remote;
4. ``path``: cwd itself, when no git work tree holds it (or the folder no longer exists).

The filesystem is read once per session, when it is first ingested
(``om_core.ingest.projects.record_session_projects``): the facts found then (cwd, git root, remote)
are kept in ``om_internal.project_sessions``, so a folder deleted later changes nothing, and no read path ever
looks at the disk. Which project a session belongs to follows from those facts and the setting; every
ingest assigns it again (pure, no filesystem), so a changed setting applies to every session.
Git is not run: the work tree is found by its ``.git`` (a folder, or a worktree's file) and the
remote read from the repository's ``config``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import duckdb
from pydantic import BaseModel

from om_core.store.db import named_rows


class ProjectFacts(BaseModel):
    """What the filesystem said about a session's cwd when it was first ingested."""

    cwd: str | None
    git_root: str | None = None
    git_remote: str | None = None


def find_git_root(cwd: str | os.PathLike) -> Path | None:
    """The top folder of the git work tree holding ``cwd`` (its ``.git`` is a folder, or a worktree's or
    submodule's ``gitdir:`` file); None when the folder is gone or no work tree holds it."""
    try:
        here = Path(cwd)
        if not here.is_absolute() or not here.is_dir():
            return None
        here = here.resolve()
    except OSError:
        return None
    for folder in (here, *here.parents):
        marker = folder / ".git"
        try:
            if marker.is_dir() or marker.is_file():
                return folder
        except OSError:
            return None
    return None


def _git_dir(root: Path) -> Path | None:
    """The repository folder whose ``config`` holds the remotes: ``.git``, or for a linked worktree
    the common directory its ``gitdir:`` file leads to."""
    marker = root / ".git"
    if marker.is_dir():
        return marker
    try:
        text = marker.read_text(errors="replace")
    except OSError:
        return None
    match = re.match(r"gitdir:\s*(.+)", text.strip())
    if not match:
        return None
    gitdir = Path(match.group(1).strip())
    gitdir = gitdir if gitdir.is_absolute() else (root / gitdir)
    try:
        common = (gitdir / "commondir").read_text().strip()
        return (gitdir / common).resolve() if not Path(common).is_absolute() else Path(common)
    except OSError:
        return gitdir


_SECTION = re.compile(r'^\s*\[\s*remote\s+"([^"]*)"\s*\]')
_ANY_SECTION = re.compile(r"^\s*\[")
_URL = re.compile(r"^\s*url\s*=\s*(.+?)\s*$", re.IGNORECASE)


def read_remotes(config_text: str) -> dict[str, str]:
    """Remote name -> URL from a git config file's text (the first url of each remote)."""
    remotes: dict[str, str] = {}
    current: str | None = None
    for line in config_text.splitlines():
        section = _SECTION.match(line)
        if section:
            current = section.group(1)
            continue
        if _ANY_SECTION.match(line):
            current = None
            continue
        url = _URL.match(line)
        if current is not None and url and current not in remotes:
            value = url.group(1)
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            remotes[current] = value
    return remotes


def git_remote(root: Path) -> str | None:
    """The work tree's remote URL, ``origin`` first, else the first one configured."""
    gitdir = _git_dir(root)
    if gitdir is None:
        return None
    try:
        remotes = read_remotes((gitdir / "config").read_text(errors="replace"))
    except OSError:
        return None
    if not remotes:
        return None
    return remotes.get("origin") or next(iter(remotes.values()))


_SCP_LIKE = re.compile(r"^(?:[^@/]+@)?([^:/]+):(?!//)(.+)$")  # git@github.com:acme/app.git


def normalise_remote(url: str) -> str:
    """A remote URL as a project id: host and path, lower-case host, no scheme, user, password, port
    or ``.git`` (``https://tok@github.com/Acme/app.git`` and ``git@github.com:Acme/app`` are both
    ``github.com/Acme/app``); a local path stays a path."""
    url = url.strip()
    match = re.match(r"^([a-z][a-z0-9+.-]*)://(.*)$", url, re.IGNORECASE)
    if match:
        scheme, rest = match.group(1).lower(), match.group(2)
        if scheme == "file":
            path = rest
        else:
            host, _, path = rest.partition("/")
            host = host.rsplit("@", 1)[-1]  # credentials never become part of an id
            host = host.split(":", 1)[0].lower()
            path = f"{host}/{path}"
    else:
        scp = _SCP_LIKE.match(url)
        path = f"{scp.group(1).lower()}/{scp.group(2)}" if scp and not url.startswith("/") else url
    path = path.rstrip("/")
    if path.endswith(".git"):
        path = path[:-4]
    return path.rstrip("/") or url


def resolve_facts(cwd: str | None) -> ProjectFacts:
    """Read the filesystem once for a session's cwd (at ingest)."""
    if not cwd:
        return ProjectFacts(cwd=cwd)
    root = find_git_root(cwd)
    if root is None:
        return ProjectFacts(cwd=cwd)
    remote = git_remote(root)
    return ProjectFacts(cwd=cwd, git_root=str(root), git_remote=normalise_remote(remote) if remote else None)


def _within(path: str, folder: str) -> bool:
    p, f = PurePosixPath(path), PurePosixPath(folder.rstrip("/") or "/")
    return p == f or f in p.parents


def project_of(facts: ProjectFacts, overrides: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """(project id, how) for a session's facts and the ``projects`` setting (folder -> project id)."""
    if facts.cwd:
        matches = [folder for folder in (overrides or {}) if _within(facts.cwd, folder)
                   or (facts.git_root is not None and _within(facts.git_root, folder))]
        if matches:
            return (overrides or {})[max(matches, key=len)], "setting"
    if facts.git_remote:
        return facts.git_remote, "git_remote"
    if facts.git_root:
        return facts.git_root, "git_root"
    if facts.cwd:
        return os.path.normpath(facts.cwd), "path"
    return None, "none"


# ------------------------------------------------------------------ reading projects


class ProjectRef(BaseModel):
    project_id: str
    name: str
    sessions: int
    how: str
    git_roots: list[str] = []
    git_remote: str | None = None
    reflections: int = 0  # recorded and not retired
    new_tokens: float = 0  # the project stage's clock


def _ref(row: dict[str, Any]) -> ProjectRef:
    return ProjectRef(project_id=row["project_id"], name=row["name"] or row["project_id"], sessions=row["sessions"],
                      how=row["how"], git_roots=list(row["git_roots"] or []), git_remote=row["git_remote"],
                      reflections=row["reflections"], new_tokens=float(row["new_tokens"] or 0))


def list_projects(con: duckdb.DuckDBPyConnection) -> list[ProjectRef]:
    return [_ref(r) for r in named_rows(con, "list_projects", {})]


def resolve_project(con: duckdb.DuckDBPyConnection, ref: str | os.PathLike | None,
                    overrides: Mapping[str, str] | None = None) -> ProjectRef:
    """The project ``ref`` names: a project id, a unique prefix of one, a project name (its last path
    part) that only one project has, or a folder (the project a session there would belong to: this
    reads the filesystem for that folder, the one read path that does, because it was asked about a
    path). None: the current directory."""
    from om_core.errors import InvalidArgument, SessionNotFound

    projects = list_projects(con)
    if not projects:
        raise SessionNotFound("no ingested session names a working folder, so there is no project yet")
    text = os.fspath(ref) if ref is not None else None
    if text is not None:
        exact = [p for p in projects if p.project_id == text]
        if exact:
            return exact[0]
    if text is not None and not (os.path.isabs(text) or text.startswith(".") or os.path.isdir(text)):
        found = [p for p in projects if p.project_id.startswith(text)] or [p for p in projects if p.name == text]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise InvalidArgument(f"{text!r} names several projects: {', '.join(p.project_id for p in found[:5])}; "
                                  "give the project id")
        raise SessionNotFound(f"no project {text!r} (om project --list shows them)")
    folder = os.path.abspath(text or os.getcwd())
    wanted, _ = project_of(resolve_facts(folder), overrides)
    for p in projects:
        if p.project_id == wanted:
            return p
    # a folder inside a project's sessions' folders, when the folder itself has no git work tree
    inside = [p for p in projects if any(_within(folder, root) for root in p.git_roots)]
    if len(inside) == 1:
        return inside[0]
    raise SessionNotFound(f"no ingested session worked in project {wanted or folder!r} (om project --list shows "
                          "the projects)")
