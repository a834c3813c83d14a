"""compose.yaml run without Docker: every service started from the file's own command and
environment, as local processes.

Only what differs between a container and a process on a shared host is replaced: the
Redis host (a local redis-server from the redis service's own command, on a free port),
the volumes (a directory each), the ports (free ones: here every replica shares one
network), the listen address, and ``python`` (this virtualenv's). The services of the
light image run with torch and triton hidden, as that image has neither.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from tools.redis_server import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "compose.yaml")
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
LIGHTSTREAM = ("tokenizer", "router", "worker", "detokenizer")

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message} and $$."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2), m.group(3) or ""
        value = env.get(name)
        if (op in (":-", ":?") and not value) or (op in ("-", "?") and value is None):
            if op.endswith("?"):
                raise ValueError(f"{name}: {arg}")
            return arg
        return value or ""

    return _VAR.sub(sub, text)


def load_compose(path: str = COMPOSE, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The file as compose reads it: YAML anchors and merge keys resolved, variables interpolated."""
    env = {} if env is None else env

    def walk(node: Any) -> Any:
        if isinstance(node, str):
            return interpolate(node, env)
        if isinstance(node, list):
            return [walk(x) for x in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    with open(path) as f:
        return walk(yaml.safe_load(f))


@dataclass
class Process:
    name: str  # service-index
    service: str
    argv: list[str]
    env: dict[str, str]
    log: str
    proc: subprocess.Popen | None = None

    def start(self) -> Process:
        out = open(self.log, "ab")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def healthcheck(self, test: list[str]) -> bool:
        """Run a compose health check (CMD form) the way Docker does: in the service's environment."""
        assert test[0] == "CMD", test
        argv = [sys.executable if a == "python" else a for a in test[1:]]
        return subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, timeout=30).returncode == 0


@dataclass
class LocalCompose:
    workdir: str
    scale: dict[str, int] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=lambda: load_compose())
    procs: list[Process] = field(default_factory=list)
    redis: Process | None = None
    redis_url: str = ""
    volumes: dict[str, str] = field(default_factory=dict)  # named volume -> local directory

    def service(self, name: str) -> dict[str, Any]:
        return self.spec["services"][name]

    def start(self, timeout_s: float = 180.0) -> LocalCompose:
        self._start_redis()
        self._run_model()
        for service in LIGHTSTREAM:
            for i in range(self.scale.get(service, 1)):
                self.procs.append(self._process(service, i).start())
        self._wait_healthy(timeout_s)
        return self

    def stop(self) -> None:
        """The services first, then Redis (so they do not log it going away)."""
        for group in (self.procs, [self.redis] if self.redis else []):
            running = [p.proc for p in group if p.proc is not None and p.proc.poll() is None]
            for proc in running:
                proc.send_signal(signal.SIGTERM)
            for proc in running:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def replicas(self, service: str) -> list[Process]:
        return [p for p in self.procs if p.service == service]

    @property
    def url(self) -> str:
        """The first front end's."""
        return self.urls[0]

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p.env['LS_PORT']}" for p in self.replicas("tokenizer")]

    # ---------------------------------------------------------------- the pieces

    def _start_redis(self) -> None:
        port = free_port()
        data = self._volume_dir("redis-data")
        argv = [*self.service("redis")["command"], "--port", str(port), "--bind", "127.0.0.1", "--dir", data]
        self.redis = Process("redis-0", "redis", argv, dict(os.environ), self._log("redis-0")).start()
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        test = self.service("redis")["healthcheck"]["test"]  # CMD redis-cli ping
        test = [*test[:2], "-p", str(port), *test[2:]]
        end = time.monotonic() + 10
        while not self.redis.healthcheck(test):
            assert time.monotonic() < end, "redis did not pass its health check"
            time.sleep(0.1)

    def _run_model(self) -> None:
        model = self._process("model", 0)
        model.start()
        assert model.proc is not None
        assert model.proc.wait(120) == 0, model.output()

    def _process(self, service: str, index: int) -> Process:
        spec = self.service(service)
        mounts = self._mounts(spec)
        env = {**_base_env(), **image_env(spec["build"]["target"])}
        env.update({k: self._localize(str(v), mounts) for k, v in spec.get("environment", {}).items()})
        if "LS_REDIS_URL" in env:  # the redis service's host name -> the local server
            local = self.redis_url.removeprefix("redis://").rsplit("/", 1)[0]
            env["LS_REDIS_URL"] = re.sub(
                r"^redis://([^@/]*@)?redis:6379/", rf"redis://\g<1>{local}/", env["LS_REDIS_URL"]
            )
        if "LS_HOST" in env:
            env["LS_HOST"] = "127.0.0.1"
        if "LS_METRICS_PORT" in env:
            env["LS_METRICS_PORT"] = str(free_port())
        if "LS_PORT" in env:
            env["LS_PORT"] = str(free_port())
        if spec["build"]["target"] == "light":
            env["PYTHONPATH"] = self._no_torch_dir()
        argv = [sys.executable if a == "python" else self._localize(a, mounts) for a in spec["command"]]
        name = f"{service}-{index}"
        return Process(name, service, argv, env, self._log(name))

    def _mounts(self, spec: dict[str, Any]) -> dict[str, str]:
        """Container path -> local directory, for the service's volumes."""
        out = {}
        for volume in spec.get("volumes", []):
            source, target = volume.split(":")[:2]
            out[target] = source if source.startswith("/") else self._volume_dir(source)
        return out

    def _localize(self, text: str, mounts: dict[str, str]) -> str:
        for target, local in mounts.items():
            text = re.sub(rf"(?<![\w/]){re.escape(target)}(?=[/\s'\"]|$)", local, text)
        return text

    def _volume_dir(self, name: str) -> str:
        if name not in self.volumes:
            self.volumes[name] = os.path.join(self.workdir, "volumes", name)
            os.makedirs(self.volumes[name], exist_ok=True)
        return self.volumes[name]

    def _no_torch_dir(self) -> str:
        """A sitecustomize that makes `import torch` fail, and transformers see no torch."""
        path = os.path.join(self.workdir, "no-torch")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "sitecustomize.py"), "w") as f:
            f.write("import sys\n\nsys.modules['torch'] = None\nsys.modules['triton'] = None\n")
        return path

    def _log(self, name: str) -> str:
        os.makedirs(os.path.join(self.workdir, "logs"), exist_ok=True)
        return os.path.join(self.workdir, "logs", f"{name}.log")

    def _wait_healthy(self, timeout_s: float) -> None:
        """Until every replica passes its service's health check, as `docker compose up --wait` does."""
        waiting = list(self.procs)
        end = time.monotonic() + timeout_s
        while waiting:
            for p in self.procs:
                assert p.proc is not None
                if p.proc.poll() is not None:
                    raise RuntimeError(f"{p.name} exited with {p.proc.returncode}:\n{p.output()[-3000:]}")
            waiting = [p for p in waiting if not p.healthcheck(self.service(p.service)["healthcheck"]["test"])]
            if time.monotonic() > end:
                raise TimeoutError(f"not healthy within {timeout_s}s: {[p.name for p in waiting]}")
            time.sleep(0.5)


def image_env(target: str, dockerfile: str = DOCKERFILE) -> dict[str, str]:
    """The ENV settings a Dockerfile target's image has (its own stage's and its parents')."""
    stages: dict[str, tuple[str, dict[str, str]]] = {}  # name -> (parent stage or base image, env)
    current: dict[str, str] = {}
    with open(dockerfile) as f:
        for line in f:
            words = line.split()
            if words[:1] == ["FROM"]:
                current = {}
                stages[words[3] if len(words) > 3 else words[1]] = (words[1], current)
            elif words[:1] == ["ENV"]:
                current.update(w.split("=", 1) for w in words[1:] if "$" not in w)  # no $PATH and the like
    env: dict[str, str] = {}
    while target in stages:
        target, own = stages[target]
        env = {**own, **env}
    return env


def _base_env() -> dict[str, str]:
    """What a container has that is not in compose.yaml: PATH (with this virtualenv's python
    for `sh -c "python ..."`), a home, a locale. Nothing of this test process's LS_* settings."""
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/tmp"), "PYTHONUNBUFFERED": "1"}
    for key in ("LANG", "LC_ALL", "TMPDIR", "TRITON_INTERPRET"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env
