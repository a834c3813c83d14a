"""The fast launcher: how it binds arguments and keys compiled kernels (CPU), and that kernels
launched through it on the GPU compute what Triton's own launch computes."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from services.worker.kernels import launch
from services.worker.kernels.launch import Launcher, cdiv, direct_path_allowed, launcher, next_pow2


def _scale_rows(x_ptr, out_ptr, stride, n, factor, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + row * stride + offs, mask=mask)
    tl.store(out_ptr + row * stride + offs, v * factor, mask=mask)


def _compiled() -> Launcher:
    """A Launcher over a real JITFunction, whatever TRITON_INTERPRET says (bind and key need no GPU)."""
    return Launcher(JITFunction(_scale_rows))


def test_a_call_form_plans_the_kernels_argument_order() -> None:
    la = _compiled()
    x, y = torch.zeros(4, 8), torch.ones(4, 8)
    args, kwargs = (x, y), {"n": 8, "stride": 16, "factor": 2.0, "BLOCK": 8, "num_warps": 2}
    plan = la.plan(len(args), tuple(kwargs))
    assert la.values(plan, args, kwargs) == [x, y, 16, 8, 2.0, 8]  # launch options are not kernel arguments
    with pytest.raises(TypeError, match="factor"):
        la.plan(4, ("BLOCK",))


def test_the_key_follows_what_triton_specialises_on() -> None:
    la = _compiled()
    x = torch.zeros(64)

    def key(*args, device=0, **kwargs):
        return la.key(args, kwargs, device)

    base = key(x, x, 8, 3, 2.0, BLOCK=8)
    # integers: 1, multiples of 16 and other values compile differently; two "other" values do not
    assert key(x, x, 8, 5, 2.0, BLOCK=8) == base
    assert key(x, x, 8, 1, 2.0, BLOCK=8) != base
    assert key(x, x, 8, 32, 2.0, BLOCK=8) != base
    assert key(x, x, 8, 2**40 + 3, 2.0, BLOCK=8) != base  # a 64-bit integer
    # floats are runtime fp32 values; constexprs and launch options are compiled in
    assert key(x, x, 8, 3, 0.5, BLOCK=8) == base
    assert key(x, x, 8, 3, 2.0, BLOCK=16) != base
    assert key(x, x, 8, 3, 2.0, 8) != base  # a constexpr by position: keyed by value, and another form
    assert key(x, x, 8, 3, 2.0, BLOCK=8, num_warps=8) != base
    # tensors: dtype and 16-byte alignment
    assert key(x.half(), x, 8, 3, 2.0, BLOCK=8) != base
    assert key(x[1:], x, 8, 3, 2.0, BLOCK=8) != base
    assert key(x[4:], x, 8, 3, 2.0, BLOCK=8) == base
    # the same values by name are another call form
    assert key(x, x, 8, 3, factor=2.0, BLOCK=8) != base
    # the device: each has its own loaded module
    assert key(x, x, 8, 3, 2.0, BLOCK=8, device=1) != base
    # a type Triton may treat otherwise is not keyed: Triton's own call handles it
    assert key(x, x, 8, 3, "2.0", BLOCK=8) is None


def test_under_the_interpreter_the_kernel_is_returned_as_is() -> None:
    fn = triton.jit(_scale_rows)
    la = launcher(fn)
    assert (la is fn) == (not isinstance(fn, JITFunction))


@pytest.mark.parametrize(
    ("version", "allowed"),
    [("3.6.0", True), ("3.6.1+git1a2b3c", True), ("3.5.1", False), ("3.7.0", False), ("3.9.0", False)],
)
def test_only_a_tested_triton_major_minor_may_launch_directly(version: str, allowed: bool) -> None:
    ok, why = direct_path_allowed(version)
    assert ok == allowed and version in why
    assert ("never tested" in why) != allowed
    assert direct_path_allowed("3.9.0", tested=("3.6", "3.9"))[0]


@pytest.fixture
def undecided(monkeypatch: pytest.MonkeyPatch) -> dict[int, bool]:
    """The launch path not yet decided on any device (restored after the test)."""
    decided: dict[int, bool] = {}
    monkeypatch.setattr(launch, "_DIRECT", decided)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return decided


@pytest.mark.parametrize(
    ("version", "problem", "direct", "says"),
    [
        ("3.6.0", None, True, "self-test passed"),
        ("3.6.0", "wrote other values", False, "wrote other values"),
        ("3.9.0", None, False, "never tested"),
    ],
)
def test_the_path_is_decided_once_a_device_and_logged(
    monkeypatch, caplog, undecided, version: str, problem: str | None, direct: bool, says: str
) -> None:
    tests: list[int] = []
    monkeypatch.setattr(launch.triton, "__version__", version)
    monkeypatch.setattr(launch, "self_test", lambda device: tests.append(device) or problem)
    with caplog.at_level("INFO", logger="services.worker.kernels.launch"):
        assert launch.direct_path_on(0) == direct
        assert launch.direct_path_on(0) == direct
    assert undecided == {0: direct}
    assert tests == ([] if version == "3.9.0" else [0])  # an untested version is not even self-tested
    (record,) = caplog.records
    assert says in record.getMessage()
    assert ("launch directly" in record.getMessage()) == direct


def test_no_self_test_runs_inside_a_graph_capture(monkeypatch, undecided) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(launch, "self_test", lambda device: pytest.fail("self-tested while capturing"))
    assert not launch.direct_path_on(0)
    assert undecided == {}  # decided at the next launch outside a capture


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_self_test_passes_on_the_live_gpu() -> None:
    assert launch.self_test(torch.cuda.current_device()) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_untested_triton_launches_through_triton(monkeypatch, undecided) -> None:
    monkeypatch.setattr(launch, "TESTED_TRITON", ())
    la = launcher(triton.jit(_scale_rows))
    x = torch.randn(8, 32, device="cuda")
    for _ in range(3):
        out = torch.zeros_like(x)
        la[(8,)](x, out, x.stride(0), 32, 2.0, BLOCK=32, num_warps=1)
        torch.testing.assert_close(out, x * 2.0)
    assert la.direct == 0 and undecided == {torch.cuda.current_device(): False}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fast_launches_compute_what_triton_launches_compute() -> None:
    fn = triton.jit(_scale_rows)
    la = launcher(fn)
    assert isinstance(la, Launcher)
    base = torch.randn(8, 33, device="cuda")
    for x in (base, base.view(-1)[1:].view(-1)[: 8 * 32].view(8, 32)):  # aligned, then not
        rows, n = x.shape
        for factor in (2.0, -0.5, 3.0):  # the second and third calls of each key take the fast path
            out = torch.full_like(x, float("nan"))
            la[(rows,)](x, out, x.stride(0), n, factor, BLOCK=64, num_warps=2)
            torch.testing.assert_close(out, x * factor)
    assert len(la.compiled) == 2 and la.direct == 4
    # and inside a CUDA graph, on the capture stream
    out = torch.zeros_like(base)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        la[(8,)](base, out, base.stride(0), 33, 4.0, BLOCK=64, num_warps=2)
    base.copy_(torch.randn_like(base))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, base * 4.0)


def test_host_integer_helpers_match_tritons() -> None:
    assert [next_pow2(n) for n in (1, 2, 3, 64, 65, 14336)] == [
        triton.next_power_of_2(n) for n in (1, 2, 3, 64, 65, 14336)
    ]
    assert all(cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 200) for b in range(1, 20))


def test_a_slow_call_through_triton_is_logged_with_the_kernel_and_its_constexprs(caplog) -> None:
    la = _compiled()
    key = la.key((torch.zeros(8), torch.zeros(8)), {"stride": 8, "n": 8, "factor": 1.0, "BLOCK": 64}, 0)
    with caplog.at_level("INFO", logger="services.worker.kernels.launch"):
        la._note(0.0005, key)  # a cached specialisation: nothing to say
        assert not caplog.records and not la.slow
        la._note(0.9, key)
    assert la.slow == [(0.9, key)]
    (record,) = caplog.records
    assert "_scale_rows" in record.getMessage() and "900 ms" in record.getMessage()
    assert "BLOCK=64" in record.getMessage()


def test_an_argument_the_kernel_does_not_specialise_on_is_keyed_by_its_width_only() -> None:
    la = Launcher(JITFunction(_scale_rows, do_not_specialize=["n"]))
    x = torch.zeros(64)

    def key(n: int, stride: int) -> tuple | None:
        return la.key((x, x, stride, n, 1.0), {"BLOCK": 64}, 0)

    assert key(1, 8) == key(16, 8) == key(17, 8)  # one compiled kernel for every count
    assert key(17, 8) != key(17, 16)  # the others still specialise
    assert key(17, 8) != key(2**40, 8)  # and a 64-bit count is another kernel
