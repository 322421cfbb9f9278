-- om forget (om_core.ledger.forget).

-- name: any_memory_ids_by_prefix
-- The session memory ids (one session's, or all) and project reflection ids that start with it.
SELECT DISTINCT id FROM (
    SELECT session_id, obs_id AS id FROM om_internal.observations
    UNION ALL SELECT session_id, refl_id FROM om_internal.reflections
    UNION ALL SELECT NULL, refl_id FROM om_internal.project_reflections
) WHERE starts_with(id, $prefix) AND ($session_id IS NULL OR session_id = $session_id)
ORDER BY id LIMIT 6;

-- name: sessions_recording_memory_id
-- The sessions whose ledger records this id as an observation or a reflection, with their current leaf
-- (a forget is anchored there) and whether the user forgot it there already.
WITH held AS (
    SELECT session_id, 'observation' AS kind FROM om_internal.observations WHERE obs_id = $id
    UNION SELECT session_id, 'reflection' FROM om_internal.reflections WHERE refl_id = $id
)
SELECT h.session_id, min(h.kind) AS kind, s.leaf_id,
       EXISTS (SELECT 1 FROM om_internal.drops d
               JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id
               WHERE d.session_id = h.session_id AND d.obs_id = $id AND r.origin = 'user')
       OR EXISTS (SELECT 1 FROM om_internal.reflection_drops d
                  JOIN om_internal.ledger r ON r.session_id = d.session_id AND r.ledger_id = d.ledger_id
                  WHERE d.session_id = h.session_id AND d.refl_id = $id AND r.origin = 'user') AS forgotten
FROM held h JOIN om_internal.sessions s USING (session_id)
WHERE ($session_id IS NULL OR h.session_id = $session_id) AND s.leaf_id IS NOT NULL
GROUP BY h.session_id, s.leaf_id
ORDER BY h.session_id;

-- name: project_reflection_forgotten
SELECT EXISTS (SELECT 1 FROM om_internal.project_retirements t
               JOIN om_internal.project_ledger r ON r.project_id = t.project_id AND r.ledger_id = t.ledger_id
               WHERE t.project_id = $project_id AND t.refl_id = $id AND r.origin = 'user');
