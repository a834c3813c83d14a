"""Next-token choice for a whole batch at once, on the logits' device.

Greedy rows take the argmax. Sampling rows apply temperature, top-k and top-p, then
draw with the Gumbel-max trick from noise that is a hash of (request seed, output
position, token id): a request's draw depends on its seed alone, never on which
requests share its batch, so seeded requests are reproducible. Penalties (repetition
over prompt and output; presence and frequency over the output, as in OpenAI's API)
and min_new_tokens (end tokens banned until then) apply to both. Only the chosen
tokens, and logprobs when asked for, cross to the host: one transfer per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.request import Req

_MASK = {s: (1 << (64 - s)) - 1 for s in (27, 30, 31, 40)}


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
    return (_shr(z, 40).float() + 0.5) * (1.0 / (1 << 24))


@dataclass
class SampleOutput:
    tokens: list[int]
    logprobs: list[float] | None  # of each chosen token, under the model's distribution
    top_logprobs: list[list[list[float]]] | None  # per row: [[token id, logprob], ...]


class Sampler:
    def __init__(self, eos_ids: frozenset[int], vocab_size: int) -> None:
        self.eos_ids = sorted(eos_ids)
        self.vocab = vocab_size

    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> SampleOutput:
        """logits: [S, V] float32, one row per request in reqs."""
        if not reqs:
            return SampleOutput([], None, None)
        device = logits.device
        raw = logits
        logits = self._penalised(logits, reqs)
        params = [r.params for r in reqs]
        greedy = [p.greedy for p in params]
        if all(greedy):
            chosen = logits.argmax(dim=-1)
        else:
            chosen = self._draw(logits, reqs, greedy, device)
        want_lp = any(p.logprobs or p.top_logprobs for p in params)
        k = max(p.top_logprobs for p in params)
        lp_chosen = top = None
        if want_lp:
            lp = torch.log_softmax(raw, dim=-1)
            lp_chosen = lp.gather(1, chosen[:, None])[:, 0]
            if k:
                top = torch.topk(lp, k, dim=-1)
        tokens = chosen.tolist()
        logprobs = lp_chosen.tolist() if lp_chosen is not None else None
        top_out = None
        if top is not None:
            ids, vals = top.indices.tolist(), top.values.tolist()
            top_out = [
                [[float(t), v] for t, v in zip(ids[i][: p.top_logprobs], vals[i][: p.top_logprobs], strict=True)]
                for i, p in enumerate(params)
            ]
        return SampleOutput(tokens, logprobs, top_out)

    def _penalised(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        rows = [
            i
            for i, r in enumerate(reqs)
            if r.params.repetition_penalty != 1.0
            or r.params.presence_penalty
            or r.params.frequency_penalty
            or r.output_len < r.params.min_new_tokens
        ]
        if not rows:
            return logits
        logits = logits.clone()
        device = logits.device
        for i in rows:
            r, p = reqs[i], reqs[i].params
            row = logits[i]
            if p.repetition_penalty != 1.0:
                seen = torch.tensor(sorted(set(r.tokens)), dtype=torch.int64, device=device)
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if (p.presence_penalty or p.frequency_penalty) and r.output_len:
                out = torch.tensor(r.output_ids, dtype=torch.int64, device=device)
                counts = torch.bincount(out, minlength=row.shape[0]).to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
            if r.output_len < p.min_new_tokens:
                ends = [*p.stop_token_ids, *([] if p.ignore_eos else self.eos_ids)]
                ends = [t for t in ends if 0 <= t < row.shape[0]]
                if ends:
                    row[torch.tensor(ends, dtype=torch.int64, device=device)] = float("-inf")
        return logits

    def _draw(self, logits: torch.Tensor, reqs: list[Req], greedy: list[bool], device: torch.device) -> torch.Tensor:
        params = [r.params for r in reqs]
        vocab = logits.shape[1]
        temp = torch.tensor([1.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)], device=device)
        scaled = logits / temp[:, None]
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p for p in params]
        if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
            scaled = _top_k_top_p(scaled, top_k, top_p)
        seeds = torch.tensor([p.seed for p in params], dtype=torch.int64, device=device)
        steps = torch.tensor([r.output_len for r in reqs], dtype=torch.int64, device=device)
        gumbel = -torch.log(-torch.log(hashed_uniform(seeds, steps, vocab)))
        drawn = (torch.log_softmax(scaled, dim=-1) + gumbel).argmax(dim=-1)
        greedy_t = torch.tensor(greedy, device=device)
        return torch.where(greedy_t, logits.argmax(dim=-1), drawn)


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask (to -inf) all but each row's top_k tokens and its top_p nucleus."""
    device = logits.device
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[1]
    rank = torch.arange(vocab, device=device)[None, :]
    k = torch.tensor(top_k, device=device)[:, None]
    drop = rank >= k
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
    p = torch.tensor(top_p, device=device, dtype=probs.dtype)[:, None]
    drop |= before >= p
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
