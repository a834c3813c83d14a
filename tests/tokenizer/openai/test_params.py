"""OpenAI request bodies: defaults as OpenAI's, conversion to the worker's parameters, and
rules across fields that name the parameter to change."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.tokenizer.errors import APIError, describe_validation, validation_param
from services.tokenizer.openai.chat_params import ChatCompletionRequest
from services.tokenizer.openai.params import CompletionRequest

CHAT = [{"role": "user", "content": "hi"}]


def _completion(**kw) -> CompletionRequest:
    return CompletionRequest.model_validate({"model": "m", "prompt": "hi", **kw})


def _chat(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT, **kw})


def test_openai_samples_by_default_and_temperature_zero_is_greedy() -> None:
    sp = _completion().sampling(seed=4, max_new_tokens=16, logprobs=False, top_logprobs=0)
    assert sp.do_sample and sp.temperature == 1.0 and sp.top_p == 1.0 and sp.seed == 4 and not sp.greedy
    sp = _completion(temperature=0, top_p=0.5).sampling(seed=4, max_new_tokens=16, logprobs=True, top_logprobs=3)
    assert sp.greedy and sp.logprobs and sp.top_logprobs == 3
    sp = _chat(
        presence_penalty=-1.5, frequency_penalty=2, top_k=5, repetition_penalty=1.2, min_tokens=2, ignore_eos=True
    ).sampling(seed=0, max_new_tokens=9, logprobs=False, top_logprobs=0)
    assert (sp.presence_penalty, sp.frequency_penalty, sp.top_k, sp.repetition_penalty) == (-1.5, 2.0, 5, 1.2)
    assert (sp.min_new_tokens, sp.max_new_tokens, sp.ignore_eos) == (2, 9, True)


def test_nulls_mean_the_defaults() -> None:
    body = _completion(temperature=None, top_p=None, n=None, stop=None, max_tokens=None, seed=None)
    assert body.sequences == 1 and body.stops() == []
    sp = body.sampling(seed=1, max_new_tokens=16, logprobs=False, top_logprobs=0)
    assert sp.temperature == 1.0 and sp.top_p == 1.0


def test_prompts_in_every_form() -> None:
    assert _completion(prompt="a").prompts() == ["a"]
    assert _completion(prompt=["a", "b"]).prompts() == ["a", "b"]
    assert _completion(prompt=[1, 2]).prompts() == [[1, 2]]
    assert _completion(prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]
    for mixed in ([1, "a"], ["a", 1], [1, [2]]):  # prompts() tells the forms apart by the first element
        with pytest.raises(ValidationError):
            _completion(prompt=mixed)


def test_chat_messages_flatten_text_parts() -> None:
    body = _chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert body.chat() == [{"role": "user", "content": "ab"}]
    assert body.max_tokens_asked() == (None, "max_tokens")
    assert _chat(max_tokens=3, max_completion_tokens=5).max_tokens_asked() == (5, "max_completion_tokens")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"best_of": 2, "stream": True}, "best_of"),
        ({"prompt": ["p"] * 9, "best_of": 8}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
    ],
)
def test_completion_rules_across_fields(body: dict, param: str) -> None:
    with pytest.raises(APIError) as e:
        _completion(**body).check()
    assert e.value.status == 400 and e.value.param == param and param in e.value.message


def test_chat_rules_across_fields() -> None:
    with pytest.raises(APIError) as e:
        _chat(top_logprobs=2).check()
    assert e.value.param == "top_logprobs"
    with pytest.raises(APIError) as e:
        _chat(min_tokens=10).check_max_tokens(5, "max_completion_tokens")
    assert e.value.param == "min_tokens" and "max_completion_tokens (5)" in e.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools.0.function"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.0.content"),
        ({"logit_bias": {"-1": 2.0}}, "logit_bias"),
        ({"logit_bias": {"1": -100.5}}, "logit_bias"),
        ({"logit_bias": {"1": "2"}}, "logit_bias.1"),
        ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs"),
        ({"stream_options": {"continuous": True}}, "stream_options.continuous"),
        ({"stop": 3}, "stop"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_unsupported_and_unknown_are_named(body: dict, param: str) -> None:
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT, **body})
    errors = e.value.errors()
    assert validation_param(errors) == param
    assert describe_validation(errors).startswith(param)


def test_fields_that_change_nothing_are_accepted_with_a_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    no_ops = {"store": False, "service_tier": "auto", "user": "u", "metadata": {"k": "v"}}
    with caplog.at_level("DEBUG", logger="services.tokenizer.openai.params"):
        sp = _chat(**no_ops).sampling(seed=1, max_new_tokens=4, logprobs=False, top_logprobs=0)
    assert sp == _chat().sampling(seed=1, max_new_tokens=4, logprobs=False, top_logprobs=0)
    assert "service_tier" in caplog.text and "metadata" in caplog.text
    _completion(**no_ops, priority=1, prompt_cache_key="c", safety_identifier="s")


def test_vllm_extras_that_change_the_output() -> None:
    body = _completion(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert body.continuous_usage()
    assert not _completion(stream=True, stream_options={"continuous_usage_stats": True}).continuous_usage()
    assert _chat(include_stop_str_in_output=True, spaces_between_special_tokens=True).include_stop_str_in_output


def test_min_p_reaches_the_sampling_params() -> None:
    assert _completion(min_p=0.05).sampling(1, 4, False, 0).min_p == 0.05
    assert _chat().sampling(1, 4, False, 0).min_p == 0.0


def test_logit_bias_reaches_the_sampling_params() -> None:
    body = _chat(logit_bias={"7": -100, "12": 2.5})  # an integer bias is a number as JSON has it
    sp = body.sampling(seed=1, max_new_tokens=4, logprobs=False, top_logprobs=0)
    assert sp.logit_bias == [[7, -100.0], [12, 2.5]] and body.bias_ids() == [7, 12]
    assert _completion(logit_bias={}).sampling(1, 4, False, 0).logit_bias == []
