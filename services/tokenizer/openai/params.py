"""OpenAI's request bodies (/v1/completions, /v1/chat/completions), validated.

Bounds follow OpenAI's API reference; an unknown key is an error, and so is an OpenAI
parameter this server does not implement (suffix, ...), with a message that says so.
logit_bias maps token ids (as strings) to a bias in [-100, 100] added to their logits before
sampling; the routes check the ids against the vocabulary. The output's format
(response_format, vLLM's guided_*) is formats.py's. Checks across fields are in ``check()`` so
the error can name its parameter.
top_k, min_p, repetition_penalty, min_tokens, ignore_eos, stop_token_ids, allowed_token_ids,
skip_special_tokens and include_stop_str_in_output are accepted as extensions, spelled as vLLM
spells them, and so are (completions and chat: TokenIdOutput) return_token_ids and
return_tokens_as_token_ids. Fields SDKs send that change no output (NO_OPS) are accepted and
ignored, with a debug line.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from services.tokenizer.errors import APIError
from services.tokenizer.limits import (
    GREEDY_TEMPERATURE,
    MAX_N,
    MAX_TOP_LOGPROBS,
    TokenId,
    check_stops,
    check_token_ids,
    check_top_k,
)
from services.tokenizer.openai.formats import OutputFormat
from services.tokenizer.token_names import TokenNames, token_names
from shared.messages import Constraint, SamplingParams

MAX_GENERATIONS = 64  # prompts x best_of of one completions request
MAX_LOGIT_BIAS = 300  # token ids one logit_bias may name, as OpenAI's API allows
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions

log = logging.getLogger(__name__)

# fields that change nothing this server returns: storage, billing, tracing and scheduling
# hints of OpenAI's API and vLLM's
NO_OPS = (
    "user",
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "priority",
    "request_id",
    "cache_salt",
)


def not_supported(name: str, value: Any) -> Any:
    if value:
        raise ValueError(f"not supported by this server ({name})")
    return value


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, usage so far in every chunk


class PromptTruncation(BaseModel):
    """vLLM's truncate_prompt_tokens (completions, chat): only the prompt's last k tokens are used;
    -1: the model's context length."""

    model_config = ConfigDict(extra="forbid", strict=True)

    truncate_prompt_tokens: int | None = Field(None, ge=-1)

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _not_zero(cls, v: int | None) -> int | None:
        if v == 0:
            raise ValueError("must be -1 (the model's context length) or at least 1")
        return v

    def truncated(self, ids: list[int], context: int) -> list[int]:
        """ids, or its last truncate_prompt_tokens (-1: context) when it is longer."""
        k = context if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens
        return ids[-k:] if k is not None and len(ids) > k else ids


class TokenIdOutput(BaseModel):
    """vLLM's token id outputs (completions, chat): return_token_ids puts the prompt's ids (as the
    model saw them) and each choice's generated ids in the response; return_tokens_as_token_ids
    names each token of the logprobs "token_id:<id>" instead of by its text."""

    model_config = ConfigDict(extra="forbid", strict=True)

    return_token_ids: bool | None = False
    return_tokens_as_token_ids: bool | None = False

    def token_names(self, tok: TokenNames) -> TokenNames:
        """What names the logprobs' tokens: tok, or its ids."""
        return token_names(tok, bool(self.return_tokens_as_token_ids))

    def token_ids(self, token_ids: list[int], prompt_ids: list[int] | None = None) -> dict[str, list[int]]:
        """The keys return_token_ids adds (prompt_token_ids only where given); none without it."""
        if not self.return_token_ids:
            return {}
        out = {} if prompt_ids is None else {"prompt_token_ids": list(prompt_ids)}
        return out | {"token_ids": list(token_ids)}


class OpenAISampling(OutputFormat):
    """What completions and chat completions share: sampling, stops, the output's format
    (formats.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    _constraint: Constraint | None = PrivateAttr(None)  # the format asked for, once validated

    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int | None = Field(None, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)
    logit_bias: dict[str, float] | None = None
    # accepted and ignored (NO_OPS)
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None  # with tools (chat): false allows one call at most
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    priority: int | None = None
    request_id: str | None = None
    cache_salt: str | None = None
    # extensions
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_tokens: int | None = Field(None, ge=0)
    ignore_eos: bool | None = False
    stop_token_ids: list[TokenId] | None = None
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    skip_special_tokens: bool | None = True
    spaces_between_special_tokens: bool | None = True
    include_stop_str_in_output: bool | None = False

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stops(v)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        return check_top_k(v)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if len(v) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens, got {len(v)}")
        for key, bias in v.items():
            if not key.isdigit():
                raise ValueError(f"keys must be token ids (non-negative integers), got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases must be in [-100, 100], got {bias} for token {key}")
        return v

    def bias_ids(self) -> list[int]:
        """logit_bias's token ids (the routes check them against the vocabulary)."""
        return [int(k) for k in self.logit_bias or {}]

    def check_ids(self, vocab_size: int) -> None:
        """The token ids the body names (stop_token_ids, logit_bias's) must be in the vocabulary."""
        check_token_ids(self.stop_token_ids or [], vocab_size, "stop_token_ids")
        check_token_ids(self.bias_ids(), vocab_size, "logit_bias")
        check_token_ids(self.allowed_token_ids or [], vocab_size, "allowed_token_ids")

    @field_validator("spaces_between_special_tokens")
    @classmethod
    def _spaces(cls, v: bool | None) -> bool | None:
        # a slow tokenizer's option: Hugging Face's fast tokenizers (the only kind read here) decode the
        # same either way, and vLLM applies it to slow tokenizers only; so false changes nothing here either
        if v is False:
            log.debug("spaces_between_special_tokens=false: the fast tokenizer decodes the same either way")
        return v

    @model_validator(mode="after")
    def _format(self) -> OpenAISampling:
        self._constraint = self.output_constraint()
        return self

    def format_constraint(self) -> Constraint | None:
        """The output format the request asked for (response_format, guided_*), if any."""
        return self._constraint

    @model_validator(mode="after")
    def _log_no_ops(self) -> OpenAISampling:
        ignored = [name for name in NO_OPS if getattr(self, name) is not None]
        if ignored:
            log.debug("ignored, as they change no output: %s", ", ".join(ignored))
        return self

    @property
    def sequences(self) -> int:
        return self.n or 1

    def stops(self) -> list[str]:
        v = self.stop
        return [v] if isinstance(v, str) else list(v or [])

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """vLLM's continuous_usage_stats: every chunk carries the usage so far (with include_usage)."""
        return self.include_usage() and bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def check(self) -> None:
        """Rules across fields; each error names the parameter to change."""
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options: allowed only when stream is true", param="stream_options")

    def check_max_tokens(self, max_tokens: int, name: str) -> None:
        if self.min_tokens and self.min_tokens > max_tokens:
            raise APIError(
                400, f"min_tokens ({self.min_tokens}) must not exceed {name} ({max_tokens})", param="min_tokens"
            )

    def sampling(
        self, seed: int, max_new_tokens: int, logprobs: bool, top_logprobs: int, constraint: Constraint | None = None
    ) -> SamplingParams:
        """constraint: what the chat route decided the answer is held to (tools, a format after
        the thinking); by default the format the request asked for."""
        temperature = 1.0 if self.temperature is None else self.temperature  # OpenAI samples by default
        greedy = temperature < GREEDY_TEMPERATURE
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            min_new_tokens=self.min_tokens or 0,
            do_sample=not greedy,
            temperature=1.0 if greedy else temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            ignore_eos=bool(self.ignore_eos),
            stop_token_ids=list(self.stop_token_ids or []),
            seed=seed,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            constraint=constraint if constraint is not None else self._constraint,
            logit_bias=[[int(k), float(b)] for k, b in (self.logit_bias or {}).items()],
            allowed_token_ids=list(self.allowed_token_ids or []),
        )


class CompletionRequest(OpenAISampling, PromptTruncation, TokenIdOutput):
    # token ids first: pydantic tries the members in turn and a member that fails reports every
    # element, so list[str] ahead of list[int] cost a 1000-token prompt 120 us (of 146) locally
    prompt: list[int] | str | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)  # 0: with echo, the prompt alone (scored with logprobs)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool | None = False
    suffix: str | None = None
    # vLLM's: each choice's prompt_logprobs, every prompt token's logprob and rank with this many alternatives
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: list[int] | str | list[str] | list[list[int]]) -> Any:
        if isinstance(v, list) and not v:
            raise ValueError("must not be an empty list")
        return v

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: Any) -> Any:
        return not_supported("suffix", v)

    @property
    def sequences(self) -> int:
        return self.best_of or self.n or 1

    def prompts(self) -> list[str | list[int]]:
        """Each prompt as text or as token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):  # validated: an int first means every element is one
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    def check(self) -> None:
        super().check()
        n = self.n or 1
        if self.best_of is not None and self.best_of < n:
            raise APIError(400, f"best_of ({self.best_of}) must not be less than n ({n})", param="best_of")
        if self.stream and self.sequences > n:
            raise APIError(
                400, "best_of: cannot be used with stream (the best are known only at the end)", param="best_of"
            )
        if len(self.prompts()) * self.sequences > MAX_GENERATIONS:
            raise APIError(
                400, f"prompt: at most {MAX_GENERATIONS} generations per request (prompts x best_of)", param="prompt"
            )
        if self.max_tokens == 0 and not self.echo:
            raise APIError(
                400, "max_tokens: 0 needs echo (it returns the prompt alone, scored with logprobs)", param="max_tokens"
            )
