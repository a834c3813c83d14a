"""lightstream/model_check.py on a mixture of experts: --tp must divide each expert's width
(and the shared expert's), as every rank holds its share of every expert; and on quantized
checkpoints: what cannot be served is refused at start, naming what was found."""

from __future__ import annotations

import json
import os

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


def test_quantization_that_cannot_be_served_is_refused_at_start(tmp_path) -> None:
    model = str(tmp_path / "awq")
    make_tiny_model.main(["--out", model, "--hidden", "128", "--intermediate", "256", "--quant", "awq"])
    assert check_model(model, ServeConfig(model_dir=model)).quantization.method == "awq"
    with pytest.raises(ModelCheckError, match="--quantization fp8 on a awq 4-bit checkpoint is not supported"):
        check_model(model, ServeConfig(model_dir=model, quantization="fp8"))
    fp8 = str(tmp_path / "fp8")
    make_tiny_model.main(["--out", fp8, "--quant", "fp8-block", "--block-size", "32"])
    assert check_model(fp8, ServeConfig(model_dir=fp8, quantization="fp8")).quantization.block == (32, 32)
    with open(os.path.join(fp8, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"]["fmt"] = "e5m2"
    with open(os.path.join(fp8, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ModelCheckError, match=r"fp8 with fmt 'e5m2'.*supported: .*compressed-tensors"):
        check_model(fp8, ServeConfig(model_dir=fp8))
