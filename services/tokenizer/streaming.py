"""Server-sent events that stop, and so abort their generations, when the client goes away."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


def sse(body: dict[str, Any] | str) -> bytes:
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return b"data: " + data.encode() + b"\n\n"


class EventStream(StreamingResponse):
    """A text/event-stream response that listens for the client's disconnect while it streams.

    Starlette does so only for servers of ASGI spec below 2.4; from 2.4 on it notices a
    gone client only when the next write fails, which for a request still queued or
    slow to produce could be long after. Here the body iterator is cancelled at once, and
    on_close runs however the response ends, even when the body never began: it must not
    wait, and it aborts the generations behind the stream.
    """

    def __init__(self, content: Any, on_close: Callable[[], None], headers: dict[str, str] | None = None) -> None:
        self.on_close = on_close
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **(headers or {})}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def run_then_cancel(work: Any) -> None:
                    await work()
                    group.cancel_scope.cancel()

                group.start_soon(run_then_cancel, partial(self.stream_response, send))
                await run_then_cancel(partial(self.listen_for_disconnect, receive))
        finally:
            self.on_close()
