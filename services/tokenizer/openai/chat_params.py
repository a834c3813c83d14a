"""OpenAI's chat completions body: the messages (with the tool calls and tool results of the
conversation so far), tools and tool_choice (tools.py), and what params.py's OpenAISampling
shares with completions. functions and function_call, OpenAI's older spelling of tools, are
refused with a 400 that says so."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from services.tokenizer.errors import APIError
from services.tokenizer.images.sources import ImageSource
from services.tokenizer.limits import MAX_TOP_LOGPROBS
from services.tokenizer.openai.params import OpenAISampling, PromptTruncation, TokenIdOutput
from services.tokenizer.openai.tools import ToolCallIn, ToolChoice, ToolDef
from shared.messages import SamplingParams


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # the call a tool message answers

    @field_validator("content")
    @classmethod
    def _parts(cls, v: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        for part in v if isinstance(v, list) else []:
            kind = part.get("type")
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind == "image_url" and isinstance(_image_url(part), str):
                continue
            raise ValueError(
                "content parts must be {'type': 'text', 'text': str} or {'type': 'image_url', 'image_url': "
                f"{{'url': str}}}}; {kind!r} is not supported"
            )
        return v

    def text(self) -> str:
        c = self.content
        if isinstance(c, list):
            return "".join(part["text"] for part in c if part["type"] == "text")
        return c or ""

    def image_urls(self) -> list[str]:
        c = self.content
        return [_image_url(part) for part in c if part["type"] == "image_url"] if isinstance(c, list) else []

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it: content as text, or as a list of text and
        {"type": "image"} parts, in order, where it has images (a vision model's template writes
        each image's placeholder there)."""
        content: str | list[dict[str, Any]] = self.text()
        if self.image_urls():
            assert isinstance(self.content, list)
            content = [p if p["type"] == "text" else {"type": "image"} for p in self.content]
        msg: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            msg["name"] = self.name
        if self.tool_calls:
            msg["tool_calls"] = [c.for_template() for c in self.tool_calls]
        if self.tool_call_id is not None:
            msg["tool_call_id"] = self.tool_call_id
        return msg


def _image_url(part: dict[str, Any]) -> Any:
    """An image_url part's URL: OpenAI's {"image_url": {"url": ...}}, or the URL itself."""
    url = part.get("image_url")
    return url.get("url") if isinstance(url, dict) else url


class ChatCompletionRequest(OpenAISampling, PromptTruncation, TokenIdOutput):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    # vLLM's: extra variables for the chat template (e.g. {"enable_thinking": false} for Qwen3)
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the rendered prompt's logprobs (the response's prompt_logprobs), with this many alternatives
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    # vLLM's: the template's generation prompt (the next turn's header), or instead the last
    # message (an assistant's answer begun) left open for the answer to continue
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = {
            "messages",
            "tokenize",
            "add_generation_prompt",
            "continue_final_message",
            "conversation",
            "chat_template",
            "tools",
        }
        clash = sorted(reserved & set(v or {}))
        if clash:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(clash)}")
        return v

    @field_validator("functions", "function_call")
    @classmethod
    def _no_functions(cls, v: Any) -> Any:
        if v:
            raise ValueError("not supported by this server (OpenAI's deprecated function calling): use tools")
        return v

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise APIError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
        if self.prompt_logprobs is not None and self.stream:
            raise APIError(
                400, "prompt_logprobs: not with stream (they come in the whole response)", param="prompt_logprobs"
            )
        if self.continue_final_message and self.add_generation_prompt is not False:
            raise APIError(
                400,
                "continue_final_message: needs add_generation_prompt false (the answer continues the last message"
                " instead of starting a turn)",
                param="continue_final_message",
            )

    def truncated_chat(self, ids: list[int], context: int, images: list) -> list[int]:
        """The rendered chat's last truncate_prompt_tokens (PromptTruncation); refused with images,
        whose placeholders a cut could split."""
        if self.truncate_prompt_tokens is not None and images:
            raise APIError(
                400,
                "truncate_prompt_tokens: not with images (a cut could split an image's tokens)",
                param="truncate_prompt_tokens",
            )
        return self.truncated(ids, context)

    def template_flags(self) -> dict[str, bool]:
        """How the chat template ends the prompt: a generation prompt, or the last message open."""
        return {
            "add_generation_prompt": self.add_generation_prompt is not False,
            "continue_final": bool(self.continue_final_message),
        }

    def sampling(self, *args: Any, **kwargs: Any) -> SamplingParams:
        """OpenAISampling's, with vLLM's prompt_logprobs."""
        params = super().sampling(*args, **kwargs)
        k = self.prompt_logprobs
        return params if k is None else dataclasses.replace(params, prompt_logprobs=k)

    def max_tokens_asked(self) -> tuple[int | None, str]:
        """(the client's output limit, the parameter it came from); max_completion_tokens is
        OpenAI's newer name and wins."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def chat(self) -> list[dict[str, Any]]:
        """The messages as the chat template reads them."""
        return [m.for_template() for m in self.messages]

    def image_sources(self) -> list[ImageSource]:
        """Every image's URL in the order the template meets them, with the parameter naming it."""
        out = []
        for i, m in enumerate(self.messages):
            parts = m.content if isinstance(m.content, list) else []
            for j, part in enumerate(parts):
                if part["type"] == "image_url":
                    out.append(ImageSource(_image_url(part), f"messages.{i}.content.{j}.image_url"))
        return out
