"""Sampling: reproducible per seed, independent of batch company; filters and penalties."""

from __future__ import annotations

import torch

from services.worker.request import Req
from services.worker.sampler import LOGPROB_FLOOR, UNIFORM_BITS, Sampler, SampleResult, hashed_uniform, open_unit
from services.worker.sampling_state import SamplingState
from tests.worker.engine_driver import request

V = 50
CPU = torch.device("cpu")


class Bench:
    """A sampler over a SamplingState whose rows are handed out like the request table does."""

    def __init__(self, eos: frozenset[int] = frozenset()) -> None:
        self.state = SamplingState(16, V, CPU)
        self.sampler = Sampler(self.state, eos)
        self.next_row = 0

    def req(self, rid: str = "r", tokens: list[int] | None = None, **params) -> Req:
        r = Req(request(rid, tokens or [1, 2, 3], **params), 0)
        r.row = self.next_row
        self.next_row += 1
        self.state.assign([r])
        return r

    def sample(self, logits: torch.Tensor, reqs: list[Req]) -> SampleResult:
        return self.sampler.sample(logits, self.sampler.batch(reqs, CPU))

    def tokens(self, logits: torch.Tensor, reqs: list[Req]) -> list[int]:
        return self.sample(logits, reqs).tokens.tolist()


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


def test_the_uniform_draws_never_reach_0_or_1() -> None:
    """The largest and smallest hash values stay inside (0, 1) in float32, so the Gumbel noise is
    finite and a masked token (-inf) can never be drawn (24 bits rounded the top one to 1.0)."""
    top = (1 << UNIFORM_BITS) - 1
    u = open_unit(torch.tensor([0, 1, top - 1, top], dtype=torch.int64))
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0 and len(set(u.tolist())) == 4
    noise = -torch.log(-torch.log(u))
    assert bool(torch.isfinite(noise).all())
    assert int(torch.argmax(torch.tensor([0.0, float("-inf")]) + noise[[0, 3]])) == 0


def test_greedy_takes_the_argmax() -> None:
    b = Bench()
    logits = torch.randn(3, V)
    out = b.sample(logits, [b.req(str(i)) for i in range(3)])
    assert out.tokens.tolist() == logits.argmax(-1).tolist()
    assert out.logprobs is None


def test_seeded_draw_does_not_depend_on_the_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    alone = Bench()
    first = alone.tokens(logits[2:3], [alone.req("x", do_sample=True, seed=7)])
    mixed = Bench()
    reqs = [
        mixed.req("a", do_sample=True, seed=1),
        mixed.req("b"),
        mixed.req("x", do_sample=True, seed=7),
        mixed.req("c", do_sample=True),
    ]
    together = mixed.tokens(logits, reqs)
    assert together[2] == first[0]
    assert together[1] == int(logits[1].argmax())


def test_output_position_moves_the_draw_on() -> None:
    b = Bench()
    r = b.req(do_sample=True, seed=3)
    logits = torch.zeros(1, V)  # uniform: successive draws differ
    draws = [b.tokens(logits, [r])[0] for _ in range(20)]
    assert len(set(draws)) > 5
    again = Bench()
    r2 = again.req(do_sample=True, seed=3)
    assert [again.tokens(logits, [r2])[0] for _ in range(20)] == draws


def test_draws_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [1e-9] * (V - 3)]))
    counts = [0, 0, 0]
    for seed in range(2000):
        b = Bench()
        counts[b.tokens(logits, [b.req(do_sample=True, seed=seed)])[0]] += 1
    assert abs(counts[0] / 2000 - 0.7) < 0.04 and abs(counts[2] / 2000 - 0.1) < 0.03


def test_top_k_and_top_p_restrict_the_choice() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (V - 4)]))

    def seen(n: int, **params) -> set[int]:
        out = set()
        for s in range(n):
            b = Bench()
            out.add(b.tokens(logits, [b.req(do_sample=True, seed=s, **params)])[0])
        return out

    assert seen(300, top_k=2) == {0, 1}
    assert seen(300, top_p=0.75) == {0, 1}  # 0.5 + 0.3 covers 0.75
    assert seen(100, top_p=0.4) == {0}
    assert seen(50, temperature=1e-3) == {0}


def test_penalties() -> None:
    logits = torch.zeros(1, V)
    logits[0, 5] = 2.0
    logits[0, 6] = 1.9
    b = Bench()
    assert b.tokens(logits, [b.req(tokens=[5], repetition_penalty=1.5)]) == [6]  # 5 in the prompt: 2.0 / 1.5
    b = Bench()
    freq = b.req(tokens=[1], frequency_penalty=0.5)
    assert b.tokens(logits, [freq]) == [5]  # nothing produced yet
    assert b.tokens(logits, [freq]) == [6]  # 5 was produced once: 2.0 - 0.5 < 1.9
    b = Bench()
    pres = b.req(tokens=[1], presence_penalty=0.05)
    for _ in range(3):
        assert b.tokens(logits, [pres]) == [5]  # presence counts once: 2.0 - 0.05 > 1.9


def test_penalty_history_of_a_resumed_request() -> None:
    """A request that takes a row again (resumed after a pause) brings its output counts along."""
    logits = torch.zeros(1, V)
    logits[0, 5] = 2.0
    logits[0, 6] = 1.9
    b = Bench()
    r = Req(request("r", [1], frequency_penalty=0.5), 0)
    r.tokens += [5]  # one output token so far
    r.row = 3
    b.state.assign([r])
    assert b.tokens(logits, [r]) == [6]


def test_min_new_tokens_bans_the_end_tokens() -> None:
    logits = torch.zeros(1, V)
    logits[0, 5] = 10.0
    logits[0, 7] = 9.0
    b = Bench(eos=frozenset({5}))
    assert b.tokens(logits, [b.req(min_new_tokens=2)]) == [7]
    assert b.tokens(logits, [b.req(min_new_tokens=0)]) == [5]
    logits[0, 7] = 11.0
    assert b.tokens(logits, [b.req(min_new_tokens=2, stop_token_ids=[7], ignore_eos=True)]) == [5]


def test_logprobs_and_top_logprobs() -> None:
    b = Bench()
    logits = torch.randn(2, V)
    out = b.sample(logits, [b.req("a", logprobs=True, top_logprobs=3), b.req("b", logprobs=True)])
    lp = torch.log_softmax(logits, -1)
    assert torch.allclose(out.logprobs, lp.max(-1).values, atol=1e-5)
    assert out.top_ids is not None and out.top_ids[0].tolist() == lp[0].topk(3).indices.tolist()


def test_masked_tokens_report_the_floor_not_minus_infinity() -> None:
    """An output format's mask leaves one token: the chosen token's logprob is 0, and the other
    top_logprobs entries (tokens the mask rules out) are LOGPROB_FLOOR, which JSON can carry."""
    b = Bench()
    logits = torch.full((1, V), float("-inf"))
    logits[0, 4] = 1.5
    out = b.sample(logits, [b.req("a", logprobs=True, top_logprobs=3)])
    assert out.tokens.tolist() == [4]
    assert out.logprobs is not None and out.logprobs.tolist() == [0.0]
    assert out.top_values is not None and out.top_values[0].tolist() == [0.0, LOGPROB_FLOOR, LOGPROB_FLOOR]
    assert out.top_ids is not None and out.top_ids[0, 0].item() == 4


def test_low_precision_logits_give_what_their_float32_copy_gives() -> None:
    """The model hands the sampler logits in its own dtype: a greedy step takes their argmax as
    they are, and every other kind of step works on a float32 copy, so each gives what the
    float32 logits give."""
    torch.manual_seed(3)
    logits = (torch.randn(4, V) * 3).to(torch.bfloat16)
    wide = logits.float()

    def run(x: torch.Tensor) -> SampleResult:
        b = Bench()
        seen = [int(wide[2].argmax())]  # penalised: request p's prompt holds its row's best token
        reqs = [
            b.req("g"),
            b.req("s", do_sample=True, seed=5, temperature=0.7, top_k=10),
            b.req("p", tokens=seen, repetition_penalty=1.3),
            b.req("l", logprobs=True),
        ]
        return b.sample(x, reqs)

    greedy = Bench()
    assert greedy.tokens(logits, [greedy.req(str(i)) for i in range(4)]) == wide.argmax(-1).tolist()
    low, ref = run(logits), run(wide)
    assert torch.equal(low.tokens, ref.tokens)
    assert low.logprobs is not None and low.logprobs.dtype == torch.float32
    assert torch.equal(low.logprobs, ref.logprobs)


def test_logit_bias_moves_the_choice_of_its_request_only() -> None:
    """A bias is added to its request's logits before the choice, greedy or sampled; the
    logprobs stay those of the model's logits (vLLM's default); other rows are untouched."""
    b = Bench()
    torch.manual_seed(3)
    logits = torch.randn(3, V)
    top = logits.argmax(-1).tolist()
    second = logits.topk(2, dim=-1).indices[:, 1].tolist()
    banned = b.req("ban", logit_bias=[[top[0], -100.0]], logprobs=True)
    forced = b.req("force", logit_bias=[[7, 100.0], [top[1], -1.0]], do_sample=True, temperature=0.8, seed=5)
    plain = b.req("plain")
    out = b.sample(logits, [banned, forced, plain])
    assert out.tokens.tolist() == [second[0], 7, top[2]]
    raw = torch.log_softmax(logits[0], -1)[second[0]]
    assert out.logprobs is not None and torch.allclose(out.logprobs[0], raw)
    # a small bias adds to the logit: the second-best passes the best when the bias bridges their gap
    gap = float(logits[2, top[2]] - logits[2, second[2]])
    nudged = b.req("nudge", logit_bias=[[second[2], gap + 0.01]])
    assert b.tokens(logits[2:3], [nudged]) == [second[2]]


def test_min_p_keeps_the_tokens_near_the_likeliest() -> None:
    """min_p 0.5 keeps the tokens of at least half the likeliest one's probability (after the
    temperature): over many seeds every draw is one of them, and without it others come too."""
    b = Bench()
    logits = torch.full((1, V), -2.0)
    logits[0, 3], logits[0, 9], logits[0, 20] = 1.0, 1.0 - 0.5, 1.0 - 0.8  # ratios 1, 0.61, 0.45
    kept, free = set(), set()
    for seed in range(300):
        kept |= set(b.tokens(logits, [b.req("k", do_sample=True, seed=seed, min_p=0.5)]))
        free |= set(b.tokens(logits, [b.req("f", do_sample=True, seed=seed)]))
        b.next_row = 0
    assert kept == {3, 9} and len(free) > 10
    # min_p 1: only the likeliest token is left, as greedy takes it
    assert b.tokens(logits, [b.req("one", do_sample=True, seed=1, min_p=1.0)]) == [3]


def test_allowed_token_ids_hold_the_choice_to_them() -> None:
    """A row with allowed_token_ids takes the best of them (greedy) or draws among them only;
    the row beside it is free."""
    b = Bench()
    torch.manual_seed(5)
    logits = torch.randn(2, V)
    allowed = [4, 11, 30]
    best = max(allowed, key=lambda t: float(logits[0, t]))
    held, free = b.req("held", allowed_token_ids=allowed), b.req("free")
    assert b.tokens(logits, [held, free]) == [best, int(logits[1].argmax())]
    drawn = set()
    for seed in range(200):
        drawn |= set(b.tokens(logits[:1], [b.req("s", do_sample=True, seed=seed, allowed_token_ids=allowed)]))
        b.next_row = 2
    assert drawn == set(allowed)


def test_ids_past_the_vocabulary_are_left_out() -> None:
    """The fronts refuse them; a request that has them anyway is sampled as if they were not there."""
    b = Bench()
    logits = torch.randn(1, V)
    r = b.req("r", logit_bias=[[V + 3, 50.0]], allowed_token_ids=[V, V + 1])
    assert b.tokens(logits, [r]) == [int(logits.argmax())]
