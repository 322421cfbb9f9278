-- Projects and project memory (issue 35): which repository each session worked in, the project
-- ledger, and its fold.

-- Each session's project, with the facts it was resolved from (om_core.project.repository): sessions whose
-- header names no cwd belong to none.
CREATE OR REPLACE VIEW project_sessions AS
    SELECT p.project_id, p.session_id, s.file_path, p.cwd, p.git_root, p.git_remote, p.how, s.started_at,
           s.leaf_id, p.resolved_at
    FROM om_internal.project_sessions p
    JOIN om_internal.sessions s USING (session_id)
    WHERE p.project_id IS NOT NULL;

-- The project ledger's records, reflections and retirements (as the session ledger's views).
CREATE OR REPLACE VIEW project_ledger AS
    SELECT project_id, ledger_id, kind, covers_up_to_seq, origin, created_at, append_seq, run_id, stage, stage_key
    FROM om_internal.project_ledger;

CREATE OR REPLACE VIEW project_reflections AS
    SELECT x.project_id, x.ledger_id, x.refl_id, x.content, x.supporting_ids, x.token_count, x.item_index,
           r.covers_up_to_seq, r.origin, r.created_at
    FROM om_internal.project_reflections x
    JOIN om_internal.project_ledger r ON r.project_id = x.project_id AND r.ledger_id = x.ledger_id;

CREATE OR REPLACE VIEW project_retirements AS
    SELECT t.project_id, t.ledger_id, t.refl_id, t.item_index, t.reason, r.origin, r.created_at
    FROM om_internal.project_retirements t
    JOIN om_internal.project_ledger r ON r.project_id = t.project_id AND r.ledger_id = t.ledger_id;

CREATE OR REPLACE VIEW project_stages AS
    SELECT stage_run_id, run_id, project_id, outcome, model, covers_up_to_seq, inputs, input_tokens, records,
           items, rejected, error_kind, error, started_at, finished_at, stage_key
    FROM om_internal.project_stages;

-- The project fold (SPEC §3's rules on the project ledger): records in append order; the first
-- record of a reflection id wins; every retired id is a tombstone, even one not seen yet. A
-- supporting id a user forgot in the session that holds it is left out of the list, and a
-- reflection with no support left is retired by that. retired_at: the record order of the first
-- retirement naming it (NULL: current).
CREATE OR REPLACE MACRO project_fold(p_project) AS TABLE
    WITH recs AS (
        SELECT ledger_id, kind, origin, covers_up_to_seq, row_number() OVER (ORDER BY append_seq) AS rec_order
        FROM om_internal.project_ledger WHERE project_id = p_project
    ),
    items AS (
        SELECT r.rec_order, x.item_index, x.refl_id AS id, x.content, x.supporting_ids, x.token_count, x.ledger_id
        FROM om_internal.project_reflections x
        JOIN recs r ON r.ledger_id = x.ledger_id AND r.kind = 'om.project.reflections.recorded'
        WHERE x.project_id = p_project
    ),
    first_seen AS (SELECT id, min((rec_order, item_index)) AS first_at FROM items GROUP BY id),
    walked AS (
        SELECT i.* FROM items i JOIN first_seen f ON f.id = i.id AND f.first_at = (i.rec_order, i.item_index)
    ),
    retired AS (
        SELECT t.refl_id AS id, min(r.rec_order) AS retired_at, arg_min(t.reason, (r.rec_order, t.item_index)) AS reason
        FROM om_internal.project_retirements t
        JOIN recs r ON r.ledger_id = t.ledger_id AND r.kind = 'om.project.reflections.retired'
        WHERE t.project_id = p_project
        GROUP BY t.refl_id
    ),
    forgotten AS (
        SELECT DISTINCT d.obs_id AS id
        FROM om_internal.project_sessions p
        JOIN om_internal.ledger l ON l.session_id = p.session_id AND l.origin = 'user'
        JOIN om_internal.drops d ON d.session_id = l.session_id AND d.ledger_id = l.ledger_id
        WHERE p.project_id = p_project
    ),
    support AS (
        SELECT w.id, list(s.sid ORDER BY s.pos) FILTER (WHERE g.id IS NULL) AS kept
        FROM walked w,
             LATERAL (SELECT unnest(w.supporting_ids) AS sid, generate_subscripts(w.supporting_ids, 1) AS pos) s
        LEFT JOIN forgotten g ON g.id = s.sid
        GROUP BY w.id
    )
    SELECT row_number() OVER (ORDER BY w.rec_order, w.item_index) AS fold_order, w.id, w.content,
           coalesce(s.kept, []::VARCHAR[]) AS supporting_ids, w.token_count, w.ledger_id, w.rec_order,
           t.retired_at,
           CASE WHEN t.id IS NOT NULL THEN t.reason
                WHEN coalesce(len(s.kept), 0) = 0 THEN 'its support was forgotten' END AS retired_reason,
           t.id IS NOT NULL OR coalesce(len(s.kept), 0) = 0 AS retired
    FROM walked w
    LEFT JOIN support s ON s.id = w.id
    LEFT JOIN retired t ON t.id = w.id;

-- A project's memory: its current reflections, in fold order.
CREATE OR REPLACE MACRO project_memory(p_project) AS TABLE
    SELECT fold_order, id, content, supporting_ids, token_count, ledger_id
    FROM project_fold(p_project)
    WHERE NOT retired
    ORDER BY fold_order;

-- How far each project's input has grown since its project stage last read it: the reflections and
-- critical observations its sessions' ledgers recorded after the watermark (the latest project
-- record's, or a later deliberate empty result's: that input waits for more). new_tokens is the
-- project stage's clock (projectReflectAfterTokens).
CREATE OR REPLACE VIEW project_growth AS
    WITH marks AS (
        SELECT project_id, max(covers_up_to_seq) AS watermark_seq
        FROM (SELECT project_id, covers_up_to_seq FROM om_internal.project_ledger WHERE origin = 'pipeline'
              UNION ALL
              SELECT project_id, covers_up_to_seq FROM om_internal.project_stages WHERE outcome = 'empty')
        GROUP BY project_id
    ),
    inputs AS (
        SELECT p.project_id, r.append_seq, x.token_count
        FROM om_internal.project_sessions p
        JOIN om_internal.ledger r ON r.session_id = p.session_id AND r.origin <> 'user'
        JOIN om_internal.reflections x ON x.session_id = r.session_id AND x.ledger_id = r.ledger_id
        WHERE p.project_id IS NOT NULL
        UNION ALL
        SELECT p.project_id, r.append_seq, o.token_count
        FROM om_internal.project_sessions p
        JOIN om_internal.ledger r ON r.session_id = p.session_id AND r.origin <> 'user'
        JOIN om_internal.observations o ON o.session_id = r.session_id AND o.ledger_id = r.ledger_id
        WHERE p.project_id IS NOT NULL AND o.relevance = 'critical'
    )
    SELECT i.project_id, m.watermark_seq,
           coalesce(sum(i.token_count) FILTER (WHERE i.append_seq > coalesce(m.watermark_seq, 0)), 0) AS new_tokens,
           count(*) FILTER (WHERE i.append_seq > coalesce(m.watermark_seq, 0)) AS new_items,
           max(i.append_seq) AS latest_seq
    FROM inputs i LEFT JOIN marks m USING (project_id)
    GROUP BY i.project_id, m.watermark_seq;

-- Every project: its sessions, where they worked, and the size of its memory.
CREATE OR REPLACE VIEW projects AS
    WITH members AS (
        SELECT project_id, count(*) AS sessions, min(started_at) AS first_started_at,
               max(started_at) AS last_started_at,
               list(DISTINCT git_root ORDER BY git_root) FILTER (WHERE git_root IS NOT NULL) AS git_roots,
               min(git_remote) AS git_remote, min(how) AS how
        FROM project_sessions GROUP BY project_id
    ),
    current_memory AS (
        SELECT r.project_id, count(DISTINCT r.refl_id) AS reflections
        FROM om_internal.project_reflections r
        WHERE NOT EXISTS (SELECT 1 FROM om_internal.project_retirements t
                          WHERE t.project_id = r.project_id AND t.refl_id = r.refl_id)
        GROUP BY r.project_id
    )
    SELECT m.project_id, regexp_extract(m.project_id, '([^/\\:]+)[/\\]*$', 1) AS name, m.sessions,
           m.first_started_at, m.last_started_at, coalesce(m.git_roots, []::VARCHAR[]) AS git_roots, m.git_remote,
           m.how, coalesce(c.reflections, 0) AS reflections, coalesce(g.new_tokens, 0) AS new_tokens
    FROM members m
    LEFT JOIN current_memory c USING (project_id)
    LEFT JOIN project_growth g USING (project_id);
