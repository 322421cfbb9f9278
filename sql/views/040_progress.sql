-- Progress clocks (SPEC §7), coverage tiers (SPEC §8) and recall (SPEC §6).

-- Source tokens on the branch after each worker's latest valid watermark, and after the latest
-- compaction's first kept entry. from_pos is the first counted position.
CREATE OR REPLACE MACRO progress_clocks(p_session, p_tip) AS TABLE
    WITH b AS (
        SELECT position, entry_id, is_source, tokens_pi, tokens FROM branch_detail(p_session, p_tip)
    ),
    marks AS (
        SELECT kind, max(wm_pos) AS wm_pos FROM branch_records(p_session, p_tip)
        WHERE wm_pos IS NOT NULL GROUP BY kind
    ),
    latest_compaction AS (
        SELECT compaction_id, first_kept_pos, anchor_pos FROM branch_compactions(p_session, p_tip)
        ORDER BY compaction_order DESC LIMIT 1
    ),
    starts AS (
        SELECT k.clock, coalesce(m.wm_pos + 1, 0) AS from_pos, m.wm_pos AS watermark_pos
        FROM (VALUES ('observer', 'om.observations.recorded'), ('reflector', 'om.reflections.recorded'),
                     ('dropper', 'om.observations.dropped')) k(clock, kind)
        LEFT JOIN marks m ON m.kind = k.kind
        UNION ALL
        SELECT 'compaction', coalesce((SELECT coalesce(first_kept_pos, anchor_pos + 1) FROM latest_compaction), 0),
               (SELECT anchor_pos FROM latest_compaction)
    )
    SELECT s.clock, s.from_pos, s.watermark_pos,
           (SELECT entry_id FROM b WHERE b.position = s.watermark_pos) AS watermark_entry_id,
           coalesce(sum(b.tokens_pi) FILTER (WHERE b.is_source AND b.position >= s.from_pos), 0) AS tokens_pi,
           coalesce(sum(b.tokens) FILTER (WHERE b.is_source AND b.position >= s.from_pos), 0) AS tokens
    FROM starts s, b
    GROUP BY s.clock, s.from_pos, s.watermark_pos;

-- The ledger at the tip (ledger_at) with each observation's coverage tier: none (cited by no
-- current reflection), partial (by one), strong (by two or more). One query gives a worker all of
-- its memory input.
CREATE OR REPLACE MACRO ledger_coverage(p_session, p_tip) AS TABLE
    WITH state AS (SELECT * FROM ledger_at(p_session, p_tip)),
    cites AS (
        SELECT DISTINCT id AS refl_id, unnest(supporting_observation_ids) AS obs_id
        FROM state WHERE item_kind = 'reflection' AND NOT dropped  -- a dropped reflection cites nothing
    ),
    counted AS (
        SELECT obs_id, count(*) AS citing_reflections FROM cites GROUP BY obs_id
    )
    SELECT s.*,
           CASE WHEN s.item_kind = 'observation' THEN coalesce(n.citing_reflections, 0) END AS citing_reflections,
           CASE WHEN s.item_kind <> 'observation' THEN NULL
                WHEN coalesce(n.citing_reflections, 0) = 0 THEN 'none'
                WHEN n.citing_reflections = 1 THEN 'partial' ELSE 'strong' END AS coverage
    FROM state s LEFT JOIN counted n ON s.item_kind = 'observation' AND n.obs_id = s.id;

-- Active observations at the tip with their coverage tier.
CREATE OR REPLACE MACRO coverage_tiers(p_session, p_tip) AS TABLE
    SELECT fold_order, id AS obs_id, content, ts, relevance, source_entry_ids, token_count, citing_reflections,
           coverage
    FROM ledger_coverage(p_session, p_tip)
    WHERE item_kind = 'observation' AND NOT dropped;

-- Recall searches the whole ledger history of the branch, every valid record, regardless of
-- watermarks. Each occurrence of the id in a record is one match.
CREATE OR REPLACE MACRO recall_observations(p_session, p_tip, p_ids) AS TABLE
    WITH recs AS (SELECT * FROM branch_records(p_session, p_tip)),
    dropped AS (
        SELECT DISTINCT d.obs_id FROM om_internal.drops d
        JOIN recs r ON r.ledger_id = d.ledger_id AND r.kind = 'om.observations.dropped'
        WHERE d.session_id = p_session AND list_contains(p_ids, d.obs_id)
    )
    SELECT o.obs_id AS id, o.ledger_id, r.rec_order, o.item_index, o.content, o.ts, o.relevance,
           o.source_entry_ids, o.token_count,
           CASE WHEN o.obs_id IN (SELECT id FROM forgotten_ids(p_session)) THEN 'forgotten'
                WHEN x.obs_id IS NULL THEN 'active' ELSE 'dropped' END AS status,
           row_number() OVER (PARTITION BY o.obs_id ORDER BY r.rec_order, o.item_index) AS occurrence
    FROM om_internal.observations o
    JOIN recs r ON r.ledger_id = o.ledger_id AND r.kind = 'om.observations.recorded'
    LEFT JOIN dropped x ON x.obs_id = o.obs_id
    WHERE o.session_id = p_session AND list_contains(p_ids, o.obs_id);

CREATE OR REPLACE MACRO recall_reflections(p_session, p_tip, p_id) AS TABLE
    SELECT f.refl_id AS id, f.ledger_id, r.rec_order, f.item_index, f.content,
           f.supporting_observation_ids, f.token_count,
           f.refl_id IN (SELECT id FROM forgotten_ids(p_session)) AS forgotten,
           -- dropped (SPEC §13): a reflection drop record on the branch names it
           EXISTS (SELECT 1 FROM om_internal.reflection_drops d
                   JOIN branch_records(p_session, p_tip) x
                     ON x.ledger_id = d.ledger_id AND x.kind = 'om.reflections.dropped'
                   WHERE d.session_id = p_session AND d.refl_id = p_id) AS dropped
    FROM om_internal.reflections f
    JOIN branch_records(p_session, p_tip) r ON r.ledger_id = f.ledger_id AND r.kind = 'om.reflections.recorded'
    WHERE f.session_id = p_session AND f.refl_id = p_id;

-- How each cited entry id resolves on the branch: missing, a source entry, or a non-source entry.
CREATE OR REPLACE MACRO resolve_entries(p_session, p_tip, p_ids) AS TABLE
    WITH wanted AS (SELECT DISTINCT unnest(p_ids) AS entry_id),
    b AS (SELECT position, entry_id FROM branch(p_session, p_tip))
    SELECT w.entry_id, b.position, e.entry_type, e.role, e.is_source, e.ts, e.tokens_pi, e.raw
    FROM wanted w
    LEFT JOIN b ON b.entry_id = w.entry_id
    LEFT JOIN om_internal.entries e ON e.session_id = p_session AND e.entry_id = b.entry_id;
