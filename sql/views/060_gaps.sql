-- The compaction gap (SPEC §10, seed 001): raw messages that are neither in the summary nor in the
-- kept tail. Each compaction is judged against the ledger as it stood when it happened: records
-- anchored before it on its branch (for a simulated compaction: also those appended at its anchor
-- before it).

-- The observation records a compaction at p_compaction_pos is judged by: those before it in branch
-- order (branch_records), with their watermark on the branch. A simulated compaction sits after
-- the records appended at its anchor before it (append_seq < p_compaction_seq).
CREATE OR REPLACE MACRO judged_observation_records(p_session, p_leaf, p_compaction_pos, p_compaction_seq, p_simulated) AS TABLE
    SELECT ledger_id, anchor_pos, wm_pos
    FROM branch_records(p_session, p_leaf)
    WHERE kind = 'om.observations.recorded' AND wm_pos IS NOT NULL
      AND (anchor_pos < p_compaction_pos
           OR (p_simulated AND anchor_pos = p_compaction_pos AND append_seq < p_compaction_seq));

-- C, how far the included observation records reach, and the raw messages in (C, p(F)).
CREATE OR REPLACE MACRO compaction_gap(p_session, p_leaf, p_compaction_pos, p_compaction_seq, p_simulated, p_f_pos) AS TABLE
    WITH c AS (
        SELECT coalesce(max(wm_pos) FILTER (WHERE wm_pos <= p_f_pos), -1) AS c_pos, max(wm_pos) AS reach
        FROM judged_observation_records(p_session, p_leaf, p_compaction_pos, p_compaction_seq, p_simulated)
    ),
    gap AS (
        SELECT count(*) AS gap_messages, coalesce(sum(b.tokens_pi), 0) AS gap_tokens
        FROM branch_detail(p_session, p_leaf) b
        CROSS JOIN c
        WHERE b.entry_type = 'message' AND b.is_source AND b.position > c.c_pos AND b.position < p_f_pos
    )
    SELECT c.c_pos, c.reach, gap.gap_messages, gap.gap_tokens FROM c CROSS JOIN gap;

-- The class of a compaction given its gap (SPEC §10).
CREATE OR REPLACE MACRO gap_class(p_empty, p_gap_messages, p_reach, p_f_pos) AS
    CASE WHEN p_empty THEN 'native_fallback'
         WHEN p_gap_messages = 0 THEN 'no_gap'
         WHEN p_reach > p_f_pos THEN 'cross_boundary'
         ELSE 'observer_lag' END;

-- Every compaction on every branch it appears on, classified.
CREATE OR REPLACE VIEW compaction_gaps AS
    WITH occurrences AS (
        SELECT c.session_id, b.leaf_id, c.compaction_id, c.origin, c.trigger, c.first_kept_entry_id, c.folded,
               b.position AS compaction_pos, c.append_seq, f.position AS first_kept_pos,
               -- Pi's own compaction: the projection is the one its simulated twin (if any) folded
               CASE WHEN c.origin = 'pi' THEN (SELECT NOT t.folded FROM om_internal.compactions t
                                               WHERE t.session_id = c.session_id AND t.origin = 'simulated'
                                                 AND t.trigger = 'archive' AND t.anchor_entry_id = c.anchor_entry_id
                                               LIMIT 1)
                    ELSE NOT c.folded END AS empty_projection
        FROM compactions c
        -- b: the compaction entry, once per leaf below it
        JOIN (SELECT a.session_id, a.entry_id, a.depth AS position, l.entry_id AS leaf_id, l.pre AS leaf_pre
              FROM om_internal.entry_tree a
              JOIN om_internal.entry_tree l ON l.session_id = a.session_id AND l.is_leaf AND a.pre <= l.pre AND l.pre <= a.last) b
          ON b.session_id = c.session_id AND b.entry_id = c.anchor_entry_id
        LEFT JOIN (SELECT session_id, entry_id, depth AS position, pre, last FROM om_internal.entry_tree) f
               ON f.session_id = c.session_id AND f.entry_id = c.first_kept_entry_id
              AND f.pre <= b.leaf_pre AND b.leaf_pre <= f.last
    )
    SELECT o.session_id, o.leaf_id, o.compaction_id, o.origin, o.trigger, o.first_kept_entry_id,
           o.compaction_pos, coalesce(o.first_kept_pos, o.compaction_pos) AS first_kept_pos,
           g.c_pos, g.reach AS watermark_reach,
           -- a native fallback summarizes everything before F itself: nothing falls in a gap
           CASE WHEN coalesce(o.empty_projection, g.c_pos < 0) THEN 0 ELSE g.gap_messages END AS gap_messages,
           CASE WHEN coalesce(o.empty_projection, g.c_pos < 0) THEN 0 ELSE g.gap_tokens END AS gap_tokens,
           gap_class(coalesce(o.empty_projection, g.c_pos < 0), g.gap_messages, g.reach,
                     coalesce(o.first_kept_pos, o.compaction_pos)) AS class,
           coalesce(o.empty_projection, g.c_pos < 0) AS empty_projection, o.append_seq
    FROM occurrences o,
         LATERAL compaction_gap(o.session_id, o.leaf_id, o.compaction_pos, o.append_seq, o.origin = 'simulated',
                                coalesce(o.first_kept_pos, o.compaction_pos)) g;
