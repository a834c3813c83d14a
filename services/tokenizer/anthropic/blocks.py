"""Anthropic's messages and their content blocks, validated, and turned into the chat messages
the model's chat template reads (OpenAI's shape, as the chat route hands them over).

- text blocks: a turn's text, joined as the chat route joins text parts;
- image blocks (user turns): base64 or a URL, as the chat route's images (a text-only model
  refuses them there);
- tool_use blocks (assistant turns): the turn's tool calls, their input as the arguments;
- tool_result blocks (user turns): each a ``tool`` message answering its call, in order;
- thinking and redacted_thinking blocks (assistant turns, as a response gave them back):
  accepted and left out, as chat templates leave out earlier turns' thinking.

cache_control on a block is accepted and changes nothing: the worker's prompt cache reuses
any prefix it holds without being asked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.tokenizer.images.sources import ImageSource


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    cache_control: dict[str, Any] | None = None  # accepted; the prompt cache needs no marks


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = None  # as a response gave them back; not rendered


class Base64Source(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class URLSource(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["url"]
    url: str


class ImageBlock(_Block):
    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]

    def image_source(self, param: str) -> ImageSource:
        s = self.source
        if isinstance(s, Base64Source):
            return ImageSource(s.data, param + ".source.data", bare_base64=True)
        return ImageSource(s.url, param + ".source.url")


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]

    def for_template(self) -> dict[str, Any]:
        """As chat templates read a call (the chat route's shape): arguments as an object."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.input}}


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None  # accepted: chat templates have no place for it, the text says it

    def for_template(self) -> dict[str, Any]:
        c = self.content
        text = c if isinstance(c, str) else "".join(b.text for b in c or [])
        return {"role": "tool", "tool_call_id": self.tool_use_id, "content": text}


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]

_USER_ONLY = (ImageBlock, ToolResultBlock)
_ASSISTANT_ONLY = (ToolUseBlock, ThinkingBlock, RedactedThinkingBlock)


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["user", "assistant"]
    content: str | list[Block]

    @model_validator(mode="after")
    def _blocks_of_the_role(self) -> MessageParam:
        wrong = _ASSISTANT_ONLY if self.role == "user" else _USER_ONLY
        for block in self.blocks():
            if isinstance(block, wrong):
                raise ValueError(f"{block.type} blocks may not be in {self.role} turns")
        return self

    def blocks(self) -> list[Any]:
        return [] if isinstance(self.content, str) else list(self.content)

    def for_template(self) -> list[dict[str, Any]]:
        """The turn as chat messages: a user turn's tool results become tool messages (between
        the runs of its other blocks, in order); an assistant turn is one message, its tool_use
        blocks its tool calls."""
        if isinstance(self.content, str):
            return [{"role": self.role, "content": self.content}]
        if self.role == "assistant":
            msg = _message("assistant", [b for b in self.content if isinstance(b, TextBlock)])
            calls = [b.for_template() for b in self.content if isinstance(b, ToolUseBlock)]
            return [msg | {"tool_calls": calls} if calls else msg]
        out: list[dict[str, Any]] = []
        run: list[TextBlock | ImageBlock] = []
        for b in self.content:
            if isinstance(b, ToolResultBlock):
                out += [_message("user", run)] if run else []
                out.append(b.for_template())
                run = []
            else:
                run.append(b)
        if run or not out:
            out.append(_message("user", run))
        return out

    def image_sources(self, param: str) -> list[ImageSource]:
        """This turn's images in order; param: where the turn is ("messages.3")."""
        return [
            b.image_source(f"{param}.content.{j}") for j, b in enumerate(self.blocks()) if isinstance(b, ImageBlock)
        ]

    def text(self) -> str:
        c = self.content
        return c if isinstance(c, str) else "".join(b.text for b in c if isinstance(b, TextBlock))

    def text_only(self) -> bool:
        return all(isinstance(b, TextBlock) for b in self.blocks())


def _message(role: str, run: list[Any]) -> dict[str, Any]:
    """A chat message of text and image blocks: its content as text, or as text and {"type":
    "image"} parts where it has images (a vision model's template writes each placeholder there)."""
    if any(isinstance(b, ImageBlock) for b in run):
        parts = [{"type": "text", "text": b.text} if isinstance(b, TextBlock) else {"type": "image"} for b in run]
        return {"role": role, "content": parts}
    return {"role": role, "content": "".join(b.text for b in run)}


def system_text(system: str | list[TextBlock] | None) -> str:
    """The system prompt as one text (its blocks joined as a turn's are)."""
    if system is None or isinstance(system, str):
        return system or ""
    return "".join(b.text for b in system)
