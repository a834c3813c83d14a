"""Structured output through the whole stack, driven by the real `openai` package: with a tiny
random model (whose free output is never JSON), every answer under a JSON schema parses and
validates, regexes and choice lists hold, free requests beside constrained ones keep their
greedy text, and a format that cannot be compiled is a 400 that says why."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Annotated

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.integration.openai_helpers import AUTH, _stack, async_client, sync_client  # noqa: F401 (_stack: a fixture)
from tests.structured_cases import CHOICES, REGEXES, SCHEMAS
from tools.stack import Stack

QUESTIONS = ["Describe a person.", "What is the weather?", "List some numbers.", "x"]


def _chat(i: int) -> list[dict]:
    return [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]


def test_every_answer_under_a_json_schema_validates(stack: Stack) -> None:
    client = async_client(stack)

    async def ask(i: int, schema: dict):
        fmt = {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}}
        return await client.chat.completions.create(
            model=stack.model_name, messages=_chat(i), max_tokens=300, temperature=0, response_format=fmt
        )

    async def run() -> list:
        return await asyncio.gather(*(ask(i, s) for i, s in enumerate(SCHEMAS)))

    for schema, answer in zip(SCHEMAS, asyncio.run(run()), strict=True):
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", (schema, choice)
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_regexes_and_choices_hold_on_both_routes(stack: Stack) -> None:
    client = async_client(stack)

    async def regex(i: int, pattern: str) -> str:
        r = await client.completions.create(
            model=stack.model_name,
            prompt=QUESTIONS[i % len(QUESTIONS)],
            max_tokens=60,
            temperature=0.8,
            seed=i,
            extra_body={"guided_regex": pattern},
        )
        return r.choices[0].text

    async def choice(i: int, options: list[str]) -> str:
        r = await client.chat.completions.create(
            model=stack.model_name,
            messages=_chat(i),
            max_tokens=60,
            temperature=0,
            extra_body={"guided_choice": options},
        )
        return r.choices[0].message.content

    async def run() -> tuple[list, list]:
        texts = asyncio.gather(*(regex(i, p) for i, p in enumerate(REGEXES)))
        picks = asyncio.gather(*(choice(i, c) for i, c in enumerate(CHOICES)))
        return await texts, await picks

    texts, picks = asyncio.run(run())
    for pattern, text in zip(REGEXES, texts, strict=True):
        assert re.fullmatch(pattern, text), (pattern, text)
    for options, pick in zip(CHOICES, picks, strict=True):
        assert pick in options


def test_free_requests_keep_their_greedy_text_beside_constrained_ones(stack: Stack) -> None:
    client = async_client(stack)
    prompts = ["Once upon a time", "The capital of France is", "1, 2, 3,"]

    async def free(prompt: str) -> str:
        r = await client.completions.create(model=stack.model_name, prompt=prompt, max_tokens=20, temperature=0)
        return r.choices[0].text

    async def constrained(i: int) -> str:
        fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[i]}}
        r = await client.chat.completions.create(
            model=stack.model_name, messages=_chat(i), max_tokens=200, temperature=0, response_format=fmt
        )
        return r.choices[0].message.content

    async def run() -> tuple[list, list]:
        alone = [await free(p) for p in prompts]
        mixed = await asyncio.gather(*(free(p) for p in prompts), *(constrained(i) for i in range(8)))
        return alone, list(mixed[: len(prompts)])

    alone, together = asyncio.run(run())
    assert together == alone


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    tags: list[Annotated[str, Field(max_length=8)]] = Field(max_length=3)


def test_the_sdks_parse_helper_and_a_streamed_answer(stack: Stack) -> None:
    """openai's chat.completions.parse sends a strict schema of a pydantic model and reads it
    back; a stream's deltas make up the same kind of answer."""
    client = sync_client(stack)
    parsed = client.chat.completions.parse(
        model=stack.model_name, messages=_chat(0), max_tokens=300, temperature=0, response_format=Person
    )
    assert isinstance(parsed.choices[0].message.parsed, Person)
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[11]}}
    stream = client.chat.completions.create(
        model=stack.model_name, messages=_chat(1), max_tokens=300, temperature=0, response_format=fmt, stream=True
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMAS[11])
    assert chunks[-1].choices[0].finish_reason == "stop"
    whole = client.chat.completions.create(
        model=stack.model_name, messages=_chat(1), max_tokens=300, temperature=0, response_format=fmt
    )
    assert whole.choices[0].message.content == text


def test_log_probabilities_under_a_format_are_numbers_json_carries(stack: Stack) -> None:
    """Under a choice list most steps allow one token, so most of the top five are tokens the
    format rules out: they come back at the sampler's floor (as vLLM's do), the chosen token at
    its own log-probability, on the chat route and the completions route alike."""
    client = sync_client(stack)
    chat = client.chat.completions.create(
        model=stack.model_name,
        messages=_chat(0),
        max_tokens=20,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        extra_body={"guided_choice": ["yes indeed", "no"]},
    )
    assert chat.choices[0].message.content in ("yes indeed", "no")
    steps = chat.choices[0].logprobs.content
    assert steps and all(len(s.top_logprobs) == 5 for s in steps)
    assert all(-9999.0 <= t.logprob <= 0.0 for s in steps for t in s.top_logprobs)
    assert any(t.logprob == -9999.0 for s in steps for t in s.top_logprobs)
    plain = client.completions.create(
        model=stack.model_name,
        prompt=QUESTIONS[1],
        max_tokens=8,
        temperature=0,
        logprobs=3,
        extra_body={"guided_regex": "[0-9]{3}"},
    )
    assert re.fullmatch("[0-9]{3}", plain.choices[0].text)
    assert all(-9999.0 <= v <= 0.0 for top in plain.choices[0].logprobs.top_logprobs for v in top.values())


def test_json_object_and_the_lightllm_and_tgi_spellings(stack: Stack) -> None:
    client = sync_client(stack)
    r = client.chat.completions.create(
        model=stack.model_name,
        messages=_chat(2),
        max_tokens=300,
        temperature=0,
        response_format={"type": "json_object"},
    )
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":  # a random model may fill an open string to the limit
        assert isinstance(json.loads(text), dict)
    assert text.startswith("{")
    with httpx.Client(base_url=stack.url, headers=AUTH, timeout=60) as http:
        body = {"inputs": "Today", "parameters": {"max_new_tokens": 40, "guided_regex": REGEXES[3]}}
        out = http.post("/generate", json=body).json()
        assert re.fullmatch(REGEXES[3], out["generated_text"][0]), out
        body["parameters"] = {"max_new_tokens": 40, "regular_constraint": REGEXES[7]}
        assert re.fullmatch(REGEXES[7], http.post("/generate", json=body).json()["generated_text"][0])
        grammar = {"type": "json", "value": SCHEMAS[13]}
        tgi = http.post("/", json={"inputs": "Today", "parameters": {"max_new_tokens": 60, "grammar": grammar}})
        jsonschema.validate(json.loads(tgi.json()[0]["generated_text"]), SCHEMAS[13])


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"guided_json": {"type": "foo"}}, 'Unsupported type "foo"'),
        ({"guided_json": {"type": "integer", "minimum": 3, "maximum": 1}}, "minimum greater than maximum"),
        ({"guided_json": {"$ref": "#/$defs/missing"}}, "missing"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": {"not": {}}}}},
            "the keyword 'not' (at #) is not supported",
        ),
        ({"guided_regex": "[a-"}, "Regex parsing error"),
        ({"guided_regex": "(?<=a)b"}, "regex"),
        ({"guided_grammar": 'root ::= "a" | b'}, 'Rule "b" is not defined'),
    ],
)
def test_a_format_that_does_not_compile_is_a_400_and_serving_goes_on(stack: Stack, extra: dict, says: str) -> None:
    client = sync_client(stack)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model=stack.model_name, messages=_chat(0), max_tokens=8, stream=stream, extra_body=extra
            )
        assert says in e.value.body["message"] and e.value.body["code"] == "invalid", e.value.body
    ok = client.completions.create(
        model=stack.model_name, prompt="x", max_tokens=8, temperature=0, extra_body={"guided_regex": "[0-9]{2}"}
    )
    assert re.fullmatch("[0-9]{2}", ok.choices[0].text)
