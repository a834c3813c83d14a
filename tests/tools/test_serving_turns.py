"""The serving benchmark's prompt-cache side: output ids read back from the logprobs' labels,
the multi-turn closed loop over a client, and the hit rate from the usage."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest

from services.tokenizer.tokenization import Tokenization
from tools import benchmark_serving, make_tiny_model
from tools.bench_workloads import conversations
from tools.serving_turns import LabelIndex, run_conversations

SMALL = ["--multi-turn-conversations", "3", "--multi-turn-turns", "3", "--multi-turn-max-context", "1500"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("tiny-turns"))
    make_tiny_model.main(["--out", path])
    return path


@pytest.fixture(scope="module")
def index(tiny: str) -> LabelIndex:
    return LabelIndex(tiny)


def test_every_token_is_read_back_from_its_label(tiny: str, index: LabelIndex) -> None:
    tok = Tokenization(tiny, threads=1)
    ids = list(range(len(tok.hf)))
    assert index.token_ids([tok.token_label(i) for i in ids]) == ids
    assert not index.shared and index.ambiguous == 0
    assert index.token_ids([tok.token_label(5), "no such label", tok.token_label(6)]) == [5]  # cut at the unknown
    assert index.unknown == 1
    index.unknown = 0
    tok.shutdown()


def test_a_stream_gives_its_labels_and_the_cached_tokens() -> None:
    chunks = [
        {"choices": [{"text": "a", "logprobs": {"tokens": ["a", "b"]}}], "usage": None},
        {"choices": [{"text": "c", "logprobs": {"tokens": ["c"]}}], "usage": None},
        {
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 6}},
        },
    ]
    lines = [f"data: {json.dumps(c)}".encode() for c in chunks] + [b"data: [DONE]"]

    async def feed():
        for line in lines:
            yield line

    out = benchmark_serving.Outcome(prompt_tokens=9)
    asyncio.run(benchmark_serving.consume(feed(), out, 0.0))
    assert out.ok and out.labels == ["a", "b", "c"] and (out.output_tokens, out.cached_tokens) == (3, 6)
    told = benchmark_serving.Outcome(ok=True, prompt_tokens=10, cached_tokens=5)
    untold = benchmark_serving.Outcome(ok=True, prompt_tokens=10)
    assert benchmark_serving.cache_hits([told, untold, out]) == {
        "hit_rate": 11 / 19,
        "cached_prompt_tokens": 11,
        "hit_rate_requests": 2,
    }
    assert benchmark_serving.cache_hits([untold]) == {"hit_rate": None}


def _args() -> argparse.Namespace:
    return benchmark_serving.parse_args(
        ["--out", "x.json", "--vocab", "1000", *SMALL, "--workload", "multi_turn", "--tokenizer", "m"]
    )


def test_each_turn_is_sent_after_the_last_with_its_reply(index: LabelIndex) -> None:
    label = {i: s for s, i in index.ids.items()}
    sent: list[list[int]] = []

    async def send(prompt: list[int], out_len: int) -> benchmark_serving.Outcome:
        sent.append(list(prompt))
        await asyncio.sleep(0)
        reply = [(len(prompt) + k) % 500 + 100 for k in range(out_len)]  # the "server's" output ids
        return benchmark_serving.Outcome(ok=True, output_tokens=out_len, labels=[label[i] for i in reply])

    args = _args()
    got = asyncio.run(run_conversations(args, send, index, lambda: None))
    convs = conversations(args, args.vocab)
    assert got["conversations"] == len(convs) and len(got["outcomes"]) == got["turns"] == sum(map(len, convs))
    for turns in convs:
        history: list[int] = []
        for user, n in turns:
            prompt = history + user
            assert prompt in sent
            history = prompt + [(len(prompt) + k) % 500 + 100 for k in range(n)]


def test_a_reply_that_cannot_be_read_back_ends_its_conversation(index: LabelIndex) -> None:
    async def send(prompt: list[int], out_len: int) -> benchmark_serving.Outcome:
        return benchmark_serving.Outcome(ok=True, output_tokens=out_len, labels=["no such label"] * out_len)

    got = asyncio.run(run_conversations(_args(), send, index, lambda: None))
    assert len(got["outcomes"]) == got["conversations"]  # one turn each
    assert all(not o.ok and "0 ids read" in o.error for o in got["outcomes"])
    index.unknown = 0
