-- name: position_on_branch
SELECT position_on_branch($session_id, $tip, $entry_id);

-- name: full_projection
SELECT * FROM full_projection($session_id, $tip, $boundary);

-- name: visible_projection
SELECT * FROM visible_projection($session_id, $tip);

-- name: replayed_projection
SELECT * FROM replayed_projection($session_id, $tip);

-- name: latest_folds
-- The compaction behind the visible projection (replayed = false) and behind the replayed view
-- (replayed = true), and how many of the branch's folded compactions were simulated.
WITH f AS (SELECT * FROM branch_folds($session_id, $tip)),
     visible AS (SELECT * FROM f WHERE origin <> 'simulated' ORDER BY fold_rank LIMIT 1),
     replayed AS (SELECT * FROM f ORDER BY fold_rank LIMIT 1),
     simulated AS (SELECT count(*) AS n FROM f WHERE origin = 'simulated')
SELECT false AS replayed, v.compaction_id, v.origin, v.first_kept_entry_id, v.full_fold, s.n AS simulated_folds
FROM simulated s LEFT JOIN visible v ON true
UNION ALL
SELECT true, r.compaction_id, r.origin, r.first_kept_entry_id, r.full_fold, s.n
FROM simulated s LEFT JOIN replayed r ON true
ORDER BY replayed;

-- name: ledger_at
SELECT * FROM ledger_at($session_id, $tip) ORDER BY item_kind, fold_order;

-- name: kept_entry
-- The branch entry a first kept entry F stands for: F itself when it is on the branch; one of this
-- project's records stands for the entry it is anchored to (in the file om export writes it is an
-- entry right after that anchor, and no watermark lies between them). NULL: neither.
SELECT CASE WHEN position_on_branch($session_id, $tip, $entry_id) IS NOT NULL THEN $entry_id
            ELSE (SELECT anchor_entry_id FROM branch_records($session_id, $tip)
                  WHERE ledger_id = $entry_id AND origin = 'pipeline') END AS entry_id;

-- name: compaction_decision
SELECT f_pos, m_pos, normal_tokens, full_fold, others_through, c_pos
FROM compaction_decision($session_id, $tip, $first_kept, $pool_max, $replayed);

-- name: compaction_projection
-- The items of the compaction projection once compaction_decision has been read: the same fold the
-- compaction_projection macro makes, without deciding a second time.
SELECT item_kind, fold_order, id, content, ts, relevance, source_entry_ids, supporting_observation_ids,
       token_count
FROM fold($session_id, $tip, 'watermark', $first_kept, $others_through, $others_through)
WHERE NOT dropped
ORDER BY item_kind, fold_order;

-- name: memory_drift
SELECT drift, id FROM folded_drift($session_id, $tip, $replayed);

-- name: progress_clocks
SELECT * FROM progress_clocks($session_id, $tip);

-- name: coverage_tiers
SELECT * FROM coverage_tiers($session_id, $tip);

-- name: ledger_coverage
SELECT * FROM ledger_coverage($session_id, $tip) ORDER BY item_kind, fold_order;

-- name: last_errors
SELECT 'stage' AS source, stage || ' ' || coalesce(error_kind, '') AS reason, error AS detail,
       finished_at AS occurred_at
FROM om_internal.stages WHERE session_id = $session_id AND outcome = 'failed'
UNION ALL
SELECT 'quarantine', reason, detail, quarantined_at FROM om_internal.quarantine WHERE session_id = $session_id
UNION ALL
SELECT 'ledger', reason, kind || ' ' || entry_id, NULL FROM om_internal.ledger_rejects WHERE session_id = $session_id
ORDER BY occurred_at DESC NULLS LAST LIMIT 5;

-- name: recall_observations
SELECT * FROM recall_observations($session_id, $tip, $ids::VARCHAR[]) ORDER BY rec_order, item_index;

-- name: recall_superseded_by
-- The observations on the branch that name $id in brackets (a note saying which one it replaces).
SELECT o.obs_id AS id
FROM om_internal.observations o
JOIN branch_records($session_id, $tip) r ON r.ledger_id = o.ledger_id AND r.kind = 'om.observations.recorded'
WHERE o.session_id = $session_id AND contains(o.content, '[' || $id || ']') AND o.obs_id <> $id
GROUP BY o.obs_id ORDER BY min(r.rec_order), o.obs_id;

-- name: recall_reflections
SELECT * FROM recall_reflections($session_id, $tip, $id) ORDER BY rec_order, item_index;

-- name: resolve_entries
SELECT * FROM resolve_entries($session_id, $tip, $ids::VARCHAR[]);

-- name: sessions_mentioning_memory_id
SELECT s.session_id, s.leaf_id FROM om_internal.sessions s
WHERE s.session_id IN (SELECT session_id FROM om_internal.observations WHERE obs_id = $id
                       UNION SELECT session_id FROM om_internal.reflections WHERE refl_id = $id)
ORDER BY s.session_id;

-- name: memory_ids_by_prefix
-- `om recall PREFIX`: the observation and reflection ids that start with it, in one session or all.
-- Project reflection ids count too: everywhere, or in the session's own project.
SELECT DISTINCT id FROM (
    SELECT session_id, obs_id AS id FROM om_internal.observations
    UNION ALL SELECT session_id, refl_id FROM om_internal.reflections
    UNION ALL SELECT p.session_id, x.refl_id FROM om_internal.project_reflections x
              JOIN om_internal.project_sessions p ON p.project_id = x.project_id
) WHERE starts_with(id, $prefix) AND ($session_id IS NULL OR session_id = $session_id)
ORDER BY id LIMIT 6;

-- name: recall_orphaned
-- The id in this project's records that lie on no branch any more (their session or anchor entry is
-- gone from the session file: SPEC §2); a NULL session: in every session.
WITH hits AS (
    SELECT session_id, ledger_id, item_index, 'observation' AS kind, obs_id AS id, content, ts, relevance,
           source_entry_ids, []::VARCHAR[] AS supporting_observation_ids
    FROM om_internal.observations
    WHERE obs_id = $id AND ($session_id::VARCHAR IS NULL OR session_id = $session_id::VARCHAR)
    UNION ALL
    SELECT session_id, ledger_id, item_index, 'reflection', refl_id, content, NULL, NULL, []::VARCHAR[],
           supporting_observation_ids
    FROM om_internal.reflections
    WHERE refl_id = $id AND ($session_id::VARCHAR IS NULL OR session_id = $session_id::VARCHAR))
SELECT h.*, r.anchor_entry_id, anchor_gone_reason(r.session_id, r.anchor_entry_id) AS reason
FROM hits h
JOIN om_internal.ledger r ON r.session_id = h.session_id AND r.ledger_id = h.ledger_id
WHERE r.origin = 'pipeline' AND anchor_gone_reason(r.session_id, r.anchor_entry_id) IS NOT NULL
ORDER BY h.session_id, r.append_seq, h.item_index;

-- name: offline_memory
-- Whether the offline baseline (extractive rules, no model) wrote any of this session's memory: the
-- commands that show it say so.
SELECT count(*) > 0 FROM stages WHERE session_id = $session_id AND outcome = 'recorded' AND model = 'offline';
