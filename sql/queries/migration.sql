-- Memory follows Pi's own rewrites (om_core/ingest/migration.py): a v1/v2 file Pi migrated in place,
-- a pi --fork copy. The map of ids is om_internal.entry_id_map; nothing here reads through it later.

-- name: keep_replaced_entries
-- A v1/v2 session's entries before its rewritten file is read again (a snapshot a crash left stays).
INSERT INTO om_internal.replaced_entries
    (session_id, version, entry_id, parent_id, entry_index, entry_type, first_kept_entry_id, raw)
SELECT e.session_id, s.version, e.entry_id, e.parent_id, e.entry_index, e.entry_type, e.first_kept_entry_id, e.raw
FROM om_internal.entries e JOIN om_internal.sessions s USING (session_id)
WHERE e.session_id = $session_id AND s.version < 3
  AND NOT EXISTS (SELECT 1 FROM om_internal.replaced_entries r WHERE r.session_id = $session_id);

-- name: replaced_entries_version
SELECT any_value(version) FROM om_internal.replaced_entries WHERE session_id = $session_id;

-- name: session_version
SELECT version FROM om_internal.sessions WHERE session_id = $session_id;

-- name: drop_replaced_entries
DELETE FROM om_internal.replaced_entries WHERE session_id = $session_id;

-- name: migration_pairs
-- The entries om knew (kept before the re-read) beside the file's entries now, in order.
WITH o AS (SELECT row_number() OVER (ORDER BY entry_index) AS k, entry_id, parent_id, entry_type,
                  first_kept_entry_id, raw
           FROM om_internal.replaced_entries WHERE session_id = $session_id),
     n AS (SELECT row_number() OVER (ORDER BY entry_index) AS k, entry_id, parent_id, entry_type,
                  first_kept_entry_id, raw
           FROM om_internal.entries WHERE session_id = $session_id)
SELECT k, o.entry_id AS old_id, o.parent_id AS old_parent, o.entry_type AS old_type,
       o.first_kept_entry_id AS old_first_kept, o.raw AS old_raw,
       n.entry_id AS new_id, n.parent_id AS new_parent, n.entry_type AS new_type,
       n.first_kept_entry_id AS new_first_kept, n.raw AS new_raw
FROM o FULL JOIN n USING (k)
ORDER BY k;

-- name: fork_pairs
-- A fork's source session's entries beside the fork's, in order.
WITH o AS (SELECT row_number() OVER (ORDER BY entry_index) AS k, entry_id, parent_id, entry_type,
                  first_kept_entry_id, raw
           FROM om_internal.entries WHERE session_id = $from_session_id),
     n AS (SELECT row_number() OVER (ORDER BY entry_index) AS k, entry_id, parent_id, entry_type,
                  first_kept_entry_id, raw
           FROM om_internal.entries WHERE session_id = $session_id)
SELECT k, o.entry_id AS old_id, o.parent_id AS old_parent, o.entry_type AS old_type,
       o.first_kept_entry_id AS old_first_kept, o.raw AS old_raw,
       n.entry_id AS new_id, n.parent_id AS new_parent, n.entry_type AS new_type,
       n.first_kept_entry_id AS new_first_kept, n.raw AS new_raw
FROM o FULL JOIN n USING (k)
ORDER BY k;

-- name: insert_entry_id_map
INSERT INTO om_internal.entry_id_map (session_id, from_session_id, old_id, new_id, how, run_id)
SELECT $session_id, $from_session_id, old_id, new_id, $how, $run_id FROM id_map_batch;

-- The references of what this project appended, rewritten through the run's map (records the file
-- holds, origin imported, were read from the file again).

-- name: remap_ledger
UPDATE om_internal.ledger r
SET anchor_entry_id = coalesce(m.mp[r.anchor_entry_id], r.anchor_entry_id),
    covers_up_to_id = coalesce(m.mp[r.covers_up_to_id], r.covers_up_to_id)
FROM (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE r.session_id = $session_id AND r.origin = 'pipeline';

-- name: remap_observations
UPDATE om_internal.observations o
SET source_entry_ids = list_transform(o.source_entry_ids, lambda s: coalesce(m.mp[s], s))
FROM (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE o.session_id = $session_id
  AND o.ledger_id IN (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'pipeline');

-- name: remap_compactions
UPDATE om_internal.compactions c
SET anchor_entry_id = coalesce(m.mp[c.anchor_entry_id], c.anchor_entry_id),
    first_kept_entry_id = coalesce(m.mp[c.first_kept_entry_id], c.first_kept_entry_id),
    plain_first_kept_entry_id = coalesce(m.mp[c.plain_first_kept_entry_id], c.plain_first_kept_entry_id)
FROM (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE c.session_id = $session_id AND c.origin = 'simulated';

-- name: remap_compaction_items
UPDATE om_internal.compaction_items i
SET source_entry_ids = list_transform(i.source_entry_ids, lambda s: coalesce(m.mp[s], s))
FROM (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE i.session_id = $session_id AND i.source_entry_ids IS NOT NULL
  AND i.compaction_id IN (SELECT compaction_id FROM om_internal.compactions
                          WHERE session_id = $session_id AND origin = 'simulated');

-- name: remap_stages
-- The stages' tips and chunks: where the replay finds its earlier empty results (the observer's backoff).
UPDATE om_internal.stages st
SET tip_entry_id = coalesce(m.mp[st.tip_entry_id], st.tip_entry_id),
    chunk_first_id = coalesce(m.mp[st.chunk_first_id], st.chunk_first_id),
    chunk_last_id = coalesce(m.mp[st.chunk_last_id], st.chunk_last_id)
FROM (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE st.session_id = $session_id;

-- name: fork_source
-- The session of the file a new session was forked from (by the path Pi wrote, or that path resolved),
-- whether it holds memory of this project's to carry over, and whether the fork has its own already
-- (its own replay: then nothing is copied) or was looked at before.
SELECT s.session_id, s.version,
       EXISTS (SELECT 1 FROM om_internal.ledger r WHERE r.session_id = $session_id AND r.origin = 'pipeline')
       OR EXISTS (SELECT 1 FROM om_internal.compactions c WHERE c.session_id = $session_id
                  AND c.origin = 'simulated') AS has_own,
       EXISTS (SELECT 1 FROM om_internal.ledger r WHERE r.session_id = s.session_id AND r.origin = 'pipeline')
       OR EXISTS (SELECT 1 FROM om_internal.compactions c WHERE c.session_id = s.session_id
                  AND c.origin = 'simulated') AS has_memory,
       EXISTS (SELECT 1 FROM om_internal.ingest_notes n WHERE n.session_id = $session_id
                  AND n.kind IN ('forked', 'not_forked')) AS already_looked
FROM om_internal.sessions s
WHERE s.file_path IN ($file_path, $resolved_path) AND s.session_id <> $session_id
LIMIT 1;

-- A fork's copy of its source's records and simulated compactions, under the fork's ids: only those on
-- an entry the fork holds (a record orphaned in the source stays there), in the same record order
-- (append_seq kept: records are ordered within a session).

-- name: copy_fork_ledger
INSERT INTO om_internal.ledger (session_id, ledger_id, kind, covers_up_to_id, anchor_entry_id, append_seq, origin,
                                created_at, run_id, stage, stage_key)
SELECT $session_id, r.ledger_id, r.kind, coalesce(m.mp[r.covers_up_to_id], r.covers_up_to_id),
       coalesce(m.mp[r.anchor_entry_id], r.anchor_entry_id), r.append_seq, r.origin, r.created_at, r.run_id,
       r.stage, r.stage_key
FROM om_internal.ledger r,
     (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE r.session_id = $from_session_id AND r.origin = 'pipeline'
  AND EXISTS (SELECT 1 FROM om_internal.entries e WHERE e.session_id = $session_id
              AND e.entry_id = coalesce(m.mp[r.anchor_entry_id], r.anchor_entry_id))
ORDER BY r.append_seq;

-- name: copy_fork_observations
INSERT INTO om_internal.observations (session_id, ledger_id, item_index, obs_id, content, ts, relevance,
                                      source_entry_ids, token_count, ts_repaired_from)
SELECT $session_id, o.ledger_id, o.item_index, o.obs_id, o.content, o.ts, o.relevance,
       list_transform(o.source_entry_ids, lambda s: coalesce(m.mp[s], s)), o.token_count, o.ts_repaired_from
FROM om_internal.observations o,
     (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE o.session_id = $from_session_id
  AND o.ledger_id IN (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'pipeline');

-- name: copy_fork_reflections
INSERT INTO om_internal.reflections (session_id, ledger_id, item_index, refl_id, content,
                                     supporting_observation_ids, token_count)
SELECT $session_id, f.ledger_id, f.item_index, f.refl_id, f.content, f.supporting_observation_ids, f.token_count
FROM om_internal.reflections f
WHERE f.session_id = $from_session_id
  AND f.ledger_id IN (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'pipeline');

-- name: copy_fork_drops
INSERT INTO om_internal.drops (session_id, ledger_id, item_index, obs_id, reason)
SELECT $session_id, d.ledger_id, d.item_index, d.obs_id, d.reason
FROM om_internal.drops d
WHERE d.session_id = $from_session_id
  AND d.ledger_id IN (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'pipeline');

-- name: copy_fork_reflection_drops
INSERT INTO om_internal.reflection_drops (session_id, ledger_id, item_index, refl_id, reason, replaced_by, kind)
SELECT $session_id, d.ledger_id, d.item_index, d.refl_id, d.reason, d.replaced_by, d.kind
FROM om_internal.reflection_drops d
WHERE d.session_id = $from_session_id
  AND d.ledger_id IN (SELECT ledger_id FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'pipeline');

-- name: copy_fork_compactions
INSERT INTO om_internal.compactions (session_id, compaction_id, origin, anchor_entry_id, append_seq,
                                     first_kept_entry_id, folded, full_fold, summary, note, trigger, gap_safe,
                                     plain_first_kept_entry_id, created_at, run_id)
SELECT $session_id, c.compaction_id, c.origin, coalesce(m.mp[c.anchor_entry_id], c.anchor_entry_id), c.append_seq,
       coalesce(m.mp[c.first_kept_entry_id], c.first_kept_entry_id), c.folded, c.full_fold, c.summary, c.note,
       c.trigger, c.gap_safe, coalesce(m.mp[c.plain_first_kept_entry_id], c.plain_first_kept_entry_id),
       c.created_at, c.run_id
FROM om_internal.compactions c,
     (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE c.session_id = $from_session_id AND c.origin = 'simulated'
  AND EXISTS (SELECT 1 FROM om_internal.entries e WHERE e.session_id = $session_id
              AND e.entry_id = coalesce(m.mp[c.anchor_entry_id], c.anchor_entry_id))
ORDER BY c.append_seq;

-- name: copy_fork_compaction_items
INSERT INTO om_internal.compaction_items (session_id, compaction_id, item_kind, item_index, id, content, ts, relevance,
                                          source_entry_ids, supporting_observation_ids, token_count)
SELECT $session_id, i.compaction_id, i.item_kind, i.item_index, i.id, i.content, i.ts, i.relevance,
       list_transform(i.source_entry_ids, lambda s: coalesce(m.mp[s], s)), i.supporting_observation_ids, i.token_count
FROM om_internal.compaction_items i,
     (SELECT map(list(old_id), list(new_id)) AS mp FROM om_internal.entry_id_map
      WHERE session_id = $session_id AND from_session_id = $from_session_id AND run_id = $run_id) m
WHERE i.session_id = $from_session_id
  AND i.compaction_id IN (SELECT compaction_id FROM om_internal.compactions
                          WHERE session_id = $session_id AND origin = 'simulated');

-- name: followed_counts
-- This project's records and simulated compactions of a session: how many, how many this run's map
-- re-anchored (their anchor is an id it gave), and how many of the records are orphaned.
SELECT (SELECT count(*) FROM om_internal.ledger WHERE session_id = $session_id AND origin = 'pipeline') AS records,
       (SELECT count(*) FROM om_internal.ledger r JOIN om_internal.entry_id_map m
               ON m.session_id = r.session_id AND m.new_id = r.anchor_entry_id AND m.run_id = $run_id
        WHERE r.session_id = $session_id AND r.origin = 'pipeline') AS records_reanchored,
       (SELECT count(*) FROM om_internal.compactions WHERE session_id = $session_id AND origin = 'simulated')
           AS compactions,
       (SELECT count(*) FROM om_internal.compactions c JOIN om_internal.entry_id_map m
               ON m.session_id = c.session_id AND m.new_id = c.anchor_entry_id AND m.run_id = $run_id
        WHERE c.session_id = $session_id AND c.origin = 'simulated') AS compactions_reanchored,
       (SELECT count(*) FROM orphaned_records_in($session_id)) AS orphaned;
