"""Registration with a FastChat controller, so that its API server sends requests here.

As FastChat's own workers do (fastchat/serve/base_model_worker.py): register with the
worker's status, then a heartbeat every 45 s with the queue length; the controller drops a
worker whose last heartbeat is 90 s old, and answers a heartbeat from a worker it does not
know (it restarted, or dropped it) with exist: false, on which the worker registers again.
Unlike theirs, this waits until the pipeline can serve before registering, and a
controller that is down is retried every few seconds, not an error that stops the worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx

from services.tokenizer.fastchat.worker import FastChatWorker

log = logging.getLogger(__name__)

RETRY_S = 5.0  # FastChat's workers retry a failed heartbeat after 5 s
READY_POLL_S = 0.5


class ControllerLink:
    def __init__(
        self,
        controller: str,
        worker_address: str,
        status: Callable[[], dict[str, Any]],
        ready: Callable[[], bool],
        interval_s: float,
        retry_s: float = RETRY_S,
        transport: httpx.AsyncBaseTransport | None = None,  # tests put a stub controller here
    ) -> None:
        self.controller = controller.rstrip("/")
        self.worker_address = worker_address
        self.status = status
        self.ready = ready
        self.interval_s = interval_s
        self.retry_s = retry_s
        self.transport = transport

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=5.0, transport=self.transport) as http:
            while not self.ready():
                await asyncio.sleep(READY_POLL_S)
            known = False
            while True:
                if not known:
                    known = await self._register(http)
                    delay = self.interval_s if known else self.retry_s
                else:
                    exist = await self._heart_beat(http)
                    if exist is None:  # no answer: ask again soon, as FastChat's workers do
                        delay = self.retry_s
                    else:
                        known, delay = exist, self.interval_s if exist else 0.0
                        if not exist:
                            log.warning("the FastChat controller does not know this worker: registering again")
                await asyncio.sleep(delay)

    async def _register(self, http: httpx.AsyncClient) -> bool:
        body = {
            "worker_name": self.worker_address,
            "check_heart_beat": True,
            "worker_status": self.status(),
            "multimodal": False,
        }
        try:
            r = await http.post(self.controller + "/register_worker", json=body)
            r.raise_for_status()
        except httpx.HTTPError as e:
            log.warning("registering with the FastChat controller %s failed: %s", self.controller, e)
            return False
        log.info("registered with the FastChat controller %s as %s", self.controller, self.worker_address)
        return True

    async def _heart_beat(self, http: httpx.AsyncClient) -> bool | None:
        """Whether the controller knows this worker; None when it did not answer."""
        body = {"worker_name": self.worker_address, "queue_length": self.status()["queue_length"]}
        try:
            r = await http.post(self.controller + "/receive_heart_beat", json=body)
            r.raise_for_status()
            return bool(r.json()["exist"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            log.warning("heartbeat to the FastChat controller %s failed: %s", self.controller, e)
            return None


def start_registration(worker: FastChatWorker) -> asyncio.Task | None:
    """The registration task, if the front end was given a controller; cancel it to stop."""
    cfg = worker.ctx.cfg
    if not cfg.fastchat_controller:
        return None
    link = ControllerLink(
        cfg.fastchat_controller,
        worker.address,
        worker.status,
        lambda: worker.ctx.pipeline.live.ready,
        cfg.fastchat_heartbeat_s,
    )
    task = asyncio.create_task(link.run(), name="fastchat-registration")
    task.add_done_callback(_log_end)
    return task


def _log_end(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("FastChat registration stopped", exc_info=task.exception())
