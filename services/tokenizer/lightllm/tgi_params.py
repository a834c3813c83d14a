"""TGI's request body (text-generation-inference's POST /, /generate, /generate_stream), as
its clients send it: every parameter may be null, and null means TGI's default.

The `text-generation` client and huggingface_hub's InferenceClient send the whole parameter
set on every call (details, decoder_input_details, stop, truncate, watermark, ...). What
changes the output and this server cannot do (watermark, typical_p below 1, adapter_id)
is a 400 that names the parameter; the rest is honoured. grammar is TGI's structured output:
``{"type": "json", "value": schema}`` or ``{"type": "regex", "value": str}``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.tokenizer import constraints
from services.tokenizer.limits import GREEDY_TEMPERATURE, MAX_N, MAX_TOP_LOGPROBS, check_stops
from shared.messages import Constraint, SamplingParams

# parameters only TGI spells (LightLLM's are return_details, stop_sequences, ...): a body on
# /generate or /generate_stream that has one (TGI's clients send them all, null or not) is
# TGI's; a null is no sign, as LightLLM's body takes null for seed, best_of, stops
TGI_ONLY = frozenset(
    {
        "details",
        "decoder_input_details",
        "stop",
        "truncate",
        "watermark",
        "return_full_text",
        "top_n_tokens",
        "typical_p",
        "grammar",
        "adapter_id",
    }
)


def is_tgi(body: Any) -> bool:
    """Whether a parsed /generate body is TGI's rather than LightLLM's ("parameters": null is
    TGI's: LightLLM's refuses it)."""
    p = body.get("parameters") if isinstance(body, dict) else None
    if not isinstance(p, dict):
        return p is None and isinstance(body, dict) and "parameters" in body
    return any(k in TGI_ONLY for k in p)


def _unsupported(name: str) -> ValueError:
    return ValueError(f"not supported by this server ({name})")


class TGIGrammar(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["json", "regex"]
    value: dict[str, Any] | bool | str

    @model_validator(mode="after")
    def _value(self) -> TGIGrammar:
        if self.type == "json":
            constraints.check_schema(self.value)
        elif not isinstance(self.value, str) or not self.value:
            raise ValueError("a regex grammar's value is a non-empty string")
        return self

    def constraint(self) -> Constraint | None:
        if self.type == "json":
            return constraints.json_schema(self.value)
        return constraints.regex(self.value)  # type: ignore[arg-type]


class TGIParameters(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    do_sample: bool | None = None
    max_new_tokens: int | None = Field(None, ge=1)  # None: up to the model's length limit, as TGI
    temperature: float | None = Field(None, ge=0.0)  # 0 (TGI refuses it) is taken as greedy
    top_k: int | None = Field(None, ge=1)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    typical_p: float | None = Field(None, gt=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: list[str] | None = None
    truncate: int | None = Field(None, ge=1)  # keep the last truncate tokens of the prompt, as TGI
    watermark: bool | None = None
    return_full_text: bool | None = None
    details: bool | None = None
    decoder_input_details: bool | None = None
    top_n_tokens: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    grammar: TGIGrammar | None = None
    adapter_id: str | None = None
    # LightLLM's own extension, kept on TGI's routes (POST / took LightLLM's body before): decode
    # to max_new_tokens past the end-of-sequence token, as benchmarks ask
    ignore_eos: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        return check_stops(v)  # type: ignore[return-value]

    @field_validator("typical_p")
    @classmethod
    def _typical(cls, v: float | None) -> float | None:
        if v is not None and v < 1.0:
            raise _unsupported("typical_p")
        return v

    @field_validator("watermark")
    @classmethod
    def _watermark(cls, v: bool | None) -> bool | None:
        if v:
            raise _unsupported("watermark")
        return v

    @field_validator("adapter_id")
    @classmethod
    def _nothing(cls, v: Any) -> Any:
        if v is not None:
            raise _unsupported("adapter_id")
        return v

    @model_validator(mode="after")
    def _best_of_samples(self) -> TGIParameters:
        if (self.best_of or 1) > 1 and not self.sampled:
            raise ValueError("best_of > 1 needs sampling (do_sample, temperature, top_k or top_p), as in TGI")
        return self

    @property
    def sampled(self) -> bool:
        """TGI samples when asked to or when any warper is set; else it is greedy."""
        warped = (
            (self.temperature is not None and self.temperature != 1.0)
            or self.top_k is not None
            or (self.top_p is not None and self.top_p < 1.0)
        )
        greedy_t = self.temperature is not None and self.temperature < GREEDY_TEMPERATURE
        return bool(self.do_sample or warped) and not greedy_t

    @property
    def sequences(self) -> int:
        return self.best_of or 1

    def sampling(self, seed: int, max_new_tokens: int) -> SamplingParams:
        sampled = self.sampled
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            do_sample=sampled,
            temperature=self.temperature if sampled and self.temperature is not None else 1.0,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=-1 if self.top_k is None else self.top_k,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            seed=seed,
            logprobs=bool(self.details) or self.sequences > 1,
            top_logprobs=self.top_n_tokens or 0,
            ignore_eos=bool(self.ignore_eos),
            constraint=self.grammar.constraint() if self.grammar is not None else None,
            # details.prefill's logprobs (TGI computes them only when it returns them)
            prompt_logprobs=0 if self.details and self.decoder_input_details else -1,
        )


class TGIRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    inputs: str
    parameters: TGIParameters | None = None
    stream: bool | None = False

    @property
    def params(self) -> TGIParameters:
        return self.parameters or TGIParameters()
