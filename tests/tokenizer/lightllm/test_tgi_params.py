"""TGI's request body: what its clients send validates, nulls mean TGI's defaults, what
this server cannot honour is refused by name, and /generate tells TGI's body from LightLLM's."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.tokenizer.lightllm.tgi_params import TGIParameters, TGIRequest, is_tgi

# the parameters the `text-generation` client (0.7.0) sends with every generate()
CLIENT_PARAMETERS = {
    "best_of": None,
    "details": True,
    "decoder_input_details": False,
    "do_sample": False,
    "max_new_tokens": 20,
    "repetition_penalty": None,
    "frequency_penalty": None,
    "return_full_text": False,
    "seed": None,
    "stop": [],
    "temperature": None,
    "top_k": None,
    "top_p": None,
    "truncate": None,
    "typical_p": None,
    "watermark": False,
    "top_n_tokens": None,
    "grammar": None,
}


def test_the_clients_body_is_greedy_with_logprobs() -> None:
    body = TGIRequest.model_validate({"inputs": "hi", "parameters": CLIENT_PARAMETERS, "stream": False})
    p = body.params
    s = p.sampling(seed=7, max_new_tokens=20)
    assert not s.do_sample and s.temperature == 1.0 and s.top_k == -1 and s.logprobs and s.top_logprobs == 0
    assert p.sequences == 1 and not p.sampled


def test_nulls_everywhere_mean_the_defaults() -> None:
    body = TGIRequest.model_validate({"inputs": "hi", "parameters": None, "stream": None})
    assert body.params == TGIParameters() and not body.stream


@pytest.mark.parametrize(
    ("given", "sampled"),
    [({"do_sample": True}, True), ({"temperature": 0.7}, True), ({"top_k": 5}, True), ({"top_p": 0.9}, True),
     ({"temperature": 0.0, "do_sample": True}, False), ({"temperature": 1.0}, False), ({"top_p": 1.0}, False)],
)  # fmt: skip
def test_tgi_samples_when_a_warper_is_set(given: dict, sampled: bool) -> None:
    p = TGIParameters.model_validate(given)
    assert p.sampled is sampled and p.sampling(0, 4).do_sample is sampled


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"watermark": True}, "watermark"),
        ({"typical_p": 0.9}, "typical_p"),
        ({"grammar": {"type": "ebnf", "value": "a+"}}, "grammar.type"),
        ({"grammar": {"type": "regex", "value": ""}}, "grammar"),
        ({"grammar": {"type": "json", "value": "[1]"}}, "grammar"),
        ({"adapter_id": "x"}, "adapter_id"),
        ({"best_of": 2}, "best_of"),
        ({"stop": [""]}, "stop"),
        ({"truncate": 0}, "truncate"),
        ({"stop_sequences": ["x"]}, "stop_sequences"),
    ],
)
def test_what_cannot_be_honoured_is_named(given: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        TGIParameters.model_validate(given)


def test_generate_tells_the_dialects_apart() -> None:
    assert is_tgi({"inputs": "x", "parameters": CLIENT_PARAMETERS})
    assert is_tgi({"inputs": "x", "parameters": {"max_new_tokens": 5, "details": None}})
    assert not is_tgi({"inputs": "x", "parameters": {"max_new_tokens": 5, "seed": None}})
    assert is_tgi({"inputs": "x", "parameters": None})
    assert not is_tgi({"inputs": "x", "parameters": {"max_new_tokens": 5, "return_details": True}})
    assert not is_tgi({"inputs": "x"})
    assert not is_tgi(["x"])
