"""``ingest()``: many files in one run, the reader thread parsing ahead of the writer.

A reader thread (``read_ahead``) plans the files and parses them into batches, up to
``READ_AHEAD_BYTES`` ahead, their token counts already started. The calling thread does all the
database work: it inserts batches as their counts come in, commits every ``COMMIT_BYTES`` and
finishes each session (``file_ingest``), while the reader and the tokenizer threads are already on
the next files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from om_core.store import db as dbmod
from om_core.errors import OmError, StorageError, storage_error
from om_core.ingest.connection import WriteConnection
from om_core.ingest.file_ingest import FileIngest
from om_core.ingest.files import discover
from om_core.ingest.read_ahead import ReadAhead
from om_core.ingest.reader import ProgressFn
from om_core.ingest.reports import FileReport, IngestReport
from om_core.ingest.projects import record_session_projects
from om_core.store.runs import finish_run, start_run
from om_core.store.search_index import refresh_search_index
from om_core.recall.vectors import Embedder, refresh_vectors
from om_core.pi.tokens import DEFAULT_ENCODING

if TYPE_CHECKING:
    from om_core.store.workspace import Workspace


def ingest(
    ws: Workspace,
    paths: Iterable[str | os.PathLike],
    *,
    progress: ProgressFn | None = None,
    encoding: str = DEFAULT_ENCODING,
    threads: int = 2,
    command: str = "ingest",
    exclude: Iterable[str] = (),
    index: bool = True,
) -> IngestReport:
    """Ingest files and directories into the workspace's database; ``exclude``: globs that leave out
    files a directory walk finds (``discover``). ``index`` False leaves the search index to the caller
    (``om_core.recall.search.refresh_session_index``: the live endpoint updates it after its reply).

    On the user's file the ingest holds a write connection of its own, with a memory limit, and lets
    it go between files every few seconds so a waiting reader can take the file; on a workspace
    around an open connection (a command's step, a test) it writes through that connection.
    One bad file never stops the others; its error is in the report.
    """
    projects = ws.settings.projects
    model = None
    if index and ws.settings.recallEmbeddings:  # the writers embed what they index (recall by meaning)
        from om_core.recall.vectors import embedder

        model = embedder()
    if ws.has_file:
        return _ingest(ws.path, paths, progress, encoding, threads, command, exclude, projects, model, index)
    with ws.write() as con:
        return _ingest(con, paths, progress, encoding, threads, command, exclude, projects, model, index)


def _ingest(db: Path | duckdb.DuckDBPyConnection, paths: Iterable[str | os.PathLike], progress: ProgressFn | None,
            encoding: str, threads: int, command: str, exclude: Iterable[str],
            projects: Mapping[str, str], model: Embedder | None = None, index: bool = True) -> IngestReport:
    started = time.monotonic()
    paths = list(paths)
    files, missing = discover(paths, exclude)
    named = {Path(p).resolve() for p in paths if Path(p).is_file()}
    run_id = dbmod.new_run_id()
    report = IngestReport(run_id=run_id, missing_paths=missing)
    where = None if isinstance(db, duckdb.DuckDBPyConnection) else db
    try:
        return _ingest_files(db, files, named, report, started, progress, encoding, threads, command, projects,
                             model, index)
    except Exception as exc:
        # A write error of the storage ends the ingest: every later file would fail the same way.
        stored = storage_error(exc, where)
        if stored is None:
            raise
        kept = sum(1 for f in report.files if not f.error)
        raise StorageError(f"{stored} (ingest stopped; {kept} file(s) before it are stored and readable)") from None


def _ingest_files(db, files: list[Path], named: set[Path], report: IngestReport, started: float,
                  progress: ProgressFn | None, encoding: str, threads: int, command: str,
                  projects: Mapping[str, str], model: Embedder | None, index: bool = True) -> IngestReport:
    run_id = report.run_id
    holder = WriteConnection(db)
    ahead: ReadAhead | None = None
    failed = False
    try:
        start_run(holder.con, run_id, command, {"paths": [str(p) for p in files]})
        ahead = ReadAhead(holder, files, progress, encoding, threads)
        for index, path in enumerate(files):
            con = holder.breathe()
            make_room = holder.make_room if holder.memory_limit is not None else None
            prepared = ahead.take(index)
            try:
                try:
                    result = FileIngest(con, path, run_id, progress, encoding, threads, make_room,
                                        prepared, walked=path not in named).run()
                except duckdb.OutOfMemoryException:
                    if not holder.after_out_of_memory():
                        raise
                    result = FileIngest(con, path, run_id, progress, encoding, threads, make_room,
                                        walked=path not in named).run()
                report.files.append(result)
            except OmError:
                raise
            except Exception as exc:  # a bad file is reported, never fatal to the rest
                if storage_error(exc) is not None:
                    raise  # but a full disk is fatal to all
                report.files.append(FileReport(path=str(path), status="error",
                                               error=f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
        # what the run's sessions are now: each new session's project (its cwd read once, here) and the
        # search index of what this ingest added or took away
        con = holder.breathe()
        touched = sorted({f.session_id for f in report.files if f.session_id})
        with dbmod.transaction(con):  # only this ingest's sessions: a concurrent one (the endpoint's) has its own
            record_session_projects(con, projects, touched)
        try:
            if index:
                with dbmod.transaction(con):
                    refresh_search_index(con, touched)
                    if model is not None:
                        refresh_vectors(con, model)
        except duckdb.Error as exc:  # the index is derived: what the ingest stored stays, a search catches up
            if storage_error(exc) is not None:
                raise
            report.index_error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
        report.seconds = time.monotonic() - started
        status = "failed" if any(f.error for f in report.files) else "ok"
        finish_run(holder.con, run_id, status, report.summary())
    except BaseException:
        failed = True
        raise
    finally:
        if ahead is not None:
            ahead.close()
        try:
            holder.close()  # may checkpoint: a full disk can fail here too
        except Exception:
            if not failed:
                raise
    return report
