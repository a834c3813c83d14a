"""Structured-output cases shared by the worker's tests and the stack's: twenty JSON schemas of
varied shapes, twenty regular expressions and twenty choice lists.

Every string, array and number has a bound: the tiny random models would otherwise fill an
open string or a digit run to the token limit (the output then stops short of valid JSON,
which is the model's doing, not the grammar's).
"""

from __future__ import annotations

S = "string"
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": S, "maxLength": 10}}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}}, "required": ["ok", "note"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"score": {"type": "number", "minimum": -1, "maximum": 1}}, "required": ["score"]},
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": S, "maxLength": 6}, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -10, "maximum": 10},
                    "y": {"type": "integer", "minimum": -10, "maximum": 10},
                },
                "required": ["x", "y"],
            }
        },
        "required": ["point"],
    },
    {"type": "object", "properties": {"code": {"type": S, "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"]},
    {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 9}, "label": {"type": S, "maxLength": 8}},
        "required": ["id"],
    },
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 4},
    {
        "type": "object",
        "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 10}},
        "required": ["kind", "r"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": S, "pattern": "^[a-z]{2}[0-9]$"},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 5},
                    },
                    "required": ["sku", "qty"],
                },
                "minItems": 1,
                "maxItems": 2,
            }
        },
        "required": ["items"],
    },
    {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "boolean"}]}},
        "required": ["value"],
    },
    {
        "type": "object",
        "properties": {"level": {"type": "integer", "enum": [1, 2, 3]}, "on": {"type": "boolean"}},
        "required": ["level", "on"],
    },
    {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "properties": {"b": {"type": "object", "properties": {"c": {"type": "boolean"}}, "required": ["c"]}},
                "required": ["b"],
            }
        },
        "required": ["a"],
    },
    {
        "type": "object",
        "properties": {"date": {"type": S, "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}},
        "required": ["date"],
    },
    {
        "type": "object",
        "properties": {"ratio": {"type": "number", "minimum": 0, "maximum": 100}, "unit": {"enum": ["%", "x"]}},
        "required": ["ratio", "unit"],
    },
    {
        "type": "object",
        "properties": {
            "first": {"type": S, "maxLength": 5},
            "last": {"type": S, "maxLength": 5},
            "nick": {"type": S, "maxLength": 4},
        },
        "required": ["first", "last"],
    },
    {
        "type": "object",
        "properties": {
            "matrix": {
                "type": "array",
                "items": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "minItems": 2,
                "maxItems": 2,
            }
        },
        "required": ["matrix"],
    },
    {
        "type": "object",
        "properties": {
            "status": {"enum": ["ok", "fail"]},
            "detail": {
                "type": "object",
                "properties": {"code": {"type": "integer", "minimum": 100, "maximum": 599}},
                "required": ["code"],
            },
        },
        "required": ["status", "detail"],
    },
]

REGEXES = [
    r"[0-9]{3}-[a-z]{2,5}",
    r"(cat|dog|bird)s?",
    r"[A-Z][a-z]{1,6}",
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    r"(true|false)",
    r"[a-f0-9]{8}",
    r"-?[1-9][0-9]{0,2}",
    r"([01][0-9]|2[0-3]):[0-5][0-9]",
    r"[a-z]{1,8}@[a-z]{1,8}\.(com|org)",
    r"(yes|no), because [a-z]{1,10}\.",
    r"\d{2}\.\d{1,3}",
    r"[A-Z]{2}[0-9]{4}",
    r"(Mon|Tue|Wed|Thu|Fri|Sat|Sun)day?",
    r"#[0-9A-F]{6}",
    r"v[0-9]\.[0-9]{1,2}\.[0-9]{1,2}",
    r"(a|b|c){2,4}",
    r"[xyz] = [0-9]{1,3};",
    r"\(\d{3}\) \d{3}-\d{4}",
    r"[a-z ]{3,12}!",
    r"é{1,3}ü?",
]
CHOICES = [
    ["yes", "no"],
    ["red", "green", "blue"],
    ["positive", "negative", "neutral"],
    ["a", "ab", "abc"],
    ["New York", "Los Angeles", "San Francisco"],
    ["1", "2", "3", "4", "5"],
    ['say "hi"', "say 'bye'"],
    ["true", "false", "null"],
    ["über", "naïve", "café"],
    ["东京", "北京", "上海"],
    ["left\tright", "up\ndown"],
    ["back\\slash", "forward/slash"],
    ["x"],
    ["The answer is 42.", "I do not know."],
    ["SELECT", "INSERT", "UPDATE", "DELETE"],
    ["😀", "🚀"],
    ["alpha", "alphabet", "alphanumeric"],
    ["{}", "[]"],
    ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"],
    ["low", "medium", "high", "critical"],
]
