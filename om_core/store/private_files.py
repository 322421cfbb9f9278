"""Files om creates are this user's only: the database and its WAL, the writer lock, the endpoint file,
the stage-result folder, the Prefect home om starts a server in.

``use_private_umask()`` is called where om's processes start (the CLI, ``python -m deployments``, a
flow run), never at import: every file created after it, by om or by DuckDB and Prefect on om's
behalf, is 0600 and every folder 0700. The helpers here give the same modes explicitly where om
itself creates the file, so they hold whatever umask a caller of the library has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

PRIVATE_UMASK = 0o077


def use_private_umask() -> None:
    """This process creates files for this user only (0600) and folders 0700."""
    os.umask(os.umask(PRIVATE_UMASK) | PRIVATE_UMASK)


def private_dir(path: Path) -> Path:
    """``path`` as a folder, created 0700 (with its missing parents) when it does not exist."""
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def write_private(path: Path, data: bytes) -> None:
    """``data`` in ``path`` (mode 0600), whole or not at all: a reader sees the old file or the new one."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def readable_by_others(path: Path) -> bool:
    try:
        return bool(path.stat().st_mode & 0o077)
    except OSError:
        return False


def _work_tree(path: Path) -> Path | None:
    """The git work tree holding ``path`` (a folder with ``.git``, up from the file's folder), or None."""
    for folder in [path.parent, *path.parent.parents]:
        if (folder / ".git").exists():
            return folder
    return None


def unignored_in_git(path: Path) -> Path | None:
    """The git work tree that holds ``path`` without ignoring it (one ``git add .`` from a commit), or
    None. Costs a few stat calls, and one ``git check-ignore`` only inside a work tree."""
    path = Path(path).absolute()
    tree = _work_tree(path)
    if tree is None or shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(["git", "-C", str(tree), "check-ignore", "-q", "--", str(path)],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    # 0: ignored; 1: not ignored; 128: not a work tree after all (a stray .git), or git failed
    return tree if done.returncode == 1 else None


def exposure_warnings(db_path: Path) -> list[str]:
    """What would let others read the database: a git work tree that does not ignore it, a file others
    can read (made by an older om, or by hand)."""
    lines = []
    tree = unignored_in_git(db_path)
    if tree is not None:
        lines.append(f"the database {db_path} is inside the git work tree {tree}, which does not ignore it: "
                     f"one `git add .` would commit whole sessions; add it to .gitignore or move it (--db, OM_DB)")
    if readable_by_others(db_path):
        lines.append(f"the database {db_path} can be read by other users (mode "
                     f"{db_path.stat().st_mode & 0o777:04o}): chmod 600 it and its .wal")
    return lines
