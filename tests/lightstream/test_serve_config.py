"""``lightstream serve``'s flags: every one with help text and its LS_* variable, both
spellings (LightLLM's and vLLM's), and each handed to the service flag it stands for."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from lightstream.serve_config import ServeConfig, front_env, service_args
from shared.cli import build_parser, parse_config, with_key_file
from shared.config import ConfigError, RouterConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the flags issue 46 asks for, each with the variable --help must name
FLAGS = {
    "--host": "LS_HOST",
    "--port": "LS_PORT",
    "--tp": "LS_TP",
    "--tensor-parallel-size": "LS_TP",
    "--dp": "LS_DP",
    "--mem-fraction": "LS_MEM_FRACTION",
    "--gpu-memory-utilization": "LS_MEM_FRACTION",
    "--max-total-token-num": "LS_MAX_TOTAL_TOKEN_NUM",
    "--max-model-len": "LS_MAX_REQ_TOTAL_LEN",
    "--served-model-name": "LS_MODEL_NAME",
    "--api-key": "LS_API_KEYS",
    "--dtype": "LS_DTYPE",
    "--kv-cache-dtype": "LS_KV_DTYPE",
    "--quantization": "LS_QUANTIZATION",
    "--max-num-seqs": "LS_RUNNING_MAX_REQ_SIZE",
    "--running-max-req-size": "LS_RUNNING_MAX_REQ_SIZE",
    "--chunked-prefill-size": "LS_CHUNKED_PREFILL_SIZE",
    "--log-dir": "LS_LOG_DIR",
    "--log-format": "LS_LOG_FORMAT",
    "--tokenizer": "LS_TOKENIZER",
    "--chat-template": "LS_CHAT_TEMPLATE",
    "--disable-prompt-cache": "LS_DISABLE_PROMPT_CACHE",
    "--routing-policy": "LS_ROUTING_POLICY",
    "--drain-timeout-s": "LS_DRAIN_TIMEOUT_S",
    "--api-key-file": "LS_API_KEY_FILE",
}


def _help_entries(text: str) -> dict[str, str]:
    """flag -> the help text of its entry in argparse's --help output."""
    entries: dict[str, str] = {}
    current: list[str] = []
    for line in text.split("options:", 1)[1].splitlines():
        stripped = line.strip()
        if line.startswith("  -"):
            head, _, rest = stripped.partition("  ")
            current = [part.split()[0] for part in head.split(", ")]
            for flag in current:
                entries[flag] = rest.strip()
        elif current and stripped:
            for flag in current:
                entries[flag] += " " + stripped
    return entries


def test_help_lists_every_flag_with_its_text_and_variable() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lightstream", "serve", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    entries = _help_entries(out.stdout)
    for flag, env in FLAGS.items():
        assert flag in entries, flag
        text = entries[flag]
        assert f"[{env};" in text and len(text.split("[")[0].strip()) > 10, (flag, text)
    assert "MODEL" in out.stdout.split("options:")[0]


def test_the_console_script_is_the_same_entry_point() -> None:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["scripts"]["lightstream"] == "lightstream.cli:main"


def test_both_spellings_reach_the_services_flags() -> None:
    argv = ["m", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.5", "--max-model-len", "512"]
    argv += ["--max-num-seqs", "8", "--dtype", "bf16", "--kv-cache-dtype", "fp8", "--chunked-prefill-size", "64"]
    argv += ["--quantization", "fp8"]
    argv += ["--served-model-name", "demo", "--api-key", "K", "--worker-arg=--cuda-graph-max-bs=0"]
    cfg = parse_config(ServeConfig, argv, {})
    assert cfg.model_dir == "m" and cfg.tp == 2 and cfg.model_name == "demo" and cfg.api_keys == ("K",)
    args = service_args(cfg)
    pairs = dict(zip(args["worker"][:-1:2], args["worker"][1::2], strict=True))
    assert pairs == {
        "--tp": "2",
        "--dtype": "bfloat16",
        "--kv-dtype": "fp8",
        "--quantization": "fp8",
        "--mem-fraction": "0.5",
        "--max-req-total-len": "512",
        "--running-max-req-size": "8",
        "--batch-max-tokens": "64",
        "--model-name": "demo",  # the label on its metrics series
    }
    assert args["worker"][-1] == "--cuda-graph-max-bs=0"  # a pass-through flag comes last: it wins
    assert args["tokenizer"] == ["--max-req-total-len", "512", "--model-name", "demo"]
    assert args["router"] == ["--running-max-req-size", "8", "--model-name", "demo"]
    assert args["detokenizer"] == ["--model-name", "demo"]
    assert args["visual"] == ["--dtype", "bfloat16", "--model-name", "demo"]  # the vision tower's dtype is the model's


def test_a_setting_left_at_its_default_leaves_the_service_its_own() -> None:
    """A service then keeps its default or its own LS_* variable (LS_CPU_KV_TOKENS, say)."""
    args = service_args(parse_config(ServeConfig, ["m", "--api-key", "K", "--drain-timeout-s", "30"], {}))
    assert args == {"worker": [], "router": [], "tokenizer": [], "detokenizer": [], "visual": []}


def test_the_drain_timeout_reaches_every_service_that_drains() -> None:
    for cfg in (
        parse_config(ServeConfig, ["m", "--drain-timeout-s", "2.5"], {}),
        parse_config(ServeConfig, ["m"], {"LS_DRAIN_TIMEOUT_S": "2.5"}),
    ):
        args = service_args(cfg)
        for service in ("worker", "tokenizer", "detokenizer"):
            assert args[service] == ["--drain-timeout-s", "2.5"], service
        assert args["router"] == [] and args["visual"] == []
    with pytest.raises(ConfigError, match="--drain-timeout-s must be >= 0"):
        ServeConfig(drain_timeout_s=-1)


def test_api_keys_reach_the_front_ends_environment_never_their_command_line(tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# the front end's keys\nfrom-file-a\n\n  from-file-b  \n")
    cfg = with_key_file(parse_config(ServeConfig, ["m", "--api-key", "K", "--api-key-file", str(keys)], {}))
    assert cfg.api_keys == ("K", "from-file-a", "from-file-b")
    assert not any("K" in a or "from-file" in a for a in service_args(cfg)["tokenizer"])
    assert front_env(cfg) == {"LS_API_KEYS": "K,from-file-a,from-file-b"}
    assert front_env(parse_config(ServeConfig, ["m"], {})) == {}
    cfg = with_key_file(parse_config(ServeConfig, ["m"], {"LS_API_KEY_FILE": str(keys)}))
    assert cfg.api_keys == ("from-file-a", "from-file-b")
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="no key in it"):
        with_key_file(ServeConfig(api_key_file=str(tmp_path / "empty")))
    with pytest.raises(ConfigError, match=r"--api-key-file .*missing"):
        with_key_file(ServeConfig(api_key_file=str(tmp_path / "missing")))


def test_variables_stand_in_for_flags() -> None:
    cfg = parse_config(ServeConfig, [], {"LS_TP": "2", "LS_DP": "3", "LS_MODEL_DIR": "m", "LS_API_KEYS": "a,b"})
    assert (cfg.tp, cfg.dp, cfg.model_dir, cfg.api_keys) == (2, 3, "m", ("a", "b"))
    assert parse_config(ServeConfig, ["--workers", "2"], {}).dp == 2  # run_local.py's spelling


@pytest.mark.parametrize(
    "flags", [["--dtype", "fp8"], ["--kv-cache-dtype", "fp4"], ["--quantization", "int4"], ["--tp", "0"]]
)
def test_an_unsupported_value_is_refused(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse_config(ServeConfig, flags, {})
    assert e.value.code == 2


def test_the_check_names_what_is_supported() -> None:
    with pytest.raises(ConfigError, match="supported: auto, bf16"):
        ServeConfig(dtype="fp8")


def test_a_services_help_names_its_variables() -> None:
    text = build_parser(RouterConfig, "router").format_help()
    assert "[LS_RUNNING_MAX_REQ_SIZE; default: 1000]" in " ".join(text.split())
