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
