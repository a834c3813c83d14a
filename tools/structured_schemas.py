"""The structured-output benchmark's fixed set of ten JSON schemas (issue 48): shapes an
application asks for (a record, a list of records, nested objects, enums, bounded numbers,
patterns, optional fields). Strings carry no maxLength, as OpenAI's strict schemas cannot:
xgrammar checks a bounded string's every token at every step (a fill of about 2 ms a request
on the H200 host's CPU, against 0.05 ms unbounded), a cost of the schema, not of the serving.

tools/benchmark_serving.py --json-schemas K sends request i under SCHEMAS[i % K].
"""

from __future__ import annotations

S = "string"


STR = {"type": S}  # unbounded (the docstring says why)


def _int(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required}


SCHEMAS: list[dict] = [
    _obj({"title": STR, "summary": STR, "rating": _int(1, 5)}),
    _obj(
        {
            "people": {
                "type": "array",
                "items": _obj({"name": STR, "age": _int(0, 120), "email": STR}),
                "maxItems": 8,
            }
        }
    ),
    _obj({"answer": STR, "confidence": {"type": "number", "minimum": 0, "maximum": 1}}),
    _obj({"steps": {"type": "array", "items": STR, "minItems": 1, "maxItems": 6}, "result": STR}),
    _obj(
        {
            "order": _obj(
                {
                    "id": {"type": S, "pattern": "^[A-Z]{2}[0-9]{6}$"},
                    "items": {
                        "type": "array",
                        "items": _obj({"sku": STR, "qty": _int(1, 99), "price": {"type": "number"}}),
                        "maxItems": 10,
                    },
                    "status": {"enum": ["new", "paid", "shipped", "delivered", "cancelled"]},
                }
            )
        }
    ),
    _obj(
        {"sentiment": {"enum": ["positive", "neutral", "negative"]}, "reasons": {"type": "array", "items": STR}},
        ["sentiment"],
    ),
    _obj(
        {
            "city": STR,
            "forecast": {
                "type": "array",
                "items": _obj(
                    {"day": {"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]}, "high": _int(-40, 50)}
                ),
                "maxItems": 7,
            },
        }
    ),
    _obj({"code": STR, "language": {"enum": ["python", "rust", "go", "sql"]}, "explanation": STR}),
    _obj(
        {
            "entities": {
                "type": "array",
                "items": _obj({"text": STR, "type": {"enum": ["person", "place", "org", "date"]}}),
                "maxItems": 12,
            },
            "language": STR,
        },
        ["entities"],
    ),
    _obj(
        {
            "question": STR,
            "options": {"type": "array", "items": STR, "minItems": 2, "maxItems": 5},
            "correct": _int(0, 4),
            "hint": STR,
        },
        ["question", "options", "correct"],
    ),
]
