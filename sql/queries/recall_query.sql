-- Recall by query (om_core.recall.query) and its embeddings index (om_core.recall.vectors).

-- name: query_keyword_ranks
-- The keyword (BM25) candidates of a query in one scope, best first.
SELECT rank, score, doc_kind, scope_id, doc_id
FROM search_ranked($query, $project, $session) WHERE rank <= $limit ORDER BY rank;

-- name: query_semantic_ranks
-- The semantic candidates of a query's embedding in one scope, most similar first.
SELECT row_number() OVER (ORDER BY similarity DESC, doc_kind, scope_id, doc_id) AS rank, similarity,
       doc_kind, scope_id, doc_id
FROM semantic_memory($vec, $model, $project, $session)
QUALIFY rank <= $limit ORDER BY rank;

-- name: query_branch_documents
SELECT doc_kind, doc_id FROM branch_documents($session_id, $tip);

-- name: query_identifier_holders
-- The documents holding one of the query's identifiers (a term joined by _ . + - / : @ #: a path, a
-- file name, a snake_case name) as a term of their own: those mean exactly themselves.
SELECT DISTINCT t.doc_kind, t.scope_id, t.doc_id
FROM om_internal.search_terms t
WHERE t.term IN (SELECT unnest(list_filter(text_terms($query), lambda x: regexp_matches(x, '[_.+\-/:@#]'))))
  AND list_contains($scopes, t.scope_id);

-- name: query_session_project
SELECT project_id FROM om_internal.project_sessions WHERE session_id = $session_id;

-- name: query_documents
-- What a hit shows: a memory item's text (and an observation's sources), or an entry's line to render.
WITH keys AS (SELECT unnest($kinds) AS doc_kind, unnest($scopes) AS scope_id, unnest($ids) AS doc_id)
SELECT k.doc_kind, k.scope_id, k.doc_id,
       coalesce(o.content, f.content, x.content) AS content,
       coalesce(o.sources, []::VARCHAR[]) AS source_entry_ids,
       coalesce(f.supports, x.supports, c.ids, []::VARCHAR[]) AS memory_ids,
       e.entry_type, e.raw,
       CASE WHEN k.doc_kind = 'project_reflection' THEN k.scope_id ELSE sp.project_id END AS project_id
FROM keys k
LEFT JOIN (SELECT session_id, obs_id, any_value(content) AS content, any_value(source_entry_ids) AS sources
           FROM om_internal.observations GROUP BY ALL) o
       ON k.doc_kind = 'observation' AND o.session_id = k.scope_id AND o.obs_id = k.doc_id
LEFT JOIN (SELECT session_id, refl_id, any_value(content) AS content, any_value(supporting_observation_ids) AS supports
           FROM om_internal.reflections GROUP BY ALL) f
       ON k.doc_kind = 'reflection' AND f.session_id = k.scope_id AND f.refl_id = k.doc_id
LEFT JOIN (SELECT project_id, refl_id, any_value(content) AS content, any_value(supporting_ids) AS supports
           FROM om_internal.project_reflections GROUP BY ALL) x
       ON k.doc_kind = 'project_reflection' AND x.project_id = k.scope_id AND x.refl_id = k.doc_id
LEFT JOIN om_internal.entries e ON k.doc_kind = 'entry' AND e.session_id = k.scope_id AND e.entry_id = k.doc_id
LEFT JOIN (SELECT k2.scope_id AS session_id, k2.doc_id AS entry_id, list(DISTINCT o2.obs_id ORDER BY o2.obs_id) AS ids
           FROM keys k2
           JOIN om_internal.observations o2 ON o2.session_id = k2.scope_id AND list_contains(o2.source_entry_ids, k2.doc_id)
           WHERE k2.doc_kind = 'entry' GROUP BY ALL) c
       ON k.doc_kind = 'entry' AND c.session_id = k.scope_id AND c.entry_id = k.doc_id
LEFT JOIN om_internal.project_sessions sp ON k.doc_kind <> 'project_reflection' AND sp.session_id = k.scope_id;

-- name: vectors_missing
-- Indexed documents with no embedding of this model yet (at most $limit): a memory item's text, or
-- an entry's line to render.
WITH missing AS (
    SELECT d.doc_kind, d.scope_id, d.doc_id FROM om_internal.search_documents d
    WHERE NOT EXISTS (SELECT 1 FROM om_internal.search_vectors v
                      WHERE v.model = $model AND v.doc_kind = d.doc_kind AND v.scope_id = d.scope_id
                        AND v.doc_id = d.doc_id)
    ORDER BY d.doc_kind, d.scope_id, d.doc_id
    LIMIT $limit
)
SELECT m.doc_kind, m.scope_id, m.doc_id,
       coalesce(o.content, f.content, x.content) AS content, e.entry_type, e.raw
FROM missing m
LEFT JOIN (SELECT session_id, obs_id, any_value(content) AS content FROM om_internal.observations GROUP BY ALL) o
       ON m.doc_kind = 'observation' AND o.session_id = m.scope_id AND o.obs_id = m.doc_id
LEFT JOIN (SELECT session_id, refl_id, any_value(content) AS content FROM om_internal.reflections GROUP BY ALL) f
       ON m.doc_kind = 'reflection' AND f.session_id = m.scope_id AND f.refl_id = m.doc_id
LEFT JOIN (SELECT project_id, refl_id, any_value(content) AS content FROM om_internal.project_reflections GROUP BY ALL) x
       ON m.doc_kind = 'project_reflection' AND x.project_id = m.scope_id AND x.refl_id = m.doc_id
LEFT JOIN om_internal.entries e ON m.doc_kind = 'entry' AND e.session_id = m.scope_id AND e.entry_id = m.doc_id;

-- name: vectors_count_missing
SELECT count(*) FROM om_internal.search_documents d
WHERE NOT EXISTS (SELECT 1 FROM om_internal.search_vectors v
                  WHERE v.model = $model AND v.doc_kind = d.doc_kind AND v.scope_id = d.scope_id AND v.doc_id = d.doc_id);

-- name: vectors_insert
INSERT INTO om_internal.search_vectors (doc_kind, scope_id, doc_id, model, vec)
SELECT doc_kind, scope_id, doc_id, model, vec::FLOAT[] FROM search_vector_batch;

-- name: vectors_drop_gone
-- Embeddings of documents the index no longer holds (a rewrite, a forget, a session gone).
DELETE FROM om_internal.search_vectors v
WHERE NOT EXISTS (SELECT 1 FROM om_internal.search_documents d
                  WHERE d.doc_kind = v.doc_kind AND d.scope_id = v.scope_id AND d.doc_id = v.doc_id);
