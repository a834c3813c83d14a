"""The structured-output benchmark's fixed set of ten JSON schemas (issue 48): shapes an
application asks for (a record, a list of records, nested objects, enums, bounded numbers,
patterns, optional fields), with bounds long enough that an answer runs to a few hundred
tokens, as the sharegpt-shaped workload's answers do.

tools/benchmark_serving.py --json-schemas K sends request i under SCHEMAS[i % K].
"""

from __future__ import annotations

S = "string"


def _str(n: int) -> dict:
    return {"type": S, "maxLength": n}


def _int(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required}


SCHEMAS: list[dict] = [
    _obj({"title": _str(80), "summary": _str(400), "rating": _int(1, 5)}),
    _obj(
        {
            "people": {
                "type": "array",
                "items": _obj({"name": _str(30), "age": _int(0, 120), "email": _str(40)}),
                "maxItems": 8,
            }
        }
    ),
    _obj({"answer": _str(600), "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
    _obj({"steps": {"type": "array", "items": _str(120), "minItems": 1, "maxItems": 6}, "result": _str(100)}),
    _obj(
        {
            "order": _obj(
                {
                    "id": {"type": S, "pattern": "^[A-Z]{2}[0-9]{6}$"},
                    "items": {
                        "type": "array",
                        "items": _obj({"sku": _str(12), "qty": _int(1, 99), "price": {"type": "number"}}),
                        "maxItems": 10,
                    },
                    "status": {"enum": ["new", "paid", "shipped", "delivered", "cancelled"]},
                }
            )
        }
    ),
    _obj(
        {"sentiment": {"enum": ["positive", "neutral", "negative"]}, "reasons": {"type": "array", "items": _str(150)}},
        ["sentiment"],
    ),
    _obj(
        {
            "city": _str(40),
            "forecast": {
                "type": "array",
                "items": _obj(
                    {"day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]}, "high": _int(-40, 50)}
                ),
                "maxItems": 7,
            },
        }
    ),
    _obj({"code": _str(800), "language": {"enum": ["python", "rust", "go", "sql"]}, "explanation": _str(300)}),
    _obj(
        {
            "entities": {
                "type": "array",
                "items": _obj({"text": _str(40), "type": {"enum": ["person", "place", "org", "date"]}}),
                "maxItems": 12,
            },
            "language": _str(10),
        },
        ["entities"],
    ),
    _obj(
        {
            "question": _str(200),
            "options": {"type": "array", "items": _str(60), "minItems": 2, "maxItems": 5},
            "correct": _int(0, 4),
            "hint": _str(150),
        },
        ["question", "options", "correct"],
    ),
]
