"""Where a lone request's first token spends its time between the services.

    python tools/trace_lowload.py --out FILE.json [--device cpu|cuda] [--requests 12]
        [--redis-server PATH] [--work-dir DIR]

Starts redis-server and the stack (tools/stack.py; on cuda the Llama-3-8B-shaped random
model, on cpu the tiny model), then streams the workload's first prompts through
/v1/completions one at a time while Redis's MONITOR records when each stream message is
appended or acknowledged. For each request it reports the hops of its first token, in ms:
  front_in     client sends -> the front end appends the request for the router
  router       -> the router appends the admission for the worker
  worker_read  -> the worker acknowledges it (it has the request)
  worker_step  -> the worker appends the first token for the detokenizer (its prefill step)
  detok        -> the detokenizer appends the text for the front end
  front_read   -> the front end acknowledges the text
  front_out    -> the client has the first chunk (can be negative: the front end acknowledges
                  after handing the text on, so the client may have it first)
and the medians. MONITOR costs Redis time: the figures are for finding a slow hop, not for
quoting end-to-end latency (tools/benchmark_serving.py does that).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import httpx
import redis

from tools import make_bench_model, make_tiny_model
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions
from tools.workload import random_prompts, sharegpt_shaped

HOPS = ["front_in", "router", "worker_read", "worker_step", "detok", "front_read", "front_out"]
CUDA_WORKER_ARGS = ["--device", "cuda", "--random-weights", "true", "--running-max-req-size", "2048"]


class Monitor:
    """Redis's MONITOR in a thread: (unix time, command) of every XADD and XACK."""

    def __init__(self, url: str) -> None:
        self.events: list[tuple[float, list[str]]] = []
        self._client = redis.Redis.from_url(url)
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        self._ready.wait(5.0)

    def _run(self) -> None:
        try:
            with self._client.monitor() as m:
                self._ready.set()
                for e in m.listen():
                    command = e["command"]
                    if command.startswith(("XADD", "XACK")):
                        self.events.append((e["time"], command.split(" ", 3)))
        except redis.ConnectionError:
            return  # the server stopped: the trace is over


def hops(events: list[tuple[float, list[str]]], sent: float, first: float) -> dict[str, float]:
    """A lone request's hop times (ms) from the commands between its sending and its first chunk."""

    def after(t0: float, verb: str, stream_part: str, payload: str = "") -> float:
        for t, words in events:
            if t >= t0 and words[0] == verb and stream_part in words[1] and payload in " ".join(words[2:]):
                return t
        return math.nan

    gen = after(sent, "XADD", ":router", "gen")
    admit = after(gen, "XADD", ":worker:")
    took = after(admit, "XACK", ":worker:")
    tokens = after(took, "XADD", ":detok:", "tokens")
    text = after(tokens, "XADD", ":front:")
    read = after(text, "XACK", ":front:")
    stamps = [sent, gen, admit, took, tokens, text, read, first]
    out = {name: 1000 * (b - a) for name, a, b in zip(HOPS, stamps[:-1], stamps[1:], strict=True)}
    out["ttft"] = 1000 * (first - sent)
    return out


def first_chunk(client: httpx.Client, url: str, model: str, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
    }
    sent, first = time.time(), math.nan
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and math.isnan(first):
                first = time.time()
    return sent, first


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--work-dir", default="/tmp/lightstream-trace")
    ap.add_argument("--model-dir", default="", help="a model to serve instead of the default for --device")
    args = ap.parse_args(argv)
    model_dir = args.model_dir or os.path.join(args.work_dir, "model")
    if not args.model_dir and args.device == "cuda":
        make_bench_model.main(["--out", model_dir])
    elif not args.model_dir:
        make_tiny_model.main(["--out", model_dir, "--max-positions", "2048"])
    worker_args = CUDA_WORKER_ARGS if args.device == "cuda" else []
    server = RedisServer(binary=args.redis_server).start()
    stack = Stack(
        StackOptions(
            model_dir=model_dir,
            redis_url=server.url,
            port=free_port(),
            log_dir=os.path.join(args.work_dir, "logs"),
            worker_args=worker_args,
        )
    )
    rows = []
    try:
        stack.start()
        stack.wait_ready(timeout_s=600)
        with httpx.Client(timeout=120) as client:
            card = client.get(stack.url + "/v1/models").json()["data"][0]
            pairs = sharegpt_shaped(args.requests)
            prompts = random_prompts([i for i, _ in pairs], _vocab(model_dir), seed=1)
            for ids in prompts[:4]:  # warm up
                first_chunk(client, stack.url, card["id"], ids, 4)
            time.sleep(0.2)
            monitor = Monitor(server.url)
            for ids in prompts:
                sent, first = first_chunk(client, stack.url, card["id"], ids, 3)
                time.sleep(0.2)  # the request's last messages, then nothing: the next one is alone
                rows.append({"input": len(ids), **hops(list(monitor.events), sent, first)})
    finally:
        stack.stop()
        server.stop()
    keys = [*HOPS, "ttft"]
    median = {k: statistics.median([r[k] for r in rows if not math.isnan(r[k])] or [math.nan]) for k in keys}
    result = {"device": args.device, "rows": rows, "median_ms": median}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: round(v, 3) for k, v in median.items()}), flush=True)
    return result


def _vocab(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


if __name__ == "__main__":
    main()
