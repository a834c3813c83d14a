"""FastChat's generation parameters, the front end's FastChat options, and the worker's
concurrency slots."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from services.tokenizer.fastchat.params import WorkerParams
from services.tokenizer.fastchat.worker import Slots, _own_address
from shared.cli import parse_config
from shared.config import ConfigError, TokenizerConfig


def test_what_fastchats_api_server_sends_is_read_as_its_workers_read_it() -> None:
    sent = {
        "model": "m",
        "prompt": "Hi",
        "temperature": 0,
        "logprobs": None,
        "top_p": 0.0,
        "top_k": -1,
        "presence_penalty": -1.5,
        "frequency_penalty": 0.0,
        "max_new_tokens": 7,
        "echo": False,
        "stop_token_ids": None,
        "stop": ["</s>", "", "</s>", "###"],
        "use_beam_search": False,
    }
    p = WorkerParams.model_validate(sent)
    assert p.stops() == ["</s>", "###"] and not p.echo
    s = p.sampling(seed=5)
    assert s.greedy and s.top_p == 1.0 and s.max_new_tokens == 7 and s.presence_penalty == -1.5 and not s.logprobs
    assert WorkerParams.model_validate({"prompt": "Hi"}).echo, "echo defaults to true"
    assert WorkerParams.model_validate({"prompt": "Hi"}).max_new_tokens == 256
    sampled = WorkerParams.model_validate({"prompt": "Hi", "temperature": 0.7, "top_p": 0, "top_k": 0}).sampling(1)
    assert sampled.do_sample and sampled.top_p == 1e-5 and sampled.top_k == -1
    ranked = WorkerParams.model_validate({"prompt": "Hi", "best_of": 3, "logprobs": 2}).sampling(1)
    assert ranked.logprobs and ranked.top_logprobs == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"top_p": 1.5},
        {"temperature": -1},
        {"max_new_tokens": 0},
        {"presence_penalty": 3},
        {"repetition_penalty": 0},
        {"stop": [str(i) for i in range(17)]},
        {"use_beam_search": True},
        {"images": [{"url": "x.png"}]},  # FastChat sends each image as a string
        {"logprobs": 21},
    ],
)
def test_a_bad_value_is_an_error_naming_it(bad: dict) -> None:
    with pytest.raises(ValidationError) as e:
        WorkerParams.model_validate({"prompt": "Hi", **bad})
    assert next(iter(bad)) in str(e.value)


def test_the_fastchat_options() -> None:
    argv = ["--model-dir", "m", "--model-name", "served", "--fastchat-controller", "http://c:21001"]
    argv += ["--worker-address", "http://w:8000", "--model-names", "a,b", "--limit-worker-concurrency", "5"]
    cfg = parse_config(TokenizerConfig, argv, {"LS_FASTCHAT_HEARTBEAT_S": "10"})
    assert (cfg.model_name, cfg.fastchat_controller, cfg.worker_address) == (
        "served",
        "http://c:21001",
        "http://w:8000",
    )
    assert (cfg.model_names, cfg.limit_worker_concurrency, cfg.fastchat_heartbeat_s) == ("a,b", 5, 10.0)
    assert parse_config(TokenizerConfig, ["--model-dir", "m"], {}).fastchat_controller == ""
    for bad in (
        {"fastchat_controller": "c:21001"},
        {"fastchat_controller": "http://c:21001", "api_keys": ("k",)},  # FastChat sends no key
        {"model_names": "a,,b"},
        {"limit_worker_concurrency": 0},
    ):
        with pytest.raises(ConfigError):
            TokenizerConfig(model_dir="m", **bad)


def test_the_worker_address_defaults_to_the_front_ends_own() -> None:
    assert _own_address("0.0.0.0", 8000) == "http://127.0.0.1:8000"
    assert _own_address("10.1.2.3", 21002) == "http://10.1.2.3:21002"
    assert _own_address("fd00::1", 80) == "http://[fd00::1]:80"


def test_on_every_address_the_worker_advertises_the_one_its_controller_is_reached_from() -> None:
    # the route to a loopback controller leaves from the loopback; to another host's, from this
    # host's own address on that route, which is never the loopback
    assert _own_address("0.0.0.0", 8000, "http://127.0.0.1:21001") == "http://127.0.0.1:8000"
    assert _own_address("::", 8000, "http://[::1]:21001") == "http://[::1]:8000"
    assert _own_address("0.0.0.0", 8000, "http://no-such-controller.invalid:21001") == "http://127.0.0.1:8000"


def test_slots_wait_in_turn_and_a_caller_that_leaves_while_waiting_holds_none() -> None:
    async def run() -> None:
        slots = Slots(1)
        first = await slots.take()
        waiter = asyncio.create_task(slots.take())
        await asyncio.sleep(0.01)
        assert slots.waiting == 1 and not waiter.done()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert slots.waiting == 0
        first.release()
        first.release()  # every exit path may release: only the first counts
        second = await asyncio.wait_for(slots.take(), 1)
        third = asyncio.create_task(slots.take())
        await asyncio.sleep(0.01)
        assert not third.done(), "a slot released twice was given out twice"
        second.release()
        (await asyncio.wait_for(third, 1)).release()

    asyncio.run(run())
