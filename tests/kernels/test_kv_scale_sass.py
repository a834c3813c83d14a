"""e4m3's int8 exponent scales are read in 4-byte words (kv_scale.load_kv_scale) so that the
decode loop's software pipeline copies them asynchronously, as it does float32 scales: checked in
the SASS of decode attention compiled for sm_90 here (tools/sass_count.py, in a process without
the interpreter; ptxas ships with Triton)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ops(scales: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, os.path.join(ROOT, "tools", "sass_count.py"), "decode-e4m3", "--scales", scales]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["ops"]


def test_exponent_scales_are_copied_asynchronously_as_float32_scales_are() -> None:
    exponents, floats = _ops("i8"), _ops("fp32")
    assert floats.get("LDGSTS", 0) > 0
    assert exponents.get("LDGSTS", 0) == floats["LDGSTS"]
