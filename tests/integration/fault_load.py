"""The fault suite's load: concurrent clients sending greedy requests while a test breaks the
stack, each request classified as completed, ended by an explicit error, or lost (no answer
within the bound). Greedy requests have one right answer, so a completed one is checked
against the text an unbroken stack gave for the same prompt."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

import httpx

COMPLETED = "completed"
ERROR = "error"
LOST = "lost"


@dataclass(frozen=True)
class Outcome:
    prompt: str
    kind: str  # COMPLETED, ERROR or LOST
    sent: float  # monotonic
    ended: float
    status: int = 0  # the HTTP status; 0 when none came
    text: str = ""
    error: str = ""


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(o.kind == kind for o in self.outcomes)

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    def summary(self, name: str) -> str:
        return (
            f"{name}: {len(self.outcomes)} requests, {self.count(COMPLETED)} completed, "
            f"{self.count(ERROR)} explicit errors, {self.count(LOST)} lost"
        )

    def slow_to_end(self, fault: float, within_s: float) -> list[Outcome]:
        """Requests that ended more than within_s after the fault (or after they were sent, if later)."""
        return [o for o in self.outcomes if o.ended - max(o.sent, fault) > within_s]

    def wrong_texts(self, reference: dict[str, str]) -> list[Outcome]:
        """Completed requests whose text is not the one an unbroken stack gave."""
        return [o for o in self.of(COMPLETED) if o.text != reference[o.prompt]]


def prompts(n: int) -> list[str]:
    return [f"Request {i} tells the story of the river and the {i % 7} bridges" for i in range(n)]


async def one(client: httpx.AsyncClient, prompt: str, max_new: int, bound_s: float) -> Outcome:
    """POST /generate (greedy, ignore_eos); LOST when no answer came within bound_s."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new, "ignore_eos": True}}
    sent = time.monotonic()
    try:
        r = await asyncio.wait_for(client.post("/generate", json=body), bound_s)
    except (TimeoutError, httpx.TimeoutException):
        return Outcome(prompt, LOST, sent, time.monotonic())
    except httpx.TransportError as e:  # the connection closed under it: no answer, but no hang either
        return Outcome(prompt, ERROR, sent, time.monotonic(), error=f"{type(e).__name__}: {e}")
    ended = time.monotonic()
    data = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    if r.status_code == 200 and data.get("count_output_tokens") == max_new:
        return Outcome(prompt, COMPLETED, sent, ended, 200, text=data["generated_text"][0])
    return Outcome(prompt, ERROR, sent, ended, r.status_code, error=str(data.get("error", r.text))[:300])


async def reference_texts(url: str, texts: list[str], max_new: int) -> dict[str, str]:
    """Each prompt's text from the stack before anything breaks."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        outs = await asyncio.gather(*(one(client, p, max_new, 60) for p in texts))
    assert all(o.kind == COMPLETED for o in outs), [o for o in outs if o.kind != COMPLETED]
    return {o.prompt: o.text for o in outs}


class Load:
    """``clients`` concurrent clients, each sending the prompts in turn, one request after the
    other, until stop(); every request's outcome is kept."""

    def __init__(self, url: str, texts: list[str], clients: int, max_new: int, bound_s: float) -> None:
        self.url = url
        self.texts = texts
        self.clients = clients
        self.max_new = max_new
        self.bound_s = bound_s
        self.tally = Tally()
        self._stop = asyncio.Event()
        self._next = itertools.cycle(texts)
        self._tasks: list[asyncio.Task[None]] = []
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Load:
        limits = httpx.Limits(max_connections=self.clients, max_keepalive_connections=self.clients)
        self._client = httpx.AsyncClient(base_url=self.url, timeout=self.bound_s + 5, limits=limits)
        self._tasks = [asyncio.create_task(self._client_loop()) for _ in range(self.clients)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        assert self._client is not None
        await self._client.aclose()

    async def _client_loop(self) -> None:
        assert self._client is not None
        while not self._stop.is_set():
            self.tally.outcomes.append(await one(self._client, next(self._next), self.max_new, self.bound_s))
            if self.tally.outcomes[-1].kind != COMPLETED:
                await asyncio.sleep(0.2)  # as a client told to retry would

    async def completed_since(self, t: float, n: int, timeout_s: float) -> None:
        """Until n requests sent after t have completed."""
        end = time.monotonic() + timeout_s
        while sum(o.kind == COMPLETED and o.sent >= t for o in self.tally.outcomes) < n:
            assert time.monotonic() < end, f"fewer than {n} requests completed within {timeout_s}s"
            await asyncio.sleep(0.1)
