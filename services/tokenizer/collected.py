"""A whole generation gathered from its text items, and best-of choice among several."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.messages import TextItem


@dataclass
class Collected:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[list[float]]] = field(default_factory=list)  # per token: [[id, logprob], ...]
    finish_reason: str = ""
    error: str = ""
    error_kind: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the worker's prompt cache held when the generation started
    prompt_logprobs: list[float] = field(default_factory=list)  # prompt tokens 1.. (echo with logprobs)
    prompt_top_logprobs: list[list[list[float]]] = field(default_factory=list)
    prompt_ranks: list[int] = field(default_factory=list)

    def add(self, item: TextItem) -> None:
        self.text += item.text
        self.token_ids.extend(item.token_ids)
        self.logprobs.extend(item.logprobs)
        self.top_logprobs.extend(item.top_logprobs)
        self.prompt_tokens = item.prompt_tokens or self.prompt_tokens
        self.output_tokens = max(self.output_tokens, item.output_tokens)
        self.cached_tokens = item.cached_tokens or self.cached_tokens
        self.prompt_logprobs = self.prompt_logprobs or item.prompt_logprobs
        self.prompt_top_logprobs = self.prompt_top_logprobs or item.prompt_top_logprobs
        self.prompt_ranks = self.prompt_ranks or item.prompt_ranks
        if item.finish_reason:
            self.finish_reason = item.finish_reason
            self.error = item.error
            self.error_kind = item.error_kind

    @property
    def cumulative_logprob(self) -> float:
        return sum(self.logprobs)

    def token_logprobs(self) -> list[float | None]:
        """One logprob per output token, None where the worker sent none."""
        if len(self.logprobs) == len(self.token_ids):
            return list(self.logprobs)
        return [None] * len(self.token_ids)


def best(candidates: list[Collected], n: int) -> list[Collected]:
    """The n candidates with the highest cumulative logprob (LightLLM's and OpenAI's best_of),
    best first; ties keep the order they were generated in."""
    if len(candidates) <= n:
        return candidates
    return sorted(candidates, key=lambda c: -c.cumulative_logprob)[:n]
