-- name: export_header
SELECT header, file_path, version FROM om_internal.sessions WHERE session_id = $session_id;

-- name: export_entries
-- Entries in file order, with their timestamp as text and as parsed (a record placed after an entry
-- is never stamped earlier than it).
SELECT entry_id, parent_id, entry_type, role, first_kept_entry_id,
       coalesce(raw ->> '$.timestamp', strftime(ts, '%Y-%m-%dT%H:%M:%S.%gZ')) AS ts_text, raw, ts
FROM om_internal.entries WHERE session_id = $session_id ORDER BY line_no;

-- name: pipeline_records
SELECT ledger_id, kind, covers_up_to_id, anchor_entry_id, created_at
FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'pipeline' ORDER BY append_seq;

-- name: record_observations
SELECT obs_id, content, ts, relevance, source_entry_ids, token_count FROM om_internal.observations
WHERE session_id = $session_id AND ledger_id = $ledger_id ORDER BY item_index;

-- name: record_reflections
SELECT refl_id, content, supporting_observation_ids, token_count FROM om_internal.reflections
WHERE session_id = $session_id AND ledger_id = $ledger_id ORDER BY item_index;

-- name: record_reflection_drops
SELECT refl_id, replaced_by, kind FROM om_internal.reflection_drops
WHERE session_id = $session_id AND ledger_id = $ledger_id ORDER BY item_index;

-- name: record_drops
SELECT obs_id FROM om_internal.drops WHERE session_id = $session_id AND ledger_id = $ledger_id ORDER BY item_index;

-- name: quarantined_lines
SELECT count(*) FROM om_internal.quarantine WHERE file_path = $file_path;
