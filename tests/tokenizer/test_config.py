"""API keys in the front end's config: a repeatable flag, a comma-separated variable."""

from __future__ import annotations

import pytest

from shared.cli import parse_config
from shared.config import ConfigError, TokenizerConfig


def test_api_keys_from_repeated_flags_and_from_the_environment() -> None:
    cfg = parse_config(TokenizerConfig, ["--model-dir", "m", "--api-key", "a", "--api-key", "b"], {})
    assert cfg.api_keys == ("a", "b")
    cfg = parse_config(TokenizerConfig, ["--model-dir", "m"], {"LS_API_KEYS": "a, b,,"})
    assert cfg.api_keys == ("a", "b")
    cfg = parse_config(TokenizerConfig, ["--model-dir", "m", "--api_keys", "c"], {"LS_API_KEYS": "a"})
    assert cfg.api_keys == ("c",)  # a flag beats the environment
    assert parse_config(TokenizerConfig, ["--model-dir", "m"], {}).api_keys == ()


def test_a_blank_key_is_refused() -> None:
    with pytest.raises(ConfigError):
        TokenizerConfig(model_dir="m", api_keys=("",))


def test_every_service_refuses_a_read_wait_under_one_ms() -> None:
    from shared.config import DetokenizerConfig, RouterConfig, WorkerConfig

    assert parse_config(RouterConfig, ["--read-block-ms", "20"], {}).read_block_ms == 20
    assert parse_config(TokenizerConfig, ["--model-dir", "m"], {"LS_READ_BLOCK_MS": "7"}).read_block_ms == 7
    for cls, kw in ((TokenizerConfig, {"model_dir": "m"}), (RouterConfig, {}), (WorkerConfig, {"model_dir": "m"}),
                    (DetokenizerConfig, {"model_dir": "m"})):  # fmt: skip
        with pytest.raises(ConfigError, match="read_block_ms"):
            cls(read_block_ms=0, **kw)
