"""Tool calling on /v1/chat/completions: the tools and tool_choice of a request, what the chat
template is given, the grammar that enforces a required call, and how the answer is read.

- tool_choice "none": the tools are not shown to the model and its answer is content.
- "auto" (the default with tools): the template renders the tools; the answer is read with
  the server's --tool-call-parser (tool_calls.py), so the model decides.
- "required": the answer is a JSON array of calls ``[{"name", "parameters"}, ...]``, each
  with arguments valid for its function's schema: the worker's grammar writes nothing else.
- a named function: the answer is that function's arguments, valid for its schema.

A message with tool calls ends with finish_reason "tool_calls".
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.tokenizer import constraints
from services.tokenizer.errors import APIError
from services.tokenizer.openai.tool_calls import NamedReader, ToolReader, parser_reader, required_reader
from shared.messages import Constraint

NO_ARGUMENTS = {"type": "object", "properties": {}}


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # a call "required" or named is always held to its schema

    @field_validator("parameters")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None and (why := constraints.schema_shape(v)):
            raise ValueError(f"not a JSON schema: {why}")
        return v

    def arguments_schema(self) -> dict[str, Any]:
        return self.parameters if self.parameters is not None else NO_ARGUMENTS


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    arguments: str


class ToolCallIn(BaseModel):
    """A call in an assistant message of the conversation so far."""

    model_config = ConfigDict(extra="forbid", strict=True)

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction

    def for_template(self) -> dict[str, Any]:
        """As chat templates read a call: arguments as an object where they are JSON (Qwen's
        and Llama's templates write them with tojson)."""
        try:
            args: Any = json.loads(self.function.arguments)
        except ValueError:
            args = self.function.arguments
        return {"id": self.id, "type": "function", "function": {"name": self.function.name, "arguments": args}}


@dataclass(frozen=True)
class ToolPlan:
    """What the tools of one request change."""

    tools: list[dict[str, Any]] | None = None  # for the chat template
    constraint: Constraint | None = None  # what the worker's grammar holds the answer to
    reader: Callable[[], ToolReader] | None = None  # a new reader of the answer, per choice


def tool_plan(tools: list[ToolDef] | None, choice: ToolChoice | None, parser: str, parallel: bool | None) -> ToolPlan:
    """The plan for a request's tools; APIError naming tools or tool_choice when they cannot be."""
    if not tools:
        if choice not in (None, "none"):
            raise APIError(400, "tool_choice: there are no tools to choose from", param="tool_choice")
        return ToolPlan()
    names = [t.function.name for t in tools]
    if len(set(names)) < len(names):
        raise APIError(400, "tools: two functions have the same name", param="tools")
    rendered = [t.model_dump(exclude_none=True) for t in tools]
    if choice == "none":
        return ToolPlan()
    if choice is None or choice == "auto":
        if not parser:
            raise APIError(
                400,
                "tool_choice: auto reads tool calls from the model's text, which this server does only when started "
                "with --tool-call-parser (hermes, llama3_json); ask for 'required' or a named function instead",
                param="tool_choice",
            )
        return ToolPlan(rendered, None, lambda: parser_reader(parser))
    if choice == "required":
        calls = [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "parameters": t.function.arguments_schema()},
                "required": ["name", "parameters"],
            }
            for t in tools
        ]
        schema = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
        if parallel is False:
            schema["maxItems"] = 1
        return ToolPlan(rendered, constraints.json_schema(schema), required_reader)
    chosen = next((t for t in tools if t.function.name == choice.function.name), None)
    if chosen is None:
        raise APIError(
            400,
            f"tool_choice: no function named {choice.function.name!r} in tools ({', '.join(names)})",
            param="tool_choice",
        )
    name = chosen.function.name
    return ToolPlan(rendered, constraints.json_schema(chosen.function.arguments_schema()), lambda: NamedReader(name))
