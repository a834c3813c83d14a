"""tools/sass_count.py run as the kernel tests need it: in a process of its own without
TRITON_INTERPRET (which swaps kernels for the interpreter's), its JSON line parsed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sass_count(*args: str) -> dict[str, Any]:
    """tools/sass_count.py ARGS -> its JSON line (the loop's instructions, the opcodes' counts)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, os.path.join(ROOT, "tools", "sass_count.py"), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
