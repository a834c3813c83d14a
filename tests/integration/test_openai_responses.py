"""POST /v1/responses through the stack with the real openai client: the greedy text Hugging
Face gives for the rendered chat, whole and streamed, with usage and the events OpenAI sends."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from tests import hf_reference
from tests.integration.conftest import start_stack
from tests.structured_cases import SCHEMAS
from tools.redis_server import RedisServer

INSTRUCTIONS = "Answer briefly."
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def stack(tiny_llama: str, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory):
    s = start_stack(tiny_llama, redis_server, str(tmp_path_factory.mktemp("responses")))
    yield s
    s.stop()


def _want(model_dir: str, n: int) -> tuple[list[int], str]:
    tok = hf_reference.tokenizer(model_dir)
    chat = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    ids = tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
    out = hf_reference.greedy(model_dir, ids["input_ids"], n, eos=False)
    return ids["input_ids"], tok.decode(out, skip_special_tokens=True)


def test_a_whole_response_is_hf_greedy_text(stack, tiny_llama: str) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    ids, text = _want(tiny_llama, 6)
    r = client.responses.create(
        model=model,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
        store=False,
    )
    assert r.output_text == text and r.status == "incomplete"  # cut by max_output_tokens
    assert r.incomplete_details.reason == "max_output_tokens"
    assert (r.usage.input_tokens, r.usage.output_tokens) == (len(ids), 6)
    # the same as messages, developer for system
    r2 = client.responses.create(
        model=model,
        input=[{"role": "developer", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}],
        max_output_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r2.output_text == text and r2.usage.input_tokens_details.cached_tokens == len(ids) - 1


def test_a_streamed_response_sends_openais_events(stack, tiny_llama: str) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none")
    _, text = _want(tiny_llama, 5)
    events = list(
        client.responses.create(
            model=client.models.list().data[0].id,
            instructions=INSTRUCTIONS,
            input=QUESTION,
            max_output_tokens=5,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    assert events[-1].response.output_text == text and events[-1].response.usage.output_tokens == 5
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_what_is_not_supported_is_named(stack) -> None:
    model = httpx.get(stack.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    for extra, name in [
        ({"tools": [{"type": "function", "name": "f"}]}, "tools"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_schema"}}}, "schema"),
        ({"text": {"format": {"type": "json_object"}}, "guided_regex": "a+"}, "text.format and guided_*"),
        ({"logit_bias": {"10000000": 1.0}}, "logit_bias"),  # past the vocabulary
        ({"stop_token_ids": [10000000]}, "stop_token_ids"),
    ]:
        body = {"model": model, "input": "hi", **extra}
        r = httpx.post(stack.url + "/v1/responses", json=body, timeout=30)
        assert r.status_code == 400 and name in r.text, (extra, r.text)


def test_text_format_holds_the_answer_to_a_schema(stack) -> None:
    """text.format json_schema (the Responses API's spelling), whole and streamed; the response
    repeats the format it was given."""
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    schema = SCHEMAS[6]
    fmt = {"type": "json_schema", "name": "point", "schema": schema, "strict": True}
    r = client.responses.create(model=model, input=QUESTION, text={"format": fmt}, max_output_tokens=60, temperature=0)
    assert r.status == "completed" and r.text.format.type == "json_schema" and r.text.format.name == "point"
    jsonschema.validate(json.loads(r.output_text), schema)
    events = list(
        client.responses.create(
            model=model, input=QUESTION, text={"format": fmt}, max_output_tokens=60, temperature=0, stream=True
        )
    )
    assert json.loads(events[-1].response.output_text) == json.loads(r.output_text)
    obj = client.responses.create(
        model=model, input=QUESTION, text={"format": {"type": "json_object"}}, max_output_tokens=60
    )
    # any JSON object: a random model's object may outrun the limit, but it opens as one
    assert obj.text.format.type == "json_object" and obj.output_text.startswith("{")
