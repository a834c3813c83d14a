"""FastChat's own servers (controller, OpenAI API server) as processes, for the tests that
put LightStream behind them. They run from .venv-fastchat (tools/setup.sh), made here
when missing: FastChat's API server streams only with pydantic 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(ROOT, ".venv-fastchat")


def fastchat_python() -> str:
    """The FastChat virtualenv's interpreter, installing it as tools/setup.sh does if missing."""
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", VENV], check=True)
        req = os.path.join(ROOT, "requirements-fastchat.txt")
        subprocess.run([python, "-m", "pip", "install", "-q", "-r", req], check=True)
    return python


class FastChatServer:
    """python -m fastchat.serve.<module> in its own session, logging into log_dir (FastChat
    writes its log files into the working directory)."""

    def __init__(self, module: str, args: list[str], log_dir: str) -> None:
        self.module = module
        self.log_path = os.path.join(log_dir, f"{module.rsplit('.', 1)[-1]}.out")
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [fastchat_python(), "-m", module, *args],
                cwd=log_dir,
                env={**os.environ, "LOGDIR": log_dir, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_until(self, check: Callable[[], bool], timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.module} exited with {self.proc.returncode}: {self.tail()}")
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{what} not within {timeout_s}s: {self.tail()}")

    def tail(self, n: int = 2000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def controller_models(url: str) -> list[str]:
    return httpx.post(url + "/list_models", timeout=5).json()["models"]
