-- Which process owns a run, so a run whose process ended without finishing (kill -9, a crash) is
-- marked when the database is next opened for a run, instead of staying 'running' for good.
-- stage_results is no longer needed by the pipeline (Prefect's result storage keeps computed stage
-- results); commands keep using it.
ALTER TABLE runs ADD COLUMN pid INTEGER;
ALTER TABLE runs ADD COLUMN host VARCHAR;
-- The helper processes a run started (Prefect's local API server, a local Dask cluster): after a
-- kill -9 of the run, the next run's start ends those still alive.
ALTER TABLE runs ADD COLUMN child_pids INTEGER[];

-- What each session's last complete replay started from (its rows, the settings, the model): a run
-- skips sessions that have not changed since, so a rerun of a finished archive does nothing, fast.
CREATE TABLE session_replays (
    session_id   VARCHAR PRIMARY KEY,
    fingerprint  VARCHAR NOT NULL,
    run_id       VARCHAR,
    replayed_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);
