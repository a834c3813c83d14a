"""TGI's response shapes: generated_text a string, details with finish_reason, tokens, the
prompt's tokens (prefill) when asked, and one server-sent event per token."""

from __future__ import annotations

from services.tokenizer.collected import Collected
from services.tokenizer.lightllm.tgi_params import TGIParameters
from services.tokenizer.streaming import sse
from services.tokenizer.tokenization import Tokenization
from shared.messages import FINISH_ERROR, FINISH_LENGTH, FINISH_STOP, TextItem


def finish_reason(reason: str, token_ids: list[int], tok: Tokenization) -> str:
    """TGI's names: length, eos_token (the model ended), stop_sequence (a stop string did)."""
    if reason == FINISH_STOP:
        return "eos_token" if token_ids and token_ids[-1] in tok.special_ids else "stop_sequence"
    return "length" if reason == FINISH_LENGTH else reason


def token(tid: int, text: str, logprob: float | None, tok: Tokenization) -> dict:
    return {"id": tid, "text": text, "logprob": logprob, "special": tid in tok.special_ids}


def top_tokens(alternatives: list[list[float]], tok: Tokenization) -> list[dict]:
    return [token(int(t), tok.token_text(int(t)), lp, tok) for t, lp in alternatives]


def details(c: Collected, p: TGIParameters, seed: int, prompt_ids: list[int], tok: Tokenization) -> dict:
    """TGI's Details of one sequence (BestOfSequence adds generated_text to the same fields). With
    decoder_input_details, prefill: the prompt's tokens, each after the first with its logprob."""
    prompt_lp = [None, *c.prompt_logprobs] if len(c.prompt_logprobs) == len(prompt_ids) - 1 else []
    body: dict = {
        "finish_reason": finish_reason(c.finish_reason, c.token_ids, tok),
        "generated_tokens": c.output_tokens,
        "seed": seed if p.sampled else None,
        "prefill": [
            {"id": t, "text": tok.token_text(t), "logprob": prompt_lp[i] if prompt_lp else None}
            for i, t in enumerate(prompt_ids)
        ]
        if p.decoder_input_details
        else [],
        "tokens": [token(t, tok.token_text(t), lp, tok) for t, lp in zip(c.token_ids, c.token_logprobs(), strict=True)],
    }
    if p.top_n_tokens:
        body["top_tokens"] = [top_tokens(alts, tok) for alts in c.top_logprobs]
    return body


def generate_response(
    outs: list[Collected], chosen: int, p: TGIParameters, seeds: list[int], prompt: tuple[str, list[int]], tok
) -> dict:
    """TGI's /generate body for the chosen sequence; the others of best_of as best_of_sequences."""
    inputs, prompt_ids = prompt
    prefix = inputs if p.return_full_text else ""
    c = outs[chosen]
    body: dict = {"generated_text": prefix + c.text}
    if p.details:
        body["details"] = details(c, p, seeds[chosen], prompt_ids, tok)
        others = [i for i in range(len(outs)) if i != chosen]
        if others:
            body["details"]["best_of_sequences"] = [
                {"generated_text": prefix + outs[i].text, **details(outs[i], p, seeds[i], prompt_ids, tok)}
                for i in others
            ]
    return body


class TGIStream:
    """One sequence's events: one per token, the last with the whole text and its details."""

    def __init__(self, p: TGIParameters, seed: int, inputs: str, tok: Tokenization) -> None:
        self.p, self.seed, self.tok = p, seed, tok
        self.text = inputs if p.return_full_text else ""
        self.index = 0
        self.token_ids: list[int] = []

    def events(self, item: TextItem) -> list[bytes]:
        if item.finish_reason == FINISH_ERROR:
            return [sse({"error": item.error, "error_type": item.error_kind or "generation"})]
        self.text += item.text
        self.token_ids.extend(item.token_ids)
        n = len(item.token_ids)
        out = []
        for i, tid in enumerate(item.token_ids):
            lp = item.logprobs[i] if i < len(item.logprobs) else None
            alts = item.top_logprobs[i] if i < len(item.top_logprobs) else None
            out.append(self._event(token(tid, item.text if i == n - 1 else "", lp, self.tok), alts, item, i == n - 1))
        if not out and item.finish_reason:  # an end with no new token: text released at the end
            out.append(self._event(token(-1, item.text, None, self.tok) | {"special": True}, None, item, True))
        return out

    def _event(self, tok_body: dict, alts: list | None, item: TextItem, last: bool) -> bytes:
        end = last and bool(item.finish_reason)
        body: dict = {"index": self.index, "token": tok_body}
        self.index += 1
        if self.p.top_n_tokens:
            body["top_tokens"] = top_tokens(alts or [], self.tok)
        body["generated_text"] = self.text if end else None
        body["details"] = None
        if end and self.p.details:
            body["details"] = {
                "finish_reason": finish_reason(item.finish_reason, self.token_ids, self.tok),
                "generated_tokens": item.output_tokens,
                "seed": self.seed if self.p.sampled else None,
                "input_length": item.prompt_tokens,
            }
        return sse(body)
