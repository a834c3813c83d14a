"""Fault suite: worker groups killed under load (two groups, greedy requests). A killed group's
requests are handed over to the other through their detokenizer shards and go on by
recomputation: nothing is lost, nothing fails, and every text is the one an unbroken stack
gives (docs/router.md, Failures). Every other kill first freezes the group (SIGSTOP) for a
second: the router goes on placing requests on it, which never start there. Answers under a
regex or a JSON schema keep their format across a handover."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time

import httpx
import pytest

from tests.integration.fault_load import COMPLETED, ERROR, LOST, Load, Tally, prompts, reference_texts
from tests.integration.router_live import RouterProbe, two_groups, wait_until, worker_beats
from tools.redis_server import RedisServer
from tools.stack import Stack

pytestmark = pytest.mark.slow  # the fault suite: CI runs it (not deselected)

# one plain kill and one of a frozen group in CI; the acceptance run: LS_FAULT_KILLS=10
KILLS = int(os.environ.get("LS_FAULT_KILLS", "2"))
MAX_NEW = 32
CLIENTS = 6


def test_worker_groups_killed_under_load_lose_nothing_and_keep_the_greedy_text(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    stack, probe = two_groups(tiny_llama, redis_server, str(tmp_path))
    try:
        reference, tally = asyncio.run(_kill_groups(stack, probe))
        figures = probe.figures()
    finally:
        stack.stop()
    print(tally.summary(f"{KILLS} worker groups killed"), f"handed over: {figures['requeued_total']:.0f}")
    assert tally.count(LOST) == 0, tally.of(LOST)
    assert tally.count(ERROR) == 0, tally.of(ERROR)
    assert not tally.wrong_texts(reference), tally.wrong_texts(reference)[:3]
    assert tally.count(COMPLETED) > 0 and figures["requeued_total"] >= KILLS and figures["failed_total"] == 0


async def _kill_groups(stack: Stack, probe: RouterProbe) -> tuple[dict[str, str], Tally]:
    texts = prompts(12)
    reference = await reference_texts(stack.url, texts, MAX_NEW)
    async with Load(stack.url, texts, CLIENTS, MAX_NEW, bound_s=40) as load:
        for k in range(KILLS):
            group = str(k % 2)
            await load.completed_since(time.monotonic(), 2, 60)  # requests flow
            before = await asyncio.to_thread(probe.holding, group)  # and some are on this group
            if k % 2:
                stack.signal_service(f"worker-{group}", signal.SIGSTOP)
                await asyncio.sleep(1.0)
            await asyncio.to_thread(stack.kill_service, f"worker-{group}")
            stack.start_service(f"worker-{group}")
            await asyncio.to_thread(_wait_rejoined, stack, probe, group, before)
        await load.completed_since(time.monotonic(), 4, 60)  # and keep flowing after the last
    return reference, load.tally


def _wait_rejoined(stack: Stack, probe: RouterProbe, group: str, before: dict[str, float]) -> None:
    """Until the restarted group beats and the router has handed its requests over and taken
    it back (a new instance)."""
    wait_until(lambda: group in worker_beats(stack.opts.redis_url, stack.opts.namespace), 60, f"group {group} beats")
    probe.wait_for(
        lambda f: f["worker_groups"] == 2 and f["requeued_total"] > before["requeued_total"],
        60,
        f"group {group}'s requests handed over and the group back",
    )


# bounded formats: the tiny model's answer under them ends well within MAX_FORMATTED tokens
FORMAT_REGEX = "([a-z]{1,4} ){20,30}end"
FORMAT_SCHEMA = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"enum": [1, 22, 333]}, "minItems": 15, "maxItems": 20}},
    "required": ["items"],
}
MAX_FORMATTED = 300


def test_formatted_answers_hold_their_format_across_a_handover(
    tiny_llama: str, redis_server: RedisServer, tmp_path
) -> None:
    """Requests under a regex or a JSON schema, a worker group killed while they generate: those
    it held go on in the other group from the output they had (their grammar takes it in), and
    every answer holds to its format and ends there."""
    stack, probe = two_groups(tiny_llama, redis_server, str(tmp_path))
    try:
        answers = asyncio.run(_formatted_through_a_kill(stack))
        handed_over = probe.figures()["requeued_total"]
    finally:
        stack.stop()
    assert handed_over > 0
    for kind, finish, text in answers:
        assert finish == "stop", (kind, finish, text)
        if kind == "regex":
            assert re.fullmatch(FORMAT_REGEX, text), text
        else:
            assert 15 <= len(json.loads(text)["items"]) <= 20, text


async def _formatted_through_a_kill(stack: Stack) -> list[tuple[str, str, str]]:
    async with httpx.AsyncClient(base_url=stack.url, timeout=120) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def regex(i: int) -> tuple[str, str, str]:
            body = {"model": model, "prompt": f"Tell {i}", "max_tokens": MAX_FORMATTED, "guided_regex": FORMAT_REGEX}
            choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
            return "regex", choice["finish_reason"], choice["text"]

        async def schema(i: int) -> tuple[str, str, str]:
            fmt = {"type": "json_schema", "json_schema": {"name": "list", "schema": FORMAT_SCHEMA}}
            messages = [{"role": "user", "content": f"List {i}"}]
            body = {"model": model, "messages": messages, "max_tokens": MAX_FORMATTED, "response_format": fmt}
            choice = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]
            return "schema", choice["finish_reason"], choice["message"]["content"]

        async def streamed(flowing: asyncio.Event) -> tuple[str, str, str]:
            """A regex answer streamed: flowing is set at its fifth chunk (the others decode too)."""
            body = {"model": model, "prompt": "Tell", "max_tokens": MAX_FORMATTED, "guided_regex": FORMAT_REGEX}
            text, finish, chunks = "", "", 0
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    choice = json.loads(line[len("data: ") :])["choices"][0]
                    text, finish, chunks = text + choice["text"], choice["finish_reason"] or finish, chunks + 1
                    if chunks == 5:
                        flowing.set()
            return "regex", finish, text

        flowing = asyncio.Event()
        tasks = [asyncio.create_task(regex(i) if i % 2 else schema(i)) for i in range(15)]
        tasks.append(asyncio.create_task(streamed(flowing)))
        await asyncio.wait_for(flowing.wait(), 60)
        await asyncio.to_thread(stack.kill_service, "worker-0")
        return await asyncio.gather(*tasks)
