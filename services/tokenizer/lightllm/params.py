"""LightLLM's request body and its parameters, validated before anything is queued.

Every bound follows LightLLM's SamplingParams (../shared/REFERENCE.md); an unknown key
is an error, and each message names the parameter it is about.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from services.tokenizer import constraints
from services.tokenizer.images.sources import ImageSource
from services.tokenizer.limits import GREEDY_TEMPERATURE, MAX_N, TokenId, check_stops, check_top_k
from shared.messages import Constraint, SamplingParams


class GenerateParameters(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    do_sample: bool = False
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    presence_penalty: float = Field(0.0, ge=0.0)
    frequency_penalty: float = Field(0.0, ge=0.0)
    repetition_penalty: float = Field(1.0, ge=1.0)
    ignore_eos: bool = False
    max_new_tokens: int = Field(16, ge=1)
    min_new_tokens: int = Field(0, ge=0)
    stop_sequences: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    return_details: bool = False
    seed: int | None = Field(None, ge=0, lt=2**63)
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # sequences generated; default n
    n: int = Field(1, ge=1, le=MAX_N)  # sequences returned: the best_of with the highest cumulative logprob
    # the output's format (services/tokenizer/constraints.py), one at most: a JSON schema, a regex
    # (vLLM's guided_regex, or LightLLM's regular_constraint), one of a list, an EBNF grammar
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    regular_constraint: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    _constraint: Constraint | None = PrivateAttr(None)

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        return check_top_k(v)  # type: ignore[return-value]

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        return check_stops(v)

    @field_validator("guided_json")
    @classmethod
    def _schema(cls, v: dict[str, Any] | bool | str | None) -> dict[str, Any] | bool | str | None:
        return constraints.check_schema(v)

    @field_validator("guided_regex", "regular_constraint", "guided_grammar")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return constraints.check_text(v)

    @field_validator("guided_choice")
    @classmethod
    def _choice(cls, v: list[str] | None) -> list[str] | None:
        return constraints.check_choice(v)

    @model_validator(mode="after")
    def _format(self) -> GenerateParameters:
        self._constraint = constraints.one_constraint(
            guided_json=constraints.json_schema(self.guided_json),
            guided_regex=constraints.regex(self.guided_regex),
            regular_constraint=constraints.regex(self.regular_constraint),
            guided_choice=constraints.choice(self.guided_choice),
            guided_grammar=constraints.grammar(self.guided_grammar),
        )
        return self

    @model_validator(mode="after")
    def _min_le_max(self) -> GenerateParameters:
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must not exceed max_new_tokens ({self.max_new_tokens})"
            )
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) must not be less than n ({self.n})")
        return self

    @property
    def sequences(self) -> int:
        """How many generations to run."""
        return self.best_of if self.best_of is not None else self.n

    def stops(self) -> list[str]:
        v = self.stop_sequences
        return [v] if isinstance(v, str) else list(v or [])

    def sampling(self, seed: int) -> SamplingParams:
        """The worker's parameters for one sequence; its seed comes from generation.seeds(),
        which starts at the client's seed. Logprobs also when best_of must rank the sequences."""
        greedy = not self.do_sample or self.temperature < GREEDY_TEMPERATURE
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            min_new_tokens=self.min_new_tokens,
            do_sample=not greedy,
            temperature=1.0 if greedy else self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            ignore_eos=self.ignore_eos,
            stop_token_ids=list(self.stop_token_ids or []),
            seed=seed,
            logprobs=self.return_details or self.sequences > self.n,
            constraint=self._constraint,
        )


class ImageParam(BaseModel):
    """One of LightLLM's multimodal_params.images: base64 data, or a URL to fetch."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["base64", "url"]
    data: str


class MultimodalParams(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    images: list[ImageParam] = Field(default_factory=list)
    audios: list[Any] = Field(default_factory=list)

    @field_validator("audios")
    @classmethod
    def _no_audio(cls, v: list[Any]) -> list[Any]:
        if v:
            raise ValueError("audio is not supported")
        return v


class GenerateBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: str
    parameters: GenerateParameters = Field(default_factory=GenerateParameters)
    multimodal_params: MultimodalParams | None = None
    stream: bool = False  # read by TGI's POST / only

    def image_sources(self) -> list[ImageSource]:
        """Each image in the prompt's order: base64 data, or a URL."""
        images = self.multimodal_params.images if self.multimodal_params is not None else []
        return [
            ImageSource(im.data, f"multimodal_params.images.{i}.data", im.type == "base64")
            for i, im in enumerate(images)
        ]
