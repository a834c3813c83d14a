"""The front end as one FastChat model worker: the names it serves, its conversation
template, its concurrency slots and the status the controller reads."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

from services.tokenizer.fastchat.conversation import conversation
from services.tokenizer.generation import FrontContext

log = logging.getLogger(__name__)


class Slot:
    """One FastChat request's share of the worker's concurrency; release() may be called on
    every exit path, it gives the slot back once."""

    def __init__(self, slots: Slots) -> None:
        self._slots = slots
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._slots.release()


class Slots:
    """FastChat's limit_worker_concurrency: at most limit requests generate at once, the
    rest wait in arrival order and count in the queue length the controller sees."""

    def __init__(self, limit: int) -> None:
        self._sem = asyncio.Semaphore(limit)
        self.waiting = 0

    async def take(self) -> Slot:
        # cancelled while waiting, the semaphore is not held (asyncio hands a slot given at
        # the same moment on to the next waiter)
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        return Slot(self)

    def release(self) -> None:
        self._sem.release()


class FastChatWorker:
    def __init__(self, ctx: FrontContext) -> None:
        self.ctx = ctx
        cfg = ctx.cfg
        names = [n.strip() for n in cfg.model_names.split(",")] if cfg.model_names else [ctx.model_name]
        self.model_names = list(dict.fromkeys(names))
        self.address = cfg.worker_address or _own_address(cfg.host, cfg.port, cfg.fastchat_controller)
        self.slots = Slots(cfg.limit_worker_concurrency)
        self.conv = conversation(ctx.tok, ctx.model_name)
        log.info("FastChat worker %s for %s, template %s", self.address, self.model_names, self.conv["name"])

    def queue_length(self) -> int:
        """Generations in flight at this front end (any route; queued at the router or running)
        and FastChat requests waiting for a slot."""
        return len(self.ctx.pipeline.pending) + self.slots.waiting

    def status(self) -> dict[str, Any]:
        # speed weighs workers in the controller's lottery dispatch; all LightStream fronts are alike
        return {"model_names": self.model_names, "speed": 1, "queue_length": self.queue_length()}


def _own_address(host: str, port: int, controller: str = "") -> str:
    """The URL FastChat reaches this front end at: its listening address, or where that is every
    address, the one this host sends from towards the controller (on another host, 127.0.0.1
    would be the controller's own loopback)."""
    reachable = host
    if host in ("0.0.0.0", "", "::"):
        reachable = _source_towards(controller) if controller else "127.0.0.1"
    if ":" in reachable:
        reachable = f"[{reachable}]"
    return f"http://{reachable}:{port}"


def _source_towards(url: str) -> str:
    """This host's address on the route to url's host: a UDP socket's connect() only picks the
    route and its source address, nothing is sent. 127.0.0.1 where there is no route yet (the
    controller's name does not resolve): --worker-address then says what to advertise."""
    parts = urlsplit(url)
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(parts.hostname, parts.port or 80, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.connect(addr)
            return s.getsockname()[0]
    except OSError as e:
        log.warning("no route to the FastChat controller %s (%s): advertising 127.0.0.1; set --worker-address", url, e)
        return "127.0.0.1"
