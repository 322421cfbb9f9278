-- Public ledger views (stable names, documented in the README) and the branch-local record order.

CREATE OR REPLACE VIEW ledger AS
    SELECT session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, origin, created_at,
           append_seq, run_id, stage, stage_key
    FROM om_internal.ledger;

CREATE OR REPLACE VIEW observations AS
    SELECT o.session_id, o.ledger_id, o.obs_id, o.content, o.ts, o.relevance, o.source_entry_ids,
           o.token_count, o.item_index, r.covers_up_to_id, r.anchor_entry_id, r.origin, o.ts_repaired_from
    FROM om_internal.observations o
    JOIN om_internal.ledger r ON r.session_id = o.session_id AND r.ledger_id = o.ledger_id;

CREATE OR REPLACE VIEW reflections AS
    SELECT f.session_id, f.ledger_id, f.refl_id, f.content, f.supporting_observation_ids,
           f.token_count, f.item_index, r.covers_up_to_id, r.anchor_entry_id, r.origin
    FROM om_internal.reflections f
    JOIN om_internal.ledger r ON r.session_id = f.session_id AND r.ledger_id = f.ledger_id;

CREATE OR REPLACE VIEW drops AS
    SELECT d.session_id, d.ledger_id, d.obs_id, d.item_index, r.covers_up_to_id, r.anchor_entry_id,
           r.origin, d.reason
    FROM om_internal.drops d
    JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id;

-- Reflection drops (SPEC §13): each reflection id an om.reflections.dropped record tombstones;
-- replaced_by and kind as the record carried them (JSON text), NULL when absent.
CREATE OR REPLACE VIEW reflection_drops AS
    SELECT d.session_id, d.ledger_id, d.refl_id, d.item_index, r.covers_up_to_id, r.anchor_entry_id,
           r.origin, d.reason, d.replaced_by, d.kind
    FROM om_internal.reflection_drops d
    JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id;

-- Every compaction: Pi's own entries (origin pi), the extension's om.folded ones (imported), and
-- the ones this project simulated. full_fold and the item lists exist only for folded ones.
CREATE OR REPLACE VIEW compactions AS
    SELECT e.session_id, e.entry_id AS compaction_id,
           CASE WHEN f.compaction_id IS NULL THEN 'pi' ELSE 'imported' END AS origin,
           e.first_kept_entry_id, f.full_fold, e.raw ->> '$.summary' AS summary,
           coalesce(f.folded, false) AS folded, e.entry_id AS anchor_entry_id, e.line_no,
           TRY_CAST(e.raw ->> '$.tokensBefore' AS BIGINT) AS tokens_before, e.ts AS created_at,
           NULL::VARCHAR AS note, NULL::VARCHAR AS trigger, NULL::BIGINT AS append_seq
    FROM om_internal.entries e
    LEFT JOIN om_internal.compactions f
           ON f.session_id = e.session_id AND f.compaction_id = e.entry_id AND f.origin = 'imported'
    WHERE e.entry_type = 'compaction'
    UNION ALL
    SELECT session_id, compaction_id, origin, first_kept_entry_id, full_fold, summary, folded,
           anchor_entry_id, NULL AS line_no, NULL AS tokens_before, created_at, note, trigger, append_seq
    FROM om_internal.compactions
    WHERE origin = 'simulated';

CREATE OR REPLACE VIEW compaction_items AS
    SELECT session_id, compaction_id, item_kind, item_index, id, content, ts, relevance,
           source_entry_ids, supporting_observation_ids, token_count
    FROM om_internal.compaction_items;

-- Position of an entry on the branch to p_tip (NULL when it is not on that branch).
CREATE OR REPLACE MACRO position_on_branch(p_session, p_tip, p_entry) AS (
    SELECT max(position) FROM branch(p_session, p_tip) WHERE entry_id = p_entry
);

-- SPEC §2's branch order, the one tie-break both orders below share: at one anchor, what the
-- session file holds (imported records; Pi's and the extension's compactions) comes before what
-- this project appended there (pipeline records, simulated compactions), then append order.
CREATE OR REPLACE MACRO appended_by_project(p_origin) AS p_origin IN ('pipeline', 'simulated');

-- The ids a user forgot in a session (om forget): the items of the session's drop records of origin
-- user. A forgotten id leaves every fold, projection and compaction of that session, on every branch
-- and at every boundary (a forget is the user's, not a point in the conversation).
CREATE OR REPLACE MACRO forgotten_ids(p_session) AS TABLE
    SELECT DISTINCT d.obs_id AS id
    FROM om_internal.drops d
    JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id
    WHERE d.session_id = p_session AND r.origin = 'user'
    UNION
    SELECT d.refl_id
    FROM om_internal.reflection_drops d
    JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id
    WHERE d.session_id = p_session AND r.origin = 'user';

-- The record order: every valid ledger record on the branch to p_tip in branch order (anchor
-- position, then the tie-break above), with its watermark position (wm_pos NULL = dangling).
-- Every fold, projection, clock and recall walks records through this macro. A user's forget (a
-- drop record of origin user) has no place in it: it applies to every branch and boundary
-- (forgotten_ids), and it is no dropper's watermark.
CREATE OR REPLACE MACRO branch_records(p_session, p_tip) AS TABLE
    WITH b AS (SELECT position, entry_id FROM branch(p_session, p_tip))
    SELECT r.ledger_id, r.kind, r.origin, r.covers_up_to_id, r.anchor_entry_id, r.append_seq,
           a.position AS anchor_pos, w.position AS wm_pos,
           row_number() OVER (ORDER BY a.position, appended_by_project(r.origin), r.append_seq) AS rec_order
    FROM om_internal.ledger r
    JOIN b a ON a.entry_id = r.anchor_entry_id
    LEFT JOIN b w ON w.entry_id = r.covers_up_to_id
    WHERE r.session_id = p_session AND r.origin <> 'user';

-- The compaction order: every compaction on the branch to p_tip in the same branch order, with
-- where its first kept entry sits (NULL: not on the branch). A macro of its own only because
-- compactions are other rows (the compactions view: Pi's entries and om_internal.compactions), not
-- because their order differs.
CREATE OR REPLACE MACRO branch_compactions(p_session, p_tip) AS TABLE
    WITH b AS (SELECT position, entry_id FROM branch(p_session, p_tip))
    SELECT c.compaction_id, c.origin, c.folded, c.full_fold, c.first_kept_entry_id, c.summary,
           a.position AS anchor_pos, k.position AS first_kept_pos,
           row_number() OVER (ORDER BY a.position, appended_by_project(c.origin), c.append_seq) AS compaction_order
    FROM compactions c
    JOIN b a ON a.entry_id = c.anchor_entry_id
    LEFT JOIN b k ON k.entry_id = c.first_kept_entry_id
    WHERE c.session_id = p_session;

-- Orphaned records (SPEC §2): what this project appended to a session whose file was later rewritten
-- and no longer holds the record's evidence. They are kept as recorded, never deleted (the file's
-- own records, origin imported, are read from the file again). A record whose session or anchor
-- entry is gone lies on no branch: no fold, projection, compaction or branch recall sees it.
--   session_gone:  the file now holds another session (or none) and no file holds this one;
--   anchor_gone:   the entry it was appended after is no longer in the session;
--   sources_gone:  still on its branch, but some of its observations' source entries are gone.
CREATE OR REPLACE MACRO anchor_gone_reason(p_session, p_anchor) AS CASE
    WHEN NOT EXISTS (SELECT 1 FROM om_internal.sessions s WHERE s.session_id = p_session) THEN 'session_gone'
    WHEN NOT EXISTS (SELECT 1 FROM om_internal.entries e WHERE e.session_id = p_session AND e.entry_id = p_anchor)
        THEN 'anchor_gone'
END;

-- The orphaned records of one session (p_session NULL: of every session).
CREATE OR REPLACE MACRO orphaned_records_in(p_session) AS TABLE
    WITH r AS (
        SELECT session_id, ledger_id, kind, anchor_entry_id, covers_up_to_id, run_id, created_at,
               anchor_gone_reason(session_id, anchor_entry_id) AS gone
        FROM om_internal.ledger
        WHERE origin = 'pipeline' AND (p_session IS NULL OR session_id = p_session)),
    gone_sources AS (
        SELECT o.session_id, o.ledger_id, list(DISTINCT s.entry_id ORDER BY s.entry_id) AS ids
        FROM om_internal.observations o, unnest(o.source_entry_ids) AS s(entry_id)
        WHERE (p_session IS NULL OR o.session_id = p_session)
          AND NOT EXISTS (SELECT 1 FROM om_internal.entries e
                          WHERE e.session_id = o.session_id AND e.entry_id = s.entry_id)
        GROUP BY ALL)
    SELECT r.session_id, r.ledger_id, r.kind, coalesce(r.gone, 'sources_gone') AS reason, r.anchor_entry_id,
           coalesce(g.ids, []::VARCHAR[]) AS missing_source_entry_ids, r.covers_up_to_id, r.run_id, r.created_at
    FROM r LEFT JOIN gone_sources g ON g.session_id = r.session_id AND g.ledger_id = r.ledger_id
    WHERE r.gone IS NOT NULL OR g.ledger_id IS NOT NULL;

CREATE OR REPLACE VIEW orphaned_records AS SELECT * FROM orphaned_records_in(NULL);
