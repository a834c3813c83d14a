"""The prompt cache's engine benchmark (tools/bench_prefix.py, tools/benchmark_engine.py's
shared_prefix, shared_prefix_rate and multi_turn parts): the workloads at their flags'
defaults are the fixed ones, the closed loop sends each turn with the replies before it, and
the parts run end to end on the tiny model on the CPU with the prompt cache on and off."""

from __future__ import annotations

import argparse
import time
import weakref
from types import SimpleNamespace

import pytest

from shared.messages import GenerateReq, TokenItem
from tools import bench_prefix, benchmark_engine, make_tiny_model, workload
from tools.bench_workloads import Conversation, conversations, fit_vocab, shared_prefix_requests
from tools.engine_factory import EngineFactory

SMALL = [
    "--shared-prefix-groups", "3", "--shared-prefix-per-group", "4", "--shared-prefix-system", "200",
    "--shared-prefix-question", "16", "--shared-prefix-output", "8", "--shared-prefix-rate", "100",
    "--multi-turn-conversations", "4", "--multi-turn-turns", "3", "--multi-turn-max-context", "1200",
    "--multi-turn-max-output", "12",
]  # fmt: skip


def _args(*flags: str) -> argparse.Namespace:
    return benchmark_engine.parse_args(["--out", "unused.json", *flags])


def test_the_flags_defaults_are_the_fixed_workloads() -> None:
    args = _args()
    assert shared_prefix_requests(args, workload.VOCAB) == workload.shared_prefix()
    assert conversations(args, workload.VOCAB) == [c for c in workload.multi_turn() if c]


def test_a_small_vocabulary_gets_the_same_requests_folded_into_it() -> None:
    ids = [1000, 1001, 64_000, 127_255]
    assert fit_vocab(ids, workload.VOCAB) == ids
    small = fit_vocab(ids, 1000)
    assert all(250 <= i < 750 for i in small) and small[0] != small[1]
    reqs = shared_prefix_requests(_args(*SMALL), 1000)
    assert len(reqs) == 12 and all(250 <= i < 750 for ids, _ in reqs for i in ids)


def test_a_conversation_sends_the_whole_history() -> None:
    c = Conversation([([1, 2], 3), ([4], 2), ([5, 6], 1)])
    assert (c.prompt, c.output_len) == ([1, 2], 3)
    assert c.advance([7, 8, 9]) and (c.prompt, c.output_len) == ([1, 2, 7, 8, 9, 4], 2)
    assert c.advance([10, 11]) and c.prompt == [1, 2, 7, 8, 9, 4, 10, 11, 5, 6]
    assert not c.advance([12])


class FakeEngine:
    """Each step, one token for every request; a request's cached tokens are its prompt's
    longest prefix among the sequences (prompt and output) of those finished before it."""

    def __init__(self) -> None:
        self.running: list[list] = []  # [request, produced, cached]
        self.finished: list[list[int]] = []
        self.added: dict[str, tuple[float, list[int]]] = {}

    def add(self, msg: GenerateReq) -> None:
        ids = list(msg.input_ids)
        cached = max((_common(ids, seq) for seq in self.finished), default=0)
        self.added[msg.rid] = (time.perf_counter(), ids)
        self.running.append([msg, 0, cached])

    def has_work(self) -> bool:
        return bool(self.running)

    def step(self) -> SimpleNamespace:
        items = []
        for entry in list(self.running):
            msg, produced, cached = entry
            entry[1] = produced = produced + 1
            done = produced == msg.params.max_new_tokens
            items.append(
                (
                    "bench",
                    TokenItem(msg.rid, [900 + produced], finish_reason="length" if done else "", cached_tokens=cached),
                )
            )
            if done:
                self.running.remove(entry)
                self.finished.append(list(msg.input_ids) + [901 + k for k in range(produced)])
        return SimpleNamespace(items=items)


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_multi_turn_adds_each_turn_after_the_last_with_its_reply() -> None:
    args = _args(*SMALL)
    convs = conversations(args, 1000)
    engine = FakeEngine()
    res = bench_prefix.multi_turn(engine, 1000, args)  # type: ignore[arg-type]
    assert res["conversations"] == len(convs) and res["completed"] == res["turns"] == sum(len(c) for c in convs)
    assert res["output_tokens"] == res["expected_output_tokens"] == sum(n for c in convs for _, n in c)
    cached = 0
    for i, turns in enumerate(convs):
        history: list[int] = []
        for k, (user, n) in enumerate(turns):
            _, prompt = engine.added[f"c{i}-{k}"]
            assert prompt == history + user  # every user message and reply before it, then its own
            cached += len(history)  # the last turn's prompt and reply were in the cache
            history = prompt + [901 + j for j in range(n)]
    assert res["cached_prompt_tokens"] == cached > 0
    assert res["hit_rate"] == pytest.approx(cached / res["prompt_tokens"])


def test_arrivals_are_added_when_their_time_has_come() -> None:
    engine = FakeEngine()
    start = time.perf_counter()
    arrivals = [(0.0, "a", [1, 2, 3], 2), (0.05, "b", [4, 5], 2)]
    recs, seconds = bench_prefix.drive(engine, arrivals)  # type: ignore[arg-type]
    assert engine.added["b"][0] - start >= 0.05 and seconds >= 0.05
    assert all(r.end >= r.first > r.start and len(r.output) == 2 for r in recs.values())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-prefix"))
    make_tiny_model.main(["--out", path, "--max-positions", "2048"])
    return path


def test_the_parts_run_with_the_prompt_cache_on_and_off(tiny: str, tmp_path) -> None:
    parts = "shared_prefix,shared_prefix_rate,multi_turn,offline"
    flags = ["--model-dir", tiny, "--device", "cpu", "--parts", parts, "--requests", "6", "--prompt-cache", "on,off"]
    res = benchmark_engine.main(["--out", str(tmp_path / "engine.json"), *flags, *SMALL])
    runs = res["by_prompt_cache"]
    for setting in ("on", "off"):
        for part in bench_prefix.PARTS:
            r = runs[setting][part]
            assert r["engine"]["prompt_cache"] == setting
            assert r["completed"] == r["requests"] and r["failed"] == 0, r["errors"]
            assert r["output_tokens"] == r["expected_output_tokens"] > 0
            assert 0.0 <= r["hit_rate"] <= 1.0 and r["req_per_s"] > 0
            assert 0 < r["ttft_ms"]["median"] <= r["ttft_ms"]["p99"]
        assert runs[setting]["shared_prefix"]["requests"] == 12
        assert runs[setting]["shared_prefix_rate"]["request_rate"] == 100.0
        assert runs[setting]["multi_turn"]["turns"] == sum(len(c) for c in conversations(_args(*SMALL), 1000))
        assert runs[setting]["offline"]["requests"] == 6
    for part in runs["off"]:  # nothing served from a cache that is off
        assert runs["off"][part].get("cached_prompt_tokens", 0) == 0
    # the same pool for both settings, and a ratio for every part both ran
    assert len({runs[s][p]["engine"]["kv_capacity_tokens"] for s in runs for p in bench_prefix.PARTS}) == 1
    assert set(res["on_over_off"]) == {*bench_prefix.PARTS, "offline"}
    assert all(v["req_per_s"] > 0 for v in res["on_over_off"].values())


def test_a_released_engine_leaves_nothing_behind(tiny: str) -> None:
    """The next setting's engine is built once this one is gone: nothing may keep its KV pool."""
    factory = EngineFactory(_args("--model-dir", tiny, "--device", "cpu"))
    built = factory.build(cache_on=True)
    bench_prefix.warm(built.engine, 1000)
    held = [weakref.ref(x) for x in (built.engine, built.engine.kv, built.engine.runner.model.attn.cache)]
    factory.release(built)
    assert all(ref() is None for ref in held)
    assert factory.build(cache_on=False).info["kv_capacity_tokens"] == factory.capacity  # the first's pool size
