"""e4m3's int8 exponent scales are read in 4-byte words (kv_scale.load_kv_scale) so that the
decode loop's software pipeline copies them asynchronously, as it does float32 scales: checked in
the SASS of decode attention compiled for sm_90 here (tools/sass_count.py, in a process without
the interpreter; ptxas ships with Triton)."""

from __future__ import annotations

from tests.kernels.sass_run import sass_count


def test_exponent_scales_are_copied_asynchronously_as_float32_scales_are() -> None:
    exponents = sass_count("decode-e4m3", "--scales", "i8")["ops"]
    floats = sass_count("decode-e4m3", "--scales", "fp32")["ops"]
    assert floats.get("LDGSTS", 0) > 0
    assert exponents.get("LDGSTS", 0) == floats["LDGSTS"]
