-- Recall by meaning: each indexed document's embedding (recallEmbeddings on, the embeddings extra
-- installed), kept by the writers beside its search terms (om_core.recall.vectors). The model is part of
-- the key: vectors of another model are never compared with this one's.
CREATE TABLE om_internal.search_vectors (
    doc_kind  VARCHAR NOT NULL,   -- as om_internal.search_documents
    scope_id  VARCHAR NOT NULL,
    doc_id    VARCHAR NOT NULL,
    model     VARCHAR NOT NULL,   -- the embedding model (library/config/dimensions)
    vec       FLOAT[] NOT NULL    -- unit length: cosine similarity is their dot product
);
