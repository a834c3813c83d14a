"""Structured output as each dialect asks for it: the Constraint the worker gets, and a 400
naming the parameter for a shape that cannot be a format (or two formats at once)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from services.tokenizer import constraints
from services.tokenizer.errors import describe_validation
from services.tokenizer.lightllm.params import GenerateParameters
from services.tokenizer.lightllm.tgi_params import TGIParameters
from services.tokenizer.openai.chat_params import ChatCompletionRequest
from services.tokenizer.openai.params import CompletionRequest
from shared.messages import Constraint

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
CHAT = [{"role": "user", "content": "hi"}]


def _openai(**kw) -> tuple[Constraint | None, Constraint | None]:
    """The constraint of a completions body and of a chat body with these fields."""
    completion = CompletionRequest.model_validate({"model": "m", "prompt": "hi", **kw})
    chat = ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT, **kw})
    return completion.sampling(0, 4, False, 0).constraint, chat.sampling(0, 4, False, 0).constraint


@pytest.mark.parametrize(
    ("fields", "want"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, Constraint("json_object")),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "n", "schema": SCHEMA, "strict": True},
                }
            },
            Constraint("json_schema", json.dumps(SCHEMA)),
        ),
        ({"guided_json": SCHEMA}, Constraint("json_schema", json.dumps(SCHEMA))),
        ({"guided_json": '{"type": "integer"}'}, Constraint("json_schema", '{"type": "integer"}')),
        ({"guided_regex": "[0-9]+", "guided_decoding_backend": "xgrammar"}, Constraint("regex", "[0-9]+")),
        ({"guided_choice": ["ja", "nö"]}, Constraint("choice", '["ja", "nö"]')),
        ({"guided_grammar": 'root ::= "a"'}, Constraint("grammar", 'root ::= "a"')),
    ],
)
def test_openai_formats_become_constraints(fields: dict, want: Constraint | None) -> None:
    assert _openai(**fields) == (want, want)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format: json_schema (with its schema)"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "json_schema.schema: required"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"guided_json": "{nope"}, "guided_json: not valid JSON"),
        ({"guided_json": "[1, 2]"}, "guided_json: a JSON schema is an object"),
        ({"guided_regex": ""}, "guided_regex: must not be empty"),
        ({"guided_choice": []}, "guided_choice: must hold 1 to"),
        ({"guided_choice": ["a", ""]}, "guided_choice: must not contain an empty string"),
        ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend: only xgrammar"),
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            "response_format and guided_regex cannot be used together",
        ),
    ],
)
def test_openai_formats_that_cannot_be_are_named(fields: dict, says: str) -> None:
    for body in ({"prompt": "hi"}, {"messages": CHAT}):
        with pytest.raises(ValidationError) as e:
            (CompletionRequest if "prompt" in body else ChatCompletionRequest).model_validate(
                {"model": "m", **body, **fields}
            )
        assert says in describe_validation(e.value.errors())


def test_lightllm_takes_vllm_spellings_and_its_own_regular_constraint() -> None:
    def constraint(**kw) -> Constraint | None:
        return GenerateParameters.model_validate(kw).sampling(0).constraint

    assert constraint(guided_json=SCHEMA) == Constraint("json_schema", json.dumps(SCHEMA))
    assert constraint(regular_constraint="a|b") == constraint(guided_regex="a|b") == Constraint("regex", "a|b")
    assert constraint(guided_choice=["x"]) == Constraint("choice", '["x"]')
    assert constraint(guided_grammar='root ::= "x"') == Constraint("grammar", 'root ::= "x"')
    assert constraint() is None
    with pytest.raises(ValidationError, match="guided_json and regular_constraint cannot be used together"):
        constraint(guided_json=SCHEMA, regular_constraint="a")


def test_tgi_grammar_is_a_json_schema_or_a_regex() -> None:
    def constraint(grammar: dict) -> Constraint | None:
        return TGIParameters.model_validate({"grammar": grammar}).sampling(0, 4).constraint

    assert constraint({"type": "json", "value": SCHEMA}) == Constraint("json_schema", json.dumps(SCHEMA))
    assert constraint({"type": "json", "value": '{"type": "object"}'}) == Constraint(
        "json_schema", '{"type": "object"}'
    )
    assert constraint({"type": "regex", "value": "[a-z]{3}"}) == Constraint("regex", "[a-z]{3}")


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"type": {"extra": None}}, "#/type: {'extra': None} is not a JSON type"),
        ({"type": ["string", ["null"]]}, "#/type: ['string', ['null']] is not a JSON type"),
        ({"type": "object", "properties": {"a": {"type": {"x": 1}}}}, "#/properties/a/type: {'x': 1} is not"),
        ({"anyOf": [{"type": 3}]}, "#/anyOf/0/type: 3 is not a JSON type"),
    ],
)
def test_a_type_that_is_no_name_is_named_not_raised(schema: dict, says: str) -> None:
    """A type of any JSON value (an object or a list among them, which no set holds) is a shape
    error the 400 names, never an exception out of the check."""
    assert constraints.schema_shape(schema).startswith(says)
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    with pytest.raises(ValidationError) as e:
        ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT, "tools": [tool]})
    assert "not a JSON schema: " + says in describe_validation(e.value.errors())
