"""The four services with busy polling on (as on a GPU host, where the default turns it on):
outputs equal Hugging Face's greedy ones, one request at a time and many at once, streamed and
whole, and every service says that it polls (the front end from its event loop)."""

from __future__ import annotations

import asyncio
import glob
import os
import pathlib
from collections.abc import Iterator

import httpx
import pytest

from tests import hf_reference
from tests.integration.api_helpers import generate, generate_stream
from tests.integration.conftest import keyed_stack
from tools.stack import Stack

PROMPTS = ["Hello", "The quick brown fox jumps over the lazy dog.", "a b c", "Question: Who wrote Hamlet? Answer:"]


@pytest.fixture(scope="module", params=["llama"])
def polling_stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    yield from keyed_stack(request, env={"LS_BUSY_POLL_MS": "200"})


def test_every_service_polls(polling_stack: Stack) -> None:
    paths = glob.glob(os.path.join(polling_stack.opts.log_dir, "*.log"))
    logs = {os.path.basename(p): pathlib.Path(p).read_text(encoding="utf-8") for p in paths}
    assert {"tokenizer.log", "router.log", "worker-0.log", "detokenizer-0.log"} <= set(logs)
    for name, text in logs.items():
        how = ", by the event loop," if name == "tokenizer.log" else ""
        assert f"reads poll Redis{how} while requests are in flight and 200 ms after" in text, name


def test_one_at_a_time_and_all_at_once_equal_hf(polling_stack: Stack) -> None:
    tok = hf_reference.tokenizer(polling_stack.model_dir)
    cases = [(p, 4 + 3 * i) for i, p in enumerate(PROMPTS)]
    want = [hf_reference.greedy(polling_stack.model_dir, tok(p)["input_ids"], n) for p, n in cases]

    async def run() -> tuple[list, list]:
        async with httpx.AsyncClient(base_url=polling_stack.url, timeout=60) as client:
            lone = [await generate_stream(client, p, n) for p, n in cases * 2]  # each as the last one ends
            together = await asyncio.gather(*[generate(client, p, n) for p, n in cases * 3])
        return [[e["token"]["id"] for e in events] for events in lone], [
            [t["id"] for t in b["tokens"]] for b in together
        ]

    lone, together = asyncio.run(run())
    assert lone == want * 2
    assert together == want * 3


def test_the_front_ends_reads_never_failed(polling_stack: Stack) -> None:
    """Last in this file: over all of its requests."""
    asyncio.run(_one_request(polling_stack))
    text = pathlib.Path(polling_stack.opts.log_dir, "tokenizer.log").read_text(encoding="utf-8")
    assert "reading replies failed" not in text


async def _one_request(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as client:
        await generate_stream(client, "Hello", 3)
