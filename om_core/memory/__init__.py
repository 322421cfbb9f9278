"""Memory from the ledger (SPEC §3-§5, §7, §10): the fold and its projections as the SQL computes them, the compaction summary's rendering, the progress clocks, gaps and a branch's status."""
