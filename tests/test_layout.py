"""The house rules the code base keeps (README: module map; issue 42): small files, short
functions outside Triton kernels, and the worker's rooms depending one way."""

from __future__ import annotations

import ast
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
SKIP = {".venv", ".venv-fastchat", ".git", ".peer", ".whl", ".redis", ".models"}


def _sources() -> list[pathlib.Path]:
    """The repository's Python files: those git tracks or would (not what it ignores), else all."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode == 0 and listed.stdout.strip():
        return sorted(ROOT / name for name in listed.stdout.split() if (ROOT / name).exists())
    return [p for p in sorted(ROOT.rglob("*.py")) if not SKIP.intersection(p.relative_to(ROOT).parts)]


KERNELS = ROOT / "services" / "worker" / "kernels"  # a kernel keeps its math in one piece


def test_no_file_is_over_the_limit() -> None:
    over = [(str(p.relative_to(ROOT)), n) for p in _sources() if (n := p.read_text().count("\n")) > MAX_FILE_LINES]
    assert not over, f"files over {MAX_FILE_LINES} lines: {over}"


def test_no_function_is_over_the_limit_outside_kernels() -> None:
    over = []
    for p in _sources():
        if p.is_relative_to(KERNELS):
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over.append((str(p.relative_to(ROOT)), node.name, n))
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


def _imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize(
    ("room", "forbidden"),
    [
        # the runtime wraps a model through its declared interface, never the reverse
        ("services/worker/models", "services.worker.runtime"),
        ("services/worker/memory", "services.worker.runtime"),
        ("services/worker/memory", "services.worker.models"),
        ("shared", "services"),
    ],
)
def test_rooms_depend_one_way(room: str, forbidden: str) -> None:
    bad = [
        (str(p.relative_to(ROOT)), m)
        for p in sorted((ROOT / room).rglob("*.py"))
        for m in _imports(p)
        if m == forbidden or m.startswith(forbidden + ".")
    ]
    assert not bad, f"{room} imports {forbidden}: {bad}"
