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
