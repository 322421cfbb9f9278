-- A session reference as `om` commands take it: the session id, a unique prefix of one, or the path
-- of its ingested file; an error names a reference that matches no session or several. The analyst
-- entry point: `SELECT * FROM ledger_at(session_id('5b0e7c1a'), session_leaf('5b0e7c1a'))`. The macros
-- below take the resolved id (resolved once, here: resolving inside the fold made every fold 2-3x
-- slower).
CREATE OR REPLACE MACRO session_id(p_ref) AS (
    SELECT CASE WHEN p_ref = '' THEN error('empty session reference')
                WHEN count(*) FILTER (WHERE session_id = p_ref) = 1 THEN p_ref
                WHEN count(*) FILTER (WHERE file_path = p_ref) >= 1
                    THEN min(session_id) FILTER (WHERE file_path = p_ref)
                WHEN count(*) FILTER (WHERE starts_with(session_id, p_ref)) = 1
                    THEN min(session_id) FILTER (WHERE starts_with(session_id, p_ref))
                WHEN count(*) FILTER (WHERE starts_with(session_id, p_ref)) > 1
                    THEN error(p_ref || ' matches several sessions; give more characters')
                ELSE error('no ingested session matches ' || coalesce(p_ref, 'NULL')) END
    FROM om_internal.sessions
);

-- The current leaf (its last entry in file order) of a session reference, as session_id takes it.
CREATE OR REPLACE MACRO session_leaf(p_ref) AS (
    SELECT leaf_id FROM om_internal.sessions WHERE session_id = session_id(p_ref)
);

-- The branch ending at any entry: its root-to-tip path with 0-based positions (an entry's position
-- is its depth). An entry is on it when its preorder interval contains the tip's (entry_tree).
CREATE OR REPLACE MACRO branch(p_session, p_tip) AS TABLE
    SELECT n.depth AS position, n.entry_id
    FROM om_internal.entry_tree n
    JOIN om_internal.entry_tree t ON t.session_id = p_session AND t.entry_id = p_tip AND n.pre <= t.pre AND t.pre <= n.last
    WHERE n.session_id = p_session;

-- Every entry of a branch with the columns most questions need.
CREATE OR REPLACE MACRO branch_detail(p_session, p_tip) AS TABLE
    SELECT b.position, e.entry_id, e.parent_id, e.line_no, e.entry_type, e.role, e.ts, e.is_source,
           e.tokens_pi, e.tokens, e.first_kept_entry_id, e.custom_type
    FROM branch(p_session, p_tip) b
    JOIN om_internal.entries e ON e.session_id = p_session AND e.entry_id = b.entry_id;

-- The current branch of every session (to its last entry in file order, which may have children).
CREATE OR REPLACE VIEW current_branches AS
    SELECT s.session_id, s.leaf_id, n.depth AS position, n.entry_id
    FROM om_internal.sessions s
    JOIN om_internal.entry_tree t ON t.session_id = s.session_id AND t.entry_id = s.leaf_id
    JOIN om_internal.entry_tree n ON n.session_id = s.session_id AND n.pre <= t.pre AND t.pre <= n.last;

-- Every entry on every leaf's root-to-leaf path (one row per entry per leaf: large for sessions
-- with many branches; filter by session_id and leaf_id).
CREATE OR REPLACE VIEW branch_entries AS
    SELECT l.session_id, l.entry_id AS leaf_id, n.depth AS position, n.entry_id
    FROM om_internal.entry_tree l
    JOIN om_internal.entry_tree n ON n.session_id = l.session_id AND n.pre <= l.pre AND l.pre <= n.last
    WHERE l.is_leaf;
