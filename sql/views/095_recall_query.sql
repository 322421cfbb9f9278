-- Recall by query (om_core.recall.query): the session's branch first, cosine similarity over the
-- embeddings (om_internal.search_vectors, kept by the writers when recallEmbeddings is on).

-- The embeddings, one per indexed document and model (unit vectors).
CREATE OR REPLACE VIEW search_vectors AS
    SELECT doc_kind, scope_id, doc_id, model, vec FROM om_internal.search_vectors;

-- The documents of a session's branch to p_tip: the memory recorded on it (observations and
-- reflections of its valid ledger records) and its source entries, the transcript a compaction hid
-- included.
CREATE OR REPLACE MACRO branch_documents(p_session, p_tip) AS TABLE
    WITH recs AS (SELECT ledger_id FROM branch_records(p_session, p_tip))
    SELECT DISTINCT 'observation' AS doc_kind, o.obs_id AS doc_id
    FROM om_internal.observations o
    WHERE o.session_id = p_session AND o.ledger_id IN (SELECT ledger_id FROM recs)
    UNION
    SELECT DISTINCT 'reflection', f.refl_id
    FROM om_internal.reflections f
    WHERE f.session_id = p_session AND f.ledger_id IN (SELECT ledger_id FROM recs)
    UNION
    SELECT 'entry', b.entry_id
    FROM branch(p_session, p_tip) b
    JOIN om_internal.entries e ON e.session_id = p_session AND e.entry_id = b.entry_id AND e.is_source;

-- Cosine similarity of p_vec (a unit vector of model p_model) to every document in a search's scope
-- (search_scope: one project, one session, or everything), most similar first.
CREATE OR REPLACE MACRO semantic_memory(p_vec, p_model, p_project, p_session) AS TABLE
    SELECT v.doc_kind, v.scope_id, v.doc_id,
           list_cosine_similarity(v.vec, p_vec::FLOAT[]) AS similarity
    FROM om_internal.search_vectors v
    JOIN search_scope(p_project, p_session) d
      ON d.doc_kind = v.doc_kind AND d.scope_id = v.scope_id AND d.doc_id = v.doc_id
    WHERE v.model = p_model
    ORDER BY similarity DESC, v.doc_kind, v.scope_id, v.doc_id;
