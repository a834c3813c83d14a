"""A running LightStream stack (real processes on a real redis-server) for integration tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tools import make_tiny_model
from tools.redis_server import RedisServer, free_port
from tools.stack import Stack, StackOptions


def start_stack(model_dir: str, redis: RedisServer, log_dir: str, **kw) -> Stack:
    opts = StackOptions(
        model_dir=model_dir,
        redis_url=redis.url,
        port=free_port(),
        namespace="t" + uuid.uuid4().hex[:8],
        log_dir=log_dir,
        **kw,
    )
    stack = Stack(opts).start()
    try:
        stack.wait_ready(timeout_s=120)
    except BaseException:
        stack.stop()
        raise
    return stack


def keyed_stack(request: pytest.FixtureRequest, **kw) -> Iterator[Stack]:
    """The body of a module's stack fixture parametrised by tiny model (request.param): kw go
    to start_stack; the stack knows its model's directory and served name."""
    model_dir = request.getfixturevalue("tiny_models")[request.param]
    log_dir = str(request.getfixturevalue("tmp_path_factory").mktemp(f"logs-{request.param}"))
    s = start_stack(model_dir, request.getfixturevalue("redis_server"), log_dir, **kw)
    s.model_dir = model_dir  # type: ignore[attr-defined]
    s.model_name = os.path.basename(os.path.normpath(s.model_dir))  # type: ignore[attr-defined]
    yield s
    s.stop()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    """One stack per tiny model, shared by a test module."""
    yield from keyed_stack(request)


@pytest.fixture(scope="session")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with room for the benchmark workload's longest requests (input + output
    <= 2048), for the benchmark tools' CI runs."""
    path = str(tmp_path_factory.mktemp("tiny-long"))
    make_tiny_model.main(["--out", path, "--max-positions", "2048"])
    return path
