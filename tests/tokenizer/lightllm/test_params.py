"""LightLLM request validation: each bad parameter is named in the message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.tokenizer.errors import describe_validation
from services.tokenizer.generation import SEED_LIMIT, seeds
from services.tokenizer.lightllm.params import GenerateBody


def _error(body: dict) -> str:
    with pytest.raises(ValidationError) as e:
        GenerateBody.model_validate(body)
    return describe_validation(e.value.errors())


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"max_new_tokens": 0}, "parameters.max_new_tokens"),
        ({"top_p": 1.5}, "parameters.top_p"),
        ({"top_p": 0}, "parameters.top_p"),
        ({"top_k": 0}, "parameters.top_k"),
        ({"temperature": -1}, "parameters.temperature"),
        ({"repetition_penalty": 0.5}, "parameters.repetition_penalty"),
        ({"presence_penalty": -0.1}, "parameters.presence_penalty"),
        ({"frequency_penalty": -2}, "parameters.frequency_penalty"),
        ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens (5) must not exceed max_new_tokens (2)"),
        ({"stop_sequences": [""]}, "parameters.stop_sequences"),
        ({"do_sample": "yes"}, "parameters.do_sample"),
        ({"max_new_tokens": "16"}, "parameters.max_new_tokens"),
        ({"no_such_thing": 1}, "parameters.no_such_thing: unknown parameter"),
    ],
)
def test_bad_parameters_are_named(parameters: dict, named: str) -> None:
    assert named in _error({"inputs": "hi", "parameters": parameters})


def test_missing_inputs_and_unknown_top_level_key() -> None:
    assert "inputs: required" in _error({"parameters": {}})
    assert "prompt: unknown parameter" in _error({"inputs": "x", "prompt": "y"})


def test_greedy_conversion() -> None:
    body = GenerateBody.model_validate({"inputs": "x", "parameters": {"do_sample": True, "temperature": 0.0}})
    sp = body.parameters.sampling(seed=3)
    assert sp.greedy and sp.seed == 3
    body = GenerateBody.model_validate(
        {"inputs": "x", "parameters": {"do_sample": True, "temperature": 0.5, "seed": 9}}
    )
    sp = body.parameters.sampling(seed=9)
    assert not sp.greedy and sp.temperature == 0.5 and sp.seed == 9


def test_seeds_start_at_the_clients_and_differ_per_sequence() -> None:
    assert seeds(9, 3) == [9, 10, 11]
    assert seeds(SEED_LIMIT - 1, 2) == [SEED_LIMIT - 1, 0]
    assert seeds(-1, 1) == [SEED_LIMIT - 1]  # OpenAI allows negative seeds
    drawn = seeds(None, 4)
    assert len(set(drawn)) == 4 and all(0 <= s < SEED_LIMIT for s in drawn)


def test_n_and_best_of() -> None:
    p = GenerateBody.model_validate({"inputs": "x", "parameters": {"n": 3}}).parameters
    assert p.sequences == 3 and not p.sampling(1).logprobs
    p = GenerateBody.model_validate({"inputs": "x", "parameters": {"n": 2, "best_of": 5}}).parameters
    assert p.sequences == 5 and p.sampling(1).logprobs  # ranking needs the logprobs
    assert "best_of (1) must not be less than n (2)" in _error({"inputs": "x", "parameters": {"n": 2, "best_of": 1}})
    assert "parameters.n" in _error({"inputs": "x", "parameters": {"n": 17}})
