"""The session tree: effective parents, leaves, and root-to-leaf branches (pi-sessions.md §1.6).

Pi follows ``parentId`` through its id map until the parent is empty or unknown; an orphan becomes
a root. Pi has no cycle guard (a cycle would loop forever). We break every cycle once, at the edge
that points forward in the file (a parent written after its child cannot be a real append), so the
tree is a forest and every branch is well defined and consistent between leaves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TreeNote:
    entry_id: str
    kind: str  # "dangling_parent" | "parent_cycle"
    detail: str


@dataclass(slots=True)
class Forest:
    parent: dict[str, str | None]  # effective parent of every entry
    order: dict[str, int]  # file order (line number) of every entry
    notes: list[TreeNote]

    def leaves(self) -> list[str]:
        """Entries with no children, in file order."""
        has_child = {p for p in self.parent.values() if p is not None}
        return sorted((e for e in self.parent if e not in has_child), key=self.order.__getitem__)

    def path(self, tip: str) -> list[str]:
        """Root-first path to ``tip`` (any entry, not only a leaf)."""
        out: list[str] = []
        node: str | None = tip
        while node is not None:
            out.append(node)
            node = self.parent[node]
        out.reverse()
        return out

    def intervals(self) -> TreeIntervals:
        """Depth and preorder interval of every entry (see ``TreeIntervals``), in preorder.

        Children are visited in file order; any order would do, the intervals only have to nest."""
        children: dict[str, list[str]] = {}
        roots: list[str] = []
        for entry_id in sorted(self.parent, key=self.order.__getitem__):
            p = self.parent[entry_id]
            if p is None:
                roots.append(entry_id)
            else:
                children.setdefault(p, []).append(entry_id)
        out = TreeIntervals([], [], [], [], [])
        # iterative DFS; an entry's ``last`` is filled in when the walk leaves its subtree
        stack: list[tuple[str, int]] = [(r, 0) for r in reversed(roots)]
        open_at: list[int] = []  # preorder index of each entry on the current path
        while stack:
            entry_id, depth = stack.pop()
            while len(open_at) > depth:  # leaving finished subtrees
                out.last[open_at.pop()] = len(out.entry_id) - 1
            index = len(out.entry_id)
            out.entry_id.append(entry_id)
            out.depth.append(depth)
            out.pre.append(index)
            out.last.append(index)
            kids = children.get(entry_id, ())
            out.is_leaf.append(not kids)
            open_at.append(index)
            stack.extend((k, depth + 1) for k in reversed(kids))
        while open_at:
            out.last[open_at.pop()] = len(out.entry_id) - 1
        return out


@dataclass(slots=True)
class TreeIntervals:
    """The tree stored in one row per entry (table ``entry_tree``) instead of one per entry per leaf.

    ``pre`` numbers the entries in depth-first preorder and ``last`` is the largest number in an
    entry's subtree, so X is on the branch ending at T exactly when X.pre <= T.pre <= X.last; a
    branch position is the entry's depth (0 = a root)."""
    entry_id: list[str]
    depth: list[int]
    pre: list[int]
    last: list[int]
    is_leaf: list[bool]


def build_forest(rows: Iterable[tuple[str, str | None, int]]) -> Forest:
    """rows: (entry_id, raw parent_id, line_no) of every entry of one session."""
    parent: dict[str, str | None] = {}
    order: dict[str, int] = {}
    notes: list[TreeNote] = []
    for entry_id, parent_id, line_no in rows:
        parent[entry_id] = parent_id
        order[entry_id] = line_no
    for entry_id, parent_id in parent.items():
        if parent_id is not None and parent_id not in parent:
            parent[entry_id] = None
            notes.append(TreeNote(entry_id, "dangling_parent", f"parent {parent_id} is not in the file; treated as a root"))
    # Break cycles: colour walk; when a walk meets a node on its own stack, cut the forward edge.
    state: dict[str, int] = {}  # 1 = on the current walk, 2 = done
    for start in sorted(parent, key=order.__getitem__):
        if state.get(start):
            continue
        stack: list[str] = []
        node: str | None = start
        while node is not None and not state.get(node):
            state[node] = 1
            stack.append(node)
            node = parent[node]
        if node is not None and state.get(node) == 1:
            cycle = stack[stack.index(node):]
            child = _forward_edge(cycle, parent, order)
            notes.append(TreeNote(child, "parent_cycle", f"parent {parent[child]} closes a cycle; treated as a root"))
            parent[child] = None
        for done in stack:
            state[done] = 2
    return Forest(parent=parent, order=order, notes=notes)


def _forward_edge(cycle: list[str], parent: dict[str, str | None], order: dict[str, int]) -> str:
    """The child in a cycle whose parent comes later in the file (first such child by file order)."""
    candidates = [c for c in cycle if order[parent[c]] >= order[c]]  # type: ignore[index]
    return min(candidates or cycle, key=order.__getitem__)


@dataclass(slots=True)
class TreeBlock:
    """The new entries hanging from one old entry (``entry_id`` None: the new roots), laid out in
    preorder right after the old entry's subtree (``at_last``)."""
    entry_id: str | None
    at_depth: int
    at_pre: int
    at_last: int
    rows: TreeIntervals  # the block's own intervals, numbered from 0 (depth 0 = a child of the old entry)


@dataclass(slots=True)
class AppendedTree:
    """What lines appended to a session add to its stored tree: the new entries' intervals, the old
    entries' shifts (``blocks``), and the notes of the new entries."""
    rows: TreeIntervals
    blocks: list[TreeBlock]
    notes: list[TreeNote]
    order: dict[str, int]  # file order (line number) of every new entry


def appended_intervals(new: list[tuple[str, str | None, int]], known: dict[str, tuple[int, int, int]],
                       size: int) -> AppendedTree | None:
    """The intervals ``Forest.intervals`` would give the grown session, for its new entries only.

    new: (entry_id, raw parent_id, line_no) of the appended entries, in file order; known: (depth, pre,
    last) of the old entries they name as parents; size: the old tree's entry count. Each new entry is
    the last child of its parent (children go in file order), so the new entries below one old entry
    form a block right after that entry's subtree, and new roots go last. None when the new entries do
    not only hang below the old tree (one names a later new entry as its parent: a possible cycle)."""
    index = {entry_id: i for i, (entry_id, _, _) in enumerate(new)}
    parent: dict[str, str | None] = {}
    attached: dict[str | None, list[str]] = {}  # old entry (None: no parent) -> the new entries below it
    notes: list[TreeNote] = []
    for i, (entry_id, parent_id, _) in enumerate(new):
        if parent_id is not None and parent_id in index:
            if index[parent_id] >= i:
                return None
            parent[entry_id] = parent_id
            continue
        if parent_id is not None and parent_id not in known:
            notes.append(TreeNote(entry_id, "dangling_parent", f"parent {parent_id} is not in the file; treated as a root"))
            parent_id = None
        parent[entry_id] = None
        attached.setdefault(parent_id, []).append(entry_id)
    order = {entry_id: line_no for entry_id, _, line_no in new}
    blocks = []
    for at, first in attached.items():
        below = set(first)
        for entry_id, _, _ in new:  # in file order: a parent before its children
            if parent[entry_id] in below:
                below.add(entry_id)
        sub = Forest(parent={e: parent[e] for e in below}, order=order, notes=[]).intervals()
        depth, pre, last = known[at] if at is not None else (-1, -1, size - 1)
        blocks.append(TreeBlock(at, depth, pre, last, sub))
    rows = TreeIntervals([], [], [], [], [])
    for block in blocks:
        # after the old subtree, after what the blocks before it add, and after the blocks at the same
        # place that hang deeper (the walk finishes a subtree before it returns to an ancestor)
        start = block.at_last + 1 + sum(len(b.rows.entry_id) for b in blocks if b.at_last < block.at_last or (
            b.at_last == block.at_last and b.at_depth > block.at_depth))
        sub = block.rows
        rows.entry_id.extend(sub.entry_id)
        rows.depth.extend(block.at_depth + 1 + d for d in sub.depth)
        rows.pre.extend(start + p for p in sub.pre)
        rows.last.extend(start + p for p in sub.last)
        rows.is_leaf.extend(sub.is_leaf)
    return AppendedTree(rows=rows, blocks=blocks, notes=notes, order=order)
