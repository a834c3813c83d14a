"""tools/bench_families.py on the CPU, so the script behind issue 45's GPU rows cannot rot: two
families' tiny models through the engine end to end on the workload's first requests; the commands
it would start on the GPU parsed by the scripts' own flags; the peer's JSON read in the shapes
peer_hf.py writes (the peer cannot run here: it builds its model on CUDA). Timings mean nothing
here."""

from __future__ import annotations

import json
import os

import pytest

from tests.tools.test_workload import shared_workload_path
from tools import bench_families, benchmark_engine, make_tiny_model
from tools.workload import sharegpt_shaped

# a benchmark tool end to end on the tiny model: opt-in (pytest -m bench), to keep CI within its time
pytestmark = pytest.mark.bench


N = 2  # the workload's first two: 129 and 114 output tokens


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {}
    for family in ("llama", "qwen3_moe"):
        path = str(tmp_path_factory.mktemp(f"tiny-{family}"))
        make_tiny_model.main(["--out", path, "--arch", family])
        out[family] = path
    return out


def test_two_families_through_the_engine_on_the_cpu(tiny_dirs: dict[str, str], tmp_path) -> None:
    out = tmp_path / "families.json"
    argv = ["--out", str(out), "--families", "llama,qwen3_moe", "--requests", str(N), "--peer", "none"]
    argv += ["--device", "cpu", "--decode-shapes", ""]
    for family, path in tiny_dirs.items():
        argv += ["--model", f"{family}={path}"]
    bench_families.main(argv)
    res = json.loads(out.read_text())
    assert list(res["families"]) == ["llama", "qwen3_moe"] and "decode" not in res
    want_out = sum(o for _, o in sharegpt_shaped(N))
    for family, row in res["families"].items():
        assert row["shape"] == tiny_dirs[family] and row["peer"] == "not run", row
        assert row["engine_req_per_s"] > 0 and row["engine_job"]["rc"] == 0, row
        engine = json.loads((tmp_path / f"engine-{family}.json").read_text())
        assert engine["offline"]["output_tokens"] == want_out  # ignore_eos: every request to its length


def test_the_commands_flags_are_the_scripts_own(tmp_path) -> None:
    """What a GPU run would start, parsed by benchmark_engine.py's own parser, and the peer's flags
    found in peer_hf.py (its parser lives inside its main)."""
    args = bench_families.parse_args(["--out", str(tmp_path / "f.json"), "--requests", "16"])
    for family in bench_families.FAMILY_SHAPES:
        engine = benchmark_engine.parse_args(bench_families.engine_cmd(args, family, "e.json")[2:])
        assert engine.shape == bench_families.FAMILY_SHAPES[family] and engine.part_list == ["offline"]
        assert engine.requests == 16 and engine.cuda_graph_max_bs == 16
    static = benchmark_engine.parse_args(bench_families.static_cmd(args, "qwen3-8b", "s.json")[2:])
    assert static.shape == "qwen3-8b" and static.static == "1x1024,64x1024" and static.cuda_graph_max_bs == 64
    workload = shared_workload_path()
    if workload is None:
        pytest.skip("no shared/bench beside the checkout")
    peer = os.path.join(os.path.dirname(workload), "peer_hf.py")
    with open(peer) as f:
        text = f.read()
    cmd = bench_families.peer_cmd(args, bench_families.peer_config(args, "gemma2", str(tmp_path)), "p.json")
    assert all(f'"{flag}"' in text for flag in cmd if flag.startswith("--"))
    with open(os.path.join(cmd[cmd.index("--config") + 1], "config.json")) as f:
        assert json.load(f)["model_type"] == "gemma2"  # what transformers' AutoConfig builds it by


def test_decode_step_ratios_pair_the_same_points() -> None:
    a = [{"batch": 1, "context": 1024, "ms_per_step": 6.0}, {"batch": 64, "context": 1024, "ms_per_step": 9.0}]
    b = [{"batch": 64, "context": 1024, "ms_per_step": 10.0}, {"batch": 1, "context": 1024, "ms_per_step": 5.0}]
    assert bench_families.step_ratios(a, b) == {"1x1024": 1.2, "64x1024": 0.9}
    assert bench_families.step_ratios(a, b[:1]) == {"64x1024": 0.9}  # a run that died early: its points only


ENGINE = {"offline": {"requests": N, "req_per_s": 30.0}}
ENGINE_JOB = {"rc": 0, "timed_out": False, "seconds": 20.0, "log": "e.log"}
PEER_JOB = {"rc": 0, "timed_out": False, "seconds": 50.0, "log": "p.log"}
FINISHED = {"cb_offline": {"requests_done": N, "requests": N, "stopped": "", "req_per_s": 2.0}}


def test_the_ratio_is_the_engine_over_a_peer_that_finished() -> None:
    row = bench_families.family_row(N, ENGINE, ENGINE_JOB, FINISHED, PEER_JOB)
    assert row["ratio"] == 15.0 and row["peer_req_per_s"] == 2.0 and "peer_error" not in row


@pytest.mark.parametrize(
    ("peer", "job", "error"),
    [
        # peer_hf.py's own deadline: fewer done, and why
        (
            {"cb_offline": {"requests_done": 1, "requests": N, "stopped": "deadline: 1/3 done in 300s"}},
            PEER_JOB,
            "deadline",
        ),
        # a part that raised: peer_hf.py records the error and goes on
        ({"cb_offline": {"error": "RuntimeError('CUDA out of memory')"}}, PEER_JOB, "out of memory"),
        # killed at --peer-timeout before it wrote anything
        ({}, {**PEER_JOB, "rc": None, "timed_out": True}, "timed out"),
    ],
)
def test_no_ratio_from_a_peer_that_did_not_finish(peer: dict, job: dict, error: str) -> None:
    row = bench_families.family_row(N, ENGINE, ENGINE_JOB, peer, job)
    assert "ratio" not in row and row["peer_req_per_s"] is None and error in row["peer_error"]


def test_an_engine_without_figures_gives_no_ratio() -> None:
    row = bench_families.family_row(N, {}, {**ENGINE_JOB, "rc": 1}, FINISHED, PEER_JOB)
    assert "ratio" not in row and "engine_error" in row
