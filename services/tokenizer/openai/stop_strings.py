"""vLLM's include_stop_str_in_output, in the front end: the detokenizer cuts a stop string
and everything after it, so the stop string that ended a choice is found again at the start
of what the output's tokens decode to past the text sent, and appended."""

from __future__ import annotations

import asyncio
import logging

from services.tokenizer.tokenization import Tokenization
from shared.messages import FINISH_STOP, TextItem

log = logging.getLogger(__name__)


async def stop_string_hit(
    tok: Tokenization, token_ids: list[int], text: str, stops: list[str], skip_special_tokens: bool
) -> str:
    """The stop string that ended an output whose text (cut) is ``text``; "" when none did."""
    if not stops or not token_ids:
        return ""
    full = await asyncio.to_thread(tok.hf.decode, token_ids, skip_special_tokens=skip_special_tokens)
    if not full.startswith(text):  # a decode that differs from the detokenizer's: nothing to trust
        log.warning("include_stop_str_in_output: the output's decode does not start with its text")
        return ""
    rest = full[len(text) :]
    return next((s for s in stops if rest.startswith(s)), "")


class StopEcho:
    """The same for a stream: each choice's token ids and text so far, and the stop string
    added to the item that ends the choice."""

    def __init__(self, tok: Tokenization, stops: list[str], skip_special_tokens: bool, choices: int) -> None:
        self.tok, self.stops, self.skip = tok, stops, skip_special_tokens
        self.ids: list[list[int]] = [[] for _ in range(choices)]
        self.texts = [""] * choices

    async def text(self, i: int, item: TextItem) -> str:
        """The item's text, with the stop string when it is the one that ended choice i."""
        self.ids[i].extend(item.token_ids)
        self.texts[i] += item.text
        if item.finish_reason != FINISH_STOP:
            return item.text
        return item.text + await stop_string_hit(self.tok, self.ids[i], self.texts[i], self.stops, self.skip)
