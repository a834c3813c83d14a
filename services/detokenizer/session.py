"""One request's detokenization: token items in, text items out, stop strings applied."""

from __future__ import annotations

import dataclasses

from services.detokenizer.incremental import Decoder, IncrementalDecoder
from services.detokenizer.stops import StopMatcher
from shared.messages import (
    ERR_FAILED,
    FINISH_ERROR,
    FINISH_STOP,
    DetokRegister,
    GenerateReq,
    TextItem,
    TokenItem,
)


class DetokSession:
    __slots__ = (
        "cached_tokens",
        "decoder",
        "front",
        "handovers",
        "output_ids",
        "prompt_tokens",
        "rid",
        "stops",
    )

    def __init__(self, reg: DetokRegister, decoder: Decoder) -> None:
        self.rid = reg.rid
        self.front = reg.front
        self.prompt_tokens = reg.prompt_tokens
        self.decoder = IncrementalDecoder(decoder, reg.skip_special_tokens)
        self.stops = StopMatcher(reg.stop)
        self.output_ids: list[int] = []  # every token sent on: what a hand-over continues from
        self.handovers = 0  # the request's hand-overs: items of an earlier copy are stale
        self.cached_tokens = 0  # prompt tokens the worker's prompt cache held, as its items report

    @property
    def output_tokens(self) -> int:
        return len(self.output_ids)

    def stale(self, item: TokenItem) -> bool:
        """An item of a copy of the request that ran before its last hand-over (a worker group
        declared dead that was only silent): the copy handed over goes on in its place."""
        return item.handovers < self.handovers

    def repeated(self, item: TokenItem) -> bool:
        """An item whose tokens this session already holds where its count puts them: the same
        batch sent again (a worker's send retried after Redis's answer was lost, or handed out
        again by a group a failover set back). Dropped; tokens that differ there are a restart."""
        n, ids = item.output_tokens, item.token_ids
        return bool(ids) and len(ids) <= n <= self.output_tokens and self.output_ids[n - len(ids) : n] == ids

    def hand_over(self, req: GenerateReq) -> GenerateReq:
        """The request to continue on another group: its prompt and the tokens sent on so far."""
        self.handovers = req.handovers + 1
        prompt = req.input_ids[: req.prompt_len]
        return dataclasses.replace(
            req, input_ids=prompt + self.output_ids, resumed=len(self.output_ids), handovers=self.handovers
        )

    def apply(self, item: TokenItem) -> tuple[TextItem, bool]:
        """-> (the text item for the front end, whether this request has ended)."""
        if item.token_ids and item.output_tokens != self.output_tokens + len(item.token_ids):
            # a worker restarted the request after its output had begun: sending the new
            # tokens would repeat text the client already has
            return self._end(FINISH_ERROR, "the request was restarted after its output began", ERR_FAILED), True
        self.output_ids += item.token_ids
        # kept, so that every text item carries it, the ends this session makes itself included
        self.cached_tokens = item.cached_tokens or self.cached_tokens
        text, hit = self.stops.feed(self.decoder.push(item.token_ids))
        if hit:
            return self._text(item, text, FINISH_STOP), True
        if item.finish_reason:
            tail, hit = self.stops.feed(self.decoder.flush())
            text += tail
            if hit:
                return self._text(item, text, FINISH_STOP), True
            text += self.stops.flush()
            return self._text(item, text, item.finish_reason, item.error, item.error_kind), True
        return self._text(item, text, ""), False

    def _text(self, item: TokenItem, text: str, finish: str, error: str = "", kind: str = "") -> TextItem:
        return TextItem(
            rid=self.rid,
            text=text,
            token_ids=item.token_ids,
            logprobs=item.logprobs,
            top_logprobs=item.top_logprobs,
            prompt_logprobs=item.prompt_logprobs,
            prompt_top_logprobs=item.prompt_top_logprobs,
            prompt_ranks=item.prompt_ranks,
            finish_reason=finish,
            error=error,
            error_kind=kind,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            cached_tokens=self.cached_tokens,
        )

    def _end(self, finish: str, error: str, kind: str) -> TextItem:
        return TextItem(
            rid=self.rid,
            text="",
            finish_reason=finish,
            error=error,
            error_kind=kind,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            cached_tokens=self.cached_tokens,
        )
