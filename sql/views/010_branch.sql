-- The branch ending at any entry: its root-to-tip path with 0-based positions.
-- branch_entries holds every leaf's path; an interior tip is a prefix of any leaf path through it.
CREATE OR REPLACE MACRO branch(p_session, p_tip) AS TABLE
    WITH anchor AS (
        SELECT leaf_id, position FROM branch_entries
        WHERE session_id = p_session AND entry_id = p_tip
        ORDER BY leaf_id LIMIT 1
    )
    SELECT b.position, b.entry_id
    FROM branch_entries b JOIN anchor a ON b.leaf_id = a.leaf_id AND b.position <= a.position
    WHERE b.session_id = p_session;

-- Every entry of a branch with the columns most questions need.
CREATE OR REPLACE MACRO branch_detail(p_session, p_tip) AS TABLE
    SELECT b.position, e.entry_id, e.parent_id, e.line_no, e.entry_type, e.role, e.ts, e.is_source,
           e.tokens_pi, e.tokens, e.first_kept_entry_id, e.custom_type
    FROM branch(p_session, p_tip) b
    JOIN entries e ON e.session_id = p_session AND e.entry_id = b.entry_id;

-- The current branch of every session (to its last entry in file order, which may have children).
CREATE OR REPLACE VIEW current_branches AS
    WITH anchor AS (
        SELECT s.session_id, s.leaf_id, min(b.leaf_id) AS via_leaf, min(b.position) AS tip_position
        FROM sessions s
        JOIN branch_entries b ON b.session_id = s.session_id AND b.entry_id = s.leaf_id
        GROUP BY s.session_id, s.leaf_id
    )
    SELECT a.session_id, a.leaf_id, b.position, b.entry_id
    FROM anchor a
    JOIN branch_entries b ON b.session_id = a.session_id AND b.leaf_id = a.via_leaf AND b.position <= a.tip_position;
