-- Search over all memory (issue 35): observations, reflections, source entries and project
-- reflections, ranked by BM25 over a terms table (om_internal.search_terms, kept by every writer:
-- om_core.recall.search). DuckDB's full-text extension is not used: no registry this project reaches ships
-- it for the DuckDB it runs on, and an extension fetched at run time is what om never does.

-- A text's terms, lower case: its words (letters and digits), its identifiers (words joined by
-- _ . + -: snake_case, file.py, v1.2.3, kebab-case) and its paths (joined by / : @ # too:
-- src/upload.py:42), so an exact identifier is a term of its own, rarer than the words in it.
-- Terms over 64 characters (base64, hashes of blobs) are left out.
CREATE OR REPLACE MACRO text_terms(p_text) AS
    list_filter(list_concat(
        regexp_extract_all(lower(p_text), '[\p{L}\p{N}]+'),
        list_filter(regexp_extract_all(lower(p_text), '[\p{L}\p{N}_]+(?:[.+\-][\p{L}\p{N}_]+)*'),
                    lambda t: regexp_matches(t, '[_.+\-]')),
        regexp_extract_all(lower(p_text), '[\p{L}\p{N}_.+\-]+(?:[/:@#][\p{L}\p{N}_.+\-]+)+')),
        lambda t: length(t) <= 64);

-- The indexed documents, with where each lives (analysts join on these keys).
CREATE OR REPLACE VIEW search_documents AS
    SELECT doc_kind, scope_id, doc_id, length FROM om_internal.search_documents;

CREATE OR REPLACE VIEW search_terms AS
    SELECT doc_kind, scope_id, doc_id, term, tf FROM om_internal.search_terms;

-- The indexed documents a search looks at: one project's (p_project: its sessions' memory and
-- entries, and its project reflections), one session's (p_session), or everything (both NULL). Ids a
-- user forgot (om forget) are left out.
CREATE OR REPLACE MACRO search_scope(p_project, p_session) AS TABLE
    WITH members AS (
        SELECT session_id FROM om_internal.project_sessions WHERE project_id = p_project
    ),
    forgotten AS (
        SELECT DISTINCT d.session_id, d.obs_id AS id
        FROM om_internal.drops d
        JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id AND r.origin = 'user'
        UNION ALL
        SELECT DISTINCT d.session_id, d.refl_id
        FROM om_internal.reflection_drops d
        JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id AND r.origin = 'user'
        UNION ALL
        SELECT DISTINCT t.project_id, t.refl_id
        FROM om_internal.project_retirements t
        JOIN om_internal.project_ledger r ON r.project_id = t.project_id AND r.ledger_id = t.ledger_id
                                         AND r.origin = 'user'
    ),
    docs AS (
        SELECT d.* FROM om_internal.search_documents d
        WHERE (p_session IS NULL OR (d.scope_id = p_session AND d.doc_kind <> 'project_reflection'))
          AND (p_project IS NULL
               OR (d.doc_kind = 'project_reflection' AND d.scope_id = p_project)
               OR (d.doc_kind <> 'project_reflection' AND d.scope_id IN (SELECT session_id FROM members)))
          AND (d.doc_kind = 'entry'
               OR NOT EXISTS (SELECT 1 FROM forgotten f WHERE f.session_id = d.scope_id AND f.id = d.doc_id))
    )
    SELECT * FROM docs;

-- The BM25 ranking alone (search_memory without the hits' texts): one row per matching document,
-- best first (rank), with its score and how many query terms it holds.
CREATE OR REPLACE MACRO search_ranked(p_query, p_project, p_session) AS TABLE
    WITH q AS (SELECT DISTINCT unnest(text_terms(p_query)) AS term),
    docs AS (SELECT * FROM search_scope(p_project, p_session)),
    stats AS (SELECT count(*) AS n, coalesce(avg(length), 0) AS avgdl FROM docs),
    hits AS (
        SELECT t.doc_kind, t.scope_id, t.doc_id, t.term, t.tf, d.length
        FROM om_internal.search_terms t
        JOIN q ON q.term = t.term
        JOIN docs d ON d.doc_kind = t.doc_kind AND d.scope_id = t.scope_id AND d.doc_id = t.doc_id
    ),
    df AS (SELECT term, count(*) AS df FROM hits GROUP BY term),
    scored AS (
        SELECT h.doc_kind, h.scope_id, h.doc_id,
               sum(ln(1 + (s.n - df.df + 0.5) / (df.df + 0.5))
                   * h.tf * 2.2 / (h.tf + 1.2 * (0.25 + 0.75 * h.length / greatest(s.avgdl, 1)))) AS score,
               count(*) AS matched_terms
        FROM hits h JOIN df USING (term) CROSS JOIN stats s
        GROUP BY h.doc_kind, h.scope_id, h.doc_id
    ),
    ranked AS (
        SELECT *, row_number() OVER (ORDER BY score DESC, matched_terms DESC,
                                     CASE doc_kind WHEN 'observation' THEN 0 WHEN 'reflection' THEN 1
                                                   WHEN 'project_reflection' THEN 2 ELSE 3 END,
                                     scope_id, doc_id) AS rank
        FROM scored
    )
    SELECT * FROM ranked;

-- BM25 (k1 1.2, b 0.75) of p_query over the documents of one project (p_project: its sessions'
-- memory and entries, and its project reflections), one session (p_session), or everything (both
-- NULL). Ids a user forgot (om forget) are left out. One row per hit, best first:
--   memory_id: the observation's or reflection's id (NULL for an entry);
--   source_entry_ids: where it comes from: an observation's sources, a reflection's supporting
--     observations' sources, the entry itself;
--   memory_ids: the memory ids that rest on the hit (an entry: the observations citing it; a project
--     reflection: the session memory ids it cites).
CREATE OR REPLACE MACRO search_memory(p_query, p_project, p_session) AS TABLE
    WITH ranked AS (SELECT * FROM search_ranked(p_query, p_project, p_session)),
    obs AS (
        SELECT o.session_id, o.obs_id, any_value(o.content) AS content, any_value(o.source_entry_ids) AS sources
        FROM om_internal.observations o
        JOIN ranked k ON k.doc_kind = 'observation' AND k.scope_id = o.session_id AND k.doc_id = o.obs_id
        GROUP BY o.session_id, o.obs_id
    ),
    refl AS (
        SELECT f.session_id, f.refl_id, any_value(f.content) AS content,
               any_value(f.supporting_observation_ids) AS supports
        FROM om_internal.reflections f
        JOIN ranked k ON k.doc_kind = 'reflection' AND k.scope_id = f.session_id AND k.doc_id = f.refl_id
        GROUP BY f.session_id, f.refl_id
    ),
    refl_sources AS (
        SELECT r.session_id, r.refl_id, list(DISTINCT s.entry_id ORDER BY s.entry_id) AS sources
        FROM refl r,
             LATERAL (SELECT unnest(o.source_entry_ids) AS entry_id FROM om_internal.observations o
                      WHERE o.session_id = r.session_id AND list_contains(r.supports, o.obs_id)) s
        GROUP BY r.session_id, r.refl_id
    ),
    cited AS (
        SELECT k.scope_id AS session_id, k.doc_id AS entry_id, list(DISTINCT o.obs_id ORDER BY o.obs_id) AS ids
        FROM ranked k
        JOIN om_internal.observations o ON o.session_id = k.scope_id AND list_contains(o.source_entry_ids, k.doc_id)
        WHERE k.doc_kind = 'entry'
        GROUP BY k.scope_id, k.doc_id
    ),
    project_refl AS (
        SELECT x.project_id, x.refl_id, any_value(x.content) AS content, any_value(x.supporting_ids) AS supports
        FROM om_internal.project_reflections x
        JOIN ranked k ON k.doc_kind = 'project_reflection' AND k.scope_id = x.project_id AND k.doc_id = x.refl_id
        GROUP BY x.project_id, x.refl_id
    ),
    hit_entries AS (
        SELECT e.session_id, e.entry_id, json_valid(e.raw) AS valid, e.raw
        FROM om_internal.entries e
        JOIN ranked k ON k.doc_kind = 'entry' AND k.scope_id = e.session_id AND k.doc_id = e.entry_id
    ),
    -- an entry's text as entry_texts renders it; a line DuckDB's JSON functions refuse (a lone
    -- surrogate) is shown as stored (om search renders those from Python, as om recall does)
    texts AS (
        SELECT t.session_id, t.entry_id, t.text FROM entry_texts t
        WHERE (t.session_id, t.entry_id) IN (SELECT session_id, entry_id FROM hit_entries WHERE valid)
        UNION ALL
        SELECT session_id, entry_id, raw FROM hit_entries WHERE NOT valid
    )
    SELECT k.rank, k.score, k.matched_terms, k.doc_kind AS kind,
           CASE WHEN k.doc_kind = 'project_reflection' THEN NULL ELSE k.scope_id END AS session_id,
           CASE WHEN k.doc_kind = 'project_reflection' THEN k.scope_id ELSE sp.project_id END AS project_id,
           CASE WHEN k.doc_kind = 'entry' THEN NULL ELSE k.doc_id END AS memory_id,
           CASE WHEN k.doc_kind = 'entry' THEN k.doc_id END AS entry_id,
           CASE k.doc_kind WHEN 'observation' THEN o.sources WHEN 'reflection' THEN coalesce(rs.sources, [])
                           WHEN 'entry' THEN [k.doc_id] ELSE []::VARCHAR[] END AS source_entry_ids,
           CASE k.doc_kind WHEN 'entry' THEN coalesce(c.ids, []) WHEN 'project_reflection' THEN p.supports
                           WHEN 'reflection' THEN r.supports ELSE []::VARCHAR[] END AS memory_ids,
           coalesce(o.content, r.content, p.content, x.text) AS text
    FROM ranked k
    LEFT JOIN om_internal.project_sessions sp ON k.doc_kind <> 'project_reflection' AND sp.session_id = k.scope_id
    LEFT JOIN obs o ON k.doc_kind = 'observation' AND o.session_id = k.scope_id AND o.obs_id = k.doc_id
    LEFT JOIN refl r ON k.doc_kind = 'reflection' AND r.session_id = k.scope_id AND r.refl_id = k.doc_id
    LEFT JOIN refl_sources rs ON k.doc_kind = 'reflection' AND rs.session_id = k.scope_id AND rs.refl_id = k.doc_id
    LEFT JOIN cited c ON k.doc_kind = 'entry' AND c.session_id = k.scope_id AND c.entry_id = k.doc_id
    LEFT JOIN project_refl p ON k.doc_kind = 'project_reflection' AND p.project_id = k.scope_id AND p.refl_id = k.doc_id
    LEFT JOIN texts x ON k.doc_kind = 'entry' AND x.session_id = k.scope_id AND x.entry_id = k.doc_id
    ORDER BY k.rank;
