-- Reflection drops (SPEC §13): the items of om.reflections.dropped records, each a reflection id the
-- record tombstones (folded like observation drops: it leaves the active reflections and stays
-- recallable). replaced_by and kind are what some versions of the extension add to the record, kept
-- as the JSON they were (a retirement by a newer reflection names it in replaced_by).
CREATE TABLE om_internal.reflection_drops (
    session_id   VARCHAR NOT NULL,
    ledger_id    VARCHAR NOT NULL,
    item_index   INTEGER NOT NULL,
    refl_id      VARCHAR NOT NULL,
    reason       VARCHAR,              -- the reflection dropper's reason for its record's drops
    replaced_by  VARCHAR,              -- the record's replacedBy, as JSON text (NULL: absent)
    kind         VARCHAR               -- the record's kind, as JSON text (NULL: absent)
);
