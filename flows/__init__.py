"""Prefect flows that orchestrate om_core: ingest, replay, workers, compaction."""
