"""POST /v1/responses's body (OpenAI's Responses API), for text: the input as a string or as
messages, instructions as the system message, max_output_tokens, and the output's format
(``text.format``: text, json_object, or json_schema with its name, schema and strict beside the
type, as this API spells it). What asks for more (tools, stored conversations, background
runs) is a 400 naming the field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.tokenizer import constraints
from services.tokenizer.openai.params import OpenAISampling, not_supported
from shared.messages import Constraint


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]

    @field_validator("content")
    @classmethod
    def _text_only(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        for part in v if isinstance(v, list) else []:
            if part.get("type") not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
                raise ValueError(f"content parts must be input_text or output_text; {part.get('type')!r} is not")
        return v

    def text(self) -> str:
        c = self.content
        return c if isinstance(c, str) else "".join(part["text"] for part in c)


class TextFormat(BaseModel):
    """text.format: the Responses API's response_format, its json_schema fields beside the type."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # OpenAI asks for one with json_schema; it changes nothing here
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if (self.type == "json_schema") != (self.schema_ is not None):
            raise ValueError("format: schema is given exactly when type is json_schema")
        return self

    def constraint(self) -> Constraint | None:
        if self.schema_ is not None:
            return constraints.json_schema(self.schema_)
        return constraints.json_object(self.type == "json_object")

    def echo(self) -> dict[str, Any]:
        """As the response object repeats it."""
        return self.model_dump(by_alias=True, exclude_none=True)


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted; the model's to heed, not ours


class ResponsesRequest(OpenAISampling):
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    text: TextOptions | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    previous_response_id: str | None = None
    background: bool | None = None
    conversation: Any = None
    reasoning: dict[str, Any] | None = None  # for reasoning models; accepted and not acted on
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None

    @field_validator("tools", "tool_choice", "max_tool_calls")
    @classmethod
    def _no_tools(cls, v: Any) -> Any:
        return not_supported("tools", v if v not in ([], "none") else None)

    @field_validator("previous_response_id", "conversation")
    @classmethod
    def _no_state(cls, v: Any) -> Any:
        return not_supported("stored responses (previous_response_id, conversation)", v)

    @field_validator("background")
    @classmethod
    def _no_background(cls, v: bool | None) -> bool | None:
        return not_supported("background", v or None)

    @field_validator("top_logprobs")
    @classmethod
    def _no_logprobs(cls, v: int | None) -> int | None:
        return not_supported("top_logprobs", v or None)

    def output_constraint(self) -> Constraint | None:
        """text.format, or vLLM's guided_* (one of them)."""
        fmt = self.text.format if self.text is not None else None
        return constraints.one_constraint(
            **{"text.format": fmt.constraint() if fmt is not None else None, "guided_*": super().output_constraint()}
        )

    def format_echo(self) -> dict[str, Any]:
        fmt = self.text.format if self.text is not None else None
        return fmt.echo() if fmt is not None else {"type": "text"}

    def chat(self) -> list[dict[str, str]]:
        """The conversation as chat messages: the instructions first, as a system message."""
        head = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return [*head, {"role": "user", "content": self.input}]
        return head + [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.input]
