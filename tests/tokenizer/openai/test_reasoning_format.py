"""With --reasoning-parser, an output format is the answer's: the worker's grammar waits for
the end of the thinking (</think> as one token), unless the prompt has ended it already."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from services.tokenizer.errors import APIError
from services.tokenizer.openai.chat import _answer_constraint
from services.tokenizer.openai.chat_params import ChatCompletionRequest
from services.tokenizer.openai.tools import ToolPlan
from services.tokenizer.tokenization import Tokenization

FORMAT = {"response_format": {"type": "json_object"}}


@pytest.fixture(scope="module")
def thinking_tok(tiny_qwen: str, tmp_path_factory: pytest.TempPathFactory) -> Tokenization:
    """The tiny tokenizer with <think> and </think> as tokens of their own, as Qwen3's has them."""
    hf = AutoTokenizer.from_pretrained(tiny_qwen)
    hf.add_tokens(["<think>", "</think>"])
    path = str(tmp_path_factory.mktemp("thinking-tok"))
    hf.save_pretrained(path)
    return Tokenization(path, 1)


def _constraint(tok: Tokenization, parser: str, prompt: str, **body):
    ctx = SimpleNamespace(cfg=SimpleNamespace(reasoning_parser=parser), tok=tok)
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    ids = tok._encode(prompt, False)
    return _answer_constraint(ctx, req, ToolPlan(), ids)  # type: ignore[arg-type]


def test_the_format_waits_for_the_end_of_the_thinking(thinking_tok: Tokenization) -> None:
    end = thinking_tok.single_token("</think>")
    assert end is not None
    assert _constraint(thinking_tok, "deepseek_r1", "<|im_start|>assistant\n<think>\n", **FORMAT).after_token == end
    assert _constraint(thinking_tok, "qwen3", "<|im_start|>assistant\n", **FORMAT).after_token == end
    # the prompt closed the thinking (enable_thinking false): the answer starts at once
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert _constraint(thinking_tok, "qwen3", closed, **FORMAT).after_token == -1
    assert _constraint(thinking_tok, "", "<think>\n", **FORMAT).after_token == -1  # no parser: all is answer
    assert _constraint(thinking_tok, "qwen3", "<think>\n") is None  # no format asked for


def test_a_tokenizer_without_the_end_token_cannot_hold_a_format_after_thinking(tiny_qwen: str) -> None:
    with pytest.raises(APIError, match="</think> to be one token"):
        _constraint(Tokenization(tiny_qwen, 1), "deepseek_r1", "hello", **FORMAT)
