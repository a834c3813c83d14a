"""The prefix tree against a plain model: a prefix-closed dictionary from each cached prefix
(a tuple of token ids) to the value of its last token, with a lock count per prefix."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.prefix_tree import PrefixTree, common_length

seqs = st.lists(st.integers(0, 3), min_size=0, max_size=12)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), seqs),
        st.tuples(st.just("match"), seqs),
        st.tuples(st.just("lock"), seqs),
        st.tuples(st.just("unlock"), st.integers(0, 50)),
        st.tuples(st.just("evict"), st.integers(0, 20)),
    ),
    max_size=60,
)


class Model:
    def __init__(self) -> None:
        self.value: dict[tuple[int, ...], int] = {}
        self.locks: dict[tuple[int, ...], int] = {}

    def cached_length(self, seq: list[int]) -> int:
        n = 0
        while n < len(seq) and tuple(seq[: n + 1]) in self.value:
            n += 1
        return n

    def check(self, tree: PrefixTree) -> None:
        for p in self.value:  # prefix-closed
            assert len(p) == 1 or p[:-1] in self.value
        locked = sum(1 for p in self.value if self.locks.get(p, 0) > 0)
        assert tree.size == len(self.value)
        assert tree.locked_size == locked
        assert tree.evictable_size == len(self.value) - locked


@settings(max_examples=300, deadline=None)
@given(ops)
def test_tree_agrees_with_a_dictionary_of_prefixes(program):
    evicted: list[int] = []
    tree = PrefixTree(on_evict=lambda v: evicted.extend(v))
    model = Model()
    held = []  # (node, prefix length, the prefix) of each lock taken
    next_value = 0
    for op, arg in program:
        if op == "insert":
            values = list(range(next_value, next_value + len(arg)))
            next_value += len(arg)
            before = model.cached_length(arg)
            assert tree.insert(arg, values) == before
            for j in range(before, len(arg)):
                model.value[tuple(arg[: j + 1])] = values[j]
        elif op in ("match", "lock"):
            m = tree.match(arg)
            n = model.cached_length(arg)
            assert m.length == n
            flat = [x for v in m.values for x in v]
            assert flat == [model.value[tuple(arg[: j + 1])] for j in range(n)]
            assert m.unlocked == sum(1 for j in range(n) if model.locks.get(tuple(arg[: j + 1]), 0) == 0)
            if op == "lock" and n:
                tree.lock(m.node)
                for j in range(n):
                    p = tuple(arg[: j + 1])
                    model.locks[p] = model.locks.get(p, 0) + 1
                held.append((m.node, arg[:n]))
        elif op == "unlock" and held:
            node, prefix = held.pop(arg % len(held))
            tree.unlock(node)
            for j in range(len(prefix)):
                model.locks[tuple(prefix[: j + 1])] -= 1
        elif op == "evict":
            evictable = tree.evictable_size
            evicted.clear()
            freed = tree.evict(arg)
            assert freed == len(evicted)
            assert freed >= min(arg, evictable)
            gone = {v for v in evicted}
            for p in [p for p, v in model.value.items() if v in gone]:
                assert model.locks.get(p, 0) == 0, "a locked prefix was evicted"
                del model.value[p]
        model.check(tree)
    # everything unlocked can go
    for node, _ in held:
        tree.unlock(node)
    tree.evict(10**9)
    assert tree.size == 0 and tree.num_nodes == 0


def test_eviction_takes_the_least_recently_used_leaf_first():
    evicted: list[list[int]] = []
    tree = PrefixTree(on_evict=lambda v: evicted.append(list(v)))
    tree.insert([1, 2, 3], [10, 11, 12])
    tree.insert([4, 5], [20, 21])
    tree.insert([1, 2, 9], [30, 31, 32])  # splits [1, 2, 3]; the duplicate [1, 2] stays the caller's
    tree.match([4, 5])  # the newest now
    assert tree.evict(1) == 1 and evicted == [[12]]  # [3] is the oldest leaf
    assert tree.evict(1) == 1 and evicted[-1] == [32]
    # [1, 2] is a leaf now but was touched by the insert of [1, 2, 9], after [4, 5]'s insert but before its match
    assert tree.evict(1) == 2 and evicted[-1] == [10, 11]
    assert tree.size == 2


def test_locked_paths_survive_and_sizes_follow_locks():
    tree = PrefixTree()
    tree.insert([1, 2, 3, 4], None)
    m = tree.match([1, 2, 7])
    assert m.length == 2 and m.unlocked == 2
    tree.lock(m.node)
    assert (tree.locked_size, tree.evictable_size) == (2, 2)
    assert tree.evict(100) == 2  # only [3, 4]
    assert tree.match([1, 2, 3]).length == 2
    tree.unlock(m.node)
    assert tree.evict(100) == 2 and tree.size == 0


def test_common_length():
    assert common_length([1, 2, 3], [0, 1, 2, 4], 1) == 2
    assert common_length([1, 2, 3], [1, 2, 3, 4], 0) == 3
    assert common_length([1, 2, 3], [1, 2], 0) == 2
    assert common_length([5], [1], 0) == 0
