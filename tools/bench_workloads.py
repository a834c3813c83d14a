"""The prompt cache's workloads (tools/workload.py: shared_prefix, multi_turn) as both benchmarks
send them, the engine alone (tools/bench_prefix.py) and the pipeline (tools/serving_turns.py):
their sizes from flags, token ids fitted to the model's vocabulary, a conversation's next
prompt, arrival times and the latency statistics both report.

At the flags' defaults the requests are the fixed workloads, request for request. Smaller
sizes are for runs on the CPU; a vocabulary smaller than Llama 3's (a tiny test model's) gets
the same requests with each id folded into it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from tools.structured_schemas import SCHEMAS
from tools.workload import ID_MARGIN, VOCAB, Turn, multi_turn, random_prompts, shared_prefix, sharegpt_shaped


def add_args(ap: argparse.ArgumentParser) -> None:
    """The workloads' sizes, the same flags for both benchmarks."""
    g = ap.add_argument_group("prompt-cache workloads (tools/workload.py; the defaults are the fixed ones)")
    g.add_argument("--shared-prefix-groups", type=int, default=64)
    g.add_argument("--shared-prefix-per-group", type=int, default=16)
    g.add_argument("--shared-prefix-system", type=int, default=2048, help="tokens of a group's system prompt")
    g.add_argument("--shared-prefix-question", type=int, default=128, help="tokens of each request's own question")
    g.add_argument("--shared-prefix-output", type=int, default=256)
    g.add_argument("--multi-turn-conversations", type=int, default=200)
    g.add_argument("--multi-turn-turns", type=int, default=5)
    g.add_argument("--multi-turn-max-context", type=int, default=4096, help="a conversation ends before passing this")
    g.add_argument("--multi-turn-max-output", type=int, default=0, help="cap on each reply's length; 0: none")
    g.add_argument("--workload-seed", type=int, default=0, help="another seed: other requests of the same shape")


def fit_vocab(ids: list[int], vocab: int) -> list[int]:
    """The ids unchanged in a vocabulary at least Llama 3's; otherwise folded into [low, vocab -
    low), clear of both ends (where special tokens sit), as random_prompts keeps its ids."""
    if vocab >= VOCAB:
        return ids
    low = min(ID_MARGIN, vocab // 4)
    return [low + (i - ID_MARGIN) % (vocab - 2 * low) for i in ids]


def shared_prefix_requests(args: argparse.Namespace, vocab: int) -> list[Turn]:
    reqs = shared_prefix(
        groups=args.shared_prefix_groups,
        per_group=args.shared_prefix_per_group,
        system_len=args.shared_prefix_system,
        question_len=args.shared_prefix_question,
        output_len=args.shared_prefix_output,
        seed=args.workload_seed,
    )
    return [(fit_vocab(ids, vocab), n) for ids, n in reqs]


def conversations(args: argparse.Namespace, vocab: int) -> list[list[Turn]]:
    """The multi-turn workload's conversations that have a turn at all."""
    convs = multi_turn(
        conversations=args.multi_turn_conversations,
        turns=args.multi_turn_turns,
        max_context=args.multi_turn_max_context,
        seed=args.workload_seed,
    )
    cap = args.multi_turn_max_output
    return [[(fit_vocab(ids, vocab), min(n, cap) if cap else n) for ids, n in conv] for conv in convs if conv]


class Conversation:
    """A conversation's turns, sent one after another: turn k's prompt is every user message
    and reply before it, then its own user message."""

    def __init__(self, turns: list[Turn]) -> None:
        self.turns = turns
        self.turn = 0
        self.prompt = list(turns[0][0])

    @property
    def output_len(self) -> int:
        return self.turns[self.turn][1]

    def advance(self, reply: list[int]) -> bool:
        """The reply to the current turn came: -> whether there is a next turn (now current)."""
        self.turn += 1
        if self.turn == len(self.turns):
            return False
        self.prompt = self.prompt + reply + self.turns[self.turn][0]
        return True


def arrival_times(n: int, rate: float, seed: int = 0) -> list[float]:
    """Poisson arrivals at rate requests a second from 0, or all at 0 when the rate is infinite."""
    if rate == float("inf"):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def latency_ms(seconds: list[float]) -> dict[str, float]:
    """Mean, median and p99 in milliseconds."""
    if not seconds:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"mean": 1000 * statistics.fmean(ordered), "median": 1000 * statistics.median(ordered), "p99": 1000 * p99}


def hit_rate(prompt_tokens: int, cached_tokens: int) -> float:
    """Prompt tokens served from the prompt cache, as a share of all prompt tokens."""
    return cached_tokens / prompt_tokens if prompt_tokens else 0.0


def open_loop_requests(args: argparse.Namespace) -> list[tuple[list[int], int]]:
    """(prompt ids, output length) of --workload sharegpt or shared_prefix, in sending order."""
    if args.workload == "shared_prefix":
        reqs = shared_prefix_requests(args, args.vocab)
    else:
        pairs = sharegpt_shaped(args.requests)
        prompts = random_prompts([i for i, _ in pairs], args.vocab, seed=1)
        reqs = [(ids, out_len) for ids, (_, out_len) in zip(prompts, pairs, strict=True)]
    if args.max_output:
        reqs = [(ids, min(n, args.max_output)) for ids, n in reqs]
    if args.output_lens:  # another run's output lengths, request for request
        with open(args.output_lens) as f:
            lens = json.load(f)["per_request_output_tokens"]
        reqs = [(ids, n or out_len) for (ids, out_len), n in zip(reqs, lens, strict=True)]
    return reqs


def schema_of(args: argparse.Namespace, k: int) -> dict | None:
    """--json-schemas: request k's output format, the fixed set's in turn."""
    return SCHEMAS[k % args.json_schemas] if args.json_schemas else None
