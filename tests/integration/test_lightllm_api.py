"""LightLLM's routes over raw HTTP against the whole stack, which here takes its API keys
from LS_API_KEYS: every parameter reaches the worker, n and best_of, per-token logprobs
with return_details, TGI's POST /, and a 4xx naming each bad parameter."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from tests import hf_reference
from tests import vision_cases as vc
from tests.integration.api_helpers import hf_logprobs, hf_penalised_greedy
from tests.integration.conftest import keyed_stack
from tools.stack import Stack

KEY = "ls-key-b"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "Once upon a time there was a small town by the sea."
# greedy ends on EOS within 40 tokens for one of these, for each tiny model
EOS_CANDIDATES = ["Mathematics is the study of numbers, shapes and patterns. One plus one is", "x", "a b c"]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    yield from keyed_stack(request, env={"LS_API_KEYS": f"ls-key-a,{KEY}"})


def _http(stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=stack.url, headers=AUTH, timeout=60)


def _events(client: httpx.Client, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def _eos_prompt(model_dir: str) -> tuple[str, list[int]]:
    tok = hf_reference.tokenizer(model_dir)
    for prompt in EOS_CANDIDATES:
        want = hf_reference.greedy(model_dir, tok(prompt)["input_ids"], 40)
        if len(want) < 40:
            return prompt, want
    raise AssertionError("no candidate prompt ends on EOS")


def test_details_carry_the_logprobs_hf_gives(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    ids = tok(PROMPT)["input_ids"]
    want = hf_reference.greedy(stack.model_dir, ids, 10)
    lp = hf_logprobs(stack.model_dir, ids, want)
    expected = [float(lp[i, t]) for i, t in enumerate(want)]
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 10, "return_details": True}}
    with _http(stack) as client:
        got = client.post("/generate", json=body).json()
        events = _events(client, "/generate_stream", body)
    assert [t["id"] for t in got["tokens"]] == want
    assert [t["logprob"] for t in got["tokens"]] == pytest.approx(expected, abs=1e-3)
    assert [t["text"] for t in got["tokens"]] == [tok.decode([t]) for t in want]
    assert [e["token"]["id"] for e in events] == want
    assert [e["token"]["logprob"] for e in events] == pytest.approx(expected, abs=1e-3)
    # the stream's prompt is /generate's again: all of it but its last token from the prompt cache
    details = {"prompt_tokens": len(ids), "generated_tokens": len(want), "prompt_cache_len": len(ids) - 1}
    assert events[-1]["details"] == details
    assert all(e["details"] is None for e in events[:-1])


def test_sampling_parameters_reach_the_worker(stack: Stack) -> None:
    tok = hf_reference.tokenizer(stack.model_dir)
    ids = tok(PROMPT)["input_ids"]
    greedy = hf_reference.greedy(stack.model_dir, ids, 12, eos=False)
    eos_prompt, eos_want = _eos_prompt(stack.model_dir)
    eos_text = tok.decode(eos_want, skip_special_tokens=False)

    def params(**p) -> dict:
        return {"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "ignore_eos": True, **p}}

    cases = {
        "greedy": params(),
        "top_k=1": params(do_sample=True, temperature=1.5, top_k=1),
        "top_p": params(do_sample=True, temperature=1.0, top_p=1e-6),
        "tiny temperature": params(do_sample=True, temperature=1e-6),
        "stop_token_ids": params(stop_token_ids=[greedy[2]]),
        "penalties": params(presence_penalty=0.5, frequency_penalty=1.5, repetition_penalty=1.3),
        "seeded a": params(do_sample=True, temperature=1.0, seed=77),
        "seeded b": params(do_sample=True, temperature=1.0, seed=77),
        "min_new_tokens": {"inputs": eos_prompt, "parameters": {"max_new_tokens": 40, "min_new_tokens": 40}},
        "eos kept": {"inputs": eos_prompt, "parameters": {"max_new_tokens": 40, "skip_special_tokens": False}},
    }

    async def run() -> dict[str, dict]:
        async with httpx.AsyncClient(base_url=stack.url, headers=AUTH, timeout=60) as client:
            rs = await asyncio.gather(*(client.post("/generate", json=b) for b in cases.values()))
        return {name: r.json() for name, r in zip(cases, rs, strict=True)}

    got = asyncio.run(run())
    text = tok.decode(greedy, skip_special_tokens=True)
    for name in ("greedy", "top_k=1", "top_p", "tiny temperature"):
        assert got[name]["generated_text"] == [text], name
        assert got[name]["count_output_tokens"] == 12 and got[name]["finish_reason"] == "length", name
    stopped = got["stop_token_ids"]  # ends at the first output of that token
    assert stopped["count_output_tokens"] == greedy.index(greedy[2]) + 1 and stopped["finish_reason"] == "stop"
    penalised = hf_penalised_greedy(stack.model_dir, ids, 12, presence=0.5, frequency=1.5, repetition=1.3)
    assert got["penalties"]["generated_text"] == [tok.decode(penalised, skip_special_tokens=True)]
    assert got["seeded a"]["generated_text"] == got["seeded b"]["generated_text"]
    assert got["min_new_tokens"]["count_output_tokens"] == 40  # the end tokens were banned until then
    assert got["eos kept"]["generated_text"] == [eos_text] and got["eos kept"]["finish_reason"] == "stop"


def test_n_and_best_of(stack: Stack) -> None:
    p = {"max_new_tokens": 8, "do_sample": True, "temperature": 2.0, "return_details": True}

    async def run() -> list[dict]:
        async with httpx.AsyncClient(base_url=stack.url, headers=AUTH, timeout=60) as client:
            calls = [
                client.post("/generate", json={"inputs": PROMPT, "parameters": {**p, "n": 3, "seed": 5}}),
                client.post("/generate", json={"inputs": PROMPT, "parameters": {**p, "n": 3, "seed": 5}}),
                client.post("/generate", json={"inputs": PROMPT, "parameters": {**p, "n": 2, "best_of": 4, "seed": 9}}),
                *(
                    client.post("/generate", json={"inputs": PROMPT, "parameters": {**p, "seed": 9 + i}})
                    for i in range(4)
                ),
            ]
            return [r.json() for r in await asyncio.gather(*calls)]

    a, b, best, *singles = asyncio.run(run())
    assert len(a["generated_text"]) == 3 and a["generated_text"] == b["generated_text"]
    assert len(set(a["generated_text"])) > 1
    assert len(a["count_output_tokens"]) == len(a["finish_reason"]) == len(a["tokens"]) == 3
    ranked = sorted(singles, key=lambda r: -sum(t["logprob"] for t in r["tokens"]))
    assert best["generated_text"] == [r["generated_text"][0] for r in ranked[:2]]
    with _http(stack) as client:
        for name, extra in (("n", {"n": 2}), ("best_of", {"best_of": 2})):
            r = client.post("/generate_stream", json={"inputs": PROMPT, "parameters": extra})
            assert r.status_code == 400 and f"parameters.{name}" in r.json()["error"]


def test_a_single_token_stop_string_is_cut_and_never_streamed(stack: Stack) -> None:
    """LightLLM matched stops on tokens after dropping a presumed BOS and lost one-token
    stops; here they are matched on the text."""
    tok = hf_reference.tokenizer(stack.model_dir)
    want = hf_reference.greedy(stack.model_dir, tok(PROMPT)["input_ids"], 24, eos=False)
    text = tok.decode(want, skip_special_tokens=True)
    stop = next(w for t in want[2:] if (w := tok.decode([t])).strip() and "\ufffd" not in w)
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 24, "ignore_eos": True, "stop_sequences": [stop]}}
    with _http(stack) as client:
        whole = client.post("/generate", json=body).json()
        events = _events(client, "/generate_stream", body)
    expected = text[: text.index(stop)]
    assert whole["generated_text"] == [expected] and whole["finish_reason"] == "stop"
    assert "".join(e["token"]["text"] for e in events) == expected
    assert events[-1]["finished"] and events[-1]["finish_reason"] == "stop"


def test_tgi_root_dispatches_on_stream(stack: Stack) -> None:
    """TGI's POST / answers in TGI's shapes (test_tgi_clients.py runs TGI's clients on it)."""
    with _http(stack) as client:
        body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 5}}
        whole = client.post("/", json=body).json()
        events = _events(client, "/", {**body, "stream": True})
    assert isinstance(whole, list) and len(whole) == 1 and set(whole[0]) == {"generated_text"}
    assert len(events) == 5 and whole[0]["generated_text"] == "".join(e["token"]["text"] for e in events)
    assert events[-1]["generated_text"] == whole[0]["generated_text"]


# (parameters, the parameter the error must name)
BAD = [
    ({"do_sample": "yes"}, "parameters.do_sample"),
    ({"temperature": -1}, "parameters.temperature"),
    ({"top_p": 0}, "parameters.top_p"),
    ({"top_p": 1.01}, "parameters.top_p"),
    ({"top_k": 0}, "parameters.top_k"),
    ({"top_k": -2}, "parameters.top_k"),
    ({"presence_penalty": -0.1}, "parameters.presence_penalty"),
    ({"frequency_penalty": -1}, "parameters.frequency_penalty"),
    ({"repetition_penalty": 0.9}, "parameters.repetition_penalty"),
    ({"ignore_eos": 1}, "parameters.ignore_eos"),
    ({"max_new_tokens": 0}, "parameters.max_new_tokens"),
    ({"max_new_tokens": 2000}, "max_new_tokens"),  # past the model's length limit
    ({"min_new_tokens": -1}, "parameters.min_new_tokens"),
    ({"min_new_tokens": 20, "max_new_tokens": 10}, "min_new_tokens"),
    ({"stop_sequences": [""]}, "parameters.stop_sequences"),
    ({"stop_sequences": ["s"] * 17}, "parameters.stop_sequences"),
    ({"stop_sequences": 3}, "parameters.stop_sequences"),
    ({"stop_token_ids": [-1]}, "parameters.stop_token_ids"),
    ({"stop_token_ids": [10**6]}, "parameters.stop_token_ids"),
    ({"skip_special_tokens": "no"}, "parameters.skip_special_tokens"),
    ({"return_details": 1}, "parameters.return_details"),
    ({"seed": -1}, "parameters.seed"),
    ({"seed": 2**63}, "parameters.seed"),
    ({"best_of": 0}, "parameters.best_of"),
    ({"best_of": 17}, "parameters.best_of"),
    ({"n": 2, "best_of": 1}, "best_of"),
    ({"n": 0}, "parameters.n"),
    ({"n": 17}, "parameters.n"),
    ({"no_such_parameter": 1}, "parameters.no_such_parameter: unknown parameter"),
]


def test_each_bad_parameter_gets_a_4xx_naming_it(stack: Stack) -> None:
    with _http(stack) as client:
        for path in ("/generate", "/generate_stream"):  # TGI's POST /: test_tgi_clients.py
            for parameters, named in BAD:
                r = client.post(path, json={"inputs": "hi", "parameters": parameters})
                assert r.status_code == 400, (path, parameters, r.status_code, r.text)
                body = r.json()
                assert set(body) == {"error", "error_type"} and named in body["error"], (path, parameters, body)
            r = client.post(path, json={"inputs": "hi", "bogus": True})
            assert r.status_code == 400 and "bogus: unknown parameter" in r.json()["error"]
            r = client.post(path, json={"inputs": "hi", "multimodal_params": {"images": [{"url": "x"}]}})
            assert r.status_code == 400 and "multimodal_params.images.0.type" in r.json()["error"]
            image = {"type": "base64", "data": base64.b64encode(vc.png(vc.image(1, 8, 8))).decode()}
            r = client.post(path, json={"inputs": "<image>hi", "multimodal_params": {"images": [image]}})
            assert r.status_code == 400 and "text-only" in r.json()["error"]


def test_keys_come_from_the_environment(stack: Stack) -> None:
    body = {"inputs": "hi", "parameters": {"max_new_tokens": 2}}
    assert httpx.post(stack.url + "/generate", json=body, timeout=30).status_code == 401
    other = {"Authorization": "Bearer ls-key-a"}
    assert httpx.post(stack.url + "/generate", json=body, headers=other, timeout=30).status_code == 200
