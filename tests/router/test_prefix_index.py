"""The router's per-group index of what a worker's prompt cache probably holds."""

from __future__ import annotations

from array import array

from services.router.prefix_index import IndexMatch, PrefixIndex


def test_match_reads_without_changing_the_tree() -> None:
    index = PrefixIndex(1_000)
    index.hold([1, 2, 3, 4, 5])
    nodes = index.tree.num_nodes
    assert index.match([1, 2, 3, 9]) == IndexMatch(3, 3)  # ends inside an edge: not split for it
    assert index.match([1, 2, 3, 4, 5, 6]) == IndexMatch(5, 5)
    assert index.match([7]) == IndexMatch(0, 0)
    assert index.tree.num_nodes == nodes


def test_a_shared_prefix_is_held_once_and_stays_cached_when_released() -> None:
    index = PrefixIndex(1_000)
    a = index.hold([1, 2, 3, 4])
    b = index.hold([1, 2, 3, 5, 6])
    assert (index.size, index.locked_size) == (6, 6)  # 1 2 3, then 4 and 5 6
    index.release(a)
    assert (index.size, index.locked_size) == (6, 5)
    assert index.match([1, 2, 3, 4]) == IndexMatch(4, 3)  # still cached; only 1 2 3 is held
    index.release(b)
    assert (index.size, index.locked_size) == (6, 0)


def test_the_index_keeps_the_most_recent_prompts_within_its_bound() -> None:
    index = PrefixIndex(10)
    for first in (10, 20, 30):
        index.release(index.hold([first, 1, 2, 3, 4]))
    assert index.size == 10
    assert index.match([10, 1]).length == 0  # the least recently placed went first
    assert index.match([30, 1, 2, 3, 4]).length == 5
    index.resize(5)
    assert index.size == 5 and index.match([30, 1]).length == 2


def test_a_held_prompt_is_never_dropped() -> None:
    index = PrefixIndex(4)
    index.hold([1, 2, 3, 4, 5, 6])  # longer than the bound: kept while its request is placed
    index.release(index.hold([7, 8]))
    assert index.match([1, 2, 3, 4, 5, 6]).length == 6
    assert index.match([7, 8]).length == 0


def test_reset_forgets_everything() -> None:
    index = PrefixIndex(100)
    index.release(index.hold([1, 2, 3]))
    index.reset()
    assert index.size == 0 and index.match([1, 2, 3]).length == 0


def test_ids_are_kept_as_int64_arrays_and_lists_still_match() -> None:
    """The index keeps 8 bytes a token, not a list of Python ints; queries come as msgpack's lists
    (image pseudo-ids included, negative and 64-bit) and match what was placed."""
    index = PrefixIndex(100)
    pseudo = -(1 << 62) - 5
    index.hold([1, 2, pseudo, 4])
    index.hold([1, 2, 7])
    keys = []
    stack = [index.tree.root]
    while stack:
        node = stack.pop()
        keys.append(node.key)
        stack.extend(node.children.values())
    assert len(keys) == 4 and all(isinstance(k, array) and k.typecode == "q" for k in keys)
    assert index.match([1, 2, pseudo, 4, 9]).length == 4
    assert index.match(array("q", [1, 2, 7])).length == 3
    assert index.match((1, 3)).length == 1
