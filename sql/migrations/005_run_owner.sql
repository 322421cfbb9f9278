-- Which process owns a run, so a run whose process ended without finishing (kill -9, a crash) is
-- marked when the database is next opened for a run, instead of staying 'running' for good.
-- stage_results is no longer needed by the pipeline (Prefect's result storage keeps computed stage
-- results); commands keep using it.
ALTER TABLE runs ADD COLUMN pid INTEGER;
ALTER TABLE runs ADD COLUMN host VARCHAR;
