"""Which waiting requests would compute a prefix a prompt being prefilled computes
(services/worker/prefill_sharing.py): blocks compared through chained hashes."""

from __future__ import annotations

from services.worker.prefill_sharing import BLOCK, Prefilling, block_hashes


def test_block_hashes_cover_whole_blocks_and_each_covers_every_token_before_it() -> None:
    a = list(range(3 * BLOCK + 5))
    b = [*a[:BLOCK], -1, *a[BLOCK + 1 :]]  # differs inside the second block
    assert len(block_hashes(a)) == 3 and block_hashes(a[: BLOCK - 1]) == []
    ha, hb = block_hashes(a), block_hashes(b)
    assert ha[0] == hb[0] and ha[1] != hb[1] and ha[2] != hb[2]  # the third block's tokens are equal


def test_a_request_waits_only_for_a_block_more_than_the_cache_holds() -> None:
    prefix = list(range(1000, 1000 + 3 * BLOCK))
    computing = Prefilling()
    assert not computing
    computing.add(block_hashes([*prefix, 1, 2, 3]))
    sharer = block_hashes([*prefix, 7])
    assert computing.shared(sharer) == 3 * BLOCK
    assert computing.worth_waiting(sharer, cached=0)
    assert computing.worth_waiting(sharer, cached=2 * BLOCK)  # the third block is not cached yet
    assert not computing.worth_waiting(sharer, cached=2 * BLOCK + 1)  # less than a block to gain
    assert not computing.worth_waiting(block_hashes([5, *prefix]), cached=0)  # shares nothing from the start
    assert not Prefilling().worth_waiting(sharer, cached=0)
