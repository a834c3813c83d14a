"""What the OpenAI routes refuse and count, driven by the real `openai` package against the
whole stack: a 4xx in OpenAI's shape naming each bad parameter, API keys, the front end's
metrics. Generation itself: test_openai_api.py."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest

from tests import vision_cases as vc
from tests.integration.api_helpers import delta, metric_samples
from tests.integration.openai_helpers import AUTH, CHATS, PROMPTS, _stack, sync_client  # noqa: F401 (_stack: a fixture)
from tools.stack import Stack

# (parameter, bad value, the param named in the error[, other fields of the body])
COMMON_BAD = [
    ("temperature", -0.1, "temperature"),
    ("temperature", 2.5, "temperature"),
    ("top_p", 0.0, "top_p"),
    ("top_p", 1.5, "top_p"),
    ("n", 0, "n"),
    ("n", 17, "n"),
    ("presence_penalty", -2.5, "presence_penalty"),
    ("presence_penalty", 2.5, "presence_penalty"),
    ("frequency_penalty", -3, "frequency_penalty"),
    ("frequency_penalty", 2.01, "frequency_penalty"),
    ("seed", 2**64, "seed"),
    ("seed", "7", "seed"),
    ("stop", [""], "stop"),
    ("stop", ["a"] * 17, "stop"),
    ("stop", 5, "stop"),
    ("max_tokens", 0, "max_tokens"),
    ("max_tokens", 5000, "max_tokens"),
    ("stream", "yes", "stream"),
    ("stream_options", {"include_usage": True}, "stream_options"),  # without stream
    ("user", 5, "user"),
    ("logit_bias", {"a": 1.0}, "logit_bias"),
    ("logit_bias", {"5": 101.0}, "logit_bias"),
    ("logit_bias", {"1000000": 1.0}, "logit_bias"),  # past the vocabulary
    ("logit_bias", {str(i): 1.0 for i in range(301)}, "logit_bias"),
    ("top_k", 0, "top_k"),
    ("min_p", -0.1, "min_p"),
    ("allowed_token_ids", [], "allowed_token_ids"),
    ("allowed_token_ids", [10**6], "allowed_token_ids"),
    ("truncate_prompt_tokens", 0, "truncate_prompt_tokens"),
    ("truncate_prompt_tokens", -2, "truncate_prompt_tokens"),
    ("min_p", 1.5, "min_p"),
    ("repetition_penalty", 0, "repetition_penalty"),
    ("min_tokens", -1, "min_tokens"),
    ("min_tokens", 100, "min_tokens", {"max_tokens": 5}),
    ("ignore_eos", "yes", "ignore_eos"),
    ("stop_token_ids", [-1], "stop_token_ids.0"),
    ("stop_token_ids", [10**6], "stop_token_ids"),
    ("skip_special_tokens", 1, "skip_special_tokens"),
    ("no_such_parameter", 1, "no_such_parameter"),
]
COMPLETIONS_BAD = [
    ("prompt", [], "prompt"),
    ("prompt", [10**6], "prompt"),
    ("prompt", 3, "prompt"),
    ("best_of", 0, "best_of"),
    ("best_of", 17, "best_of"),
    ("best_of", 1, "best_of", {"n": 2}),
    ("best_of", 3, "best_of", {"stream": True}),
    ("logprobs", -1, "logprobs"),
    ("logprobs", 21, "logprobs"),
    ("echo", "x", "echo"),
    ("suffix", "the end", "suffix"),
]
CHAT_BAD = [
    ("messages", [], "messages"),
    ("messages", [{"role": "wizard", "content": "hi"}], "messages.0.role"),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages.0.content"),
    ("messages", [{"role": "user", "content": "hi", "extra": 1}], "messages.0.extra"),
    ("max_completion_tokens", 0, "max_completion_tokens"),
    ("logprobs", "yes", "logprobs"),
    ("top_logprobs", 21, "top_logprobs"),
    ("top_logprobs", -1, "top_logprobs"),
    ("top_logprobs", 2, "top_logprobs"),  # without logprobs
    ("tools", [{"type": "function"}], "tools.0.function"),
    ("tool_choice", "required", "tool_choice"),  # without tools
    ("response_format", {"type": "xml"}, "response_format.type"),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ("guided_choice", [], "guided_choice"),
    ("guided_json", "{not json", "guided_json"),
]


def _bad_request(client: openai.OpenAI, route: str, base: dict, case: tuple) -> openai.APIStatusError:
    param, value, _, *extra = case
    body = {**base, **(extra[0] if extra else {}), param: value}
    create = client.completions.create if route == "completions" else client.chat.completions.create
    named = {k: body.pop(k) for k in ("model", "prompt", "messages") if k in body}
    with pytest.raises(openai.APIStatusError) as e:
        create(**named, extra_body=body)
    return e.value


def test_each_bad_parameter_gets_a_4xx_naming_it(stack: Stack) -> None:
    client = sync_client(stack)
    cases = [("completions", {"model": stack.model_name, "prompt": "hi"}, c) for c in COMMON_BAD + COMPLETIONS_BAD]
    cases += [("chat", {"model": stack.model_name, "messages": CHATS[0]}, c) for c in COMMON_BAD + CHAT_BAD]
    for route, base, case in cases:
        err = _bad_request(client, route, base, case)
        where, named = (route, *case), case[2]
        assert err.status_code == 400, (where, err.status_code, err.body)
        assert set(err.body) == {"message", "type", "param", "code"}, (where, err.body)
        assert err.body["type"] == "invalid_request_error"
        assert err.body["param"] == named, (where, err.body)
        assert named.split(".")[0] in err.body["message"], (where, err.body)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="hi")
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    r = httpx.post(
        stack.url + "/v1/completions", content=b"{oops", headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    # the service keeps serving
    ok = client.completions.create(model=stack.model_name, prompt="still there?", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens >= 1


def test_api_keys(stack: Stack) -> None:
    bad = openai.OpenAI(base_url=stack.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model=stack.model_name, prompt="hi", max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error"
        r = http.post("/generate", json={"inputs": "hi"}, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error_type"] == "invalid_api_key"
        # open to scrapers without the key by default (--protect-metrics puts it behind the key)
        assert http.get("/metrics").status_code == 200
        assert http.get("/health").status_code == 200  # load balancers probe it without a key
        other = http.post("/generate", json={"inputs": "hi", "parameters": {"max_new_tokens": 2}}, headers=AUTH)
        assert other.status_code == 200
        r = http.post(
            "/generate",
            json={"inputs": "hi", "parameters": {"max_new_tokens": 2}},
            headers={"Authorization": "Bearer other"},
        )
        assert r.status_code == 200  # every configured key works


def test_metrics_count_requests_tokens_and_latencies(stack: Stack) -> None:
    client = sync_client(stack)
    before = metric_samples(stack.url, AUTH)
    r = client.completions.create(model=stack.model_name, prompt=PROMPTS[1], max_tokens=7, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=stack.model_name, prompt="hi", temperature=9)
    after = metric_samples(stack.url, AUTH)
    route = "/v1/completions"
    assert delta(before, after, "lightstream_front_requests_total", route=route) == 2
    assert delta(before, after, "lightstream_front_request_errors_total", route=route, code="400") == 1
    assert delta(before, after, "lightstream_front_prompt_tokens_total") == r.usage.prompt_tokens
    assert delta(before, after, "lightstream_front_generation_tokens_total") == r.usage.completion_tokens
    reason = "length" if r.choices[0].finish_reason == "length" else "stop"
    assert delta(before, after, "lightstream_front_generations_total", finish_reason=reason) == 1
    for name in ("queue_time_seconds", "time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert delta(before, after, f"lightstream_front_{name}_count") == 1, name
        assert delta(before, after, f"lightstream_front_{name}_sum") > 0, name
    if r.usage.completion_tokens > 1:
        assert delta(before, after, "lightstream_front_time_per_output_token_seconds_count") == 1
    assert after[("lightstream_front_generations_in_flight", ())] == 0


def test_an_image_to_a_text_only_model_is_a_400_naming_it(stack: Stack) -> None:
    png = base64.b64encode(vc.png(vc.image(1, 8, 8))).decode()
    content = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png}},
        {"type": "text", "text": "hi"},
    ]
    body = {"model": stack.model_name, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    r = httpx.post(stack.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "text-only" in error["message"] and error["param"] == "messages.0.content.0.image_url"
