"""How far the prompt cache can lift multi_turn's output tokens/s on one GPU: the ratio's ceiling
from a measured on/off run, the workload and the GPU's copy rate.

    python tools/multi_turn_bound.py --result docs/performance/cache-multi-turn.json \
        --copy-gbps 4289 --weights-gb 15.0 --kv-bytes-per-token 131072

Both settings of the run spend time on the same two things: decode steps and the prompt tokens
they compute. The cache removes prompt tokens only. So, with

- D the least decode time any engine could reach: every conversation's turns run one after another
  and a step gives a request one token, so there are at least as many steps as the longest
  conversation's output tokens, each reading the weights; and every output token's step reads its
  context's KV once. D = (steps x weight bytes + KV bytes read) / copy rate;
- c the run's own marginal cost of a prompt token: (off seconds - on seconds) over (tokens the off
  run computed - tokens the on run computed);

on >= D + c x P_on and off ~ D + c x P_off give a ceiling of (D + c P_off) / (D + c P_on) on the
ratio. A slower decode than D (larger D) or a faster prefill (smaller c) only lowers it: the
ceiling is what the cache could reach with every decode step at the copy rate and prefill as fast
as the run measured it. It assumes prefill and decode add up, as in the run (its two settings fit
one overhead per step), not that they overlap.
"""

from __future__ import annotations

import argparse
import json
import sys

from tools.workload import Turn, multi_turn


def decode_reads(convs: list[list[Turn]]) -> tuple[int, int, int]:
    """(the longest conversation's output tokens, the tokens of KV all output tokens' steps read,
    the prompt tokens a cache-less server computes): turn k's prompt is the history plus its user
    message, and its i-th output token's step reads the prompt and the i - 1 tokens before it."""
    longest = kv = prompts = 0
    for conv in convs:
        history = out = 0
        for user, n_out in conv:
            prompt = history + len(user)
            prompts += prompt
            kv += n_out * prompt + n_out * (n_out - 1) // 2
            history = prompt + n_out
            out += n_out
        longest = max(longest, out)
    return longest, kv, prompts


def ceiling(result: dict, copy_gbps: float, weights_gb: float, kv_bytes_per_token: int) -> dict:
    """The ratio's ceiling and its terms, from benchmark_engine's multi_turn result (its
    by_prompt_cache.on and .off runs and the workload's arguments)."""
    a = result["args"]
    convs = multi_turn(a["multi_turn_conversations"], a["multi_turn_turns"], a["multi_turn_max_context"])
    longest, kv_tokens, prompts = decode_reads(convs)
    on, off = (result["by_prompt_cache"][s]["multi_turn"] for s in ("on", "off"))
    if on["prompt_tokens"] != prompts:
        raise ValueError(f"the run's prompt tokens ({on['prompt_tokens']}) are not the workload's ({prompts})")
    computed_on = on["prompt_tokens"] - on["cached_prompt_tokens"]
    computed_off = off["prompt_tokens"] - off["cached_prompt_tokens"]
    per_token_s = (off["seconds"] - on["seconds"]) / (computed_off - computed_on)
    rate = copy_gbps * 1e9
    decode_s = (longest * weights_gb * 1e9 + kv_tokens * kv_bytes_per_token) / rate
    on_floor, off_at_floor = decode_s + per_token_s * computed_on, decode_s + per_token_s * computed_off
    return {
        "longest_conversation_output_tokens": longest,
        "kv_read_tokens": kv_tokens,
        "kv_read_s": kv_tokens * kv_bytes_per_token / rate,
        "weight_read_s": longest * weights_gb * 1e9 / rate,
        "decode_floor_s": decode_s,
        "prompt_tokens_computed": {"on": computed_on, "off": computed_off},
        "prompt_token_cost_us": per_token_s * 1e6,
        "measured_s": {"on": on["seconds"], "off": off["seconds"]},
        "measured_ratio": off["seconds"] / on["seconds"],
        "on_floor_s": on_floor,
        "off_at_decode_floor_s": off_at_floor,
        "ratio_ceiling": off_at_floor / on_floor,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", required=True, help="benchmark_engine.py --parts multi_turn --prompt-cache on,off JSON")
    ap.add_argument("--copy-gbps", type=float, required=True, help="the GPU's measured copy rate, GB/s")
    ap.add_argument("--weights-gb", type=float, required=True, help="bytes a decode step reads of the weights, GB")
    ap.add_argument("--kv-bytes-per-token", type=int, required=True, help="KV bytes of one token, all layers")
    a = ap.parse_args(argv)
    with open(a.result) as f:
        result = json.load(f)
    json.dump(ceiling(result, a.copy_gbps, a.weights_gb, a.kv_bytes_per_token), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
