"""The replay: how om lives an archived session the way the extension would have (SPEC §9).

* ``plan``: what a run will do, decided once before anything starts (targets, ingest, due sessions
  and their fingerprints);
* ``payload``: a session's rows as a unit of work that needs no database file, loaded into a
  task-local in-memory database, and the rows a replay appended, committed by the one writer;
* ``branch``: the events of a branch and the stages and compactions due at each;
* ``compaction``: a simulated compaction (the compaction projection, stored as the extension would).
"""
