"""The prefill budget: big steps drain a long queue, small ones keep decodes smooth."""

from __future__ import annotations

from services.worker.kv_manager import KVManager
from services.worker.req_table import ReqTable
from services.worker.request import Req
from services.worker.scheduler import Scheduler, SchedulerLimits
from services.worker.token_allocator import TokenAllocator
from tests.worker.engine_driver import request


def _scheduler() -> Scheduler:
    kv = KVManager(TokenAllocator(100_000, "cpu"), ReqTable(64, 4096, "cpu", dummy_slot=100_000))
    limits = SchedulerLimits(max_running=64, prefill_budget=4096, max_total_len=4096, decode_prefill_budget=256)
    return Scheduler(kv, limits, frozenset())


def _decoding(s: Scheduler, rid: str) -> Req:
    """A request that has finished its prefill and decodes one token per step."""
    req = Req(request(rid, [1] * 10, max_new_tokens=100), 0)
    s.running.append(req)
    s.kv.allocate(req, 10)
    req.kv_len = 10
    req.tokens.append(5)
    return req


def prefill_tokens(s: Scheduler) -> int:
    return sum(n for _, n in s.schedule().extends)


def test_without_decodes_the_full_budget_is_used() -> None:
    s = _scheduler()
    s.add(Req(request("long", [1] * 3000), 1))
    assert prefill_tokens(s) == 3000


def test_a_short_queue_gets_small_steps_while_requests_decode() -> None:
    s = _scheduler()
    _decoding(s, "d")
    s.add(Req(request("p", [1] * 600), 1))
    assert prefill_tokens(s) == 256 - 1  # the decode token counts against the step's budget


def test_a_long_queue_gets_big_steps_even_while_requests_decode() -> None:
    s = _scheduler()
    _decoding(s, "d")
    for k in range(20):
        s.add(Req(request(f"p{k}", [1] * 800), k + 1))
    # 16,000 waiting tokens: a quarter of them, within the full budget
    assert prefill_tokens(s) == 4000 - 1
