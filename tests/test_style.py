"""The code base passes ruff's lint rules and formatting (configured in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint() -> None:
    r = _ruff("check", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = _ruff("format", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr
