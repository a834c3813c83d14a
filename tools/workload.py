"""The fixed benchmark workloads, drawn from Python's own random.Random so that every machine and
Python version makes the same requests.

sharegpt_shaped  (input_len, output_len) pairs with no prefix shared between requests: every
                 throughput figure in docs/performance.md runs its first n pairs.
shared_prefix    token-id prompts in groups that share a long system prompt, for the prompt cache.
multi_turn       conversations whose every turn resends the whole history, the model's own
                 earlier outputs included, for the prompt cache.

No ShareGPT file is at hand, so lengths come from log-normals fitted to its published shape
(mean input about 224 tokens, mean output about 196) and kept by vLLM's filter: input and output
at least 4 tokens, input at most 1024, the two together at most 2048. These are the workloads of
../shared/bench/workload.py, request for request (tests/tools/test_workload.py compares them).
"""

from __future__ import annotations

import math
import random

# log-normal (median, sigma) of a ShareGPT-shaped turn's user message and reply, in tokens
INPUT_LOGNORMAL = (165.0, 1.0)
OUTPUT_LOGNORMAL = (125.0, 0.95)
MIN_LEN, MAX_INPUT, MAX_TOTAL = 4, 1024, 2048
VOCAB = 128_256  # Llama 3's
ID_MARGIN = 1000  # token ids stay this far from both ends of the vocabulary, where special tokens sit

Turn = tuple[list[int], int]  # (prompt or user-message token ids, output_len)


def _lengths(rng: random.Random) -> tuple[int, int]:
    """One (user message, reply) length pair, unfiltered; the input is always drawn first."""
    (mi, si), (mo, so) = INPUT_LOGNORMAL, OUTPUT_LOGNORMAL
    return round(rng.lognormvariate(math.log(mi), si)), round(rng.lognormvariate(math.log(mo), so))


def _token_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(ID_MARGIN, vocab - ID_MARGIN) for _ in range(n)]


def sharegpt_shaped(n: int, seed: int = 0) -> list[tuple[int, int]]:
    """The first n (input_len, output_len) pairs that pass the filter, drawn with this seed."""
    rng = random.Random(seed)
    pairs: list[tuple[int, int]] = []
    while len(pairs) < n:
        i, o = _lengths(rng)
        if MIN_LEN <= i <= MAX_INPUT and o >= MIN_LEN and i + o <= MAX_TOTAL:
            pairs.append((i, o))
    return pairs


def shared_prefix(
    groups: int = 64,
    per_group: int = 16,
    system_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
    vocab: int = VOCAB,
    seed: int = 0,
) -> list[Turn]:
    """groups x per_group (prompt_ids, output_len): a group's prompts share their first system_len
    tokens, then each has question_len of its own. Shuffled, so a group's requests arrive spread
    out rather than back to back."""
    rng = random.Random(seed)
    reqs: list[Turn] = []
    for _ in range(groups):
        system = _token_ids(rng, system_len, vocab)
        reqs.extend((system + _token_ids(rng, question_len, vocab), output_len) for _ in range(per_group))
    rng.shuffle(reqs)
    return reqs


def multi_turn(
    conversations: int = 200, turns: int = 5, max_context: int = 4096, vocab: int = VOCAB, seed: int = 0
) -> list[list[Turn]]:
    """One list of (user_ids, output_len) turns per conversation. Turn k's prompt is
    user_1 + out_1 + ... + user_k, with out_i the tokens the server generated for turn i, so turn
    k + 1 is sent only once turn k has finished (with ignore_eos, len(out_i) == output_len).
    Lengths come from sharegpt_shaped's log-normals, each clamped to [4, 1024]; a conversation
    ends early rather than pass max_context tokens."""
    rng = random.Random(seed)
    convs: list[list[Turn]] = []
    for _ in range(conversations):
        conv: list[Turn] = []
        context = 0
        for _ in range(turns):
            u, o = (min(MAX_INPUT, max(MIN_LEN, x)) for x in _lengths(rng))
            if context + u + o > max_context:
                break
            conv.append((_token_ids(rng, u, vocab), o))
            context += u + o
        convs.append(conv)
    return convs


def random_prompts(lengths: list[int], vocab: int, seed: int = 1) -> list[list[int]]:
    """Token ids drawn uniformly from [min(1000, vocab // 4), min(100000, vocab)), like the peer's prompts."""
    rng = random.Random(seed)
    low, high = min(1000, vocab // 4), min(100_000, vocab)
    return [[rng.randrange(low, high) for _ in range(n)] for n in lengths]


if __name__ == "__main__":
    w = sharegpt_shaped(2000)
    mean_in, mean_out = sum(i for i, _ in w) / len(w), sum(o for _, o in w) / len(w)
    print(f"{len(w)} requests, mean input {mean_in:.1f}, mean output {mean_out:.1f}")
