"""Structured output as every dialect asks for it -> the worker's Constraint.

The front end checks shapes (a schema is a JSON object, a regex a string, a choice a list
of strings, one format per request) and says which parameter is wrong; whether a schema,
regex or grammar compiles is the worker's word (services/worker/grammar.py): one that does
not ends its request with a 400 that says why (ERR_INVALID).
"""

from __future__ import annotations

import json
from typing import Any

from shared.messages import (
    CONSTRAINT_CHOICE,
    CONSTRAINT_GRAMMAR,
    CONSTRAINT_JSON_OBJECT,
    CONSTRAINT_JSON_SCHEMA,
    CONSTRAINT_REGEX,
    Constraint,
)

MAX_CHOICES = 1024


def check_schema(v: dict[str, Any] | bool | str | None) -> dict[str, Any] | bool | str | None:
    """A JSON schema: an object (or true/false), or its JSON text."""
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except ValueError as e:
            raise ValueError(f"not valid JSON: {e}") from None
        if not isinstance(parsed, dict | bool):
            raise ValueError(f"a JSON schema is an object, got {type(parsed).__name__}")
    return v


JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def schema_shape(schema: Any, where: str = "#") -> str:
    """What makes a value no JSON schema at all ("" when nothing does): the keywords' shapes
    only (a type that is none, properties that are not an object, ...). Whether the worker
    can compile it is its word."""
    if isinstance(schema, bool):
        return ""
    if not isinstance(schema, dict):
        return f"{where} is a {type(schema).__name__}, not an object"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if any(not isinstance(k, str) or k not in JSON_TYPES for k in kinds):
        return f"{where}/type: {kind!r} is not a JSON type"
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if key in schema and not isinstance(schema[key], dict):
            return f"{where}/{key} must be an object"
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return f"{where}/required must be a list of property names"
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{where}/enum must be a list"
    subschemas = [
        (f"{where}/{k}/{n}", s) for k in ("properties", "$defs", "definitions") for n, s in schema.get(k, {}).items()
    ]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema and not isinstance(schema[key], list):
            return f"{where}/{key} must be a list"
        subschemas += [(f"{where}/{key}/{i}", s) for i, s in enumerate(schema.get(key, []))]
    if "items" in schema and not isinstance(schema["items"], list):
        subschemas.append((f"{where}/items", schema["items"]))
    for path, sub in subschemas:
        if why := schema_shape(sub, path):
            return why
    return ""


def check_text(v: str | None) -> str | None:
    """A regex or a grammar: not empty."""
    if v is not None and not v:
        raise ValueError("must not be empty")
    return v


def check_choice(v: list[str] | None) -> list[str] | None:
    if v is None:
        return v
    if not v or len(v) > MAX_CHOICES:
        raise ValueError(f"must hold 1 to {MAX_CHOICES} strings")
    if any(not c for c in v):
        raise ValueError("must not contain an empty string")
    return v


def json_schema(v: dict[str, Any] | bool | str | None) -> Constraint | None:
    """The schema as the worker compiles it (and caches it by): its JSON text, keys in the
    order given (the order the output writes properties in)."""
    if v is None:
        return None
    return Constraint(CONSTRAINT_JSON_SCHEMA, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False))


def json_object(asked: bool) -> Constraint | None:
    return Constraint(CONSTRAINT_JSON_OBJECT) if asked else None


def regex(v: str | None) -> Constraint | None:
    return None if v is None else Constraint(CONSTRAINT_REGEX, v)


def choice(v: list[str] | None) -> Constraint | None:
    return None if v is None else Constraint(CONSTRAINT_CHOICE, json.dumps(v, ensure_ascii=False))


def grammar(v: str | None) -> Constraint | None:
    return None if v is None else Constraint(CONSTRAINT_GRAMMAR, v)


def one_constraint(**given: Constraint | None) -> Constraint | None:
    """The one format asked for, by parameter name; two at once is an error naming both."""
    asked = [(name, c) for name, c in given.items() if c is not None]
    if len(asked) > 1:
        raise ValueError(f"{asked[0][0]} and {asked[1][0]} cannot be used together: one output format per request")
    return asked[0][1] if asked else None
