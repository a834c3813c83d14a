"""``pip install .`` as a user does it (slow): the wheel holds the ``lightstream`` command and
the package data, so from outside the checkout ``lightstream serve --help`` answers and the
demo model's maker finds its corpus. Built from a copy of the tracked files, without
dependencies or network (they are this virtualenv's)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args: list[str], cwd: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.slow
def test_the_installed_command_serves_help_and_makes_the_demo_model(tmp_path) -> None:
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    files = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], ROOT).split()
    for name in files:
        if os.path.isfile(os.path.join(ROOT, name)):
            os.makedirs(src / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, name), src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)], str(tmp_path))
    wheel = glob.glob(str(tmp_path / "dist" / "lightstream-*.whl"))[0]
    site = tmp_path / "site"
    _run([*pip, "install", "--no-deps", "--target", str(site), wheel], str(tmp_path))
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    helped = _run([str(site / "bin" / "lightstream"), "serve", "--help"], str(away), env)
    assert "--tensor-parallel-size" in helped and "LS_TP" in helped
    _run([sys.executable, "-m", "tools.make_tiny_model", "--out", str(away / "m")], str(away), env)
    assert os.path.exists(away / "m" / "tokenizer.json")
