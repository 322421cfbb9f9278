"""The session tree (pi-sessions.md §1.6): effective parents, leaves, root-first paths, and the cycle
guard Pi lacks. Rows are (entry_id, raw parent_id, line_no)."""

from __future__ import annotations

import signal

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from om_core.pi.tree import Forest, TreeNote, build_forest


@pytest.fixture(autouse=True)
def no_infinite_loops():
    """A cycle the guard misses would hang forever: fail after 5 s instead."""

    def timeout(signum, frame):
        raise TimeoutError("tree walk did not terminate (cycle not broken?)")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def kinds(forest: Forest) -> list[tuple[str, str]]:
    return [(n.entry_id, n.kind) for n in forest.notes]


def every_path_terminates(forest: Forest) -> None:
    for entry_id in forest.parent:
        path = forest.path(entry_id)
        assert path[-1] == entry_id
        assert len(path) == len(set(path)) <= len(forest.parent)
        assert forest.parent[path[0]] is None


# ------------------------------------------------------------------ plain trees


def test_linear_chain():
    forest = build_forest([("a", None, 2), ("b", "a", 3), ("c", "b", 4)])
    assert forest.notes == []
    assert forest.leaves() == ["c"]
    assert forest.path("c") == ["a", "b", "c"]


def test_leaves_in_file_order_not_id_order():
    # z (line 2) root; y (line 3) and x (line 5) children of z; w (line 4) child of y
    forest = build_forest([("z", None, 2), ("y", "z", 3), ("w", "y", 4), ("x", "z", 5)])
    assert forest.leaves() == ["w", "x"]


def test_path_of_an_interior_entry():
    forest = build_forest([("a", None, 2), ("b", "a", 3), ("c", "b", 4), ("d", "b", 5)])
    assert forest.path("b") == ["a", "b"]
    assert forest.path("a") == ["a"]


def test_depths_are_zero_based_positions():
    forest = build_forest([("a", None, 2), ("b", "a", 3), ("c", "b", 4), ("d", "a", 5)])
    t = forest.intervals()
    assert dict(zip(t.entry_id, t.depth)) == {"a": 0, "b": 1, "c": 2, "d": 1}


def test_several_roots():
    forest = build_forest([("a", None, 2), ("b", None, 3), ("c", "a", 4)])
    assert forest.leaves() == ["b", "c"]
    assert forest.path("b") == ["b"]


def test_forward_reference_resolves():
    # b is written before its parent a: still a parent (Pi looks ids up in a map)
    forest = build_forest([("b", "a", 2), ("a", None, 3)])
    assert forest.notes == []
    assert forest.parent == {"b": "a", "a": None}
    assert forest.leaves() == ["b"]
    assert forest.path("b") == ["a", "b"]


def test_file_order_is_kept():
    forest = build_forest([("a", None, 2), ("b", "a", 7)])
    assert forest.order == {"a": 2, "b": 7}


def test_duplicate_id_later_entry_wins():
    # Pi's byId: the later entry with the same id overwrites the earlier one
    forest = build_forest([("a", None, 2), ("b", "a", 3), ("b", None, 4)])
    assert forest.parent["b"] is None
    assert forest.order["b"] == 4
    assert forest.leaves() == ["a", "b"]


# ------------------------------------------------------------------ dangling parents


def test_dangling_parent_becomes_a_root_with_a_note():
    forest = build_forest([("a", None, 2), ("b", "ghost", 3), ("c", "b", 4)])
    assert forest.parent["b"] is None
    assert forest.path("c") == ["b", "c"]
    assert kinds(forest) == [("b", "dangling_parent")]
    assert "ghost" in forest.notes[0].detail
    assert forest.leaves() == ["a", "c"]


def test_every_dangling_parent_is_noted_once():
    forest = build_forest([("a", "x", 2), ("b", "y", 3)])
    assert kinds(forest) == [("a", "dangling_parent"), ("b", "dangling_parent")]
    assert forest.leaves() == ["a", "b"]


# ------------------------------------------------------------------ cycles


def test_self_parent_is_broken():
    forest = build_forest([("a", "a", 2), ("b", "a", 3)])
    assert forest.parent == {"a": None, "b": "a"}
    assert kinds(forest) == [("a", "parent_cycle")]
    assert forest.path("b") == ["a", "b"]
    assert forest.leaves() == ["b"]


def test_two_cycle_broken_at_the_forward_edge():
    # a (line 2) -> parent b (line 3): forward edge, cut here; b -> a stays
    forest = build_forest([("a", "b", 2), ("b", "a", 3)])
    assert forest.parent == {"a": None, "b": "a"}
    assert kinds(forest) == [("a", "parent_cycle")]
    assert forest.notes[0] == TreeNote("a", "parent_cycle", forest.notes[0].detail)
    assert forest.leaves() == ["b"]
    assert forest.path("b") == ["a", "b"]


def test_two_cycle_broken_at_the_forward_edge_whatever_the_walk_order():
    # b (line 2) -> parent a (line 3) is the forward edge; the walk starts at b (first in file order)
    forest = build_forest([("b", "a", 2), ("a", "b", 3)])
    assert forest.parent == {"b": None, "a": "b"}
    assert kinds(forest) == [("b", "parent_cycle")]


def test_three_cycle_broken_once():
    # a (2) -> c (4) forward; b (3) -> a; c (4) -> b
    forest = build_forest([("a", "c", 2), ("b", "a", 3), ("c", "b", 4)])
    assert forest.parent == {"a": None, "b": "a", "c": "b"}
    assert kinds(forest) == [("a", "parent_cycle")]
    assert forest.leaves() == ["c"]
    assert forest.path("c") == ["a", "b", "c"]


def test_cycle_reached_from_a_tail():
    # t (2) -> b; a (3) -> b (4) forward; b (4) -> a. The walk from t enters the cycle at b.
    forest = build_forest([("t", "b", 2), ("a", "b", 3), ("b", "a", 4)])
    assert forest.parent == {"t": "b", "a": None, "b": "a"}
    assert kinds(forest) == [("a", "parent_cycle")]
    assert forest.path("t") == ["a", "b", "t"]
    assert forest.leaves() == ["t"]


def test_two_separate_cycles_each_broken_once():
    forest = build_forest([("a", "b", 2), ("b", "a", 3), ("c", "c", 4), ("d", "c", 5)])
    assert kinds(forest) == [("a", "parent_cycle"), ("c", "parent_cycle")]
    assert forest.leaves() == ["b", "d"]
    every_path_terminates(forest)


def test_cycle_and_dangling_parent_together():
    forest = build_forest([("a", "zz", 2), ("b", "c", 3), ("c", "b", 4), ("d", "c", 5)])
    assert sorted(kinds(forest)) == [("a", "dangling_parent"), ("b", "parent_cycle")]
    assert forest.path("d") == ["b", "c", "d"]
    every_path_terminates(forest)


def test_intervals_terminate_with_cycles():
    forest = build_forest([("a", "c", 2), ("b", "a", 3), ("c", "b", 4)])
    t = forest.intervals()
    assert (t.entry_id, t.depth, t.last, t.is_leaf) == (["a", "b", "c"], [0, 1, 2], [2, 2, 2], [False, False, True])


def test_empty_forest():
    forest = build_forest([])
    assert forest.leaves() == [] and forest.intervals().entry_id == [] and forest.notes == []


def test_intervals_of_a_small_tree():
    forest = build_forest([("a", None, 2), ("b", "a", 3), ("c", "b", 4), ("d", "a", 5), ("e", "d", 6), ("x", None, 7)])
    t = forest.intervals()
    got = {e: (d, p, la, leaf) for e, d, p, la, leaf in zip(t.entry_id, t.depth, t.pre, t.last, t.is_leaf)}
    assert got == {"a": (0, 0, 4, False), "b": (1, 1, 2, False), "c": (2, 2, 2, True),
                   "d": (1, 3, 4, False), "e": (2, 4, 4, True), "x": (0, 5, 5, True)}


@given(st.lists(st.integers(min_value=-1, max_value=40), min_size=1, max_size=40))
def test_intervals_answer_every_branch_question_like_the_paths(parents):
    """X is on the branch ending at T exactly when X.pre <= T.pre <= X.last, at position X.depth:
    checked against Forest.path for every (X, T) pair of random trees, cycles and orphans included."""
    rows = [(f"e{i}", None if p < 0 else f"e{p}", i + 2) for i, p in enumerate(parents)]
    forest = build_forest(rows)
    t = forest.intervals()
    assert sorted(t.entry_id) == sorted(forest.parent) and t.pre == list(range(len(t.entry_id)))
    at = {e: i for i, e in enumerate(t.entry_id)}
    assert {e for e, leaf in zip(t.entry_id, t.is_leaf) if leaf} == set(forest.leaves())
    for tip in forest.parent:
        path = forest.path(tip)
        on_branch = [x for x in t.entry_id if t.pre[at[x]] <= t.pre[at[tip]] <= t.last[at[x]]]
        assert sorted(on_branch) == sorted(path)
        assert all(t.depth[at[x]] == position for position, x in enumerate(path))


# ------------------------------------------------------------------ migration 004's frozen copy


@given(st.lists(st.tuples(st.integers(min_value=0, max_value=25), st.integers(min_value=-1, max_value=30)),
                min_size=0, max_size=40))
@example([(0, 1), (1, 2), (2, 0), (3, 0), (4, 4), (5, 9)])  # a ring with two forward edges, a self-parent, an orphan
def test_migration_004_derives_the_intervals_the_ingest_stores(pairs):
    """Migration 004 derives entry_tree with its own frozen code (om_core.store.migrations); for any rows
    (duplicate ids, dangling parents, cycles) it gives what the ingest stores for them today."""
    from om_core.store.migrations import entry_tree_004

    rows = [(f"e{i}", None if p < 0 else f"e{p}", n + 2) for n, (i, p) in enumerate(pairs)]
    t = build_forest(rows).intervals()
    frozen = entry_tree_004([{"entry_id": e, "parent_id": p, "line_no": n} for e, p, n in rows])
    assert frozen == {"entry_id": t.entry_id, "depth": t.depth, "pre": t.pre, "last": t.last, "is_leaf": t.is_leaf}
