"""The front end's Prometheus metrics (documented in docs/metrics.md, section "front end").

Per HTTP request on an API route: requests and errors. Per generation (a request with
n > 1 or best_of > 1 runs several): time in the pipeline before its first text, time to
first token, time per output token, whole latency, tokens in (and of them those the prompt
cache held) and out, how it ended.
The registry is the app's own, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.messages import FINISH_REASONS
from shared.metrics import labelled

# routes counted; any other path (health, metrics, unknown) is not an API request
API_ROUTES = (
    "/generate",
    "/generate_stream",
    "/",
    "/v1/models",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class FrontMetrics:
    def __init__(self, model_name: str = "") -> None:
        self.registry = CollectorRegistry()
        self.exposed = labelled(self.registry, model_name)  # every series with its model_name label
        r = self.registry
        self.requests = Counter("lightstream_front_requests", "API requests received", ["route"], registry=r)
        self.errors = Counter(
            "lightstream_front_request_errors",
            "API requests answered with an error status, or whose stream ended with an error event (the status "
            "that error stands for)",
            ["route", "code"],
            registry=r,
        )
        self.queue_time = Histogram(
            "lightstream_front_queue_time_seconds",
            "From handing a generation to the pipeline until its first text item arrives back",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "lightstream_front_time_to_first_token_seconds",
            "From the request reaching its route until the generation's first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "lightstream_front_time_per_output_token_seconds",
            "(end - first token) / (output tokens - 1), per generation with two tokens or more",
            buckets=_TPOT_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "lightstream_front_e2e_request_latency_seconds",
            "From the request reaching its route until the generation ends",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("lightstream_front_prompt_tokens", "Prompt tokens of generations", registry=r)
        self.cached_prompt_tokens = Counter(
            "lightstream_front_cached_prompt_tokens",
            "Prompt tokens of generations that the worker's prompt cache held when they started",
            registry=r,
        )
        self.output_tokens = Counter("lightstream_front_generation_tokens", "Output tokens of generations", registry=r)
        self.generations = Counter(
            "lightstream_front_generations", "Generations ended, by finish reason", ["finish_reason"], registry=r
        )
        self.in_flight = Gauge("lightstream_front_generations_in_flight", "Generations not ended yet", registry=r)
        # every series present from the start, at zero: a rate over a series that appears only with its
        # first event misses that event
        for route in API_ROUTES:
            self.requests.labels(route)
        for reason in FINISH_REASONS:
            if reason:
                self.generations.labels(reason)

    def error(self, route: str, code: int) -> None:
        self.errors.labels(route, str(code)).inc()

    def render(self) -> bytes:
        return generate_latest(self.exposed)


class CountRequests:
    """ASGI middleware: count each API request and each answered with a status of 400 or more.

    A status of 499 (the client went away before the answer) is not an error of the
    service; such generations are counted as finish_reason "abort".
    """

    def __init__(self, app: ASGIApp, metrics: FrontMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in API_ROUTES:
            await self.app(scope, receive, send)
            return
        self.metrics.requests.labels(path).inc()

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if status >= 400 and status != 499:
                    self.metrics.error(path, status)
            await send(message)

        await self.app(scope, receive, counting_send)
