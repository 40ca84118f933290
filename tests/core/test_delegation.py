"""`DelegationWalk`: the delegation-tree walk every store shares."""

from __future__ import annotations

from step_persistence._delegation import DelegationWalk


def walk(children: dict[str, list[str]], root: str) -> list[str]:
    delegations = DelegationWalk(root)
    while delegations.level:
        delegations.add_children(child for parent in delegations.level for child in children.get(parent, []))
    return delegations.found


def test_breadth_first_nearest_first() -> None:
    tree = {'root': ['a', 'b'], 'a': ['a1'], 'b': ['b1', 'b2'], 'a1': ['a11']}
    assert walk(tree, 'root') == ['a', 'b', 'a1', 'b1', 'b2', 'a11']


def test_a_parent_cycle_ends_the_walk_and_the_root_is_never_found() -> None:
    assert walk({'root': ['a'], 'a': ['root', 'b'], 'b': ['a']}, 'root') == ['a', 'b']
    assert walk({}, 'lonely') == []
