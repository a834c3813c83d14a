"""One compose stack for the operations tests: compose.yaml's services as local processes,
scaled to two of each service that scales (worker groups, detokenizer shards, front ends),
shared by every test module here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ops.compose_local import LocalCompose


@pytest.fixture(scope="package")
def compose_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCompose]:
    stack = LocalCompose(str(tmp_path_factory.mktemp("compose")), scale={"worker": 2, "detokenizer": 2, "tokenizer": 2})
    try:
        stack.start()
    except BaseException:
        stack.stop()
        raise
    yield stack
    stack.stop()
