"""``lightstream serve`` as a user runs it: a model that cannot be served is refused in one
line, exit status 2, within two seconds and before anything starts; the tiny model behind
--tp 2 --dp 2 (gloo on the CPU), a served name and an API key answers Hugging Face's greedy
text, and SIGTERM stops the whole stack with status 0."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest
import redis

from tests import hf_reference
from tools import make_tiny_model
from tools.redis_server import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _serve(*args: str, cwd: str = ROOT, **popen) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LS_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = ROOT
    return subprocess.Popen([sys.executable, "-m", "lightstream", "serve", *args], cwd=cwd, env=env, **popen)


def _refused(model_dir: str) -> str:
    """The one line ``lightstream serve`` answers for a model it cannot serve."""
    started = time.monotonic()
    proc = _serve(model_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, (out, err)
    assert elapsed < 2.0, elapsed
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _copy(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def test_a_directory_without_config_json_is_refused(tiny_llama: str, tmp_path) -> None:
    model = _copy(tiny_llama, str(tmp_path / "m"))
    os.remove(os.path.join(model, "config.json"))
    line = _refused(model)
    assert "no config.json" in line and "supported:" in line, line


def test_an_unsupported_architecture_is_refused(tiny_llama: str, tmp_path) -> None:
    model = _copy(tiny_llama, str(tmp_path / "m"))
    path = os.path.join(model, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with open(path, "w") as f:
        json.dump(config, f)
    line = _refused(model)
    assert "GPT2LMHeadModel" in line and "LlamaForCausalLM" in line, line


def test_missing_and_corrupt_weights_are_refused(tiny_llama: str, tmp_path) -> None:
    model = _copy(tiny_llama, str(tmp_path / "m"))
    weights = os.path.join(model, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    assert "not a readable safetensors file" in _refused(model)
    os.rename(weights, os.path.join(model, "pytorch_model.bin"))
    assert "pytorch_model.bin is not a PyTorch checkpoint" in _refused(model)
    os.remove(os.path.join(model, "pytorch_model.bin"))
    line = _refused(model)
    assert "no weight files" in line and "supported: *.safetensors or PyTorch *.bin" in line, line


def test_a_path_that_is_not_a_directory_is_refused(tmp_path) -> None:
    assert "is not a directory" in _refused(str(tmp_path / "meta-llama/Llama-3-8B"))


def test_a_model_id_missing_from_the_hugging_face_cache_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no download tried: none could succeed here
    line = _refused("meta-llama/Llama-3-8B")
    assert "neither a directory nor a model in the local Hugging Face cache" in line, line


def test_a_model_id_is_served_from_the_hugging_face_cache(tiny_llama: str, tmp_path, monkeypatch) -> None:
    """The id resolves to its snapshot, which is then checked like any directory (an
    architecture made unsupported here shows that the snapshot is what was read)."""
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "0123abcd"
    model = _copy(tiny_llama, str(snapshot))
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("0123abcd")
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(config, f)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = _refused("acme/tiny")
    assert "0123abcd" in line and "GPT2LMHeadModel" in line, line


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"lightstream serve exited with {proc.returncode}"
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready within {timeout_s}s")


@pytest.mark.slow
def test_tp2_dp2_with_a_served_name_and_a_key_answers_hf_greedy_text(tiny_llama: str, tmp_path) -> None:
    port = free_port()
    flags = ["--port", str(port), "--host", "127.0.0.1", "--tp", "2", "--dp", "2", "--served-model-name", "demo"]
    # the model named relative to where the command runs, as a user would
    model = os.path.basename(tiny_llama)
    proc = _serve(model, *flags, "--api-key", "K", "--log-dir", str(tmp_path), cwd=os.path.dirname(tiny_llama))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        key = {"Authorization": "Bearer K"}
        with httpx.Client(base_url=url, timeout=120) as client:
            assert client.post("/generate", json={"inputs": "Hello"}).status_code == 401
            models = client.get("/v1/models", headers=key).json()
            assert [m["id"] for m in models["data"]] == ["demo"], models
            tok = hf_reference.tokenizer(tiny_llama)
            for prompt in ("Hello", "The quick brown fox jumps over the lazy dog."):
                body = {"inputs": prompt, "parameters": {"max_new_tokens": 12, "return_details": True}}
                r = client.post("/generate", json=body, headers=key)
                assert r.status_code == 200, r.text
                want = hf_reference.greedy(tiny_llama, tok(prompt)["input_ids"], 12)
                assert [t["id"] for t in r.json()["tokens"]] == want, prompt
                r = client.post(
                    "/v1/completions",
                    json={"model": "demo", "prompt": prompt, "max_tokens": 12, "temperature": 0},
                    headers=key,
                )
                assert r.json()["choices"][0]["text"] == tok.decode(want, skip_special_tokens=True), r.text
        logs = sorted(os.listdir(tmp_path))
        assert logs == ["detokenizer-0.log", "router.log", "tokenizer.log", "worker-0.log", "worker-1.log"], logs
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def _child_pid(parent: int, module: str) -> int | None:
    """The pid of parent's child process running ``python -m module``, if any."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == parent and module.encode() in argv:
            return int(entry)
    return None


def _gone(pid: int) -> bool:
    """Exited and reaped: no zombie left behind."""
    return not os.path.exists(f"/proc/{pid}")


def test_a_service_that_dies_is_reaped_and_started_again(tiny_llama: str, tmp_path) -> None:
    port = free_port()
    err = open(tmp_path / "serve.err", "w+")  # noqa: SIM115 (read after the process ends)
    flags = ["--port", str(port), "--host", "127.0.0.1", "--log-dir", str(tmp_path)]
    out = open(tmp_path / "serve.out", "w+")  # noqa: SIM115 (read while the process runs)
    proc = _serve(tiny_llama, *flags, stdout=out, stderr=err)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        # serve's own wait for /health ends too (a service that exits before it is a failed start)
        deadline = time.monotonic() + 30
        while "LightStream is serving" not in (tmp_path / "serve.out").read_text():
            assert time.monotonic() < deadline, "lightstream serve never said it was serving"
            time.sleep(0.1)
        router = _child_pid(proc.pid, "services.router")
        assert router is not None
        os.kill(router, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while (_child_pid(proc.pid, "services.router") or router) == router or not _gone(router):
            assert time.monotonic() < deadline, "the router was not started again"
            time.sleep(0.1)
        _wait_ready(url, proc, 60)
        r = httpx.post(url + "/generate", json={"inputs": "Hello", "parameters": {"max_new_tokens": 4}}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    err.seek(0)
    said = err.read()
    assert f"router exited with status {-signal.SIGKILL}" in said and "router started again" in said, said


def test_sigterm_gives_requests_in_flight_the_drain_timeout_and_keys_stay_off_command_lines(tmp_path) -> None:
    """--drain-timeout-s reaches the services that drain: SIGTERM with a stream in flight ends it
    with an error after 1 s (the default would let it run on for 30 s) and serve exits 0. Its
    API key, from a file, and the password of the Redis it starts are on no process's command line."""
    model = str(tmp_path / "model")
    make_tiny_model.main(["--out", model, "--max-positions", "8192"])  # a stream far longer than the drain
    (tmp_path / "keys").write_text("secret-key-43\n")
    port = free_port()
    flags = ["--port", str(port), "--host", "127.0.0.1", "--drain-timeout-s", "1"]
    proc = _serve(model, *flags, "--api-key-file", str(tmp_path / "keys"), "--log-dir", str(tmp_path / "logs"))
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        front = _child_pid(proc.pid, "services.tokenizer")
        assert front is not None
        with open(f"/proc/{front}/cmdline", "rb") as f:
            cmdline = f.read()
        assert b"secret-key-43" not in cmdline and b"redis://" not in cmdline
        with open(f"/proc/{front}/environ", "rb") as f:  # the owner's only
            environ = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        redis_url = environ[b"LS_REDIS_URL"].decode()
        assert environ[b"LS_API_KEYS"] == b"secret-key-43" and redis.Redis.from_url(redis_url).ping()
        with pytest.raises(redis.AuthenticationError):  # the Redis it started asks for its password
            redis.Redis.from_url(redis_url.replace(redis_url.split("@")[0], "redis://")).ping()
        body = {"inputs": "Hello", "parameters": {"max_new_tokens": 8000, "ignore_eos": True}}
        assert httpx.post(url + "/generate", json=body, timeout=30).status_code == 401
        key = {"Authorization": "Bearer secret-key-43"}
        events: list[dict] = []
        with httpx.stream("POST", url + "/generate_stream", json=body, headers=key, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
                    if len(events) == 5:
                        proc.send_signal(signal.SIGTERM)
                        signalled = time.monotonic()
        took = time.monotonic() - signalled
        print(f"the stream ended {took:.2f}s after SIGTERM: {events[-1]}")
        assert events[-1]["finish_reason"] == "error" and took < 8.0, events[-1]
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
