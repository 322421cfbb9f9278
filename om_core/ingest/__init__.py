"""Lossless, idempotent, incremental ingest of Pi session files into DuckDB.

The modules, in the order a file goes through them:
* ``files``: which files, their sizes and prefix hashes, their ``session_files`` rows;
* ``plan``: what to read of each (new, appended, rewritten, unchanged);
* ``reader``: lines through Pi's parser into batches of entries and quarantined lines;
* ``read_ahead``: the thread that plans and reads ahead of the writer, through a ``queue.Queue``;
* ``writer``: the bulk DuckDB writes (entries, quarantine, the tree);
* ``file_ingest``: one file's transaction, from its plan to its ``session_files`` row;
* ``rewrites``: what re-reading a rewritten file took away (entries, the evidence of memory records);
* ``runner``: ``ingest()``, many files in one run (``connection``: its write connection);
* ``reports``: what the caller gets back.
"""

from om_core.ingest.files import discover, total_bytes
from om_core.ingest.reader import ProgressFn
from om_core.ingest.reports import FileReport, IngestReport
from om_core.ingest.runner import ingest
from om_core.ingest.writer import store_tree

__all__ = ["FileReport", "IngestReport", "ProgressFn", "discover", "ingest", "store_tree", "total_bytes"]
