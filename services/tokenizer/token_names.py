"""How logprobs name tokens: by their text (Tokenization.token_label), or by their ids,
"token_id:<id>" (vLLM's return_tokens_as_token_ids: a label that maps back to one token, where
texts can be ambiguous or parts of a character). Kept apart from tokenization.py so request
bodies can name it without loading transformers."""

from __future__ import annotations

from typing import Protocol


class TokenNames(Protocol):
    """What the logprobs builders (openai/responses.py) ask of a tokenizer: Tokenization's."""

    def token_text(self, token_id: int) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def token_label(self, token_id: int) -> str: ...


class TokenIdLabels:
    """A Tokenization's TokenNames whose token_label is "token_id:<id>"; token_text (which text
    offsets count) and token_bytes (which chat's logprobs keep) are the wrapped one's."""

    def __init__(self, tok: TokenNames) -> None:
        self.tok = tok

    def token_label(self, token_id: int) -> str:
        return f"token_id:{token_id}"

    def token_text(self, token_id: int) -> str:
        return self.tok.token_text(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        return self.tok.token_bytes(token_id)


def token_names(tok: TokenNames, as_ids: bool) -> TokenNames:
    """tok, or (as_ids) tok with its tokens named by id."""
    return TokenIdLabels(tok) if as_ids else tok
