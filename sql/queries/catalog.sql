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
