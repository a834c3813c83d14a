"""An Anthropic request's prompt: its tools planned as the chat route plans them, its images
read, the conversation rendered with the model's chat template (left open in a final assistant
turn, which the answer continues) and tokenized. /v1/messages and its count_tokens share it, so
the count is the prompt's."""

from __future__ import annotations

from dataclasses import dataclass

import jinja2

from services.tokenizer.anthropic.params import CountTokensRequest
from services.tokenizer.errors import APIError
from services.tokenizer.generation import FrontContext
from services.tokenizer.images.front import PromptImages
from services.tokenizer.openai.tools import ToolPlan, tool_plan


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # with each image's positions
    images: PromptImages | None
    plan: ToolPlan  # what the tools change: the template's tools, the answer's grammar and reader


async def render(ctx: FrontContext, body: CountTokensRequest) -> Prompt:
    body.check()
    plan = tool_plan(body.function_tools(), body.function_choice(), ctx.cfg.tool_call_parser, body.parallel_calls())
    images = await ctx.images.load(body.image_sources())
    prefill = body.prefill()
    try:
        _, ids = await ctx.tok.encode_chat(
            body.chat(), None, plan.tools, add_generation_prompt=not prefill, continue_final=prefill
        )
    except (ValueError, jinja2.TemplateError) as e:
        raise APIError(400, f"messages: the chat template refused them: {e}", param="messages") from e
    ids, prompt_images = ctx.images.expand(ids, images, "messages")
    return Prompt(ids, prompt_images, plan)
