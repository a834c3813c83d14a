"""The JSON-schema keywords xgrammar would ignore, so that a schema using them is refused
rather than obeyed in part.

xgrammar 0.2.9 compiles a schema with ``not``, ``uniqueItems`` or ``if`` as if they were not
there: its output could break them. A request whose schema uses one fails with a 400 that
names the keyword and where it is (ERR_INVALID), as a schema that does not compile does.
Found by feeding each keyword's counter-example to a matcher (tests/worker/test_schema_support.py
keeps that check). ``format`` values it does not know are left alone: JSON Schema makes
``format`` an annotation unless a validator opts in, and what is generated is still a string.
"""

from __future__ import annotations

from typing import Any

IGNORED_KEYWORDS = frozenset(
    {
        "not",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "unevaluatedItems",
    }
)
# keywords whose value is a schema, a list of schemas, or a map of names to schemas
_ONE = ("additionalProperties", "items", "propertyNames", "unevaluatedProperties", "additionalItems")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions")


def unsupported(schema: Any, where: str = "#") -> str:
    """Why xgrammar cannot enforce the schema ("" when it can): the first keyword it would
    ignore, with its JSON pointer."""
    if not isinstance(schema, dict):
        return ""
    ignored = sorted(IGNORED_KEYWORDS & schema.keys())
    if ignored:
        return f"the keyword {ignored[0]!r} (at {where}) is not supported"
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:  # one member is the member itself
        return f"'allOf' with more than one schema (at {where}) is not supported"
    children: list[tuple[str, Any]] = [(f"{where}/{k}", schema[k]) for k in _ONE if isinstance(schema.get(k), dict)]
    for k in (*_LIST, "items"):  # items: a list of schemas in drafts before 2020-12
        if isinstance(schema.get(k), list):
            children += [(f"{where}/{k}/{i}", s) for i, s in enumerate(schema[k])]
    for k in _MAP:
        if isinstance(schema.get(k), dict):
            children += [(f"{where}/{k}/{name}", s) for name, s in schema[k].items()]
    for path, child in children:
        if why := unsupported(child, path):
            return why
    return ""
