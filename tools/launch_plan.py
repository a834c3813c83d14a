"""What tools/quick_launch_docker.py runs, worked out without touching Docker.

A launch is either one all-in-one container (tools/run_local.py inside: Redis and the four
services as processes) or the compose stack (compose.yaml, compose.gpu.yaml for GPUs, and
an override file with the serving options). Each plan renders as the docker CLI lines a
person would type (what --dry-run prints) and, for the container, as docker SDK arguments.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HTTP_PORT = 8000  # the front end's port inside a container
# inside the all-in-one container: where run_local.py's router, worker and detokenizer serve /metrics
METRICS_PORTS = {"router": 9101, "worker": 9102, "detokenizer": 9103}
MODEL_MOUNT = "/model"
REDIS_URL = "redis://127.0.0.1:6379/0"  # the all-in-one container's Redis, so `python -m tools.inspect` finds it


@dataclass(frozen=True)
class ServingOption:
    """A flag of the helper that is a flag of some services (same name, same meaning)."""

    flag: str
    type: type
    services: tuple[str, ...]
    help: str
    aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


SERVING_OPTIONS = (
    ServingOption("--tp", int, ("worker",), "tensor-parallel ranks of the worker group", ("--num-proc",)),
    ServingOption(
        "--max-total-token-num", int, ("worker",), "KV pool tokens (default: from free memory)", ("--max-total-tokens",)
    ),
    ServingOption("--batch-max-tokens", int, ("worker",), "prefill tokens per step"),
    ServingOption("--running-max-req-size", int, ("router", "worker"), "most requests running on a worker group"),
    ServingOption("--max-req-total-len", int, ("tokenizer", "worker"), "prompt + output tokens per request"),
    ServingOption("--mem-fraction", float, ("worker",), "share of GPU memory for weights and KV pool"),
    ServingOption("--dtype", str, ("worker",), "auto, float32, bfloat16 or float16"),
    ServingOption("--kv-dtype", str, ("worker",), "auto, int8 or fp8"),
    ServingOption("--quantization", str, ("worker",), "none or fp8 (weights quantized at load)"),
    ServingOption("--cuda-graph-max-bs", int, ("worker",), "largest decode batch run as a CUDA graph"),
    ServingOption(
        "--cuda-graph-max-tokens", int, ("worker",), "largest step with prompt tokens in CUDA graphs (but attention)"
    ),
    ServingOption("--max-waiting", int, ("router",), "the router's queue bound"),
    ServingOption("--router-token-ratio", float, ("router",), "KV usage above which admission is strict"),
    ServingOption("--router-max-new-token-len", int, ("router",), "the router's guess of an output's length"),
    ServingOption("--max-queue-time-s", float, ("router",), "longest wait in the router's queue"),
    ServingOption("--request-timeout-s", float, ("tokenizer",), "no request outlives this"),
    ServingOption("--model-name", str, ("tokenizer",), "the model's name for clients"),
)


def service_flags(values: dict[str, Any], api_keys: list[str]) -> dict[str, list[tuple[str, str]]]:
    """service -> its (flag, value) pairs, for the serving options given (None: not given)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for opt in SERVING_OPTIONS:
        value = values.get(opt.dest)
        if value is None:
            continue
        for service in opt.services:
            out.setdefault(service, []).append((opt.flag, str(value)))
    for key in api_keys:  # a repeatable flag: one key each
        out.setdefault("tokenizer", []).append(("--api-key", key))
    return out


def service_env(flags: dict[str, list[tuple[str, str]]]) -> dict[str, dict[str, str]]:
    """The same settings as the LS_* variables the services read (--api-key a --api-key b: LS_API_KEYS=a,b)."""
    out: dict[str, dict[str, str]] = {}
    for service, pairs in flags.items():
        env = out.setdefault(service, {})
        for flag, value in pairs:
            if flag == "--api-key":
                env["LS_API_KEYS"] = ",".join(filter(None, [env.get("LS_API_KEYS", ""), value]))
            else:
                env["LS_" + flag.removeprefix("--").replace("-", "_").upper()] = value
    return out


@dataclass(frozen=True)
class Gpus:
    """--gpus: none, all, a count, or device ids (0,1)."""

    spec: str

    @property
    def none(self) -> bool:
        return self.spec in ("", "none", "0")

    @property
    def ids(self) -> list[str]:
        """Device ids when given as ids (0,1 or device=0,1), else none."""
        spec = self.spec.removeprefix("device=")
        return spec.split(",") if "," in spec or self.spec.startswith("device=") else []

    def count(self) -> int | None:
        """How many GPUs, when known (None: all)."""
        if self.none:
            return 0
        if self.spec == "all":
            return None
        return len(self.ids) if self.ids else int(self.spec)

    def cli(self) -> str:
        return f'"device={",".join(self.ids)}"' if self.ids else self.spec


@dataclass(frozen=True)
class ContainerPlan:
    image: str  # repository:target
    target: str  # the Dockerfile target that builds it
    build: bool  # build even when the image exists
    name: str
    command: list[str]
    ports: dict[int, int]  # container port -> host port
    volumes: dict[str, str]  # host path -> container path, read-only
    environment: dict[str, str]
    gpus: Gpus
    shm_size: str
    remove: bool
    replace: bool = False  # remove a container of the same name first

    def build_cli(self) -> list[str]:
        return ["docker", "build", "--target", self.target, "-t", self.image, ROOT]

    def run_cli(self) -> list[str]:
        line = ["docker", "run", "-d", "--name", self.name]
        if self.remove:
            line.append("--rm")
        for inner, outer in self.ports.items():
            line += ["-p", f"{outer}:{inner}"]
        for host, inner in self.volumes.items():
            line += ["-v", f"{host}:{inner}:ro"]
        line += ["--shm-size", self.shm_size]
        if not self.gpus.none:
            line += ["--gpus", self.gpus.cli(), "--ulimit", "memlock=-1", "--ulimit", "stack=67108864"]
        for key, value in self.environment.items():
            line += ["-e", f"{key}={value}"]
        return [*line, self.image, *self.command]

    def sdk_kwargs(self) -> dict[str, Any]:
        """docker.from_env().containers.run(image, command, **these): the same as run_cli()."""
        from docker.types import DeviceRequest, Ulimit  # only when launching: --dry-run needs no docker package

        kw: dict[str, Any] = {
            "name": self.name,
            "detach": True,
            "auto_remove": self.remove,
            "ports": {f"{inner}/tcp": outer for inner, outer in self.ports.items()},
            "volumes": {host: {"bind": inner, "mode": "ro"} for host, inner in self.volumes.items()},
            "environment": dict(self.environment),
            "shm_size": self.shm_size,
        }
        if not self.gpus.none:
            n = self.gpus.count()
            request = DeviceRequest(device_ids=self.gpus.ids, capabilities=[["gpu"]])
            if not self.gpus.ids:
                request = DeviceRequest(count=-1 if n is None else n, capabilities=[["gpu"]])
            kw["device_requests"] = [request]
            kw["ulimits"] = [
                Ulimit(name="memlock", soft=-1, hard=-1),
                Ulimit(name="stack", soft=67108864, hard=67108864),
            ]
        return kw

    def lines(self) -> list[str]:
        out = [f"{shlex.join(self.build_cli())}  # when {self.image} is missing, or with --build"]
        if self.replace:
            out.append(shlex.join(["docker", "rm", "-f", self.name]))
        return [*out, shlex.join(self.run_cli())]


@dataclass(frozen=True)
class ComposePlan:
    project: str
    files: list[str]  # relative to ROOT, then the override file
    env: dict[str, str]  # variables compose.yaml reads
    override: dict[str, Any]  # the serving options, per service
    scale: dict[str, int]
    build: bool
    override_path: str = field(default="")

    @property
    def all_files(self) -> list[str]:
        """The compose files, then the override when there is anything in it (docker-compose 1.29
        takes a file with no services for one of the old format, and refuses to mix the two)."""
        return [*self.files, self.override_path] if self.override["services"] else list(self.files)

    def up_args(self) -> list[str]:
        args = ["-p", self.project]
        for f in self.all_files:
            args += ["-f", f]
        args += ["up", "-d"]
        if self.build:
            args.append("--build")
        for service, n in self.scale.items():
            args += ["--scale", f"{service}={n}"]
        return args

    def lines(self, compose: list[str]) -> list[str]:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        override = [f"# {self.override_path}:", *("# " + line for line in self.override_text().splitlines())]
        return [
            *(override if self.override["services"] else []),
            f"cd {shlex.quote(ROOT)} && {env} {shlex.join([*compose, *self.up_args()])}".replace("  ", " "),
        ]

    def override_text(self) -> str:
        return json.dumps(self.override, indent=2)  # JSON is YAML: compose reads it as is


def override_path(project: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"lightstream-{project}", "compose.quick-launch.yaml")
