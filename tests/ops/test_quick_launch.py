"""tools/quick_launch_docker.py without a Docker engine: --dry-run for every option it documents,
the docker SDK calls it makes (against a fake client), the compose override it writes (through
`docker-compose config`), and the all-in-one container's command run here as a process."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
import yaml

from shared.config import RouterConfig, TokenizerConfig, WorkerConfig
from tests.ops.compose_local import ROOT, image_env
from tools import quick_launch_docker as ql
from tools.launch_plan import HTTP_PORT, METRICS_PORTS, SERVING_OPTIONS
from tools.redis_server import free_port

# option -> (extra arguments, what the printed commands must then contain); one entry per
# option of `--help`, checked by test_every_option_has_a_dry_run_case
CASES: dict[str, tuple[list[str], list[str]]] = {
    "--model-dir": (["--model-dir", "{model}"], ["-v {model}:/model:ro", "--model-dir /model"]),
    "--port": (["--port", "9123"], ["-p 9123:8000", "for http://127.0.0.1:9123/health"]),
    "--gpus": (["--gpus", "all"], ["--gpus all", "lightstream:cuda", "--worker-arg=--device=cuda"]),
    "--tp": (["--gpus", "2", "--tp", "2"], ["--gpus 2", "--worker-arg=--tp=2"]),
    "--max-total-token-num": (["--max-total-token-num", "123456"], ["--worker-arg=--max-total-token-num=123456"]),
    "--batch-max-tokens": (["--batch-max-tokens", "4096"], ["--worker-arg=--batch-max-tokens=4096"]),
    "--running-max-req-size": (
        ["--running-max-req-size", "64"],
        ["--router-arg=--running-max-req-size=64", "--worker-arg=--running-max-req-size=64"],
    ),
    "--max-req-total-len": (
        ["--max-req-total-len", "512"],
        ["--tokenizer-arg=--max-req-total-len=512", "--worker-arg=--max-req-total-len=512"],
    ),
    "--mem-fraction": (["--mem-fraction", "0.8"], ["--worker-arg=--mem-fraction=0.8"]),
    "--cuda-graph-max-tokens": (["--cuda-graph-max-tokens", "512"], ["--worker-arg=--cuda-graph-max-tokens=512"]),
    "--dtype": (["--dtype", "bfloat16"], ["--worker-arg=--dtype=bfloat16"]),
    "--kv-dtype": (["--kv-dtype", "int8"], ["--worker-arg=--kv-dtype=int8"]),
    "--quantization": (["--quantization", "fp8"], ["--worker-arg=--quantization=fp8"]),
    "--cuda-graph-max-bs": (["--cuda-graph-max-bs", "64"], ["--worker-arg=--cuda-graph-max-bs=64"]),
    "--max-waiting": (["--max-waiting", "77"], ["--router-arg=--max-waiting=77"]),
    "--router-token-ratio": (["--router-token-ratio", "0.5"], ["--router-arg=--router-token-ratio=0.5"]),
    "--router-max-new-token-len": (
        ["--router-max-new-token-len", "300"],
        ["--router-arg=--router-max-new-token-len=300"],
    ),
    "--max-queue-time-s": (["--max-queue-time-s", "30.0"], ["--router-arg=--max-queue-time-s=30.0"]),
    "--request-timeout-s": (["--request-timeout-s", "60.0"], ["--tokenizer-arg=--request-timeout-s=60.0"]),
    "--model-name": (["--model-name", "tiny"], ["--tokenizer-arg=--model-name=tiny"]),
    "--api-key": (
        ["--api-key", "k1", "--api-key", "k2"],
        ["--tokenizer-arg=--api-key=k1 --tokenizer-arg=--api-key=k2"],
    ),
    "--log-level": (["--log-level", "DEBUG"], ["-e LS_LOG_LEVEL=DEBUG"]),
    "--image": (["--image", "registry.example/ls"], ["-t registry.example/ls:cpu", " registry.example/ls:cpu sh -c"]),
    "--build": (["--build"], ["docker build --target cpu"]),
    "--name": (["--name", "ls-test"], ["--name ls-test"]),
    "--replace": (["--replace"], ["docker rm -f lightstream\ndocker run -d --name lightstream"]),
    "--shm-size": (["--shm-size", "3g"], ["--shm-size 3g"]),
    "--rm": (["--rm"], ["docker run -d --name lightstream --rm"]),
    "--metrics-port": (["--metrics-port", "9300"], ["-p 9300:9101", "-p 9301:9102", "-p 9302:9103"]),
    "--compose": (["--compose"], ["docker compose -p lightstream -f compose.yaml up -d --scale worker=1"]),
    "--workers": (["--compose", "--workers", "3"], ["--scale worker=3"]),
    "--detokenizers": (["--compose", "--detokenizers", "2"], ["--scale detokenizer=2"]),
    "--tokenizers": (["--compose", "--tokenizers", "2"], ["--scale tokenizer=2", "LS_HTTP_PORT_LAST=8001"]),
    "--wait-s": (["--wait-s", "5"], ["# then wait up to 5s for http://127.0.0.1:8000/health"]),
}


@pytest.fixture
def no_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    """--dry-run must not touch Docker: any use of the SDK or the CLI fails the test."""
    import docker

    def refuse(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("--dry-run touched Docker")

    monkeypatch.setattr(docker, "from_env", refuse)
    monkeypatch.setattr(ql, "compose_command", refuse)
    monkeypatch.setattr(ql.subprocess, "run", refuse)


def dry_run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert ql.main([*argv, "--dry-run"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("option", sorted(CASES))
def test_dry_run_shows_each_option(
    option: str, tiny_llama: str, no_docker: None, capsys: pytest.CaptureFixture[str]
) -> None:
    args, expected = CASES[option]
    out = dry_run(capsys, [a.format(model=tiny_llama) for a in args])
    for text in expected:
        assert " ".join(text.format(model=tiny_llama).split()) in " ".join(out.split()), f"{option}: {text}\n{out}"


def test_the_serving_options_are_flags_of_their_services() -> None:
    configs = {"tokenizer": TokenizerConfig, "router": RouterConfig, "worker": WorkerConfig}
    for opt in SERVING_OPTIONS:
        for service in opt.services:
            assert opt.dest in {f.name for f in dataclasses.fields(configs[service])}, (opt.flag, service)


def test_clients_see_the_model_directory_name(tiny_llama: str, no_docker: None, capsys) -> None:
    out = dry_run(capsys, ["--model-dir", tiny_llama])
    assert f"--tokenizer-arg=--model-name={os.path.basename(tiny_llama)}" in out


def test_every_option_has_a_dry_run_case() -> None:
    parser = ql.build_parser()
    options = {
        next(s for s in a.option_strings if s.startswith("--"))
        for a in parser._actions
        if a.option_strings and a.dest not in ("help", "dry_run")
    }
    assert options == set(CASES)


def test_compose_mode_puts_serving_options_in_an_override(
    tiny_llama: str, no_docker: None, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--compose", "--model-dir", tiny_llama, "--gpus", "all", "--tp", "2", "--api-key", "a", "--api-key", "b"]
    out = dry_run(capsys, [*argv, "--batch-max-tokens", "2048", "--shm-size", "8g"])
    assert "-f compose.yaml -f compose.gpu.yaml -f " in out
    assert f"MODEL_DIR={tiny_llama}" in out and "LS_GPUS=all" in out and "LS_SHM_SIZE=8g" in out
    for text in ('"LS_TP": "2"', '"LS_BATCH_MAX_TOKENS": "2048"', '"LS_API_KEYS": "a,b"'):
        assert text in out, out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "2"], "need --compose"),
        (["--compose", "--metrics-port", "9000"], "--profile monitoring"),
        (["--compose", "--model-dir", "{model}", "--gpus", "0,1"], "a count or all"),
        (["--compose", "--gpus", "all"], "needs --model-dir"),
        (["--gpus", "1", "--tp", "2"], "needs 2 GPUs"),
        (["--model-dir", "/nonexistent"], "no config.json"),
    ],
)
def test_bad_combinations_are_refused(
    argv: list[str], message: str, tiny_llama: str, no_docker: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        ql.main([a.format(model=tiny_llama) for a in argv] + ["--dry-run"])
    assert e.value.code == 2 and message in capsys.readouterr().err


# ---------------------------------------------------------------- the SDK path, with a fake engine


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *_a: Any) -> None:
        pass


@pytest.fixture
def health_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_launch_builds_a_missing_image_runs_it_and_waits_for_health(
    tiny_llama: str, health_port: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import docker

    calls: dict[str, Any] = {}

    class Container:
        status = "running"

        def reload(self) -> None:
            pass

    class Images:
        def get(self, tag: str) -> None:
            raise docker.errors.ImageNotFound(tag)

        def build(self, **kw: Any) -> None:
            calls["build"] = kw

    class Containers:
        def run(self, image: str, command: list[str], **kw: Any) -> Container:
            calls["run"] = (image, command, kw)
            return Container()

    class Client:
        images, containers = Images(), Containers()

    monkeypatch.setattr(docker, "from_env", Client)
    argv = ["--model-dir", tiny_llama, "--port", str(health_port), "--gpus", "0,1", "--tp", "2", "--shm-size", "2g"]
    assert ql.main(argv) == 0
    assert calls["build"] == {"path": ROOT, "target": "cuda", "tag": "lightstream:cuda", "rm": True}
    image, command, kw = calls["run"]
    assert image == "lightstream:cuda" and command[:2] == ["sh", "-c"] and "--worker-arg=--tp=2" in command
    assert kw["ports"] == {"8000/tcp": health_port} and kw["shm_size"] == "2g" and kw["detach"]
    assert kw["volumes"] == {tiny_llama: {"bind": "/model", "mode": "ro"}}
    (request,) = kw["device_requests"]
    assert request["DeviceIDs"] == ["0", "1"] and request["Capabilities"] == [["gpu"]]
    out = capsys.readouterr().out
    assert f"LightStream is serving at http://127.0.0.1:{health_port}" in out
    assert f"curl http://127.0.0.1:{health_port}/generate" in out and "docker logs -f lightstream" in out


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
@pytest.mark.parametrize("options", [[], ["--tp", "1", "--api-key", "k"], ["--gpus", "all", "--kv-dtype", "int8"]])
def test_the_compose_files_it_runs_are_valid_compose(options: list[str], tiny_llama: str, tmp_path: Any) -> None:
    args = ql.build_parser().parse_args(["--compose", "--model-dir", tiny_llama, *options])
    plan = ql.compose_plan(args, ql.check(args))
    plan = dataclasses.replace(plan, override_path=str(tmp_path / "override.yaml"))
    with open(plan.override_path, "w") as f:
        f.write(plan.override_text())
    argv = ["docker-compose", "-p", plan.project, "--project-directory", ROOT]
    for name in plan.all_files:
        argv += ["-f", os.path.join(ROOT, name)]
    r = subprocess.run([*argv, "config"], env={**os.environ, **plan.env}, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    services = yaml.safe_load(r.stdout)["services"]
    assert f"{tiny_llama}:/model:ro" in services["worker"]["volumes"]
    for service, settings in plan.override["services"].items():
        for key, value in settings["environment"].items():
            assert services[service]["environment"][key] == value, (service, key)


# ---------------------------------------------------------------- the all-in-one command, run here


def test_the_all_in_one_command_serves(tiny_llama: str) -> None:
    """The container's command as a process: its Redis, run_local.py and the per-service flags.
    Only the ports (free ones, not the container's) and the model's mount are replaced."""
    args = ql.build_parser().parse_args(["--model-dir", tiny_llama, "--max-total-token-num", "4096"])
    plan = ql.container_plan(args, ql.check(args))
    ports = {"6379": free_port(), str(HTTP_PORT): free_port(), **{str(p): free_port() for p in METRICS_PORTS.values()}}

    def local(text: str) -> str:
        text = re.sub(r"(?<!\d)(6379|8000|9101|9102|9103)(?!\d)", lambda m: str(ports[m[1]]), text)
        return text.replace("/model", tiny_llama) if text.startswith(("/model", "--model-dir")) else text

    command = [sys.executable if a == "python" else local(a) for a in plan.command]
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    env = {**os.environ, **image_env(plan.target), **{k: local(v) for k, v in plan.environment.items()}, "PATH": path}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{ports[str(HTTP_PORT)]}"
    try:
        end = time.monotonic() + 120
        while not _healthy(url):
            assert proc.poll() is None and time.monotonic() < end, "the all-in-one command did not come up"
            time.sleep(0.5)
        body = {"inputs": "What is AI?", "parameters": {"max_new_tokens": 5, "ignore_eos": True}}
        assert httpx.post(url + "/generate", json=body, timeout=60).json()["count_output_tokens"] == 5
        for port in (ports[str(p)] for p in METRICS_PORTS.values()):
            assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 200
        worker = httpx.get(f"http://127.0.0.1:{ports['9102']}/metrics", timeout=10).text
        assert re.search(r'lightstream_worker_kv_capacity_tokens\{group="0",model_name="[^"]+"\} 4096\.0', worker)
    finally:
        proc.send_signal(signal.SIGTERM)  # run_local.py stops its services
        proc.wait(30)
        with contextlib.suppress(redis.ConnectionError):  # the container's Redis, left by run_local.py
            redis.Redis(port=ports["6379"]).shutdown(nosave=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
