-- name: session_by_id
SELECT session_id FROM om_internal.sessions WHERE session_id = $ref;

-- name: sessions_by_prefix
SELECT session_id FROM om_internal.sessions WHERE starts_with(session_id, $ref) ORDER BY session_id LIMIT 5;

-- name: session_by_path
SELECT session_id FROM om_internal.sessions WHERE file_path = $path;

-- name: list_sessions
SELECT session_id, file_path, version, cwd, started_at, leaf_id, entry_count, source_count,
       leaf_count, tokens_pi, tokens, ingested_at
FROM om_internal.sessions ORDER BY file_path;

-- name: session_leaf
SELECT leaf_id FROM om_internal.sessions WHERE session_id = $session_id;

-- name: entry_exists
SELECT count(*) > 0 FROM om_internal.entries WHERE session_id = $session_id AND entry_id = $entry_id;

-- name: branch_for_cut_point
-- The raw line gives Pi 1.6's view of each entry: the messages it contributes, context edits, usage.
SELECT b.entry_id, b.entry_type, b.role, b.tokens_pi, b.first_kept_entry_id, e.raw
FROM branch_detail($session_id, $tip) b
JOIN om_internal.entries e ON e.session_id = $session_id AND e.entry_id = b.entry_id
ORDER BY b.position;

-- name: file_branch_for_cut_point
-- The branch as the file om export writes holds it: each of this project's records is a custom entry
-- right after the entry it is anchored to (in record order), where Pi's cut point can absorb onto it
-- as it does on that file. Records add no messages and no tokens.
WITH entries AS (
    SELECT b.position, 0 AS rec_order, b.entry_id, b.entry_type, b.role, b.tokens_pi, b.first_kept_entry_id, e.raw
    FROM branch_detail($session_id, $tip) b
    JOIN om_internal.entries e ON e.session_id = $session_id AND e.entry_id = b.entry_id
), records AS (
    SELECT anchor_pos, rec_order, ledger_id, 'custom', NULL::VARCHAR, NULL::INTEGER, NULL::VARCHAR,
           json_object('type', 'custom', 'customType', kind, 'id', ledger_id)::VARCHAR
    FROM branch_records($session_id, $tip) WHERE origin = 'pipeline'
)
SELECT entry_id, entry_type, role, tokens_pi, first_kept_entry_id, raw
FROM (SELECT * FROM entries UNION ALL SELECT * FROM records)
ORDER BY position, rec_order;

-- name: sql_sandbox_local_files
-- `om sql --allow-files`: local files may be read (writes stay refused by statement type)
SET allowed_directories = ['/'];

-- name: sql_sandbox
-- `om sql`: no extension installs or loads, no file or network access beyond allowed_directories,
-- and the configuration locked so no statement can undo any of it
SET autoinstall_known_extensions = false;
SET autoload_known_extensions = false;
SET enable_external_access = false;
SET lock_configuration = true;

-- name: catalog_objects
-- `om sql ".tables"`: the analyst schema, every view and macro of main.
SELECT table_name AS name, 'view' AS kind FROM information_schema.tables WHERE table_schema = 'main'
UNION ALL
SELECT DISTINCT function_name, CASE function_type WHEN 'table_macro' THEN 'table macro' ELSE 'macro' END
FROM duckdb_functions() WHERE schema_name = 'main' AND NOT internal AND function_type IN ('macro', 'table_macro')
ORDER BY name;

-- name: catalog_schema
-- `om sql ".schema [NAME]"`: each view's columns and types in order, each macro's parameters ($name
-- NULL: every object).
SELECT table_name AS name, 'view' AS kind, ordinal_position AS position, column_name AS "column", data_type AS type
FROM information_schema.columns
WHERE table_schema = 'main' AND ($name IS NULL OR table_name = $name)
UNION ALL
SELECT f.function_name, CASE f.function_type WHEN 'table_macro' THEN 'table macro' ELSE 'macro' END, p.position,
       p.parameter, 'parameter'
FROM duckdb_functions() f, unnest(f.parameters) WITH ORDINALITY AS p(parameter, position)
WHERE f.schema_name = 'main' AND NOT f.internal AND f.function_type IN ('macro', 'table_macro')
  AND ($name IS NULL OR f.function_name = $name)
ORDER BY name, position;
