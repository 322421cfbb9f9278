-- name: create_schema_migrations
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     INTEGER PRIMARY KEY,
    name        VARCHAR NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT current_timestamp
);

-- name: create_om_meta
CREATE TABLE IF NOT EXISTS om_meta (
    key    VARCHAR PRIMARY KEY,
    value  VARCHAR NOT NULL
);

-- name: applied_migrations
SELECT version FROM schema_migrations ORDER BY version;

-- name: record_migration
INSERT INTO schema_migrations (version, name) VALUES ($version, $name);

-- name: get_meta
SELECT value FROM om_meta WHERE key = $key;

-- name: set_meta
INSERT OR REPLACE INTO om_meta (key, value) VALUES ($key, $value);

-- name: table_exists
SELECT count(*) > 0 FROM duckdb_tables() WHERE table_name = $name AND NOT temporary;

-- name: user_table_count
SELECT count(*) FROM duckdb_tables() WHERE NOT temporary AND NOT internal;

-- name: start_run
INSERT INTO runs (run_id, command, status, detail, pid, host)
VALUES ($run_id, $command, 'running', $detail, $pid, $host);

-- name: running_runs
SELECT run_id, pid, host, child_pids FROM runs WHERE status = 'running';

-- name: mark_run_abandoned
-- A run whose process is gone: it stopped without finishing (what it committed stays).
UPDATE runs SET status = 'abandoned', finished_at = coalesce(finished_at, current_timestamp)
WHERE run_id = $run_id AND status = 'running';

-- name: finish_run
UPDATE runs SET finished_at = current_timestamp, status = $status, detail = $detail WHERE run_id = $run_id;

-- Migration 004's data step (om_core/migrations.py), frozen: the schema as it was at 004.

-- name: m004_sessions_without_tree
SELECT session_id FROM sessions WHERE session_id NOT IN (SELECT session_id FROM entry_tree) ORDER BY session_id;

-- name: m004_session_entries
SELECT entry_id, parent_id, line_no FROM entries WHERE session_id = $session_id ORDER BY line_no;

-- name: m004_insert_entry_tree
-- One row per entry from parallel lists (unnest in one SELECT zips them).
INSERT INTO entry_tree (session_id, entry_id, depth, pre, last, is_leaf)
SELECT $session_id, unnest($entry_id::VARCHAR[]), unnest($depth::INTEGER[]), unnest($pre::INTEGER[]),
       unnest($last::INTEGER[]), unnest($is_leaf::BOOLEAN[]);
