"""POST /v1/responses's body (OpenAI's Responses API), for text: the input as a string or as
messages, instructions as the system message, max_output_tokens. What asks for more than text
(tools, stored conversations, background runs, other output formats) is a 400 naming the field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.tokenizer.openai.params import OpenAISampling, not_supported


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


class ResponsesRequest(OpenAISampling):
    input: str | list[InputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    text: dict[str, Any] | None = None
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

    @field_validator("text")
    @classmethod
    def _text_format(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        fmt = (v or {}).get("format") or {"type": "text"}
        if fmt.get("type") != "text":
            raise ValueError(f"only the text format is supported, got {fmt.get('type')!r}")
        return v

    def chat(self) -> list[dict[str, str]]:
        """The conversation as chat messages: the instructions first, as a system message."""
        head = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return [*head, {"role": "user", "content": self.input}]
        return head + [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.input]
