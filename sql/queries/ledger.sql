-- name: insert_ledger_records
INSERT INTO ledger_records (session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, origin,
                            created_at, run_id, stage, stage_key)
SELECT session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, origin,
       coalesce(TRY_CAST(created_at AS TIMESTAMPTZ), current_timestamp), run_id, stage, stage_key
FROM ledger_batch;

-- name: insert_ledger_observations
INSERT INTO ledger_observations (session_id, ledger_id, item_index, obs_id, content, ts, relevance, source_entry_ids,
                                 token_count)
SELECT session_id, ledger_id, item_index, obs_id, content, ts, relevance, source_entry_ids, token_count
FROM ledger_batch;

-- name: insert_ledger_reflections
INSERT INTO ledger_reflections (session_id, ledger_id, item_index, refl_id, content, supporting_observation_ids,
                                token_count)
SELECT session_id, ledger_id, item_index, refl_id, content, supporting_observation_ids, token_count
FROM ledger_batch;

-- name: insert_ledger_drops
INSERT INTO ledger_drops (session_id, ledger_id, item_index, obs_id)
SELECT session_id, ledger_id, item_index, obs_id FROM ledger_batch;

-- name: insert_ledger_folds
INSERT INTO compaction_folds (session_id, compaction_id, origin, anchor_entry_id, first_kept_entry_id,
                              folded, full_fold, summary, note, trigger, gap_safe, plain_first_kept_entry_id,
                              created_at, run_id)
SELECT session_id, compaction_id, origin, anchor_entry_id, first_kept_entry_id, folded, full_fold, summary,
       note, trigger, gap_safe, plain_first_kept_entry_id,
       coalesce(TRY_CAST(created_at AS TIMESTAMPTZ), current_timestamp), run_id
FROM ledger_batch;

-- name: insert_ledger_fold_items
INSERT INTO compaction_fold_items (session_id, compaction_id, item_kind, item_index, id, content, ts, relevance,
                                   source_entry_ids, supporting_observation_ids, token_count)
SELECT session_id, compaction_id, item_kind, item_index, id, content, ts, relevance, source_entry_ids,
       supporting_observation_ids, token_count
FROM ledger_batch;

-- name: insert_ledger_rejects
INSERT INTO ledger_rejects (session_id, entry_id, kind, reason, run_id)
SELECT session_id, entry_id, kind, reason, run_id FROM ledger_batch;

-- name: delete_imported_observations
DELETE FROM ledger_observations WHERE session_id = $session_id AND ledger_id IN
    (SELECT ledger_id FROM ledger_records WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_reflections
DELETE FROM ledger_reflections WHERE session_id = $session_id AND ledger_id IN
    (SELECT ledger_id FROM ledger_records WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_drops
DELETE FROM ledger_drops WHERE session_id = $session_id AND ledger_id IN
    (SELECT ledger_id FROM ledger_records WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_records
DELETE FROM ledger_records WHERE session_id = $session_id AND origin = 'imported';

-- name: delete_imported_fold_items
DELETE FROM compaction_fold_items WHERE session_id = $session_id AND compaction_id IN
    (SELECT compaction_id FROM compaction_folds WHERE session_id = $session_id AND origin = 'imported');

-- name: delete_imported_folds
DELETE FROM compaction_folds WHERE session_id = $session_id AND origin = 'imported';

-- name: delete_ledger_rejects
DELETE FROM ledger_rejects WHERE session_id = $session_id;

-- name: ledger_candidates
SELECT entry_id, entry_type, custom_type, first_kept_entry_id, raw
FROM entries
WHERE session_id = $session_id
  AND (starts_with(custom_type, 'om.') OR entry_type = 'compaction')
  AND ($run_id IS NULL OR run_id = $run_id)
ORDER BY line_no;

-- name: ledger_id_taken
SELECT EXISTS (SELECT 1 FROM entries WHERE session_id = $session_id AND entry_id = $id)
    OR EXISTS (SELECT 1 FROM ledger_records WHERE session_id = $session_id AND ledger_id = $id)
    OR EXISTS (SELECT 1 FROM compaction_folds WHERE session_id = $session_id AND compaction_id = $id);

-- name: simulated_compaction_by_seed
SELECT compaction_id, full_fold, folded FROM compaction_folds
WHERE session_id = $session_id AND origin = 'simulated' AND anchor_entry_id = $anchor
  AND plain_first_kept_entry_id = $plain_first_kept AND trigger = $trigger;
