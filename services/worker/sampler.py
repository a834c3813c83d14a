"""Next-token choice for a whole batch at once, on the logits' device, with no host sync.

Greedy rows take the argmax. Sampling rows apply temperature, min-p (a token whose probability
is under min_p times the likeliest one's is dropped), top-k and top-p, then draw with the
Gumbel-max trick from noise that is a hash of (request seed, output position, token id): a
request's draw depends on its seed alone, never on which requests share its batch, so seeded
requests are reproducible. Penalties (repetition over prompt and output; presence and frequency
over the output, as in OpenAI's API), min_new_tokens (end tokens banned until then), a request's
logit_bias (added to its logits) and its allowed_token_ids (every other token masked) apply to
both. Parameters come from SamplingState rows; the result stays on the device until the engine
copies it out.

Log-probabilities are of the logits the sampler was given (an output format's mask applied, no
penalties, no logit_bias, as vLLM reports them by default): a token the mask rules out has none,
and is reported at LOGPROB_FLOOR, as vLLM reports it, since JSON has no -inf (a top_logprobs list
under a mask that allows fewer tokens than it asks for holds such tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from services.worker.host_copy import to_device
from services.worker.request import Req
from services.worker.sampling_state import SamplingState, uses_penalty

LOGPROB_FLOOR = -9999.0
# (k + 0.5) / 2^23 is exact in float32 for every k < 2^23; with 24 bits the top k rounded to 1.0
UNIFORM_BITS = 23
_MASK = {s: (1 << (64 - s)) - 1 for s in (27, 30, 31, 64 - UNIFORM_BITS)}


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_K_SEED = _signed(0x9E3779B97F4A7C15)
_K_STEP = _signed(0xD1B54A32D192ED03)
_K_TOKEN = _signed(0x8CB92BA72F3D8DD7)
_M1 = _signed(0xBF58476D1CE4E5B9)
_M2 = _signed(0x94D049BB133111EB)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & _MASK[s]


def hashed_uniform(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """[S, vocab] float32 in (0, 1), a SplitMix64 hash of (seed, step, token id)."""
    tok = torch.arange(vocab, dtype=torch.int64, device=seeds.device)
    z = seeds[:, None] * _K_SEED + steps[:, None] * _K_STEP + tok[None, :] * _K_TOKEN
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    z = z ^ _shr(z, 31)
    return open_unit(_shr(z, 64 - UNIFORM_BITS))


def open_unit(k: torch.Tensor) -> torch.Tensor:
    """Integers k in [0, 2^UNIFORM_BITS) -> float32 (k + 0.5) / 2^UNIFORM_BITS, strictly inside (0, 1):
    a draw of exactly 1 would make its Gumbel noise +inf, and a masked token's -inf + inf a NaN
    that argmax takes."""
    return (k.float() + 0.5) * (1.0 / (1 << UNIFORM_BITS))


@dataclass
class SampleBatch:
    """What one step's sampling needs, built on the host from the requests' parameters."""

    rows: torch.Tensor  # [S] int64, the requests' rows in SamplingState
    all_greedy: bool
    filtered: bool  # some row uses top-k or top-p
    min_p: bool  # some sampling row uses min-p
    penalties: bool
    bans: list[tuple[int, int]]  # (sample index, token id) banned this step (min_new_tokens)
    bias_at: list[tuple[int, int]]  # (sample index, token id) of each logit_bias entry
    bias: list[float]  # the bias added there
    allowed_rows: list[int]  # sample indices of the rows held to allowed_token_ids
    allowed_at: list[tuple[int, int]]  # (position in allowed_rows, token id) each may take
    top_logprobs: int  # the most any row asks for; 0: none
    logprobs: bool  # some row wants its chosen token's logprob


@dataclass
class SampleResult:
    tokens: torch.Tensor  # [S] int64 on the device
    logprobs: torch.Tensor | None  # [S] float32
    top_ids: torch.Tensor | None  # [S, k] int64
    top_values: torch.Tensor | None  # [S, k] float32


def torch_argmax(x: torch.Tensor) -> torch.Tensor:
    """[S, V] -> [S] int64, each row's first maximum."""
    return x.argmax(dim=-1)


class Sampler:
    def __init__(
        self,
        state: SamplingState,
        eos_ids: frozenset[int],
        argmax: Callable[[torch.Tensor], torch.Tensor] = torch_argmax,
    ) -> None:
        """argmax: [S, V] float -> [S] int64, the first maximum of each row (the CUDA path passes
        the split kernel, kernels/argmax.py)."""
        self.state = state
        self.eos_ids = sorted(eos_ids)
        self.argmax = argmax

    def batch(self, reqs: list[Req], device: torch.device, rows: torch.Tensor | None = None) -> SampleBatch:
        """Host side: read the requests' parameters once, build the row index (rows: the
        requests' rows as [S] int64 on the device, where the batch builder made them)."""
        params = [r.params for r in reqs]
        vocab = self.state.vocab
        bans, bias_at, bias, allowed_rows, allowed_at = [], [], [], [], []
        for i, r in enumerate(reqs):
            p = r.params
            if r.output_len < p.min_new_tokens:  # outputs before this draw (pending ones included)
                ends = [*p.stop_token_ids, *([] if p.ignore_eos else self.eos_ids)]
                bans += [(i, t) for t in ends if 0 <= t < vocab]
            for t, b in p.logit_bias:  # the fronts refuse ids past the vocabulary; kept out here too
                if 0 <= t < vocab:
                    bias_at.append((i, int(t)))
                    bias.append(float(b))
            allowed = [t for t in p.allowed_token_ids if 0 <= t < vocab] if p.allowed_token_ids else None
            if allowed:  # a list with none in the vocabulary (the fronts refuse it) holds nothing
                allowed_at += [(len(allowed_rows), t) for t in allowed]
                allowed_rows.append(i)
        return SampleBatch(
            rows=rows if rows is not None else to_device([r.row for r in reqs], torch.int64, device),
            all_greedy=all(p.greedy for p in params),
            filtered=any(not p.greedy and (0 < p.top_k < vocab or p.top_p < 1.0) for p in params),
            min_p=any(not p.greedy and p.min_p > 0.0 for p in params),
            penalties=any(uses_penalty(r) for r in reqs),
            bans=bans,
            bias_at=bias_at,
            bias=bias,
            allowed_rows=allowed_rows,
            allowed_at=allowed_at,
            top_logprobs=max((p.top_logprobs for p in params), default=0),
            logprobs=any(p.logprobs or p.top_logprobs for p in params),
        )

    def sample(self, logits: torch.Tensor, b: SampleBatch) -> SampleResult:
        """logits: [S, V], one row per request of the batch, in order, in the model's dtype. A
        greedy step without penalties or log-probabilities takes the argmax of them as they are
        (a float32 copy has the same maxima); anything else works on a float32 copy."""
        masked = b.penalties or b.bans or b.bias or b.allowed_rows
        if not b.all_greedy or masked or b.logprobs:
            logits = logits.float()
        raw = logits
        st = self.state
        rows = b.rows
        if masked:
            logits = self._penalised(logits, b)
        if b.all_greedy:
            tokens = self.argmax(logits)
        else:
            scaled = logits / st.temperature[rows][:, None]
            if b.min_p:
                scaled = _min_p(scaled, st.min_p[rows])
            if b.filtered:
                scaled = _top_k_top_p(scaled, st.top_k[rows], st.top_p[rows])
            noise = -torch.log(-torch.log(hashed_uniform(st.seed[rows], st.out_pos[rows], logits.shape[1])))
            drawn = self.argmax(torch.log_softmax(scaled, dim=-1) + noise)
            tokens = torch.where(st.greedy[rows], self.argmax(logits), drawn)
        st.record(rows, tokens, b.penalties, advance=not b.all_greedy)
        lp = top_ids = top_values = None
        if b.logprobs:
            logsm = torch.log_softmax(raw, dim=-1).clamp_(min=LOGPROB_FLOOR)
            lp = logsm.gather(1, tokens[:, None])[:, 0]
            if b.top_logprobs:
                top = torch.topk(logsm, b.top_logprobs, dim=-1)
                top_ids, top_values = top.indices, top.values
        return SampleResult(tokens, lp, top_ids, top_values)

    def _penalised(self, logits: torch.Tensor, b: SampleBatch) -> torch.Tensor:
        st = self.state
        logits = logits.clone()
        if b.penalties and st.counts is not None and st.seen is not None:
            rows = b.rows
            counts = st.counts[rows].to(logits.dtype)  # [S, V]
            seen = st.seen[rows]
            rep = st.repetition[rows][:, None]
            penalised = torch.where(logits > 0, logits / rep, logits * rep)
            logits = torch.where(seen, penalised, logits)
            logits -= st.frequency[rows][:, None] * counts + st.presence[rows][:, None] * (counts > 0).to(logits.dtype)
        if b.bias:
            at = to_device(b.bias_at, torch.int64, logits.device)
            logits.index_put_((at[:, 0], at[:, 1]), to_device(b.bias, torch.float32, logits.device), accumulate=True)
        if b.bans:
            idx = to_device(b.bans, torch.int64, logits.device)
            logits[idx[:, 0], idx[:, 1]] = float("-inf")
        if b.allowed_rows:
            rows = to_device(b.allowed_rows, torch.int64, logits.device)
            at = to_device(b.allowed_at, torch.int64, logits.device)
            ok = torch.zeros((len(b.allowed_rows), logits.shape[1]), dtype=torch.bool, device=logits.device)
            ok[at[:, 0], at[:, 1]] = True
            logits[rows] = logits[rows].masked_fill(~ok, float("-inf"))
        return logits


def _min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) each row's tokens whose probability is under min_p times its likeliest
    token's: their logits are under the row's maximum plus ln(min_p) (min_p 0: none)."""
    floor = logits.max(dim=-1, keepdim=True).values + torch.log(min_p)[:, None]
    return logits.masked_fill(logits < floor, float("-inf"))


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask (to -inf) all but each row's top_k tokens and its top_p nucleus."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(logits.shape[1], device=logits.device)[None, :]
    drop = rank >= top_k[:, None]
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
    drop |= before >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
