"""lightstream/model_check.py on a mixture of experts: --tp must divide each expert's width
(and the shared expert's), as every rank holds its share of every expert."""

from __future__ import annotations

import pytest

from lightstream.model_check import ModelCheckError, check_model
from lightstream.serve_config import ServeConfig
from tools import make_tiny_model


def test_tp_must_divide_the_experts_widths(tmp_path) -> None:
    model = str(tmp_path / "m")
    make_tiny_model.main(
        [
            "--out",
            model,
            "--arch",
            "qwen2_moe",
            "--moe-intermediate",
            "36",
            "--shared-intermediate",
            "90",
            "--kv-heads",
            "4",
        ]
    )
    assert check_model(model, ServeConfig(model_dir=model, tp=2)).num_experts == 4
    with pytest.raises(ModelCheckError, match="--tp 4 does not divide the model's 90 shared expert's MLP columns"):
        check_model(model, ServeConfig(model_dir=model, tp=4, dp=1))
    make_tiny_model.main(
        ["--out", model, "--arch", "mixtral", "--moe-intermediate", "36", "--heads", "8", "--kv-heads", "8"]
    )
    with pytest.raises(ModelCheckError, match="--tp 8 does not divide the model's 36 experts' MLP columns"):
        check_model(model, ServeConfig(model_dir=model, tp=8))
