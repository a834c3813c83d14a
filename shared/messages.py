"""Every message that crosses a service boundary, grouped by the stream that carries it.

Wire format: a msgpack array ``[SCHEMA_VERSION, tag, field_1, field_2, ...]`` with the
fields in declaration order; a nested struct is the array of its own fields
(shared/wire_structs.py). No pickle, no tensors. ``encode`` and ``decode`` are the only ways
in and out, and ``decode`` rejects a message from another schema version or of an unknown type.

Streams (names in shared/streams.py):
    visual inbox       VisualReq (a request with images, before the router)
    router inbox       GenerateReq, AbortReq, WorkerStatus
    worker[g] inbox    AdmitReqs, AbortReqs
    detokenizer[k]     DetokRegister, TokenBatch, Handover
    front[f]           TextBatch
    heartbeat keys     Heartbeat
    image keys         ImageEmbedding (an image's embeddings, under its content hash)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from math import prod
from typing import Any, ClassVar

from shared.wire_structs import WireError, pack_envelope, unpack_envelope
from shared.wire_values import *  # noqa: F403 (finish reasons, error kinds, constraint kinds: read from here)
from shared.wire_values import CONSTRAINT_KINDS

# 2: WorkerStatus.running as columns (RunningTable); 3: the prompt cache's counts; 4: hand-over of a
# dead group's requests (GenerateReq.resumed and .handovers, TokenItem.handovers, Handover);
# 5: SamplingParams.constraint; 6: a group's drain (WorkerStatus.draining, .leaving); 7: images
# (GenerateReq.images, VisualReq, ImageEmbedding); 8: ImageRef.grid (M-RoPE's image grids);
# 9: prompt logprobs (SamplingParams.prompt_logprobs, TokenItem's and TextItem's); 10: SamplingParams.logit_bias,
# .min_p and .allowed_token_ids
SCHEMA_VERSION = 10


# ---------------------------------------------------------------- nested structs


@dataclass(frozen=True, slots=True)
class Constraint:
    """What the output must be (structured output): the worker masks every token the grammar
    does not allow, and the request ends when the grammar does."""

    kind: str  # one of CONSTRAINT_KINDS
    text: str = ""
    # the constraint applies from the token after this one's first appearance in the output (a
    # reasoning model's end of thinking: the format is the answer's); -1: from the first token
    after_token: int = -1

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise WireError(f"Constraint: unknown kind {self.kind!r}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request generation options, as the worker applies them."""

    max_new_tokens: int = 16
    min_new_tokens: int = 0
    do_sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int = 0  # the front always assigns one, so sampling is reproducible per request
    logprobs: bool = False  # report the chosen token's logprob
    top_logprobs: int = 0  # also report this many most likely alternatives
    constraint: Constraint | None = None  # structured output; None: free text
    # each prompt token's logprob after the first (with this many alternatives): -1 none
    prompt_logprobs: int = -1
    logit_bias: list[list[float]] = field(default_factory=list)  # [[token id, bias], ...] added to the logits
    min_p: float = 0.0  # sampling keeps the tokens of at least min_p x the likeliest one's probability
    allowed_token_ids: list[int] = field(default_factory=list)  # the only tokens the output may have; []: any

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature < 1e-5 or self.top_k == 1


@dataclass(frozen=True, slots=True)
class RunningReq:
    """One request as a worker holds it, for the router's token accounting: a row of a
    RunningTable."""

    rid: str
    detok: str  # its detokenizer shard, so a router that restarted can still fail it
    prompt_tokens: int
    held_tokens: int  # KV tokens the request owns now (prompt + output so far)
    remaining_tokens: int  # at most this many more output tokens
    paused: bool = False  # preempted: holds no KV now, resumes by recomputation
    # of held_tokens, those in the prompt cache's tree (shared with other requests, and counted
    # once in WorkerStatus.cache_locked_tokens instead)
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RunningTable:
    """Every request a worker group holds, a column per RunningReq field. A status lists up to
    thousands of requests: as one struct each, building and encoding a status of 2000 took the
    worker's step loop 2.2 ms (this machine); as columns, a few lists of plain values."""

    rids: list[str]
    detoks: list[str]
    prompt_tokens: list[int]
    held_tokens: list[int]
    remaining_tokens: list[int]
    paused: list[bool]
    cached_tokens: list[int]

    def __post_init__(self) -> None:
        lengths = [len(c) for c in self.columns()]
        if len(set(lengths)) > 1:
            raise WireError(f"RunningTable: columns of different lengths {lengths}")

    def __len__(self) -> int:
        return len(self.rids)

    def columns(self) -> tuple[list, ...]:
        """The columns in RunningReq's field order (this table's own): zip(*columns()) gives its rows' fields."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def rows(self) -> list[RunningReq]:
        return [RunningReq(*row) for row in zip(*self.columns(), strict=True)]

    @classmethod
    def of(cls, rows: list[RunningReq]) -> RunningTable:
        return cls(*([getattr(r, f.name) for r in rows] for f in fields(RunningReq)))


@dataclass(frozen=True, slots=True)
class TokenItem:
    """New tokens of one request in one worker step (or its end)."""

    rid: str
    token_ids: list[int]
    logprobs: list[float] = field(default_factory=list)  # one per token when asked for
    top_logprobs: list[list[list[float]]] = field(default_factory=list)  # per token: [[id, logprob], ...]
    finish_reason: str = ""
    error: str = ""
    error_kind: str = ""  # one of ERROR_KINDS when finish_reason is "error"
    prompt_tokens: int = 0
    output_tokens: int = 0  # total output tokens so far, this step's included
    cached_tokens: int = 0  # prompt tokens whose KV the prompt cache held when the request started
    # its GenerateReq's handovers: a detokenizer that has handed the request over drops the
    # items of the copy that ran before (a group declared dead that was only silent)
    handovers: int = 0
    # with the first output token, when SamplingParams.prompt_logprobs asked: prompt tokens 1..
    prompt_logprobs: list[float] = field(default_factory=list)
    prompt_top_logprobs: list[list[list[float]]] = field(default_factory=list)
    prompt_ranks: list[int] = field(default_factory=list)  # each prompt token's rank (1: the most likely)


@dataclass(frozen=True, slots=True)
class TextItem:
    """New text of one request, as its front end hands it to the client."""

    rid: str
    text: str  # the delta since the last TextItem of this request
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[list[float]]] = field(default_factory=list)
    finish_reason: str = ""
    error: str = ""
    error_kind: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    prompt_logprobs: list[float] = field(default_factory=list)  # as TokenItem's
    prompt_top_logprobs: list[list[list[float]]] = field(default_factory=list)
    prompt_ranks: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image of a prompt: its content hash (the key of its embeddings) and the prompt
    positions its embeddings fill, [offset, offset + length)."""

    hash: str
    offset: int
    length: int
    # the embeddings' (t, h, w) grid where the family's positions follow it (Qwen2-VL's M-RoPE); else empty
    grid: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.offset < 0 or self.length < 1 or not self.hash:
            raise WireError(f"ImageRef: {self.length} tokens at {self.offset}, hash {self.hash!r}")
        if self.grid and (len(self.grid) != 3 or min(self.grid) < 1 or prod(self.grid) != self.length):
            raise WireError(f"ImageRef: grid {self.grid} for {self.length} tokens")


@dataclass(frozen=True, slots=True)
class ImageData:
    """An image as the front end checked it, for the visual service to encode."""

    hash: str
    data: bytes  # the image file (PNG, JPEG, ...) as the client sent it


# ---------------------------------------------------------------- visual inbox


@dataclass(frozen=True, slots=True)
class VisualReq:
    """A request with images: the visual service makes sure each image's embeddings are in
    Redis, then sends ``req`` on to the router."""

    TAG: ClassVar[str] = "visual"
    req: GenerateReq
    images: list[ImageData]  # one per distinct hash among req.images


# ---------------------------------------------------------------- router inbox


@dataclass(frozen=True, slots=True)
class GenerateReq:
    TAG: ClassVar[str] = "gen"
    rid: str
    front: str  # the front end waiting for the text
    detok: str  # the detokenizer shard that holds the request's decode state
    input_ids: list[int]
    params: SamplingParams
    arrival: float  # unix time the front accepted it
    deadline: float  # unix time after which it is failed wherever it is
    # a request handed over from a dead worker group (docs/router.md, Failures): the last
    # ``resumed`` of input_ids are output its client has already had, and the worker goes on
    # from there by recomputation, as after a pause; handovers counts how often that happened
    resumed: int = 0
    handovers: int = 0
    # the prompt's images, in order: each fills its positions with its embeddings (the ids there
    # are pseudo-ids derived from the image's hash, below 0: vision_config.image_pseudo_id)
    images: list[ImageRef] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0 <= self.resumed < max(len(self.input_ids), 1) or self.handovers < 0:
            raise WireError(f"GenerateReq: resumed {self.resumed} of {len(self.input_ids)} input ids")
        end = 0
        for image in self.images:
            if image.offset < end or image.offset + image.length > len(self.input_ids) - self.resumed:
                raise WireError(f"GenerateReq: image at {image.offset}+{image.length} overlaps or leaves the prompt")
            end = image.offset + image.length

    @property
    def prompt_len(self) -> int:
        return len(self.input_ids) - self.resumed


@dataclass(frozen=True, slots=True)
class AbortReq:
    TAG: ClassVar[str] = "abort"
    rid: str
    reason: str


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """A worker group's state; sent periodically, doubling as its heartbeat."""

    TAG: ClassVar[str] = "wstat"
    group: str
    instance: str  # changes on every restart of the group
    capacity_tokens: int
    free_tokens: int
    max_running: int
    admit_seq: int  # the last AdmitReqs.seq this instance has taken in
    running: RunningTable  # every request it holds: running, waiting to start, or paused
    time: float
    # the prompt cache: tokens no request holds (freed on demand, so as good as free) and tokens
    # of the tree that running requests hold (each counted once, however many share it)
    evictable_tokens: int = 0
    cache_locked_tokens: int = 0
    prompt_cache: bool = False  # the group keeps a prompt cache (the router's index for it means something)
    draining: bool = False  # it is shutting down: it finishes what it holds and takes nothing new
    # its last status: what it lists will not finish there, and goes on elsewhere (a drain that timed out)
    leaving: bool = False


# ---------------------------------------------------------------- worker inbox


@dataclass(frozen=True, slots=True)
class AdmitReqs:
    TAG: ClassVar[str] = "admit"
    instance: str  # only this incarnation of the group may take them
    seq: int
    reqs: list[GenerateReq]


@dataclass(frozen=True, slots=True)
class AbortReqs:
    TAG: ClassVar[str] = "aborts"
    rids: list[str]
    reason: str


# ---------------------------------------------------------------- detokenizer inbox


@dataclass(frozen=True, slots=True)
class DetokRegister:
    TAG: ClassVar[str] = "dreg"
    rid: str
    front: str
    prompt_tokens: int
    stop: list[str]
    skip_special_tokens: bool
    deadline: float  # unix time; the session is dropped after it if still open


@dataclass(frozen=True, slots=True)
class Handover:
    """From the router: the worker group running ``req`` died before its end went out. The
    shard, which has every token the client was sent, sends the router the request to continue
    (the prompt and those tokens, resumed) and drops any later item of the copy that died."""

    TAG: ClassVar[str] = "handover"
    req: GenerateReq
    why: str


@dataclass(frozen=True, slots=True)
class TokenBatch:
    TAG: ClassVar[str] = "tokens"
    source: str  # "worker:<group>" or "router"
    items: list[TokenItem]


# ---------------------------------------------------------------- front-end inbox


@dataclass(frozen=True, slots=True)
class TextBatch:
    TAG: ClassVar[str] = "text"
    items: list[TextItem]


# ---------------------------------------------------------------- heartbeat keys


@dataclass(frozen=True, slots=True)
class Heartbeat:
    TAG: ClassVar[str] = "hb"
    service: str
    replica: str
    pid: int
    started: float
    time: float
    info: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- image keys


@dataclass(frozen=True, slots=True)
class ImageEmbedding:
    """An image's embeddings as stored in Redis under its hash: the projector's output rows."""

    TAG: ClassVar[str] = "emb"
    dtype: str  # float32, bfloat16 or float16
    shape: list[int]  # [tokens, hidden]
    data: bytes  # the tensor's bytes, row-major

    def __post_init__(self) -> None:
        sizes = {"float32": 4, "bfloat16": 2, "float16": 2}
        if self.dtype not in sizes or len(self.shape) != 2:
            raise WireError(f"ImageEmbedding: dtype {self.dtype!r}, shape {self.shape}")
        if len(self.data) != self.shape[0] * self.shape[1] * sizes[self.dtype]:
            raise WireError(f"ImageEmbedding: {len(self.data)} bytes for {self.shape} {self.dtype}")


MESSAGE_TYPES: tuple[type, ...] = (
    *(VisualReq, GenerateReq, AbortReq, WorkerStatus, AdmitReqs, AbortReqs, DetokRegister, Handover),
    *(TokenBatch, TextBatch, Heartbeat, ImageEmbedding),
)
NESTED_TYPES: tuple[type, ...] = (Constraint, SamplingParams, RunningTable, TokenItem, TextItem, ImageRef, ImageData)


# ---------------------------------------------------------------- codec

_BY_TAG: dict[str, type] = {cls.TAG: cls for cls in MESSAGE_TYPES}
assert len(_BY_TAG) == len(MESSAGE_TYPES), "message tags must be unique"


def encode(msg: Any) -> bytes:
    """Serialise one top-level message."""
    return pack_envelope(SCHEMA_VERSION, _BY_TAG, msg)


def decode(data: bytes) -> Any:
    """Parse one top-level message, checking version, type and shape."""
    return unpack_envelope(SCHEMA_VERSION, _BY_TAG, data)
