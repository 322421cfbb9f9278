-- Projects (om_core.project.repository) and the project ledger (om_core.project.memory).

-- name: sessions_without_project
SELECT s.session_id, s.cwd FROM om_internal.sessions s
WHERE NOT EXISTS (SELECT 1 FROM om_internal.project_sessions p WHERE p.session_id = s.session_id)
  AND ($sessions IS NULL OR list_contains($sessions, s.session_id))
ORDER BY s.session_id;

-- name: insert_session_project
-- OR IGNORE: a concurrent ingest (the endpoint's requests) may have assigned this new session first
INSERT OR IGNORE INTO om_internal.project_sessions (session_id, cwd, git_root, git_remote, project_id, how)
VALUES ($session_id, $cwd, $git_root, $git_remote, $project_id, $how);

-- name: session_project_facts
SELECT session_id, cwd, git_root, git_remote, project_id, how FROM om_internal.project_sessions ORDER BY session_id;

-- name: assign_session_project
UPDATE om_internal.project_sessions SET project_id = $project_id, how = $how WHERE session_id = $session_id;

-- name: list_projects
SELECT project_id, name, sessions, how, git_roots, git_remote, reflections, new_tokens
FROM projects ORDER BY project_id;

-- name: project_of_session
SELECT project_id FROM om_internal.project_sessions WHERE session_id = $session_id;

-- name: project_session_tips
-- The project's sessions with their current leaf, oldest first.
SELECT p.session_id, s.leaf_id, s.file_path, s.started_at
FROM om_internal.project_sessions p JOIN om_internal.sessions s USING (session_id)
WHERE p.project_id = $project_id AND s.leaf_id IS NOT NULL
ORDER BY s.started_at NULLS LAST, p.session_id;

-- name: project_growth_of
SELECT watermark_seq, new_tokens, new_items, latest_seq FROM project_growth WHERE project_id = $project_id;

-- name: project_fold_rows
SELECT * FROM project_fold($project_id) ORDER BY fold_order;

-- name: project_memory_rows
SELECT * FROM project_memory($project_id);

-- name: record_seqs
-- Each record's place in the session ledger's order (a project input's age).
SELECT ledger_id, append_seq FROM om_internal.ledger WHERE session_id = $session_id;

-- name: project_ledger_id_taken
SELECT EXISTS (SELECT 1 FROM om_internal.project_ledger WHERE project_id = $project_id AND ledger_id = $id);

-- name: project_has_stage_key
SELECT EXISTS (SELECT 1 FROM om_internal.project_ledger WHERE project_id = $project_id AND stage_key = $stage_key);

-- name: project_stage_was_empty
SELECT EXISTS (SELECT 1 FROM om_internal.project_stages
               WHERE project_id = $project_id AND stage_key = $stage_key AND outcome = 'empty');

-- name: insert_project_record
INSERT INTO om_internal.project_ledger (project_id, ledger_id, kind, covers_up_to_seq, origin, created_at, run_id,
                                        stage, stage_key)
VALUES ($project_id, $ledger_id, $kind, $covers_up_to_seq, $origin, current_timestamp, $run_id, $stage, $stage_key);

-- name: insert_project_reflection
INSERT INTO om_internal.project_reflections (project_id, ledger_id, item_index, refl_id, content, supporting_ids,
                                             token_count)
VALUES ($project_id, $ledger_id, $item_index, $refl_id, $content, $supporting_ids, $token_count);

-- name: insert_project_retirement
INSERT INTO om_internal.project_retirements (project_id, ledger_id, item_index, refl_id, reason)
VALUES ($project_id, $ledger_id, $item_index, $refl_id, $reason);

-- name: insert_project_stage
INSERT INTO om_internal.project_stages (stage_run_id, run_id, project_id, stage_key, model, outcome, covers_up_to_seq,
                                        inputs, input_tokens, records, items, rejected, error_kind, error, receipts,
                                        started_at)
VALUES ($stage_run_id, $run_id, $project_id, $stage_key, $model, $outcome, $covers_up_to_seq, $inputs, $input_tokens,
        $records, $items, $rejected, $error_kind, $error, $receipts, $started_at);

-- name: projects_holding_reflection
SELECT DISTINCT project_id FROM om_internal.project_reflections WHERE refl_id = $id ORDER BY project_id;

-- name: project_reflection_occurrences
SELECT x.ledger_id, x.item_index, x.refl_id AS id, x.content, x.supporting_ids, x.token_count, r.append_seq
FROM om_internal.project_reflections x
JOIN om_internal.project_ledger r ON r.project_id = x.project_id AND r.ledger_id = x.ledger_id
WHERE x.project_id = $project_id AND x.refl_id = $id
ORDER BY r.append_seq, x.item_index;

-- name: project_sessions_holding
-- The project's sessions whose ledger records this memory id (an observation or a reflection).
SELECT DISTINCT p.session_id, s.leaf_id
FROM om_internal.project_sessions p JOIN om_internal.sessions s USING (session_id)
WHERE p.project_id = $project_id AND s.leaf_id IS NOT NULL
  AND (EXISTS (SELECT 1 FROM om_internal.observations o WHERE o.session_id = p.session_id AND o.obs_id = $id)
       OR EXISTS (SELECT 1 FROM om_internal.reflections f WHERE f.session_id = p.session_id AND f.refl_id = $id))
ORDER BY p.session_id;

-- name: project_watermark
SELECT coalesce(max(covers_up_to_seq), 0) FROM om_internal.project_ledger
WHERE project_id = $project_id AND origin = 'pipeline';

-- name: due_projects
SELECT project_id FROM project_growth WHERE new_tokens >= $threshold ORDER BY project_id;

-- name: file_compactions_on_branch
-- Compactions the session file holds on the branch (Pi's, the extension's): none before a first one.
SELECT count(*) FROM branch_compactions($session_id, $tip) WHERE origin <> 'simulated';

-- name: project_offline
-- Whether the offline baseline wrote any of the project's memory: `om project` says so.
SELECT count(*) > 0 FROM project_stages WHERE project_id = $project_id AND outcome = 'recorded' AND model = 'offline';
