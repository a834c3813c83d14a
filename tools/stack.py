"""Run LightStream's services as local processes: redis-server (optional), detokenizer,
router, worker group(s), visual replicas (a vision-language model's) and front end. Used by
``lightstream serve`` and the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from tools.supervisor import Child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Service:
    name: str  # unique in the stack: tokenizer, router, worker-0, detokenizer-0, ...
    module: str  # services.<x>
    args: list[str]
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)  # its own, over the stack's


@dataclass
class StackOptions:
    model_dir: str
    redis_url: str
    port: int
    host: str = "127.0.0.1"  # the front ends' listening address
    workers: int = 1
    detokenizers: int = 1
    fronts: int = 1  # front-end processes; more than one share the port (--reuse-port)
    namespace: str = "ls"
    log_dir: str = ""
    tokenizer_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    worker_args: list[str] = field(default_factory=list)
    detokenizer_args: list[str] = field(default_factory=list)
    visual_args: list[str] = field(default_factory=list)
    visuals: int = 1  # visual replicas, when the model has a vision tower (shared/vision_config.py)
    env: dict[str, str] = field(default_factory=dict)
    tokenizer_env: dict[str, str] = field(default_factory=dict)  # the front ends' own (their API keys), over env
    # > 0: worker group g sees only GPUs g * n .. g * n + n - 1 (CUDA_VISIBLE_DEVICES), so that
    # data-parallel groups each have GPUs of their own; 0: every group sees every GPU
    gpus_per_worker: int = 0
    # service name (router, worker-0, ...) -> what its command runs under, as another host's
    # `ip netns exec NS` (tools/netns_hosts.py); the command is exec'd, so the pid is the service's
    prefixes: dict[str, list[str]] = field(default_factory=dict)


def _visuals(opts: StackOptions) -> int:
    """A text model has no visual replica."""
    if opts.visuals == 0 or not os.path.exists(os.path.join(opts.model_dir, "config.json")):
        return 0
    from shared.model_config import ModelConfig

    return opts.visuals if ModelConfig.from_dir(opts.model_dir).vision is not None else 0


class Stack:
    def __init__(self, opts: StackOptions) -> None:
        self.opts = opts
        common = ["--namespace", opts.namespace]  # the Redis URL goes in the environment (start_service)
        self.services: dict[str, Service] = {}
        for k in range(opts.detokenizers):
            self._add(
                f"detokenizer-{k}",
                "services.detokenizer",
                [*common, "--model-dir", opts.model_dir, "--replica", f"detok-{k}", *opts.detokenizer_args],
            )
        self._add("router", "services.router", [*common, "--replica", "router-0", *opts.router_args])
        for v in range(_visuals(opts)):
            self._add(
                f"visual-{v}",
                "services.visual",
                [*common, "--model-dir", opts.model_dir, "--replica", f"visual-{v}", *opts.visual_args],
            )
        for g in range(opts.workers):
            self._add(
                f"worker-{g}",
                "services.worker",
                [
                    *common,
                    "--model-dir",
                    opts.model_dir,
                    "--group",
                    str(g),
                    "--replica",
                    f"worker-{g}",
                    *opts.worker_args,
                ],
            )
            if n := opts.gpus_per_worker:
                self.services[f"worker-{g}"].env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g * n + i) for i in range(n))
        shared_port = ["--reuse-port", "true"] if opts.fronts > 1 else []
        for f in range(opts.fronts):
            front = "tokenizer" if f == 0 else f"tokenizer-{f}"
            self._add(
                front,
                "services.tokenizer",
                [
                    *common,
                    "--model-dir",
                    opts.model_dir,
                    "--port",
                    str(opts.port),
                    "--host",
                    opts.host,
                    "--replica",
                    f"front-{f}",
                    *shared_port,
                    *opts.tokenizer_args,
                ],
            )
            self.services[front].env.update(opts.tokenizer_env)

    @property
    def url(self) -> str:
        host = self.opts.host
        if host in ("0.0.0.0", "::", ""):  # every address: this machine reaches it on loopback
            host = "127.0.0.1"
        return f"http://[{host}]:{self.opts.port}" if ":" in host else f"http://{host}:{self.opts.port}"

    def _add(self, name: str, module: str, args: list[str]) -> None:
        self.services[name] = Service(name, module, args)

    def start(self) -> Stack:
        for name in self.services:
            self.start_service(name)
        return self

    def start_service(self, name: str) -> None:
        svc = self.services[name]
        # the URL may carry Redis's password: in the environment, not on the command line every user can read
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "LS_REDIS_URL": self.opts.redis_url, **self.opts.env, **svc.env}
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        out = None
        if self.opts.log_dir:
            os.makedirs(self.opts.log_dir, exist_ok=True)
            out = open(os.path.join(self.opts.log_dir, f"{name}.log"), "ab")  # noqa: SIM115 (lives with the process)
        svc.proc = subprocess.Popen(
            [*self.opts.prefixes.get(name, []), sys.executable, "-m", svc.module, *svc.args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,
        )

    def children(self) -> list[Child]:
        """Each service as a supervised process (tools/supervisor.py)."""
        return [
            Child(name, lambda svc=svc: svc.proc, lambda name=name: self.start_service(name))
            for name, svc in self.services.items()
        ]

    def kill_service(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.services[name].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(15)

    def signal_service(self, name: str, sig: int) -> None:
        """Send a signal without waiting for an exit (SIGSTOP freezes a service, SIGCONT thaws it)."""
        proc = self.services[name].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def wait_ready(self, timeout_s: float = 120.0, stopping: threading.Event | None = None) -> None:
        """Until /health says ready; fails early if a service exits. Front ends sharing the port
        each see the other services on their own clock, and the kernel picks one per connection:
        ready is then several answers in a row, each on a new connection. Returns early once
        ``stopping`` is set."""
        end = time.monotonic() + timeout_s
        needed = 1 if self.opts.fronts == 1 else 4 * self.opts.fronts
        in_a_row = 0
        while time.monotonic() < end and not (stopping is not None and stopping.is_set()):
            for svc in self.services.values():
                if svc.proc is not None and svc.proc.poll() is not None:
                    raise RuntimeError(f"{svc.name} exited with {svc.proc.returncode} while starting")
            try:
                in_a_row = in_a_row + 1 if httpx.get(self.url + "/health", timeout=2.0).status_code == 200 else 0
            except httpx.HTTPError:
                in_a_row = 0
            if in_a_row >= needed:
                return
            time.sleep(0.25 if in_a_row == 0 else 0.02)
        if stopping is not None and stopping.is_set():
            return
        raise TimeoutError(f"LightStream at {self.url} not ready within {timeout_s}s")

    def stop(self, timeout_s: float = 10.0) -> None:
        procs = [s.proc for s in self.services.values() if s.proc is not None and s.proc.poll() is None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout_s
        for p in procs:
            try:
                p.wait(max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
