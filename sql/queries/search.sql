-- The search index (om_core.recall.search): what every writer keeps up to date, and the search itself.

-- name: search_drop_gone_scopes
-- Documents of sessions no file holds any more, and of projects no session belongs to.
DELETE FROM om_internal.search_documents d
WHERE (d.doc_kind <> 'project_reflection' AND NOT EXISTS (SELECT 1 FROM om_internal.sessions s WHERE s.session_id = d.scope_id))
   OR (d.doc_kind = 'project_reflection' AND NOT EXISTS (SELECT 1 FROM om_internal.project_reflections x WHERE x.project_id = d.scope_id));

-- name: search_drop_gone_terms
DELETE FROM om_internal.search_terms t
WHERE NOT EXISTS (SELECT 1 FROM om_internal.search_documents d
                  WHERE d.doc_kind = t.doc_kind AND d.scope_id = t.scope_id AND d.doc_id = t.doc_id);

-- name: search_wanted_keys
-- Every document these sessions and projects have now, by key.
CREATE OR REPLACE TEMP TABLE search_wanted AS
SELECT DISTINCT 'observation' AS doc_kind, session_id AS scope_id, obs_id AS doc_id
FROM om_internal.observations WHERE list_contains($sessions, session_id)
UNION
SELECT DISTINCT 'reflection', session_id, refl_id FROM om_internal.reflections WHERE list_contains($sessions, session_id)
UNION
SELECT 'entry', session_id, entry_id FROM om_internal.entries WHERE is_source AND list_contains($sessions, session_id)
UNION
SELECT DISTINCT 'project_reflection', project_id, refl_id FROM om_internal.project_reflections
WHERE list_contains($projects, project_id);

-- name: search_drop_unwanted
-- Documents of these sessions and projects that are no longer there (an entry a rewrite took away).
DELETE FROM om_internal.search_documents d
WHERE ((d.doc_kind <> 'project_reflection' AND list_contains($sessions, d.scope_id))
       OR (d.doc_kind = 'project_reflection' AND list_contains($projects, d.scope_id)))
  AND NOT EXISTS (SELECT 1 FROM search_wanted w
                  WHERE w.doc_kind = d.doc_kind AND w.scope_id = d.scope_id AND w.doc_id = d.doc_id);

-- name: search_new_texts
-- The terms of the documents not indexed yet (an entry's text as om recall renders it, from
-- search_entry_batch: om_core.recall.search renders it in Python, which reads every line the ingest kept; one
-- with no text is indexed with no terms, so it is not looked at again).
CREATE OR REPLACE TEMP TABLE search_new AS
WITH missing AS (
    SELECT w.* FROM search_wanted w
    WHERE NOT EXISTS (SELECT 1 FROM om_internal.search_documents d
                      WHERE d.doc_kind = w.doc_kind AND d.scope_id = w.scope_id AND d.doc_id = w.doc_id)
), texts AS (
    SELECT 'observation' AS doc_kind, o.session_id AS scope_id, o.obs_id AS doc_id, any_value(o.content) AS text
    FROM om_internal.observations o
    WHERE (o.session_id, o.obs_id) IN (SELECT scope_id, doc_id FROM missing WHERE doc_kind = 'observation')
    GROUP BY ALL
    UNION ALL
    SELECT 'reflection', f.session_id, f.refl_id, any_value(f.content)
    FROM om_internal.reflections f
    WHERE (f.session_id, f.refl_id) IN (SELECT scope_id, doc_id FROM missing WHERE doc_kind = 'reflection')
    GROUP BY ALL
    UNION ALL
    SELECT 'project_reflection', x.project_id, x.refl_id, any_value(x.content)
    FROM om_internal.project_reflections x
    WHERE (x.project_id, x.refl_id) IN (SELECT scope_id, doc_id FROM missing WHERE doc_kind = 'project_reflection')
    GROUP BY ALL
    UNION ALL
    SELECT 'entry', scope_id, doc_id, text FROM search_entry_batch
)
SELECT m.doc_kind, m.scope_id, m.doc_id, text_terms(left(coalesce(t.text, ''), 65536)) AS terms
FROM missing m
LEFT JOIN texts t ON t.doc_kind = m.doc_kind AND t.scope_id = m.scope_id AND t.doc_id = m.doc_id;

-- name: search_missing_entries
-- The source entries search_wanted holds that the index does not: their lines, to render.
SELECT e.session_id, e.entry_id, e.entry_type, e.raw
FROM search_wanted w
JOIN om_internal.entries e ON e.session_id = w.scope_id AND e.entry_id = w.doc_id
WHERE w.doc_kind = 'entry' AND list_contains($sessions, e.session_id)
  AND NOT EXISTS (SELECT 1 FROM om_internal.search_documents d
                  WHERE d.doc_kind = 'entry' AND d.scope_id = w.scope_id AND d.doc_id = w.doc_id);

-- name: search_insert_docs
INSERT INTO om_internal.search_documents (doc_kind, scope_id, doc_id, length)
SELECT doc_kind, scope_id, doc_id, len(terms) FROM search_new;

-- name: search_insert_terms
INSERT INTO om_internal.search_terms (doc_kind, scope_id, doc_id, term, tf)
SELECT doc_kind, scope_id, doc_id, term, count(*)::INTEGER
FROM (SELECT doc_kind, scope_id, doc_id, unnest(terms) AS term FROM search_new)
GROUP BY ALL;

-- name: search_done
DROP TABLE IF EXISTS search_wanted;
DROP TABLE IF EXISTS search_new;

-- name: search_unindexed
-- How many documents om holds are not in the index (a database written before the index existed, until
-- its next ingest or run indexes it).
SELECT greatest(0, (SELECT count(*) FROM om_internal.entries WHERE is_source)
       + (SELECT count(*) FROM (SELECT DISTINCT session_id, obs_id FROM om_internal.observations))
       + (SELECT count(*) FROM (SELECT DISTINCT session_id, refl_id FROM om_internal.reflections))
       + (SELECT count(*) FROM (SELECT DISTINCT project_id, refl_id FROM om_internal.project_reflections))
       - (SELECT count(*) FROM om_internal.search_documents)) AS behind;

-- name: search
-- The best hits of these kinds ($kinds NULL: all), ranked again among themselves.
SELECT * REPLACE (row_number() OVER (ORDER BY rank) AS rank)
FROM search_memory($query, $project, $session)
WHERE $kinds IS NULL OR list_contains($kinds, kind)
QUALIFY row_number() OVER (ORDER BY rank) <= $limit
ORDER BY rank;

-- name: all_session_ids
SELECT session_id FROM om_internal.sessions ORDER BY session_id;

-- name: all_project_ids
SELECT DISTINCT project_id FROM om_internal.project_reflections ORDER BY project_id;

-- name: search_hit_files
-- The file of each session a hit comes from (the human listing names sessions by it).
SELECT session_id, file_path FROM om_internal.sessions WHERE list_contains($sessions, session_id);

-- name: search_hit_times
-- The time of each entry named ($keys: 'session_id/entry_id'), for the human listing.
SELECT session_id, entry_id, ts FROM om_internal.entries
WHERE list_contains($sessions, session_id) AND list_contains($keys, session_id || '/' || entry_id);
