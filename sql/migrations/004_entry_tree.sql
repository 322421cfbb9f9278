-- The tree in one row per entry. branch_entries held one row per entry per leaf path, which grows
-- with leaves x depth (a 189k-entry session with 117 leaves: 11M rows). A preorder interval per
-- entry answers "is X on the branch ending at T" with a range test instead (X.pre <= T.pre <= X.last).
-- branch_entries lives on as a view with the same columns. Sessions stored before this migration
-- get their rows when the migration runs (om_core.store.migrations.derive_entry_tree_004 derives them
-- from the stored entries, with code frozen as it was at this migration).

CREATE TABLE entry_tree (
    session_id  VARCHAR NOT NULL,
    entry_id    VARCHAR NOT NULL,
    depth       INTEGER NOT NULL,              -- its position on every branch through it (0 = a root)
    pre         INTEGER NOT NULL,              -- depth-first preorder number within the session
    last        INTEGER NOT NULL,              -- the largest preorder number in its subtree
    is_leaf     BOOLEAN NOT NULL
);

DROP TABLE branch_entries;
