"""The schema keywords xgrammar ignores: still ignored by the version pinned (so refusing them
is still needed), and found wherever they sit in a schema."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from transformers import AutoTokenizer

from services.worker.schema_support import IGNORED_KEYWORDS, unsupported

# for each keyword: a schema using it, and a value the schema forbids
BROKEN = {
    "not": ({"not": {"type": "string"}}, '"a"'),
    "uniqueItems": ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1, 1]"),
    "contains": ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 5}}, "[1]"),
    "if": ({"if": {"type": "integer"}, "then": {"minimum": 5}}, "3"),
    "dependentRequired": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "dependentRequired": {"a": ["b"]}},
        '{"a": 1}',
    ),
    "allOf": (
        {"allOf": [{"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]}, {"required": ["b"]}]},
        '{"a": 1}',
    ),
}


def test_the_pinned_xgrammar_still_lets_these_through(tiny_llama: str) -> None:
    """Should a newer xgrammar enforce one, it can leave the list."""
    info = xgr.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(tiny_llama))
    compiler = xgr.GrammarCompiler(info, max_threads=1)
    for keyword, (schema, forbidden) in BROKEN.items():
        matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=False))
        assert matcher.accept_string(forbidden) and matcher.is_completed(), keyword
        assert unsupported(schema), keyword


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}},
            "'uniqueItems' (at #/properties/a)",
        ),
        ({"$defs": {"x": {"not": {}}}, "$ref": "#/$defs/x"}, "'not' (at #/$defs/x)"),
        ({"type": "array", "items": [{"type": "integer"}, {"if": {}}]}, "'if' (at #/items/1)"),
        (
            {"anyOf": [{"type": "integer"}, {"type": "object", "additionalProperties": {"contains": {}}}]},
            "#/anyOf/1/additionalProperties",
        ),
        ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, "'allOf' with more than one schema (at #)"),
    ],
)
def test_a_keyword_is_found_where_it_is(schema: dict, says: str) -> None:
    assert says in unsupported(schema)


def test_what_is_not_a_keyword_is_not_refused() -> None:
    # a property named "not", an enum value, a one-member allOf, an unknown format
    schema = {
        "type": "object",
        "properties": {"not": {"enum": [{"uniqueItems": True}]}, "s": {"type": "string", "format": "weird"}},
        "allOf": [{"required": ["not"]}],
    }
    assert unsupported(schema) == "" and unsupported(True) == "" and unsupported(None) == ""
    assert set(BROKEN) - {"allOf"} <= IGNORED_KEYWORDS
