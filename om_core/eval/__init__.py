"""`om eval longmemeval`: how well a reader answers from memory after its history was compacted.

* ``data``: the public LongMemEval JSON, validated instance by instance (bad ones are reported and
  skipped).
* ``haystack``: one instance's haystack as one Pi session file (v3, date order, no labels).
* ``conditions``: what the reader is sent under ``om``, ``oracle``, ``native`` and ``full``.
* ``reader``: the reader (optionally with a ``recall`` tool over the ledger) and the approximate judge.
* ``results``: the per-condition files in ``--out`` (official hypotheses JSONL, judgements), resumable.
* ``report``: per-type scores, tokens, cost and time (from ``llm_calls``), ``report.json`` and HTML.
* ``run``: the run itself, instances in parallel on a thread pool, model calls under one limit.

The library's integration points are few: the ingest and the one replay path
(``om_core.replay.engine.replay_session``) in ``run``, the final compaction in ``conditions.om_memory``,
and ``run.open_database``.
"""
