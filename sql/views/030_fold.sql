-- Fold (SPEC §3) and projections (SPEC §4).
--
-- A fold walks the branch's records in branch order: the first record of an id wins, every dropped
-- id is a tombstone (even one not seen yet), and active observations are the first-seen ones not
-- tombstoned. It stops at a boundary in one of two ways, kept distinct by p_mode:
--   'anchor'    a plain fold through an entry: records whose own branch position is <= the bound;
--   'watermark' a projection: records whose watermark is on the branch at a position <= the bound.
-- Each kind has its own boundary entry (NULL, or an entry not on the branch, includes nothing).
-- The macros are written flat (one branch walk, one pass per table) because they are the hot path
-- of every compaction.

CREATE OR REPLACE MACRO fold(p_session, p_tip, p_mode, p_obs_through, p_refl_through, p_drop_through) AS TABLE
    WITH b AS (SELECT position, entry_id FROM branch(p_session, p_tip)),
    bounds AS (
        SELECT (SELECT position FROM b WHERE entry_id = p_obs_through) AS obs_b,
               (SELECT position FROM b WHERE entry_id = p_refl_through) AS refl_b,
               (SELECT position FROM b WHERE entry_id = p_drop_through) AS drop_b
    ),
    sel AS (
        SELECT r.ledger_id, r.kind, w.position AS wm_pos,
               row_number() OVER (ORDER BY a.position, r.origin <> 'imported', r.append_seq) AS rec_order
        FROM ledger_records r
        JOIN b a ON a.entry_id = r.anchor_entry_id
        LEFT JOIN b w ON w.entry_id = r.covers_up_to_id
        CROSS JOIN bounds
        WHERE r.session_id = p_session
          AND (CASE WHEN p_mode = 'anchor' THEN a.position ELSE w.position END)
              <= (CASE r.kind WHEN 'om.observations.recorded' THEN bounds.obs_b
                              WHEN 'om.reflections.recorded' THEN bounds.refl_b
                              ELSE bounds.drop_b END)
    ),
    -- first occurrence of each id: the smallest (record order, item index), found on narrow rows
    first_obs AS (
        SELECT o.obs_id, min(s.rec_order * 1000000 + o.item_index) AS fold_order,
               arg_min(o.ledger_id, s.rec_order * 1000000 + o.item_index) AS ledger_id,
               arg_min(o.item_index, s.rec_order * 1000000 + o.item_index) AS item_index,
               arg_min(s.wm_pos, s.rec_order * 1000000 + o.item_index) AS wm_pos
        FROM ledger_observations o
        JOIN sel s ON s.ledger_id = o.ledger_id AND s.kind = 'om.observations.recorded'
        WHERE o.session_id = p_session
        GROUP BY o.obs_id
    ),
    tombstones AS (
        SELECT DISTINCT d.obs_id
        FROM ledger_drops d
        JOIN sel s ON s.ledger_id = d.ledger_id AND s.kind = 'om.observations.dropped'
        WHERE d.session_id = p_session
    ),
    first_refl AS (
        SELECT x.refl_id, min(s.rec_order * 1000000 + x.item_index) AS fold_order,
               arg_min(x.ledger_id, s.rec_order * 1000000 + x.item_index) AS ledger_id,
               arg_min(x.item_index, s.rec_order * 1000000 + x.item_index) AS item_index
        FROM ledger_reflections x
        JOIN sel s ON s.ledger_id = x.ledger_id AND s.kind = 'om.reflections.recorded'
        WHERE x.session_id = p_session
        GROUP BY x.refl_id
    )
    SELECT 'observation' AS item_kind, f.fold_order, o.obs_id AS id, o.content, o.ts, o.relevance,
           o.source_entry_ids, NULL::VARCHAR[] AS supporting_observation_ids, o.token_count, o.ledger_id,
           f.wm_pos, t.obs_id IS NOT NULL AS dropped
    FROM first_obs f
    JOIN ledger_observations o
      ON o.session_id = p_session AND o.ledger_id = f.ledger_id AND o.item_index = f.item_index
    LEFT JOIN tombstones t ON t.obs_id = f.obs_id
    UNION ALL
    SELECT 'reflection', f.fold_order, x.refl_id, x.content, NULL, NULL, NULL, x.supporting_observation_ids,
           x.token_count, x.ledger_id, NULL, false
    FROM first_refl f
    JOIN ledger_reflections x
      ON x.session_id = p_session AND x.ledger_id = f.ledger_id AND x.item_index = f.item_index;

-- The ledger as it stands at p_tip: a plain fold through the tip (every record on the branch),
-- dropped observations included with dropped = true. This is what the workers read.
CREATE OR REPLACE MACRO ledger_at(p_session, p_tip) AS TABLE
    SELECT * FROM fold(p_session, p_tip, 'anchor', p_tip, p_tip, p_tip);

-- Full projection at boundary p_boundary ("full memory" when the boundary is the tip): fold only
-- the records covered through it; active observations, then reflections.
CREATE OR REPLACE MACRO full_projection(p_session, p_tip, p_boundary) AS TABLE
    SELECT * EXCLUDE (dropped) FROM fold(p_session, p_tip, 'watermark', p_boundary, p_boundary, p_boundary)
    WHERE NOT dropped;

-- Folded compactions on the branch (the extension's and simulated ones), newest first; fold_rank 1 is
-- the newest.
CREATE OR REPLACE MACRO branch_folds(p_session, p_tip) AS TABLE
    WITH b AS (SELECT position, entry_id FROM branch(p_session, p_tip))
    SELECT c.compaction_id, c.origin, c.full_fold, c.first_kept_entry_id, c.summary,
           a.position AS anchor_pos, k.position AS first_kept_pos,
           row_number() OVER (ORDER BY a.position DESC, c.origin = 'simulated' DESC, c.append_seq DESC) AS fold_rank
    FROM compaction_folds c
    JOIN b a ON a.entry_id = c.anchor_entry_id
    LEFT JOIN b k ON k.entry_id = c.first_kept_entry_id
    WHERE c.session_id = p_session AND c.folded
    ORDER BY fold_rank;

-- The lists of the latest folded compaction on the branch. p_replayed = false: only compactions the
-- session file holds (the extension's om.folded ones): the visible projection, what the agent saw.
-- p_replayed = true: the replay's simulated compactions count too: the replayed view, what the
-- extension would have shown (SPEC §4).
CREATE OR REPLACE MACRO folded_projection(p_session, p_tip, p_replayed) AS TABLE
    WITH latest AS (
        SELECT compaction_id, origin FROM branch_folds(p_session, p_tip)
        WHERE p_replayed OR origin <> 'simulated'
        ORDER BY fold_rank LIMIT 1
    )
    SELECT i.item_kind, i.item_index AS fold_order, i.id, i.content, i.ts, i.relevance,
           i.source_entry_ids, i.supporting_observation_ids, i.token_count, i.compaction_id,
           l.origin AS compaction_origin
    FROM compaction_fold_items i
    JOIN latest l ON l.compaction_id = i.compaction_id
    WHERE i.session_id = p_session;

-- Visible projection (SPEC §4): what the session file shows the agent.
CREATE OR REPLACE MACRO visible_projection(p_session, p_tip) AS TABLE
    SELECT * FROM folded_projection(p_session, p_tip, false);

-- Replayed projection: the latest folded compaction, simulated ones included (always labelled
-- replayed, never what the agent saw).
CREATE OR REPLACE MACRO replayed_projection(p_session, p_tip) AS TABLE
    SELECT * FROM folded_projection(p_session, p_tip, true);

-- Compaction projection at F = p_first_kept with pool limit P = p_pool_max (SPEC §4):
--   M = first kept entry of the latest folded full-fold compaction on the branch whose first kept
--       entry is on the branch (the last full-fold boundary);
--   normal = observations covered through F, reflections and drops covered through M (none
--       without M); when the normal observations' tokens reach P, the full projection at F.
-- Observations are selected the same way in both, so one pass serves both; only tombstones and
-- reflections depend on the decision.
CREATE OR REPLACE MACRO compaction_projection(p_session, p_tip, p_first_kept, p_pool_max) AS TABLE
    WITH b AS (SELECT position, entry_id FROM branch(p_session, p_tip)),
    m AS (
        SELECT k.position AS m_pos
        FROM compaction_folds c
        JOIN b a ON a.entry_id = c.anchor_entry_id
        JOIN b k ON k.entry_id = c.first_kept_entry_id
        WHERE c.session_id = p_session AND c.folded AND c.full_fold
        ORDER BY a.position DESC, c.origin = 'simulated' DESC, c.append_seq DESC
        LIMIT 1
    ),
    bounds AS (
        SELECT (SELECT position FROM b WHERE entry_id = p_first_kept) AS f_pos, (SELECT m_pos FROM m) AS m_pos
    ),
    recs AS (
        SELECT r.ledger_id, r.kind, w.position AS wm_pos,
               row_number() OVER (ORDER BY a.position, r.origin <> 'imported', r.append_seq) AS rec_order
        FROM ledger_records r
        JOIN b a ON a.entry_id = r.anchor_entry_id
        JOIN b w ON w.entry_id = r.covers_up_to_id
        WHERE r.session_id = p_session
    ),
    first_obs AS (
        SELECT o.obs_id, min(s.rec_order * 1000000 + o.item_index) AS fold_order,
               arg_min(o.ledger_id, s.rec_order * 1000000 + o.item_index) AS ledger_id,
               arg_min(o.item_index, s.rec_order * 1000000 + o.item_index) AS item_index,
               arg_min(o.token_count, s.rec_order * 1000000 + o.item_index) AS token_count,
               arg_min(s.wm_pos, s.rec_order * 1000000 + o.item_index) AS wm_pos
        FROM ledger_observations o
        JOIN recs s ON s.ledger_id = o.ledger_id AND s.kind = 'om.observations.recorded'
        CROSS JOIN bounds
        WHERE o.session_id = p_session AND s.wm_pos <= bounds.f_pos
        GROUP BY o.obs_id
    ),
    tombstones AS (
        SELECT d.obs_id, bool_or(s.wm_pos <= bounds.m_pos) AS in_normal, bool_or(s.wm_pos <= bounds.f_pos) AS in_full
        FROM ledger_drops d
        JOIN recs s ON s.ledger_id = d.ledger_id AND s.kind = 'om.observations.dropped'
        CROSS JOIN bounds
        WHERE d.session_id = p_session
        GROUP BY d.obs_id
    ),
    marked AS (
        SELECT f.*, coalesce(t.in_normal, false) AS dropped_normal, coalesce(t.in_full, false) AS dropped_full
        FROM first_obs f LEFT JOIN tombstones t ON t.obs_id = f.obs_id
    ),
    decision AS (
        SELECT normal_tokens >= p_pool_max AS full_fold
        FROM (SELECT coalesce(sum(token_count) FILTER (WHERE NOT dropped_normal), 0) AS normal_tokens FROM marked)
    ),
    first_refl AS (
        SELECT x.refl_id, min(s.rec_order * 1000000 + x.item_index) AS fold_order,
               arg_min(x.ledger_id, s.rec_order * 1000000 + x.item_index) AS ledger_id,
               arg_min(x.item_index, s.rec_order * 1000000 + x.item_index) AS item_index
        FROM ledger_reflections x
        JOIN recs s ON s.ledger_id = x.ledger_id AND s.kind = 'om.reflections.recorded'
        CROSS JOIN bounds
        CROSS JOIN decision
        WHERE x.session_id = p_session
          AND s.wm_pos <= (CASE WHEN decision.full_fold THEN bounds.f_pos ELSE bounds.m_pos END)
        GROUP BY x.refl_id
    )
    SELECT 'observation' AS item_kind, w.fold_order, o.obs_id AS id, o.content, o.ts, o.relevance,
           o.source_entry_ids, NULL::VARCHAR[] AS supporting_observation_ids, o.token_count, o.ledger_id,
           w.wm_pos, d.full_fold
    FROM marked w
    CROSS JOIN decision d
    JOIN ledger_observations o
      ON o.session_id = p_session AND o.ledger_id = w.ledger_id AND o.item_index = w.item_index
    WHERE NOT (CASE WHEN d.full_fold THEN w.dropped_full ELSE w.dropped_normal END)
    UNION ALL
    SELECT 'reflection', w.fold_order, x.refl_id, x.content, NULL, NULL, NULL, x.supporting_observation_ids,
           x.token_count, x.ledger_id, NULL, d.full_fold
    FROM first_refl w
    CROSS JOIN decision d
    JOIN ledger_reflections x
      ON x.session_id = p_session AND x.ledger_id = w.ledger_id AND x.item_index = w.item_index
    UNION ALL
    -- One 'boundary' row always, so callers can tell an empty projection from an F that is not
    -- on the branch: fold_order = position of F, token_count = the normal projection's
    -- observation tokens, wm_pos = C of SPEC §10 (largest observation watermark included).
    SELECT 'boundary', bounds.f_pos, p_first_kept, NULL, NULL, NULL, NULL, NULL,
           (SELECT coalesce(sum(token_count) FILTER (WHERE NOT dropped_normal), 0) FROM marked),
           NULL, (SELECT max(wm_pos) FROM recs
                  WHERE kind = 'om.observations.recorded' AND wm_pos <= bounds.f_pos),
           d.full_fold
    FROM decision d CROSS JOIN bounds;

-- Drift (SPEC §4): full memory at the tip against visible memory (p_replayed = false) or against the
-- replayed view (true), in each list's own order.
CREATE OR REPLACE MACRO folded_drift(p_session, p_tip, p_replayed) AS TABLE
    WITH full_memory AS (SELECT item_kind, fold_order, id FROM full_projection(p_session, p_tip, p_tip)),
         visible AS (SELECT item_kind, fold_order, id FROM folded_projection(p_session, p_tip, p_replayed)),
         drift AS (
             SELECT 1 AS list, fold_order, 'observation_only_in_full' AS drift, id FROM full_memory
             WHERE item_kind = 'observation' AND id NOT IN (SELECT id FROM visible WHERE item_kind = 'observation')
             UNION ALL
             SELECT 2, fold_order, 'reflection_only_in_full', id FROM full_memory
             WHERE item_kind = 'reflection' AND id NOT IN (SELECT id FROM visible WHERE item_kind = 'reflection')
             UNION ALL
             SELECT 3, fold_order, 'visible_not_active', id FROM visible
             WHERE item_kind = 'observation' AND id NOT IN (SELECT id FROM full_memory WHERE item_kind = 'observation')
         )
    SELECT drift, id FROM drift ORDER BY list, fold_order;

CREATE OR REPLACE MACRO memory_drift(p_session, p_tip) AS TABLE
    SELECT * FROM folded_drift(p_session, p_tip, false);
