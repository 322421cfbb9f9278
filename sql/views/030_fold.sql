-- Fold (SPEC §3) and projections (SPEC §4).
--
-- A fold walks the branch's records in branch order: the first record of an id wins, every dropped
-- id is a tombstone (even one not seen yet), and active observations are the first-seen ones not
-- tombstoned. It stops at a boundary in one of two ways, kept distinct by p_mode:
--   'anchor'    a plain fold through an entry: records whose own branch position is <= the bound;
--   'watermark' a projection: records whose watermark is on the branch at a position <= the bound.
-- Bounds are branch positions given per kind; a NULL bound includes nothing of that kind.

CREATE OR REPLACE MACRO fold_selection(p_session, p_tip, p_mode, p_obs_bound, p_refl_bound, p_drop_bound) AS TABLE
    SELECT ledger_id, kind, rec_order, wm_pos
    FROM branch_records(p_session, p_tip)
    WHERE (CASE WHEN p_mode = 'anchor' THEN anchor_pos ELSE wm_pos END)
          <= (CASE kind WHEN 'om.observations.recorded' THEN p_obs_bound
                        WHEN 'om.reflections.recorded' THEN p_refl_bound
                        ELSE p_drop_bound END);

-- Observations of a fold, first-seen order, with the tombstone flag (active = NOT dropped).
CREATE OR REPLACE MACRO fold_observations(p_session, p_tip, p_mode, p_obs_bound, p_drop_bound) AS TABLE
    WITH sel AS (
        SELECT * FROM fold_selection(p_session, p_tip, p_mode, p_obs_bound, NULL, p_drop_bound)
    ),
    occurrences AS (
        SELECT o.obs_id, o.content, o.ts, o.relevance, o.source_entry_ids, o.token_count, o.ledger_id,
               o.item_index, s.rec_order, s.wm_pos,
               row_number() OVER (PARTITION BY o.obs_id ORDER BY s.rec_order, o.item_index) AS occurrence
        FROM ledger_observations o
        JOIN sel s ON s.ledger_id = o.ledger_id AND s.kind = 'om.observations.recorded'
        WHERE o.session_id = p_session
    ),
    tombstones AS (
        SELECT DISTINCT d.obs_id
        FROM ledger_drops d
        JOIN sel s ON s.ledger_id = d.ledger_id AND s.kind = 'om.observations.dropped'
        WHERE d.session_id = p_session
    )
    SELECT row_number() OVER (ORDER BY f.rec_order, f.item_index) AS ordinal,
           f.obs_id, f.content, f.ts, f.relevance, f.source_entry_ids, f.token_count, f.ledger_id,
           f.wm_pos, t.obs_id IS NOT NULL AS dropped
    FROM occurrences f
    LEFT JOIN tombstones t ON t.obs_id = f.obs_id
    WHERE f.occurrence = 1;

-- Reflections of a fold, first-seen order.
CREATE OR REPLACE MACRO fold_reflections(p_session, p_tip, p_mode, p_refl_bound) AS TABLE
    WITH sel AS (
        SELECT * FROM fold_selection(p_session, p_tip, p_mode, NULL, p_refl_bound, NULL)
    ),
    occurrences AS (
        SELECT r.refl_id, r.content, r.supporting_observation_ids, r.token_count, r.ledger_id,
               r.item_index, s.rec_order,
               row_number() OVER (PARTITION BY r.refl_id ORDER BY s.rec_order, r.item_index) AS occurrence
        FROM ledger_reflections r
        JOIN sel s ON s.ledger_id = r.ledger_id AND s.kind = 'om.reflections.recorded'
        WHERE r.session_id = p_session
    )
    SELECT row_number() OVER (ORDER BY rec_order, item_index) AS ordinal,
           refl_id, content, supporting_observation_ids, token_count, ledger_id
    FROM occurrences
    WHERE occurrence = 1;

-- The ledger as it stands at p_tip: a plain fold through the tip (every record on the branch).
-- This is what the workers read.
CREATE OR REPLACE MACRO ledger_observations_at(p_session, p_tip) AS TABLE
    SELECT * FROM fold_observations(p_session, p_tip, 'anchor',
                                    position_on_branch(p_session, p_tip, p_tip),
                                    position_on_branch(p_session, p_tip, p_tip));

CREATE OR REPLACE MACRO ledger_reflections_at(p_session, p_tip) AS TABLE
    SELECT * FROM fold_reflections(p_session, p_tip, 'anchor', position_on_branch(p_session, p_tip, p_tip));

-- Full projection at boundary p_boundary ("full memory" when the boundary is the tip): fold only
-- the records covered through it. Rows: one per active observation, then one per reflection.
CREATE OR REPLACE MACRO full_projection(p_session, p_tip, p_boundary) AS TABLE
    SELECT 'observation' AS item_kind, ordinal, obs_id AS id, content, ts, relevance, source_entry_ids,
           NULL::VARCHAR[] AS supporting_observation_ids, token_count, ledger_id
    FROM fold_observations(p_session, p_tip, 'watermark',
                           position_on_branch(p_session, p_tip, p_boundary),
                           position_on_branch(p_session, p_tip, p_boundary))
    WHERE NOT dropped
    UNION ALL
    SELECT 'reflection', ordinal, refl_id, content, NULL, NULL, NULL, supporting_observation_ids,
           token_count, ledger_id
    FROM fold_reflections(p_session, p_tip, 'watermark', position_on_branch(p_session, p_tip, p_boundary));

-- Visible projection: the lists stored in the latest folded compaction on the branch.
CREATE OR REPLACE MACRO visible_projection(p_session, p_tip) AS TABLE
    WITH latest AS (
        SELECT compaction_id FROM branch_compactions(p_session, p_tip)
        WHERE folded ORDER BY compaction_order DESC LIMIT 1
    )
    SELECT i.item_kind, i.item_index + 1 AS ordinal, i.id, i.content, i.ts, i.relevance,
           i.source_entry_ids, i.supporting_observation_ids, i.token_count, i.compaction_id
    FROM compaction_fold_items i
    JOIN latest l ON l.compaction_id = i.compaction_id
    WHERE i.session_id = p_session;

-- M: the firstKeptEntryId position of the latest folded full-fold compaction on the branch whose
-- first kept entry is on the branch (the last full-fold boundary); NULL when there is none.
CREATE OR REPLACE MACRO last_full_fold_position(p_session, p_tip) AS (
    SELECT first_kept_pos FROM branch_compactions(p_session, p_tip)
    WHERE folded AND full_fold AND first_kept_pos IS NOT NULL
    ORDER BY compaction_order DESC LIMIT 1
);

-- Compaction projection at F = p_first_kept with pool limit P = p_pool_max (SPEC §4):
-- normal = observations covered through F, reflections and drops covered through M; when the
-- normal observations' tokens reach P, the full projection at F instead (full_fold = true).
CREATE OR REPLACE MACRO compaction_projection(p_session, p_tip, p_first_kept, p_pool_max) AS TABLE
    WITH normal_obs AS (
        SELECT * FROM fold_observations(p_session, p_tip, 'watermark',
                                        position_on_branch(p_session, p_tip, p_first_kept),
                                        last_full_fold_position(p_session, p_tip))
        WHERE NOT dropped
    ),
    decision AS (
        SELECT pool_tokens >= p_pool_max AS full_fold
        FROM (SELECT coalesce(sum(token_count), 0) AS pool_tokens FROM normal_obs)
    ),
    full_obs AS (
        SELECT * FROM fold_observations(p_session, p_tip, 'watermark',
                                        position_on_branch(p_session, p_tip, p_first_kept),
                                        position_on_branch(p_session, p_tip, p_first_kept))
        WHERE NOT dropped
    ),
    chosen_obs AS (
        SELECT n.* FROM normal_obs n, decision d WHERE NOT d.full_fold
        UNION ALL
        SELECT f.* FROM full_obs f, decision d WHERE d.full_fold
    ),
    chosen_refl AS (
        SELECT r.* FROM fold_reflections(p_session, p_tip, 'watermark',
                                         last_full_fold_position(p_session, p_tip)) r, decision d
        WHERE NOT d.full_fold
        UNION ALL
        SELECT r.* FROM fold_reflections(p_session, p_tip, 'watermark',
                                         position_on_branch(p_session, p_tip, p_first_kept)) r, decision d
        WHERE d.full_fold
    )
    SELECT 'observation' AS item_kind, o.ordinal, o.obs_id AS id, o.content, o.ts, o.relevance,
           o.source_entry_ids, NULL::VARCHAR[] AS supporting_observation_ids, o.token_count,
           o.ledger_id, o.wm_pos, d.full_fold
    FROM chosen_obs o, decision d
    UNION ALL
    SELECT 'reflection', r.ordinal, r.refl_id, r.content, NULL, NULL, NULL, r.supporting_observation_ids,
           r.token_count, r.ledger_id, NULL, d.full_fold
    FROM chosen_refl r, decision d;

-- Drift (SPEC §4): full memory at the tip against visible memory.
CREATE OR REPLACE MACRO memory_drift(p_session, p_tip) AS TABLE
    WITH full_memory AS (SELECT item_kind, id FROM full_projection(p_session, p_tip, p_tip)),
         visible AS (SELECT item_kind, id FROM visible_projection(p_session, p_tip))
    SELECT 'observation_only_in_full' AS drift, id FROM full_memory
    WHERE item_kind = 'observation' AND id NOT IN (SELECT id FROM visible WHERE item_kind = 'observation')
    UNION ALL
    SELECT 'reflection_only_in_full', id FROM full_memory
    WHERE item_kind = 'reflection' AND id NOT IN (SELECT id FROM visible WHERE item_kind = 'reflection')
    UNION ALL
    SELECT 'visible_not_active', id FROM visible
    WHERE item_kind = 'observation' AND id NOT IN (SELECT id FROM full_memory WHERE item_kind = 'observation');
