"""What ``pip install .`` and the images bring: the runtime dependencies are what the services,
shared/ and the ``lightstream`` command import (the tools' and tests' own are extras), and
every image exposes the HTTP port, checks /health and installs requirements.txt's torch."""

from __future__ import annotations

import ast
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# what `lightstream serve` runs besides the services; the rest of tools/ is the tools extra's
SERVED = ["services", "shared", "lightstream", "tools/stack.py", "tools/redis_server.py", "tools/make_tiny_model.py"]
LOCAL = {"services", "shared", "lightstream", "tools", "tests"}
# import name -> distribution name, where they differ
DISTRIBUTIONS = {"prometheus_client": "prometheus-client", "PIL": "pillow", "pydantic_core": "pydantic-core"}
# installed for what they do inside another package: redis-py's C parser, uvicorn's loop and HTTP parser
IMPLICIT = {"hiredis", "uvloop", "httptools"}


def _third_party_imports() -> set[str]:
    names: set[str] = set()
    for entry in SERVED:
        path = ROOT / entry
        for file in [path] if path.is_file() else sorted(path.rglob("*.py")):
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module.split(".")[0])
    return {DISTRIBUTIONS.get(n, n) for n in names - LOCAL - set(sys.stdlib_module_names) - {"__future__"}}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower()


def test_runtime_dependencies_are_what_the_services_import() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    imported = _third_party_imports()
    assert imported <= declared, f"imported, not declared: {sorted(imported - declared)}"
    assert declared - imported <= IMPLICIT, f"declared, not imported: {sorted(declared - imported - IMPLICIT)}"
    assert {"docker", "aiohttp"} <= {_name(r) for r in project["optional-dependencies"]["tools"]}
    pinned = {_name(line) for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line}
    assert declared <= pinned and not {"docker", "aiohttp"} & pinned


def _stages() -> dict[str, str]:
    """Dockerfile stage name -> its text."""
    text = (ROOT / "Dockerfile").read_text()
    parts = re.split(r"^FROM \S+ AS (\S+)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_image_exposes_the_port_and_checks_health() -> None:
    stages = _stages()
    parent = {"light": "light-deps", "cpu": "light-deps", "cuda": None}
    for target, base in parent.items():
        text = stages[target] + (stages[base] if base else "")
        assert re.search(r"^EXPOSE 8000$", text, re.M), target
        check = re.search(r"^HEALTHCHECK .*\n?.*CMD .*", text, re.M)
        assert check and "/health" in check.group(0), target


def test_images_install_requirements_torch() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "torch>=" not in text
    assert text.count("${TORCH_SPEC:-$(grep -E '^torch==' requirements.txt)}") == 2
    assert re.search(r"^torch==\S+$", (ROOT / "requirements.txt").read_text(), re.M)
