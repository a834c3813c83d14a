"""The prompt cache through the whole stack on the CPU: greedy outputs of prompts that share
prefixes of many lengths equal Hugging Face's (and, with int8 KV, the same stack's without the
cache), with a pool small enough that eviction runs on most steps and with two data-parallel
groups; clients see the cached tokens; no KV slot is lost."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests import hf_reference
from tests.integration.conftest import start_stack
from tests.integration.router_live import worker_beats
from tests.polling import until
from tools.redis_server import RedisServer
from tools.stack import Stack

BASE = "Once upon a time there was a small town by the sea. Every morning the fishermen went out early, "
MAX_NEW = 6


def _prompts() -> list[str]:
    """Sharing one token, a few words, the whole base, and more than the base; a long prompt and
    prompts sent with it that share its start (they arrive while it is still being prefilled)."""
    long = BASE * 3 + "and the story goes on"
    return [
        "Once there were two",
        BASE[:30] + " but then the weather changed",
        BASE,
        BASE + "and came back with fish in the evening",
        long,
        long[:150] + " a twist",
        long + " and on",
    ]


async def _generate(client: httpx.AsyncClient, prompt: str) -> dict:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW, "ignore_eos": True, "return_details": True}}
    r = await client.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def _run(url: str) -> tuple[dict, list[dict]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        first = await _generate(client, BASE)  # cached before the rest arrive
        rest = await asyncio.gather(*(_generate(client, p) for p in _prompts()))
        return first, list(rest)


def _openai_usage(url: str, model_dir: str) -> list:
    """A new prompt, as token ids, sent twice through the openai client: the usage of each."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    ids = hf_reference.tokenizer(model_dir)("A lighthouse keeper counted the ships that passed")["input_ids"]
    return [
        client.completions.create(model=client.models.list().data[0].id, prompt=ids, max_tokens=3).usage
        for _ in range(2)
    ]


def _tokens(body: dict) -> list[int]:
    return [t["id"] for t in body["tokens"]]


def _no_slot_lost(stack: Stack, groups: int) -> None:
    def idle() -> bool:
        beats = worker_beats(stack.opts.redis_url, stack.opts.namespace)
        infos = [b.info for b in beats.values()]
        return len(infos) == groups and all(
            i["free_tokens"] + i["evictable_tokens"] == i["capacity_tokens"] for i in infos
        )

    until(idle, 20, "every group's free plus evictable tokens to be its whole pool")


@pytest.mark.parametrize(
    ("workers", "pool"),
    [(1, 160), (2, 0)],
    ids=["one-group-evicting", "two-groups"],
)
def test_shared_prefixes_give_hugging_faces_output(
    tiny_llama: str, redis_server: RedisServer, tmp_path, workers: int, pool: int
) -> None:
    worker_args = ["--batch-max-tokens", "32"] + (["--max-total-token-num", str(pool)] if pool else [])
    stack = start_stack(tiny_llama, redis_server, str(tmp_path), workers=workers, worker_args=worker_args)
    try:
        first, rest = asyncio.run(_run(stack.url))
        usage = _openai_usage(stack.url, tiny_llama) if workers == 1 else None
        _no_slot_lost(stack, workers)
    finally:
        stack.stop()
    if usage is not None:  # the real client reads the cached tokens of a prompt sent twice
        assert usage[0].prompt_tokens_details.cached_tokens <= 1  # at most the BOS other prompts began with
        assert usage[1].prompt_tokens_details.cached_tokens == usage[1].prompt_tokens - 1
    tok = hf_reference.tokenizer(tiny_llama)
    for prompt, body in zip([BASE, *_prompts()], [first, *rest], strict=True):
        want = hf_reference.greedy(tiny_llama, tok(prompt)["input_ids"], MAX_NEW, eos=False)
        assert _tokens(body) == want, prompt
    assert first["prompt_cache_len"] == 0
    assert sum(b["prompt_cache_len"] for b in rest) > len(tok(BASE)["input_ids"])  # reuse happened


def test_int8_kv_gives_the_same_outputs_with_and_without_the_cache(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    outputs = []
    for cache in (True, False):
        args = ["--kv-dtype", "int8", "--batch-max-tokens", "32"] + ([] if cache else ["--disable-prompt-cache"])
        stack = start_stack(tiny_llama, redis_server, str(tmp_path / str(cache)), worker_args=args)
        try:
            first, rest = asyncio.run(_run(stack.url))
            _no_slot_lost(stack, 1)
        finally:
            stack.stop()
        outputs.append([_tokens(b) for b in [first, *rest]])
        reused = sum(b["prompt_cache_len"] for b in rest)
        assert (reused > 0) == cache
    assert outputs[0] == outputs[1]
