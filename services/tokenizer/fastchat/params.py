"""The generation parameters FastChat's API server sends a model worker, validated.

FastChat's workers read a loose dict (fastchat/serve/vllm_worker.py): keys they do not
know are ignored, since the API server sends more than any one worker uses (model,
use_beam_search, images, ...); so are they here. A key this worker does read, with a bad
value, is an error naming it. Null stands for the default, as FastChat sends it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.tokenizer.images.sources import ImageSource
from services.tokenizer.limits import GREEDY_TEMPERATURE, MAX_N, MAX_STOPS, MAX_TOP_LOGPROBS, TokenId
from shared.messages import SamplingParams

DEFAULT_MAX_NEW_TOKENS = 256  # FastChat's workers' default


class WorkerParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    prompt: str
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, ge=0.0, le=1.0)
    top_k: int = -1  # FastChat's workers read top_k <= 0 as the whole vocabulary
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    echo: bool = True  # FastChat's default: the text starts with the prompt
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    use_beam_search: bool = False
    images: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> list[str]:
        # FastChat merges the client's stops with its template's into a set: empty ones are noise
        stops = [s for s in ([v] if isinstance(v, str) else (v or [])) if s]
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return list(dict.fromkeys(stops))

    @field_validator("use_beam_search")
    @classmethod
    def _no_beam_search(cls, v: bool) -> bool:
        if v:
            raise ValueError("beam search is not supported by this worker")
        return v

    @field_validator("images")
    @classmethod
    def _image_strings(cls, v: list[Any] | None) -> list[Any] | None:
        """FastChat sends each image as a string: a data: or http(s) URL, or bare base64."""
        if any(not isinstance(x, str) for x in v or []):
            raise ValueError("each image must be a string: a data: or http(s) URL, or base64")
        return v

    def image_sources(self) -> list[ImageSource]:
        return [ImageSource(x, f"images.{i}") for i, x in enumerate(self.images or [])]

    @property
    def sequences(self) -> int:
        """Generations to run: best_of of them, the one with the highest cumulative logprob returned."""
        return self.best_of or 1

    def stops(self) -> list[str]:
        return list(self.stop or [])

    def sampling(self, seed: int) -> SamplingParams:
        greedy = self.temperature < GREEDY_TEMPERATURE
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            do_sample=not greedy,
            temperature=1.0 if greedy else self.temperature,
            # as FastChat's vLLM and LightLLM workers: top_p 0 is the smallest nucleus
            top_p=1.0 if greedy else max(self.top_p, 1e-5),
            top_k=self.top_k if self.top_k >= 1 else -1,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            stop_token_ids=list(self.stop_token_ids or []),
            seed=seed,
            logprobs=self.logprobs is not None or self.sequences > 1,  # best_of ranks by logprob
            top_logprobs=self.logprobs or 0,
            # with echo, the prompt's tokens' logprobs too, as FastChat's own worker gives them
            prompt_logprobs=self.logprobs if self.echo and self.logprobs is not None else -1,
        )
