"""vLLM's return_tokens_as_token_ids and return_token_ids, without a model: the wrapper that names
tokens by id in logprobs (and keeps their text for offsets and their bytes for chat), and the
keys the request bodies add."""

from __future__ import annotations

import pydantic
import pytest

from services.tokenizer.openai import responses as shape
from services.tokenizer.openai.chat_params import ChatCompletionRequest
from services.tokenizer.openai.params import CompletionRequest
from services.tokenizer.openai.responses_params import ResponsesRequest
from services.tokenizer.token_names import TokenIdLabels, token_names

TEXTS = {5: "ab", 6: "\ufffd", 7: "c"}
BYTES = {5: b"ab", 6: b"\xe4", 7: b"c"}


class FakeTok:
    """Tokenization's token names: texts, bytes, and "bytes:" labels for parts of characters."""

    eos_token_id = 2

    def token_text(self, token_id: int) -> str:
        return TEXTS[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        return BYTES[token_id]

    def token_label(self, token_id: int) -> str:
        return "bytes:\\xe4" if token_id == 6 else TEXTS[token_id]


def test_the_wrapper_labels_by_id_and_delegates_the_rest() -> None:
    tok = FakeTok()
    names = TokenIdLabels(tok)
    assert [names.token_label(t) for t in (5, 6, 7)] == ["token_id:5", "token_id:6", "token_id:7"]
    assert names.token_text(5) == "ab" and names.token_bytes(6) == b"\xe4"
    assert token_names(tok, False) is tok and isinstance(token_names(tok, True), TokenIdLabels)


def test_completion_logprobs_name_ids_and_count_offsets_by_text() -> None:
    top = [[[7.0, -0.1], [5.0, -2.0]], [[6.0, -0.3]], [[7.0, -0.2]]]
    lp = shape.CompletionLogprobs(TokenIdLabels(FakeTok()), 2, 10).of([5, 6, 7], [-0.5, -0.3, -0.2], top)
    assert lp["tokens"] == ["token_id:5", "token_id:6", "token_id:7"]
    assert lp["top_logprobs"][0] == {"token_id:7": -0.1, "token_id:5": -2.0}
    assert lp["text_offset"] == [10, 12, 13]


def test_chat_logprobs_name_ids_and_keep_the_tokens_bytes() -> None:
    lp = shape.chat_logprobs(TokenIdLabels(FakeTok()), [5, 6], [-0.5, -0.3], [[[7.0, -0.1]], []], 1)
    first, second = lp["content"]
    assert (first["token"], first["bytes"]) == ("token_id:5", list(b"ab"))
    assert first["top_logprobs"] == [{"token": "token_id:7", "logprob": -0.1, "bytes": list(b"c")}]
    assert (second["token"], second["bytes"]) == ("token_id:6", [0xE4])


def test_the_bodies_add_token_ids_only_when_asked() -> None:
    plain = CompletionRequest(model="m", prompt="x")
    asked = CompletionRequest(model="m", prompt="x", return_token_ids=True, return_tokens_as_token_ids=True)
    assert plain.token_ids([4], [1, 2]) == {} and isinstance(asked.token_names(FakeTok()), TokenIdLabels)
    assert asked.token_ids([4], [1, 2]) == {"prompt_token_ids": [1, 2], "token_ids": [4]}
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], return_token_ids=True)
    assert chat.token_ids([3]) == {"token_ids": [3]} and isinstance(chat.token_names(FakeTok()), FakeTok)
    with pytest.raises(pydantic.ValidationError):  # not the Responses API's (it would return nothing)
        ResponsesRequest(model="m", input="x", return_token_ids=True)
