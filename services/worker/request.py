"""A request as the worker holds it: its tokens, how many are in the KV pool, its row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from services.worker.mrope_index import RopePositions, rope_index
from services.worker.prefill_sharing import block_hashes
from shared.messages import GenerateReq, SamplingParams

if TYPE_CHECKING:
    from services.worker.grammar import GrammarState

PLACEHOLDER = -1  # a token sampled by a step still in flight


@dataclass(frozen=True)
class ImageSpan:
    """An image's embeddings and the prompt positions [offset, offset + rows) they fill."""

    offset: int
    rows: torch.Tensor  # [length, H] on the device, in the model's dtype
    grid: tuple[int, ...] = ()  # (t, h, w) of the rows where M-RoPE's positions follow it (ImageRef.grid)

    @property
    def end(self) -> int:
        return self.offset + self.rows.shape[0]


class Req:
    __slots__ = (
        "admit_order",
        "alloc_len",
        "cache_node",
        "cached_len",
        "cached_prompt",
        "closing",
        "deadline",
        "detok",
        "error",
        "error_kind",
        "finish_reason",
        "front",
        "grammar",
        "handovers",
        "images",
        "kv_len",
        "params",
        "prompt_blocks",
        "prompt_len",
        "prompt_lp",
        "prompt_lp_next",
        "prompt_ranks",
        "prompt_top",
        "rid",
        "rope",
        "row",
        "tokens",
        "unresolved",
    )

    def __init__(self, msg: GenerateReq, admit_order: int, images: list[ImageSpan] | None = None) -> None:
        self.rid = msg.rid
        self.front = msg.front
        self.detok = msg.detok
        self.params: SamplingParams = msg.params
        self.deadline = msg.deadline
        self.admit_order = admit_order
        self.tokens: list[int] = list(msg.input_ids)  # prompt, then output
        # a request handed over from a dead group comes with its output so far, like a paused one
        self.prompt_len = msg.prompt_len
        self.handovers = msg.handovers
        self.kv_len = 0  # tokens whose K and V are in the pool
        self.alloc_len = 0  # positions that have a slot (>= kv_len while a step is in flight)
        self.row: int | None = None  # request-table row while it holds KV
        # the prompt cache (memory/prompt_cache.py): positions [0, cached_len) of the row are the
        # tree's slots, held through the locked node cache_node; cached_prompt: the prompt tokens
        # the cache held when the request first started (reported to the client)
        self.cached_len = 0
        self.cache_node = None
        self.cached_prompt = 0
        self.finish_reason = ""
        self.error = ""  # why it failed, when finish_reason is "error"
        self.error_kind = ""
        self.prompt_blocks: list[int] | None = None  # its prompt's block hashes (prefill_sharing.py), once asked
        self.unresolved = 0  # placeholder tokens of steps still in flight
        self.closing = False  # its last token is in flight; it is scheduled no more
        self.grammar: GrammarState | None = None  # structured output: what its tokens must spell
        # prompt logprobs (prompt_logprobs.py): the first prompt position whose row no launched step
        # has computed (prompt_len - 1: none owed; a handed-over request's client has them already;
        # a prompt with images has none: its image positions hold pseudo-ids, not tokens), and the
        # values collected so far
        asked = msg.params.prompt_logprobs >= 0 and msg.resumed == 0 and not msg.images
        self.prompt_lp_next = 0 if asked else max(self.prompt_len - 1, 0)
        self.prompt_lp: list[float] = []
        self.prompt_ranks: list[int] = []
        self.prompt_top: list[list[list[float]]] = []
        # its prompt's images in order; their positions hold pseudo-ids (vision_config.image_pseudo_id),
        # so the prompt cache keys them by image, and each step's chunk takes their rows
        self.images: list[ImageSpan] = images or []
        # M-RoPE's positions where its images have grids (Qwen2-VL); None: each token's three are its position
        self.rope: RopePositions | None = None
        if any(s.grid for s in self.images):
            self.rope = rope_index(len(self.tokens), [(s.offset, s.grid) for s in self.images])

    @property
    def output_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def blocks(self) -> list[int]:
        """Its prompt's block hashes (prefill_sharing.py)."""
        if self.prompt_blocks is None:
            self.prompt_blocks = block_hashes(self.tokens[: self.prompt_len])
        return self.prompt_blocks

    @property
    def pending(self) -> int:
        """Tokens the model has not run yet; the next token is sampled after the last of them."""
        return len(self.tokens) - self.kv_len

    @property
    def decoding(self) -> bool:
        """Prefilled: one new token per step from here on."""
        return self.kv_len > 0 and self.pending == 1

    @property
    def computed_len(self) -> int:
        """Leading tokens whose K and V launched steps compute from known ids: not the placeholders
        at the tail (tokens still in flight), nor positions past a token that ended it."""
        return min(self.kv_len, len(self.tokens) - self.unresolved)

    @property
    def remaining(self) -> int:
        return max(0, self.params.max_new_tokens - self.output_len)

    def __repr__(self) -> str:
        return f"Req({self.rid}, len={len(self.tokens)}, kv={self.kv_len}, row={self.row})"
