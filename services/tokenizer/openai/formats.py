"""OpenAI's response_format, and vLLM's guided_* parameters beside it: the output's format.

``{"type": "text"}`` is free text; ``{"type": "json_object"}`` any JSON object;
``{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}``
JSON that the schema allows (always strictly: properties the schema does not name are not
written). vLLM's guided_json, guided_regex, guided_choice and guided_grammar ask for a
schema, a regex, one of a list of strings or an EBNF grammar; one format per request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.tokenizer import constraints
from shared.messages import Constraint


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str | None = None  # OpenAI's SDKs always send one; it changes nothing here
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema (with its schema) is given exactly when type is json_schema")
        return self

    def constraint(self) -> Constraint | None:
        if self.json_schema is not None:
            return constraints.json_schema(self.json_schema.schema_)
        return constraints.json_object(self.type == "json_object")


class OutputFormat(BaseModel):
    """The format fields the OpenAI routes share; the constraint they ask for, once validated."""

    model_config = ConfigDict(extra="forbid", strict=True)

    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None

    @field_validator("guided_json")
    @classmethod
    def _schema(cls, v: dict[str, Any] | bool | str | None) -> dict[str, Any] | bool | str | None:
        return constraints.check_schema(v)

    @field_validator("guided_regex", "guided_grammar")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return constraints.check_text(v)

    @field_validator("guided_choice")
    @classmethod
    def _choice(cls, v: list[str] | None) -> list[str] | None:
        return constraints.check_choice(v)

    @field_validator("guided_decoding_backend")
    @classmethod
    def _backend(cls, v: str | None) -> str | None:
        if v not in (None, "auto", "xgrammar"):
            raise ValueError(f"only xgrammar (or auto) is available, got {v!r}")
        return v

    def output_constraint(self) -> Constraint | None:
        """The one format asked for (ValueError naming two at once)."""
        rf = self.response_format
        return constraints.one_constraint(
            response_format=rf.constraint() if rf is not None else None,
            guided_json=constraints.json_schema(self.guided_json),
            guided_regex=constraints.regex(self.guided_regex),
            guided_choice=constraints.choice(self.guided_choice),
            guided_grammar=constraints.grammar(self.guided_grammar),
        )
