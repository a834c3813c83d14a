"""Benchmark a running LightStream the way vLLM, SGLang and LightLLM benchmark serving.

    python tools/benchmark_serving.py --url http://127.0.0.1:8000 --out FILE.json
        [--workload sharegpt|shared_prefix|multi_turn] [--requests 2000] [--request-rate inf|R]
        [--max-concurrency N] [--vocab 128256] [--plot FILE.png --rates 4,16,32] [--tokenizer DIR]
        [--images-per-request 1 --image-size 448 --tokenizer DIR]

A fixed workload of tools/workload.py as token-id prompts, max_tokens = its output lengths,
ignore_eos, greedy, streamed through POST /v1/completions (with --json-schemas N, each under a
JSON schema of tools/structured_schemas.py, ignore_eos off; --output-lens takes another run's
output lengths as max_tokens, so an unconstrained run writes as many tokens):
  sharegpt       the ShareGPT-shaped one: the first --requests, random ids at its input lengths
  shared_prefix  groups of requests sharing a system prompt (sizes: --shared-prefix-groups, ...)
  multi_turn     conversations, closed loop: each sends its next turn, the history holding the
                 server's output token ids, when the turn before it has finished, all of them
                 at once (tools/serving_turns.py; --tokenizer DIR, the served model's, reads the
                 ids back from the logprobs)
Arrivals of the first two are Poisson at --request-rate, or all at once (inf). Reports
requests/s, input, output and total tokens/s, and TTFT, TPOT ((E2E - TTFT) / (output tokens -
1)), ITL (every gap between streamed chunks, pooled) and end-to-end latency, each as mean,
median and p99, in milliseconds, and the prompt cache's hit rate when the usage carries
prompt_tokens_details.cached_tokens. With --plot and --rates it runs each rate in turn and
draws latency against request rate. --images-per-request sends sharegpt's requests as streamed
chats through POST /v1/chat/completions, each with its own synthetic images (tools/bench_images.py).

The client (--client) is tools/http_stream.py on uvloop by default: each request's clock
starts as its bytes go out, and the client's own Python between the wire and the clock is
small. --client aiohttp measures with aiohttp on asyncio's loop, as vLLM's client does;
at low load its own time adds about 0.4 ms to each TTFT on the H200 host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aiohttp
from tqdm import tqdm

from tools import bench_images, bench_workloads
from tools.bench_workloads import arrival_times, hit_rate, latency_ms
from tools.http_stream import HTTPStreamError, StreamClient
from tools.serving_turns import LabelIndex, run_conversations
from tools.structured_schemas import SCHEMAS

JSON = {"content-type": "application/json"}


@dataclass
class Outcome:
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0  # seconds
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    cached_tokens: int | None = None  # the usage's prompt_tokens_details.cached_tokens, when there
    labels: list[str] = field(default_factory=list)  # the output tokens' logprob labels, when asked for


def request_body(
    model: str, prompt: list[int], max_tokens: int, logprobs: bool = False, schema: dict | None = None
) -> bytes:
    body: dict = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": schema is None,  # a grammar ends its output itself
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if logprobs:  # the chosen tokens' labels, to read the output ids back (multi_turn)
        body["logprobs"] = 0
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}
    return json.dumps(body).encode()


async def consume(lines: AsyncIterator[bytes], out: Outcome, start: float) -> None:
    """Read a completion's server-sent events: the first chunk's time, every gap after it,
    the usage at the end."""
    last = start
    async for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            out.e2e = time.perf_counter() - start
            continue  # read on to the body's end, so its connection is kept for the next request
        chunk = json.loads(data)
        if chunk.get("usage"):
            out.output_tokens = chunk["usage"]["completion_tokens"]
            out.cached_tokens = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
        if not chunk.get("choices"):
            continue  # the usage-only chunk at the end
        if lp := chunk["choices"][0].get("logprobs"):
            out.labels += lp["tokens"]
        # every chunk with a choice is one step's tokens, text or not (held-back bytes)
        now = time.perf_counter()
        if out.ttft == 0.0:
            out.ttft = now - start
        else:
            out.itl.append(now - last)
        last = now
    if not out.e2e:
        out.e2e = time.perf_counter() - start
    out.ok = out.output_tokens > 0
    if not out.ok:
        out.error = "no usage in the stream"


async def lean_request(
    client: StreamClient, body: bytes, out: Outcome, timeout_s: float, path: str = "/v1/completions"
) -> Outcome:
    """One streamed completion through tools/http_stream.py. The clock starts just before the
    request is written (a new connection's set-up counts, as it does with aiohttp)."""
    try:
        async with asyncio.timeout(timeout_s):
            start = time.perf_counter()
            async with client.request("POST", path, body) as resp:
                if resp.status != 200:
                    out.error = f"HTTP {resp.status}: {(await resp.read())[:200].decode(errors='replace')}"
                    return out
                await consume(resp.lines(), out, start)
    except (TimeoutError, HTTPStreamError) as e:
        out.error = repr(e)
    return out


async def aiohttp_request(
    session: aiohttp.ClientSession, url: str, body: bytes, out: Outcome, path: str = "/v1/completions"
) -> Outcome:
    """The same through aiohttp, as vLLM's benchmark client makes it."""
    start = time.perf_counter()
    try:
        async with session.post(url + path, data=body, headers=JSON) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return out
            await consume(resp.content, out, start)
    except (TimeoutError, aiohttp.ClientError) as e:
        out.error = repr(e)
    return out


async def run(args: argparse.Namespace, rate: float) -> dict:
    reqs = bench_workloads.open_loop_requests(args)
    arrivals = arrival_times(len(reqs), rate)
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    bar = tqdm(total=len(reqs), desc=f"rate {rate}", disable=args.quiet)
    async with _client(args) as send:
        model = args.model or await send.model_name()
        if args.images_per_request:
            bodies, send.path = bench_images.chat_bodies(args, model, reqs), "/v1/chat/completions"
        else:
            bodies = [
                request_body(model, p, n, schema=bench_workloads.schema_of(args, k)) for k, (p, n) in enumerate(reqs)
            ]
        begin = time.perf_counter()

        async def scheduled(k: int) -> Outcome:
            delay = arrivals[k] - (time.perf_counter() - begin)
            if delay > 0:
                await asyncio.sleep(delay)
            out = Outcome(prompt_tokens=len(reqs[k][0]))
            if limit is None:
                res = await send(bodies[k], out)
            else:
                async with limit:
                    res = await send(bodies[k], out)
            bar.update(1)
            return res

        outcomes = await asyncio.gather(*(scheduled(k) for k in range(len(reqs))))
        duration = time.perf_counter() - begin
    bar.close()
    res = {
        "client": args.client,
        "workload": args.workload,
        "images_per_request": args.images_per_request,
        **summarize(outcomes, duration, rate, args.max_concurrency),
    }
    if isinstance(send, _Lean):
        res["connections_opened"] = send.client.connections_opened
    if args.per_request:  # in the workload's order; None for a request that failed
        res["per_request_ttft_ms"] = [1000 * o.ttft if o.ok else None for o in outcomes]
        res["per_request_output_tokens"] = [o.output_tokens if o.ok else None for o in outcomes]
    return res


class _Lean:
    def __init__(self, args: argparse.Namespace) -> None:
        self.client = StreamClient(args.url)
        self.timeout_s = args.timeout_s
        self.path = "/v1/completions"

    async def __call__(self, body: bytes, out: Outcome) -> Outcome:
        return await lean_request(self.client, body, out, self.timeout_s, self.path)

    async def model_name(self) -> str:
        async with self.client.request("GET", "/v1/models") as resp:
            return json.loads(await resp.read())["data"][0]["id"]


class _Aiohttp:
    def __init__(self, args: argparse.Namespace, session: aiohttp.ClientSession) -> None:
        self.session = session
        self.url = args.url
        self.path = "/v1/completions"

    async def __call__(self, body: bytes, out: Outcome) -> Outcome:
        return await aiohttp_request(self.session, self.url, body, out, self.path)

    async def model_name(self) -> str:
        async with self.session.get(self.url + "/v1/models") as resp:
            return (await resp.json())["data"][0]["id"]


@asynccontextmanager
async def _client(args: argparse.Namespace):
    """A callable that sends one request body and fills its Outcome, with --client's library."""
    if args.client == "lean":
        lean = _Lean(args)
        try:
            yield lean
        finally:
            await lean.client.close()
        return
    timeout = aiohttp.ClientTimeout(total=args.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        yield _Aiohttp(args, session)


def summarize(outcomes: list[Outcome], duration: float, rate: float, concurrency: int) -> dict:
    done = [o for o in outcomes if o.ok]
    out_tokens = sum(o.output_tokens for o in done)
    in_tokens = sum(o.prompt_tokens for o in done)
    tpot = [(o.e2e - o.ttft) / (o.output_tokens - 1) for o in done if o.output_tokens > 1]
    return {
        "request_rate": "inf" if rate == float("inf") else rate,
        "max_concurrency": concurrency or None,
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "errors": sorted({o.error for o in outcomes if not o.ok})[:5],
        "duration_s": duration,
        "req_per_s": len(done) / duration,
        "input_tok_per_s": in_tokens / duration,
        "output_tok_per_s": out_tokens / duration,
        "total_tok_per_s": (in_tokens + out_tokens) / duration,
        "ttft_ms": latency_ms([o.ttft for o in done]),
        "tpot_ms": latency_ms(tpot),
        "itl_ms": latency_ms([gap for o in done for gap in o.itl]),
        "e2e_ms": latency_ms([o.e2e for o in done]),
        **cache_hits(done),
    }


def cache_hits(done: list[Outcome]) -> dict:
    """The prompt cache's hit rate over the requests whose usage said how many prompt tokens it
    served (none: the server does not report it)."""
    told = [o for o in done if o.cached_tokens is not None]
    if not told:
        return {"hit_rate": None}
    prompt, cached = sum(o.prompt_tokens for o in told), sum(o.cached_tokens or 0 for o in told)
    return {"hit_rate": hit_rate(prompt, cached), "cached_prompt_tokens": cached, "hit_rate_requests": len(told)}


async def run_multi_turn(args: argparse.Namespace) -> dict:
    """--workload multi_turn: every conversation at once, each turn sent when the one before it ends."""
    index = LabelIndex(args.tokenizer)
    bar = tqdm(desc="turns", disable=args.quiet)
    async with _client(args) as client:
        model = args.model or await client.model_name()

        async def send(prompt: list[int], out_len: int) -> Outcome:
            return await client(request_body(model, prompt, out_len, logprobs=True), Outcome(prompt_tokens=len(prompt)))

        got = await run_conversations(args, send, index, lambda: bar.update(1))
    bar.close()
    res = {"client": args.client, "workload": "multi_turn", **summarize(got["outcomes"], got["duration"], 0.0, 0)}
    res.update(request_rate="closed loop", conversations=got["conversations"], turns=got["turns"])
    res.update(ambiguous_tokens=index.ambiguous, unknown_labels=index.unknown)
    return res


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [r["request_rate"] for r in results]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for metric, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
        ax.plot(rates, [r[metric]["median"] for r in results], marker="o", label=f"median {label}")
        ax.plot(rates, [r[metric]["p99"] for r in results], marker="x", linestyle="--", label=f"p99 {label}")
    ax.set_xlabel("request rate (requests/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("LightStream latency against request rate")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--rates", default="", help="comma-separated rates to run in turn (with --plot)")
    ap.add_argument("--plot", default="", help="PNG of latency against request rate")
    ap.add_argument("--max-concurrency", type=int, default=0, help="at most this many requests in flight; 0: no bound")
    ap.add_argument("--vocab", type=int, default=128256, help="prompt token ids are drawn below this")
    ap.add_argument("--model", default="", help="model name to send; default: the first of GET /v1/models")
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument(
        "--client",
        choices=("lean", "aiohttp"),
        default="lean",
        help="lean: tools/http_stream.py on uvloop; aiohttp: aiohttp on asyncio's loop, as vLLM's client",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--per-request", action="store_true", help="each request's TTFT and output tokens, in order")
    ap.add_argument(
        "--json-schemas",
        type=int,
        default=0,
        help="request k asks for JSON under tools/structured_schemas.py's schema k mod N (1..10), ignore_eos off",
    )
    ap.add_argument("--max-output", type=int, default=0, help="cap on each request's output length; 0: none")
    ap.add_argument("--output-lens", default="", help="a --per-request JSON: its output lengths as max_tokens")
    ap.add_argument("--workload", choices=("sharegpt", "shared_prefix", "multi_turn"), default="sharegpt")
    ap.add_argument("--tokenizer", default="", help="multi_turn: the served model's directory, to read output ids back")
    bench_workloads.add_args(ap)
    bench_images.add_args(ap)
    args = ap.parse_args(argv)
    if not 0 <= args.json_schemas <= len(SCHEMAS):
        ap.error(f"--json-schemas {args.json_schemas}: 0 to {len(SCHEMAS)}")
    if args.workload == "multi_turn" and (args.json_schemas or args.output_lens):
        ap.error("--json-schemas and --output-lens are for the open-loop workloads")
    if args.images_per_request and (args.workload != "sharegpt" or not args.tokenizer):
        ap.error("--images-per-request: the sharegpt workload, with --tokenizer DIR (the served model's directory)")
    if args.workload == "multi_turn" and not args.tokenizer:
        ap.error("--workload multi_turn needs --tokenizer DIR (the served model's directory)")
    if args.workload == "multi_turn" and (args.rates or args.request_rate != float("inf")):
        ap.error("--workload multi_turn sends each turn when the last has finished: no --rates or --request-rate")
    return args


def _run_loop(client: str):
    if client == "lean":
        try:
            import uvloop

            return uvloop.run
        except ImportError:
            pass
    return asyncio.run


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")] if args.rates else [args.request_rate]
    results = []
    for rate in rates:
        res = _run_loop(args.client)(run_multi_turn(args) if args.workload == "multi_turn" else run(args, rate))
        results.append(res)
        print(json.dumps(res), flush=True)
    with open(args.out, "w") as f:
        json.dump(results if len(results) > 1 else results[0], f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return results


if __name__ == "__main__":
    main()
