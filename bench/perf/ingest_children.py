"""What the ingest bench (bench/perf/ingest.py) runs in a fresh interpreter, each printing its figures
as one JSON line: one file's ingest with its peak memory, the ingest with timing wrappers around its
internals, and the CPU of one job (om's ingest or DuckDB's read_json_auto)."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path


def _vm_hwm_kb() -> int | None:
    """Peak RSS of this process image (VmHWM, Linux); unlike ru_maxrss it does not inherit the parent's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak seen afterwards is the ingest's own."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _rss_kb() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def child_ingest(file: str, db: str) -> None:
    """Runs in a fresh interpreter: ingest one file, print RSS figures (KiB) as JSON.

    After the imports and the tokenizer load, the peak counter is reset to the current RSS; the peak
    read after the ingest is then what the ingest itself needed. ru_maxrss is reported as well, but on
    Linux a child's ru_maxrss starts at its parent's RSS (it survives fork/exec), so it is only an upper
    bound here.
    """
    from om_core.ingest import ingest
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace
    from om_core.pi.tokens import get_encoding

    get_encoding()
    start = _rss_kb()
    reset = _reset_hwm()
    t0 = time.perf_counter()
    report = ingest(Workspace.open(db, settings=Settings()), [file])
    seconds = time.perf_counter() - t0
    print(json.dumps({"rss_start_kb": start, "peak_kb": _vm_hwm_kb() if reset else None,
                      "ru_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "rss_end_kb": _rss_kb(),
                      "seconds": seconds, "entries": report.entries_added,
                      "bytes": sum(f.bytes_read for f in report.files)}))


def child_breakdown(archive: str, db: str) -> None:
    """Runs in a fresh interpreter: ingest with timing wrappers around the ingest's internals.

    Nothing in om_core is edited; functions are wrapped in this process only. Names that no longer
    exist are skipped. The calling thread (database work), the reader thread (parsing) and the
    tokenizer threads run at the same time, so the parts do not add up to the wall time; the
    process's CPU time is shown as well.
    """
    import hashlib
    import threading
    from collections import defaultdict

    import om_core.store.db as dbmod
    import om_core.ingest as ing
    from om_core.settings import Settings
    from om_core.store.workspace import Workspace
    import om_core.pi.tokens as tok
    from om_core.ingest import file_ingest, files as ing_files, read_ahead, reader as ing_reader, writer as ing_writer
    from om_core.pi.tokens import get_encoding

    get_encoding()
    totals: dict[str, float] = defaultdict(float)
    lock = threading.Lock()

    def add(label: str, seconds: float) -> None:
        with lock:
            totals[label] += seconds

    def timed(owner: object, name: str, label: str) -> None:
        orig = getattr(owner, name, None)
        if orig is None:
            return

        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                add(label, time.perf_counter() - t)

        setattr(owner, name, wrapper)

    if hasattr(tok, "_make_counter"):
        make = tok._make_counter

        def make_timed(enc):
            count = make(enc)

            def counted(texts):
                t, c = time.perf_counter(), time.thread_time()
                try:
                    return count(texts)
                finally:
                    who = "tokenizer threads" if threading.current_thread().name.startswith("om-tokens") \
                        else "small batches, counted by the calling thread"
                    add(f"{who}: counting, wall", time.perf_counter() - t)
                    add(f"{who}: counting, CPU", time.thread_time() - c)

            return counted

        tok._make_counter = make_timed
    else:
        timed(ing_reader, "count_tokens", "count_tokens (tiktoken)")
    timed(ing_reader.SessionParser, "feed", "reader thread: SessionParser.feed (json + Pi estimate)")
    timed(ing_reader.FileReader, "parse_some", "reader thread: read + parse + hash + count_tokens calls")
    timed(read_ahead.ReadAhead, "take", "main: wait for the reader thread to plan the next file")
    timed(read_ahead.ReadAhead, "next_event", "main: wait for the reader thread's next batch")
    timed(ing_writer.BatchWriter, "flush", "main: insert batches (wait for counts, arrow, INSERT, chunk COMMIT)")
    if hasattr(tok, "TokenCounts"):
        timed(tok.TokenCounts, "result", "main: wait for token counts")
    timed(ing_writer.pa, "table", "pyarrow.table")
    timed(file_ingest.FileIngest, "_finish_session", "main: _finish_session (tree, branches, ledger, session row)")

    class _Hash:
        def __init__(self) -> None:
            self.h = hashlib.sha256()

        def update(self, data: bytes) -> None:
            t = time.perf_counter()
            self.h.update(data)
            add("reader thread: sha256 of the lines read (prefix hash)", time.perf_counter() - t)

        def hexdigest(self) -> str:
            return self.h.hexdigest()

        def copy(self) -> "_Hash":
            twin = _Hash.__new__(_Hash)
            twin.h = self.h.copy()
            return twin

    ing_reader.hashlib = ing_files.hashlib = type("hashlib_timed", (), {"sha256": staticmethod(_Hash)})

    class _Con:
        """The ingest's connection, with its COMMITs timed."""

        def __init__(self, con) -> None:
            self._con = con

        def execute(self, sql, *a, **k):
            if not (isinstance(sql, str) and sql.lstrip().upper().startswith("COMMIT")):
                return self._con.execute(sql, *a, **k)
            t = time.perf_counter()
            try:
                return self._con.execute(sql, *a, **k)
            finally:
                add("main: COMMIT", time.perf_counter() - t)

        def __getattr__(self, name):
            return getattr(self._con, name)

    connect = dbmod.connect
    dbmod.connect = lambda *a, **k: _Con(connect(*a, **k))
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    report = ing.ingest(Workspace.open(db, settings=Settings()), [archive])
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    errors = [f.error for f in report.files if f.error][:3]
    print(json.dumps({"wall": wall, "cpu": cpu, "entries": report.entries_added, "errors": errors, "parts": dict(totals)}))


def child_cpu(kind: str, archive: str, db: str) -> None:
    """Runs in a fresh interpreter: one job on the archive, its CPU (user + system) as JSON: ``om``,
    om's ingest; ``duckdb``, DuckDB's read_json_auto of the same files into a table (the floor a
    reader of these files could reach, without Pi's tree, hashes or token counts)."""
    import duckdb

    files = sorted(str(f) for f in Path(archive).rglob("*.jsonl"))
    if kind == "om":
        from om_core.ingest import ingest
        from om_core.settings import Settings
        from om_core.store.workspace import Workspace
        from om_core.pi.tokens import get_encoding

        get_encoding()  # loading the encoding is not ingest work
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    if kind == "om":
        ingest(Workspace.open(db, settings=Settings()), [archive])
    else:
        con = duckdb.connect(db)
        con.execute("CREATE TABLE lines AS SELECT * FROM read_json_auto(?, format = 'newline_delimited', "
                    "union_by_name = true, maximum_object_size = 268435456)", [files])
        con.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"cpu": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}))
