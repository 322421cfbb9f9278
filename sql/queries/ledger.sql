-- name: insert_ledger_records
INSERT INTO om_internal.ledger (session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, origin,
                            created_at, run_id, stage, stage_key)
SELECT session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, origin,
       coalesce(TRY_CAST(created_at AS TIMESTAMPTZ), current_timestamp), run_id, stage, stage_key
FROM ledger_batch;

-- name: insert_ledger_observations
INSERT INTO om_internal.observations (session_id, ledger_id, item_index, obs_id, content, ts, relevance, source_entry_ids,
                                 token_count, ts_repaired_from)
SELECT session_id, ledger_id, item_index, obs_id, content, ts, relevance, source_entry_ids, token_count, ts_repaired_from
FROM ledger_batch;

-- name: insert_ledger_reflections
INSERT INTO om_internal.reflections (session_id, ledger_id, item_index, refl_id, content, supporting_observation_ids,
                                token_count)
SELECT session_id, ledger_id, item_index, refl_id, content, supporting_observation_ids, token_count
FROM ledger_batch;

-- name: insert_ledger_drops
INSERT INTO om_internal.drops (session_id, ledger_id, item_index, obs_id, reason)
SELECT session_id, ledger_id, item_index, obs_id, reason FROM ledger_batch;

-- name: insert_ledger_reflection_drops
INSERT INTO om_internal.reflection_drops (session_id, ledger_id, item_index, refl_id, reason, replaced_by, kind)
SELECT session_id, ledger_id, item_index, refl_id, reason, replaced_by, kind FROM ledger_batch;

-- name: insert_ledger_folds
INSERT INTO om_internal.compactions (session_id, compaction_id, origin, anchor_entry_id, first_kept_entry_id,
                              folded, full_fold, summary, note, trigger, gap_safe, plain_first_kept_entry_id,
                              created_at, run_id)
SELECT session_id, compaction_id, origin, anchor_entry_id, first_kept_entry_id, folded, full_fold, summary,
       note, trigger, gap_safe, plain_first_kept_entry_id,
       coalesce(TRY_CAST(created_at AS TIMESTAMPTZ), current_timestamp), run_id
FROM ledger_batch;

-- name: insert_ledger_fold_items
INSERT INTO om_internal.compaction_items (session_id, compaction_id, item_kind, item_index, id, content, ts, relevance,
                                   source_entry_ids, supporting_observation_ids, token_count)
SELECT session_id, compaction_id, item_kind, item_index, id, content, ts, relevance, source_entry_ids,
       supporting_observation_ids, token_count
FROM ledger_batch;

-- name: insert_ledger_rejects
INSERT INTO om_internal.ledger_rejects (session_id, entry_id, kind, reason, run_id)
SELECT session_id, entry_id, kind, reason, run_id FROM ledger_batch;

-- name: delete_imported_observations
DELETE FROM om_internal.observations WHERE session_id = $session_id AND ledger_id IN
    (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_reflections
DELETE FROM om_internal.reflections WHERE session_id = $session_id AND ledger_id IN
    (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_drops
DELETE FROM om_internal.drops WHERE session_id = $session_id AND ledger_id IN
    (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_reflection_drops
DELETE FROM om_internal.reflection_drops WHERE session_id = $session_id AND ledger_id IN
    (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_records
DELETE FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'imported';

-- name: delete_imported_fold_items
DELETE FROM om_internal.compaction_items WHERE session_id = $session_id AND compaction_id IN
    (SELECT compaction_id FROM om_internal.compactions WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_folds
DELETE FROM om_internal.compactions WHERE session_id = $session_id AND origin = 'imported';

-- name: delete_ledger_rejects
DELETE FROM om_internal.ledger_rejects WHERE session_id = $session_id;

-- name: ledger_candidates
SELECT entry_id, entry_type, custom_type, first_kept_entry_id, raw
FROM om_internal.entries
WHERE session_id = $session_id
  AND (starts_with(custom_type, 'om.') OR entry_type = 'compaction')
  AND ($run_id IS NULL OR run_id = $run_id)
ORDER BY line_no;

-- name: ledger_id_taken
SELECT EXISTS (SELECT 1 FROM om_internal.entries WHERE session_id = $session_id AND entry_id = $id)
    OR EXISTS (SELECT 1 FROM om_internal.ledger WHERE session_id = $session_id AND ledger_id = $id)
    OR EXISTS (SELECT 1 FROM om_internal.compactions WHERE session_id = $session_id AND compaction_id = $id);

-- name: simulated_compaction_by_seed
SELECT compaction_id, full_fold, folded FROM om_internal.compactions
WHERE session_id = $session_id AND origin = 'simulated' AND anchor_entry_id = $anchor
  AND plain_first_kept_entry_id = $plain_first_kept AND trigger = $trigger;
