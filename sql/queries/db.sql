-- om's bookkeeping lives in om_internal with its tables (migration 008). A database written before
-- 008 has it in main: it moves over before the migrations run (adopt_bookkeeping_in_main).

-- name: create_internal_schema
CREATE SCHEMA IF NOT EXISTS om_internal;

-- name: create_schema_migrations
CREATE TABLE IF NOT EXISTS om_internal.schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        VARCHAR NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- name: create_om_meta
CREATE TABLE IF NOT EXISTS om_internal.om_meta (
    key    VARCHAR PRIMARY KEY,
    value  VARCHAR NOT NULL
);

-- name: bookkeeping_in_main
SELECT count(*) > 0 FROM duckdb_tables()
WHERE database_name = current_database() AND schema_name = 'main' AND table_name = 'schema_migrations'
  AND NOT temporary;

-- name: adopt_bookkeeping_in_main
INSERT INTO om_internal.schema_migrations BY NAME SELECT * FROM main.schema_migrations;
INSERT INTO om_internal.om_meta BY NAME SELECT * FROM main.om_meta;
DROP TABLE main.schema_migrations;
DROP TABLE main.om_meta;

-- A new database is a copy of a template built once per process from the schema snapshot
-- (om_core.store.db): an in-memory one copies it with COPY FROM DATABASE, which copies catalog entries as
-- they are instead of parsing and binding the snapshot, views and macros again.

-- name: attach_template
ATTACH $path AS om_template (READ_ONLY);

-- name: copy_template_to_memory
COPY FROM DATABASE om_template TO memory;

-- name: detach_template
DETACH om_template;

-- name: applied_migrations
SELECT version FROM om_internal.schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO om_internal.schema_migrations (version, name) VALUES ($version, $name);

-- name: get_meta
SELECT value FROM om_internal.om_meta WHERE key = $key;

-- name: set_meta
INSERT OR REPLACE INTO om_internal.om_meta (key, value) VALUES ($key, $value);

-- name: internal_table_exists
SELECT count(*) > 0 FROM duckdb_tables()
WHERE database_name = current_database() AND schema_name = 'om_internal' AND table_name = $name
  AND NOT temporary;

-- name: table_exists
-- In any schema: an om database before migration 008 has its tables in main.
SELECT count(*) > 0 FROM duckdb_tables() WHERE table_name = $name AND NOT temporary;

-- name: user_table_count
SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND NOT internal;

-- name: start_run
INSERT INTO om_internal.runs (run_id, command, status, detail, pid, host, child_pids)
VALUES ($run_id, $command, 'running', $detail, $pid, $host, $child_pids);

-- name: running_runs
SELECT run_id, pid, host, child_pids FROM om_internal.runs WHERE status = 'running';

-- name: mark_run_abandoned
-- A run whose process is gone: it stopped without finishing (what it committed stays).
UPDATE om_internal.runs SET status = 'abandoned', finished_at = coalesce(finished_at, current_timestamp)
WHERE run_id = $run_id AND status = 'running';

-- name: finish_unwritten_run
-- A run's end its own process could not write (a full disk), written by the next run's start.
UPDATE om_internal.runs SET finished_at = coalesce(finished_at, current_timestamp), status = $status, detail = $detail
WHERE run_id = $run_id AND status = 'running';

-- name: finish_run
-- The outcome's detail added to the start's (its targets and model stay: om status names the model of a
-- session's last replay).
UPDATE om_internal.runs SET finished_at = current_timestamp, status = $status,
       detail = json_merge_patch(coalesce(detail, '{}'::JSON), $detail::JSON)
WHERE run_id = $run_id;

-- Migration 004's data step (om_core/store/migrations.py), frozen: the schema as it was at 004 (before
-- migration 008 om's tables are in main, so these name them unqualified).

-- name: m004_sessions_without_tree
SELECT session_id FROM sessions WHERE session_id NOT IN (SELECT session_id FROM entry_tree) ORDER BY session_id;

-- name: m004_session_entries
SELECT entry_id, parent_id, line_no FROM entries WHERE session_id = $session_id ORDER BY line_no;

-- name: m004_insert_entry_tree
-- One row per entry from parallel lists (unnest in one SELECT zips them).
INSERT INTO entry_tree (session_id, entry_id, depth, pre, last, is_leaf)
SELECT $session_id, unnest($entry_id::VARCHAR[]), unnest($depth::INTEGER[]), unnest($pre::INTEGER[]),
       unnest($last::INTEGER[]), unnest($is_leaf::BOOLEAN[]);
