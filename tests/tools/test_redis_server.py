"""tools/redis_server.py's password: clients without it are refused, its URL carries it, and it
is on no command line (which every user of the host can read)."""

from __future__ import annotations

import pytest
import redis

from tools.redis_server import RedisServer


def test_a_password_is_asked_for_and_kept_off_the_command_line() -> None:
    with RedisServer(password="pw-43") as server:
        assert server.url == f"redis://:pw-43@127.0.0.1:{server.port}/0"
        assert redis.Redis.from_url(server.url).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()
        assert server.proc is not None
        with open(f"/proc/{server.proc.pid}/cmdline", "rb") as f:
            assert b"pw-43" not in f.read()
        server.kill()
        server.start()  # restarted (lightstream serve's supervisor), still with its password
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port).ping()


def test_a_password_that_the_config_file_cannot_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="without quotes"):
        RedisServer(password='a"b')
