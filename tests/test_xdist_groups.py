"""The suite's xdist layout (conftest: XDIST_GROUPS, LONGEST_FIRST) names tests that exist: a renamed test
would otherwise leave its group or its place in the order silently, and nothing would fail."""

from __future__ import annotations

from conftest import LONGEST_FIRST, XDIST_GROUPS


def test_every_group_and_every_longest_unit_names_a_collected_test(request):
    collected = [item.nodeid for item in request.session.items]
    files = {nodeid.split("::", 1)[0] for nodeid in collected}
    prefixes = [*XDIST_GROUPS, *(name for name in LONGEST_FIRST if "::" in name)]
    # only the files this run collected (a run of one file sees no other)
    missing = [p for p in prefixes if p.split("::", 1)[0] in files and not any(n.startswith(p) for n in collected)]
    assert missing == []
    groups = [name for name in LONGEST_FIRST if "::" not in name]
    assert set(groups) <= set(XDIST_GROUPS.values()), set(groups) - set(XDIST_GROUPS.values())
