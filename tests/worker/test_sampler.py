"""Sampling: reproducible per seed, independent of batch company; filters and penalties."""

from __future__ import annotations

import torch

from services.worker.request import Req
from services.worker.sampler import Sampler, hashed_uniform
from tests.worker.engine_driver import request

V = 50


def _req(rid: str = "r", tokens: list[int] | None = None, **params) -> Req:
    return Req(request(rid, tokens or [1, 2, 3], **params), 0)


def test_hashed_uniform_is_deterministic_and_uniform() -> None:
    seeds = torch.tensor([1, 2, 1], dtype=torch.int64)
    steps = torch.tensor([0, 0, 0], dtype=torch.int64)
    u = hashed_uniform(seeds, steps, 100_000)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert abs(float((u < 0.1).float().mean()) - 0.1) < 0.01
    other_step = hashed_uniform(seeds[:1], torch.tensor([1]), 100_000)
    assert not torch.equal(other_step[0], u[0])


def test_greedy_takes_the_argmax() -> None:
    logits = torch.randn(3, V)
    out = Sampler(frozenset(), V).sample(logits, [_req(str(i)) for i in range(3)])
    assert out.tokens == logits.argmax(-1).tolist()
    assert out.logprobs is None


def test_seeded_draw_does_not_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    sampler = Sampler(frozenset(), V)
    alone = sampler.sample(logits[2:3], [_req("x", do_sample=True, temperature=1.0, seed=7)]).tokens
    mixed = [_req("a", do_sample=True, seed=1), _req("b"), _req("x", do_sample=True, seed=7), _req("c", do_sample=True)]
    together = sampler.sample(logits, mixed).tokens
    assert together[2] == alone[0]
    assert together[1] == int(logits[1].argmax())


def test_draws_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [1e-9] * (V - 3)]))
    sampler = Sampler(frozenset(), V)
    counts = [0, 0, 0]
    for seed in range(2000):
        tok = sampler.sample(logits, [_req(do_sample=True, seed=seed)]).tokens[0]
        counts[tok] += 1
    assert abs(counts[0] / 2000 - 0.7) < 0.04 and abs(counts[2] / 2000 - 0.1) < 0.03


def test_top_k_and_top_p_restrict_the_choice() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4)]))
    sampler = Sampler(frozenset(), V)
    seen_k = {sampler.sample(logits, [_req(do_sample=True, top_k=2, seed=s)]).tokens[0] for s in range(300)}
    assert seen_k == {0, 1}
    seen_p = {sampler.sample(logits, [_req(do_sample=True, top_p=0.75, seed=s)]).tokens[0] for s in range(300)}
    assert seen_p == {0, 1}  # 0.5 + 0.3 covers 0.75
    seen_p1 = {sampler.sample(logits, [_req(do_sample=True, top_p=0.4, seed=s)]).tokens[0] for s in range(100)}
    assert seen_p1 == {0}
    hot = {sampler.sample(logits, [_req(do_sample=True, temperature=1e-3, seed=s)]).tokens[0] for s in range(50)}
    assert hot == {0}


def test_penalties() -> None:
    sampler = Sampler(frozenset(), V)
    logits = torch.zeros(1, V)
    logits[0, 5] = 2.0
    logits[0, 6] = 1.9
    rep = _req(tokens=[5], repetition_penalty=1.5)  # 5 is in the prompt: 2.0 / 1.5 < 1.9
    assert sampler.sample(logits, [rep]).tokens == [6]
    freq = _req(tokens=[1], frequency_penalty=0.5)
    freq.tokens.append(5)  # one output token: 5 -> 2.0 - 0.5
    assert sampler.sample(logits, [freq]).tokens == [6]
    pres = _req(tokens=[1], presence_penalty=0.05)
    pres.tokens += [5, 5, 5]  # presence counts once: 2.0 - 0.05 > 1.9
    assert sampler.sample(logits, [pres]).tokens == [5]


def test_min_new_tokens_bans_the_end_tokens() -> None:
    sampler = Sampler(frozenset({5}), V)
    logits = torch.zeros(1, V)
    logits[0, 5] = 10.0
    logits[0, 7] = 9.0
    assert sampler.sample(logits, [_req(min_new_tokens=2)]).tokens == [7]
    assert sampler.sample(logits, [_req(min_new_tokens=0)]).tokens == [5]
    logits[0, 7] = 11.0
    assert sampler.sample(logits, [_req(min_new_tokens=2, stop_token_ids=[7], ignore_eos=True)]).tokens == [5]


def test_logprobs_and_top_logprobs() -> None:
    logits = torch.randn(2, V)
    out = Sampler(frozenset(), V).sample(logits, [_req("a", logprobs=True, top_logprobs=3), _req("b", logprobs=True)])
    lp = torch.log_softmax(logits, -1)
    for i in range(2):
        assert abs(out.logprobs[i] - float(lp[i].max())) < 1e-5
    assert out.top_logprobs is not None
    assert [int(t) for t, _ in out.top_logprobs[0]] == lp[0].topk(3).indices.tolist()
    assert out.top_logprobs[1] == []
