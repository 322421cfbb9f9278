-- Fold (SPEC §3) and projections (SPEC §4).
--
-- A fold walks the branch's records in branch order (branch_records): the first record of an id
-- wins, every dropped id is a tombstone (even one not seen yet), and active observations are the
-- first-seen ones not tombstoned. It stops at a boundary in one of two ways, kept distinct by p_mode:
--   'anchor'    a plain fold through an entry: records whose own branch position is <= the bound;
--   'watermark' a projection: records whose watermark is on the branch at a position <= the bound.
-- Each kind has its own boundary entry (NULL, or an entry not on the branch, includes nothing).
-- fold_order numbers the items of both kinds in fold order (record order, then place in the record),
-- so the ledger can also be read as one list in the order it was recorded.

CREATE OR REPLACE MACRO fold(p_session, p_tip, p_mode, p_obs_through, p_refl_through, p_drop_through) AS TABLE
    WITH recs AS (SELECT * FROM branch_records(p_session, p_tip)),
    bounds AS (
        SELECT max(position) FILTER (WHERE entry_id = p_obs_through) AS obs_b,
               max(position) FILTER (WHERE entry_id = p_refl_through) AS refl_b,
               max(position) FILTER (WHERE entry_id = p_drop_through) AS drop_b
        FROM branch(p_session, p_tip)
    ),
    included AS (
        SELECT r.ledger_id, r.kind, r.rec_order, r.wm_pos
        FROM recs r CROSS JOIN bounds
        WHERE (CASE WHEN p_mode = 'anchor' THEN r.anchor_pos ELSE r.wm_pos END)
              <= (CASE r.kind WHEN 'om.observations.recorded' THEN bounds.obs_b
                              WHEN 'om.reflections.recorded' THEN bounds.refl_b
                              ELSE bounds.drop_b END)
    ),
    -- The items of all three kinds as one stream, joined to their records once (a smaller plan
    -- than a join per kind: on small sessions planning is much of a fold's cost).
    items AS (
        SELECT 'om.observations.recorded' AS kind, ledger_id, item_index, obs_id AS id, content, ts, relevance,
               source_entry_ids, NULL::VARCHAR[] AS supporting_observation_ids, token_count
        FROM om_internal.observations WHERE session_id = p_session
        UNION ALL
        SELECT 'om.reflections.recorded', ledger_id, item_index, refl_id, content, NULL, NULL, NULL,
               supporting_observation_ids, token_count
        FROM om_internal.reflections WHERE session_id = p_session
        UNION ALL
        SELECT 'om.observations.dropped', ledger_id, item_index, obs_id, NULL, NULL, NULL, NULL, NULL, NULL
        FROM om_internal.drops WHERE session_id = p_session
        UNION ALL
        SELECT 'om.reflections.dropped', ledger_id, item_index, refl_id, NULL, NULL, NULL, NULL, NULL, NULL
        FROM om_internal.reflection_drops WHERE session_id = p_session
    ),
    stream AS (
        SELECT i.*, s.rec_order, s.wm_pos
        FROM items i JOIN included s ON s.ledger_id = i.ledger_id AND s.kind = i.kind
    ),
    -- The first occurrence of each id wins (the earliest record, then place in it), and an
    -- observation id with a drop anywhere in the stream is tombstoned. Written as a GROUP BY and a
    -- semi-join rather than the two partitioned windows it equals (row_number() = 1, bool_or()):
    -- on a few hundred items DuckDB's partitioned windows cost milliseconds each; this form takes
    -- 25% fewer instructions per ledger_at on the real sessions (callgrind), and the replay folds
    -- at nearly every stage it prepares.
    -- dropped_at: the record order of the first drop record naming the id (the workers lay their
    -- memory out by it: om_core.workers.inputs.laid_out_memory).
    first_seen AS (
        SELECT kind, id, min((rec_order, item_index)) AS first_at FROM stream GROUP BY kind, id
    ),
    -- an observation drop tombstones observation ids, a reflection drop (SPEC §13) reflection ids
    tombstones AS (
        SELECT CASE kind WHEN 'om.observations.dropped' THEN 'om.observations.recorded'
                         ELSE 'om.reflections.recorded' END AS of_kind,
               id, min(rec_order) AS dropped_at
        FROM stream WHERE kind IN ('om.observations.dropped', 'om.reflections.dropped') GROUP BY ALL
    ),
    walked AS (
        SELECT s.*, t.dropped_at
        FROM stream s
        JOIN first_seen f ON f.kind = s.kind AND f.id = s.id AND f.first_at = (s.rec_order, s.item_index)
        LEFT JOIN tombstones t ON t.of_kind = s.kind AND t.id = s.id
        WHERE s.kind NOT IN ('om.observations.dropped', 'om.reflections.dropped')
          AND s.id NOT IN (SELECT id FROM forgotten_ids(p_session))  -- the user's forget: gone at every boundary
    )
    SELECT CASE kind WHEN 'om.observations.recorded' THEN 'observation' ELSE 'reflection' END AS item_kind,
           row_number() OVER (ORDER BY rec_order, item_index) AS fold_order,
           id, content, ts, relevance, source_entry_ids, supporting_observation_ids, token_count, ledger_id,
           CASE WHEN kind = 'om.observations.recorded' THEN wm_pos END AS wm_pos,
           dropped_at IS NOT NULL AS dropped, rec_order, dropped_at
    FROM walked;

-- The ledger as it stands at p_tip: a plain fold through the tip (every record on the branch),
-- dropped observations included with dropped = true. This is what the workers read.
CREATE OR REPLACE MACRO ledger_at(p_session, p_tip) AS TABLE
    SELECT * FROM fold(p_session, p_tip, 'anchor', p_tip, p_tip, p_tip);

-- Full projection at boundary p_boundary ("full memory" when the boundary is the tip): fold only
-- the records covered through it; active observations, then reflections.
CREATE OR REPLACE MACRO full_projection(p_session, p_tip, p_boundary) AS TABLE
    SELECT * EXCLUDE (dropped, rec_order, dropped_at)
    FROM fold(p_session, p_tip, 'watermark', p_boundary, p_boundary, p_boundary)
    WHERE NOT dropped;

-- Folded compactions on the branch (the extension's and simulated ones), newest first; fold_rank 1 is
-- the newest.
CREATE OR REPLACE MACRO branch_folds(p_session, p_tip) AS TABLE
    SELECT compaction_id, origin, full_fold, first_kept_entry_id, summary, anchor_pos, first_kept_pos,
           row_number() OVER (ORDER BY compaction_order DESC) AS fold_rank
    FROM branch_compactions(p_session, p_tip)
    WHERE folded
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
    FROM om_internal.compaction_items i
    JOIN latest l ON l.compaction_id = i.compaction_id
    WHERE i.session_id = p_session
      AND i.id NOT IN (SELECT id FROM forgotten_ids(p_session));  -- a stored compaction shows no forgotten id

-- Visible projection (SPEC §4): what the session file shows the agent.
CREATE OR REPLACE MACRO visible_projection(p_session, p_tip) AS TABLE
    SELECT * FROM folded_projection(p_session, p_tip, false);

-- Replayed projection: the latest folded compaction, simulated ones included (always labelled
-- replayed, never what the agent saw).
CREATE OR REPLACE MACRO replayed_projection(p_session, p_tip) AS TABLE
    SELECT * FROM folded_projection(p_session, p_tip, true);

-- The compaction decision at F = p_first_kept with pool limit P = p_pool_max (SPEC §4), one row:
--   f_pos           position of F (NULL: F is not on the branch);
--   m_entry_id, m_pos  M, the first kept entry of the latest folded full-fold compaction on the
--                   branch whose first kept entry is on the branch (NULL: no full fold yet). Which
--                   compactions count is the world: with p_replayed false only those the session
--                   file holds (Pi's and the extension's om.folded ones: what the extension computes
--                   on that file); true adds the replay's simulated ones (the replayed world);
--   normal_tokens   the tokens of the normal projection's observations (covered through F, less
--                   the drops covered through M);
--   full_fold       normal_tokens >= P;
--   others_through  the boundary for reflections and drops that follows: F for a full fold, else M;
--   c_pos           C of SPEC §10: the largest observation watermark the projection includes.
CREATE OR REPLACE MACRO compaction_decision(p_session, p_tip, p_first_kept, p_pool_max, p_replayed) AS TABLE
    WITH m AS (
        SELECT first_kept_entry_id AS m_entry_id, first_kept_pos AS m_pos
        FROM branch_compactions(p_session, p_tip)
        WHERE folded AND full_fold AND first_kept_pos IS NOT NULL AND (p_replayed OR origin <> 'simulated')
        ORDER BY compaction_order DESC LIMIT 1
    ),
    normal AS (  -- only its observations count, so reflections are left out of this fold
        SELECT coalesce(sum(token_count), 0) AS normal_tokens
        FROM fold(p_session, p_tip, 'watermark', p_first_kept, NULL, (SELECT m_entry_id FROM m))
        WHERE item_kind = 'observation' AND NOT dropped
    ),
    f AS (SELECT position_on_branch(p_session, p_tip, p_first_kept) AS f_pos)
    SELECT f.f_pos, m.m_entry_id, m.m_pos, normal.normal_tokens, normal.normal_tokens >= p_pool_max AS full_fold,
           CASE WHEN normal.normal_tokens >= p_pool_max THEN p_first_kept ELSE m.m_entry_id END AS others_through,
           (SELECT max(wm_pos) FROM branch_records(p_session, p_tip)
            WHERE kind = 'om.observations.recorded' AND wm_pos <= f.f_pos) AS c_pos
    FROM f CROSS JOIN normal LEFT JOIN m ON true;

-- Compaction projection at F (SPEC §4): the fold the decision picks, observations covered through F
-- and reflections and drops through the decision's boundary (M, or F for a full fold); p_replayed
-- as for the decision.
-- Cost (bench/perf/compaction.py, 10,000-entry branch): deciding first and then folding is about 2x the
-- former single flat pass (warm, in process: some tens of ms more); `om compact` itself is ~1 s of
-- process start, so the plain form is kept. om_core.memory.views reads the decision once and passes
-- others_through to fold, so a compaction decides once, not twice.
CREATE OR REPLACE MACRO compaction_projection(p_session, p_tip, p_first_kept, p_pool_max, p_replayed) AS TABLE
    WITH d AS MATERIALIZED (SELECT * FROM compaction_decision(p_session, p_tip, p_first_kept, p_pool_max, p_replayed))
    SELECT p.* EXCLUDE (dropped, rec_order, dropped_at), (SELECT full_fold FROM d) AS full_fold
    FROM fold(p_session, p_tip, 'watermark', p_first_kept, (SELECT others_through FROM d),
              (SELECT others_through FROM d)) p
    WHERE NOT p.dropped;

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
