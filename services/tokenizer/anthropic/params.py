"""The bodies of POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API),
validated.

An unknown field is a 400 naming it. ``metadata``, ``service_tier`` and ``cache_control`` are
accepted and change nothing. ``temperature``, ``top_p`` and ``top_k`` are taken as Anthropic's
API took them (its newer clients send them only through extra_body). ``thinking`` is refused
unless disabled: whether a model thinks is its chat template's matter (``--reasoning-parser``
then gives the thinking its own blocks). Tools are client tools (name, description,
input_schema); tool_choice maps onto the chat route's: auto -> auto, any -> required, tool ->
the named function, none -> none, and disable_parallel_tool_use onto parallel_tool_calls false.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.tokenizer import constraints
from services.tokenizer.anthropic.blocks import MessageParam, TextBlock, system_text
from services.tokenizer.errors import APIError
from services.tokenizer.images.sources import ImageSource
from services.tokenizer.limits import GREEDY_TEMPERATURE, check_stops
from services.tokenizer.openai.tools import FunctionDef, FunctionName, NamedToolChoice, ToolChoice, ToolDef
from shared.messages import Constraint, SamplingParams

log = logging.getLogger(__name__)


class Tool(BaseModel):
    """A client tool: the model may call it; the client runs it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["custom"] | None = None
    name: str = Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None  # accepted; changes nothing
    strict: bool | None = None  # any and tool always hold the input to its schema

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if why := constraints.schema_shape(v):
            raise ValueError(f"not a JSON schema: {why}")
        return v

    def as_function(self) -> ToolDef:
        """The chat route's tool definition (what the chat template renders)."""
        return ToolDef(
            type="function",
            function=FunctionDef(name=self.name, description=self.description, parameters=self.input_schema),
        )


class _Choice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    disable_parallel_tool_use: bool | None = None


class AutoChoice(_Choice):
    type: Literal["auto"]


class AnyChoice(_Choice):
    type: Literal["any"]


class NamedChoice(_Choice):
    type: Literal["tool"]
    name: str


class NoneChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["none"]


AnthropicToolChoice = Annotated[AutoChoice | AnyChoice | NamedChoice | NoneChoice, Field(discriminator="type")]


class Thinking(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None

    @model_validator(mode="after")
    def _disabled_only(self) -> Thinking:
        if self.type != "disabled":
            raise ValueError(
                "not supported by this server: whether the model thinks is its chat template's choice (with "
                "--reasoning-parser its thinking comes in thinking blocks); only {'type': 'disabled'} is accepted"
            )
        return self


class CountTokensRequest(BaseModel):
    """What the prompt is made of: the body of /v1/messages/count_tokens, and the part of
    /v1/messages's that renders the prompt."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: Thinking | None = None
    cache_control: dict[str, Any] | None = None  # accepted: the prompt cache reuses any prefix unasked

    def prefill(self) -> bool:
        """A final assistant turn is the answer's start: the answer continues it (one with no
        text but whitespace stands for no start)."""
        last = self.messages[-1]
        return last.role == "assistant" and (last.text().strip() != "" or not last.text_only())

    def check(self) -> None:
        if self.prefill() and not self.messages[-1].text_only():
            raise APIError(
                400, "messages: a final assistant turn (the answer's start) may hold text blocks only", param="messages"
            )

    def chat(self) -> list[dict[str, Any]]:
        """The conversation as the chat template reads it: the system prompt first, an empty
        final assistant turn left out."""
        system = system_text(self.system)
        head = [{"role": "system", "content": system}] if system else []
        turns = self.messages if self.prefill() or self.messages[-1].role == "user" else self.messages[:-1]
        return head + [m for turn in turns for m in turn.for_template()]

    def image_sources(self) -> list[ImageSource]:
        return [s for i, m in enumerate(self.messages) for s in m.image_sources(f"messages.{i}")]

    def function_tools(self) -> list[ToolDef] | None:
        return [t.as_function() for t in self.tools] if self.tools else None

    def function_choice(self) -> ToolChoice | None:
        """tool_choice as the chat route spells it."""
        c = self.tool_choice
        if c is None:
            return None
        if isinstance(c, NamedChoice):
            return NamedToolChoice(type="function", function=FunctionName(name=c.name))
        return {"auto": "auto", "any": "required", "none": "none"}[c.type]  # type: ignore[return-value]

    def parallel_calls(self) -> bool | None:
        c = self.tool_choice
        disabled = isinstance(c, _Choice) and c.disable_parallel_tool_use
        return False if disabled else None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    stream: bool | None = False
    # accepted and ignored: they change no output
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        return check_stops(v)  # type: ignore[return-value]

    @model_validator(mode="after")
    def _log_ignored(self) -> MessagesRequest:
        ignored = [name for name in ("metadata", "service_tier", "cache_control") if getattr(self, name) is not None]
        if ignored:
            log.debug("ignored, as they change no output: %s", ", ".join(ignored))
        return self

    def stops(self) -> list[str]:
        return list(self.stop_sequences or [])

    def sampling(self, seed: int, constraint: Constraint | None) -> SamplingParams:
        """Anthropic samples at temperature 1 unless told otherwise; below 1e-5 is greedy."""
        temperature = 1.0 if self.temperature is None else self.temperature
        greedy = temperature < GREEDY_TEMPERATURE
        return SamplingParams(
            max_new_tokens=self.max_tokens,
            do_sample=not greedy,
            temperature=1.0 if greedy else temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            seed=seed,
            constraint=constraint,
        )
