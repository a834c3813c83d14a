"""API keys in the front end's config: a repeatable flag, a comma-separated variable, a file."""

from __future__ import annotations

import pytest

from shared.cli import parse_config, with_key_file
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


def test_api_keys_from_a_file_join_the_others(tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("k1\n# a comment\nk2\n")
    cfg = with_key_file(
        parse_config(TokenizerConfig, ["--model-dir", "m", "--api-key-file", str(keys)], {"LS_API_KEYS": "e"})
    )
    assert cfg.api_keys == ("e", "k1", "k2")
    cfg = with_key_file(parse_config(TokenizerConfig, ["--model-dir", "m"], {"LS_API_KEY_FILE": str(keys)}))
    assert cfg.api_keys == ("k1", "k2")
    with pytest.raises(ConfigError, match="FastChat calls its workers without a key"):  # checked again with the keys
        with_key_file(TokenizerConfig(model_dir="m", api_key_file=str(keys), fastchat_controller="http://c"))
