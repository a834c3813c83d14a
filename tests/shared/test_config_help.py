"""Every flag of every service says what it does in --help (shared/config.py's option())."""

from __future__ import annotations

import dataclasses

import pytest

from shared import config
from shared.visual_config import VisualConfig


@pytest.mark.parametrize(
    "cls", [config.TokenizerConfig, config.RouterConfig, config.WorkerConfig, config.DetokenizerConfig, VisualConfig]
)
def test_every_field_has_its_help_text(cls: type) -> None:
    missing = [f.name for f in dataclasses.fields(cls) if len(f.metadata.get("help", "")) < 10]
    assert not missing, f"{cls.__name__}: no help text for {missing}"
