"""Launching a compiled Triton kernel without Triton's per-call dispatch.

``kernel[grid](...)`` binds the arguments, works out how each one specialises the kernel
and looks the compiled kernel up, every call: about 50 µs of Python on the H200's host,
longer than most of our kernels run. An eager step launches about six per layer,
so a lone prompt's prefill was bound by the host (18 ms for 209 tokens, the device
needing a third of that).

``launcher(kernel)[grid](...)`` takes the same arguments. It keys the compiled kernel by
the call's form (which arguments come by position, which by name) and by everything
Triton specialises a compiled kernel on, more finely than Triton does:
  - a tensor by its dtype and whether its address is 16-byte aligned;
  - an integer by whether it is 1, whether it divides by 16, and its width (32 or 64 bit),
    or by its width only when the kernel says not to specialise on it (do_not_specialize);
  - a float by its type only (passed as fp32, never specialised);
  - a constexpr, or a launch option such as num_warps, by its value.
A key seen before calls the compiled kernel's launcher directly; a new key goes through
Triton, which compiles (or finds) and launches the kernel, and is remembered with how to
put the call's arguments in the kernel's order. Under TRITON_INTERPRET=1 (the CPU tests),
with a launch hook installed (a profiler), or for an argument of any other type, it is
Triton's own call.

The direct path calls a compiled kernel's run with its arguments by position, an interface
private to Triton that may change with any version. So it is taken only on a Triton whose
major.minor is in TESTED_TRITON, and only after a self-test on the live GPU (the first time a
launch could take it on a device): a probe kernel launched directly must write exactly what
Triton's own launch of it writes. Otherwise every launch goes through Triton; a log line says
which path runs.

A call through Triton that takes over SLOW_LAUNCH_S compiled (or loaded from Triton's disk
cache) a specialisation: it is logged with the kernel's name, so a compile that stalls
requests while serving can be seen and added to the start-up warm-up.
"""

from __future__ import annotations

import inspect
import logging
import time
from functools import partial
from typing import Any

import torch
import triton
import triton.language as tl

log = logging.getLogger(__name__)

_MISSING = object()
_ARG, _KWARG, _DEFAULT = 0, 1, 2
SLOW_LAUNCH_S = 0.02  # a cached specialisation launches in microseconds; a compile takes 100s of ms
# Triton major.minor versions whose compiled kernels' run the direct path was developed and
# checked against (on H200s, with torch 2.11.0+cu130). The CPU tests' Triton runs the
# interpreter, which has no direct path, so its version does not belong here.
TESTED_TRITON = ("3.6",)
_DIRECT: dict[int, bool] = {}  # device -> whether launches on it take the direct path, once decided


def _arg_key(v: Any, plain: bool = False) -> Any:
    """What of a runtime argument a compiled kernel depends on; _MISSING when unknown. plain:
    the kernel does not specialise on this argument's value."""
    t = type(v)
    if t is int:
        width = 32 if -(2**31) <= v < 2**31 else (64 if -(2**63) <= v < 2**63 else 65)
        return ("n", width) if plain else (v == 1, v % 16 == 0, width)
    if t is float:
        return "f"
    if t is bool:
        return ("b", v)
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    return _MISSING


def _hook_set(hook: Any) -> bool:
    """A launch hook is installed: None, or Triton's HookChain with no calls, means none."""
    return hook is not None and bool(getattr(hook, "calls", True))


class Launcher:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        params = list(inspect.signature(fn.fn).parameters.values())
        self.names = [p.name for p in params]
        self.index = {p.name: i for i, p in enumerate(params)}
        self.defaults = [p.default for p in params]
        self.constexpr = [bool(kp.is_constexpr) for kp in fn.params]
        self.plain = {kp.name for kp in fn.params if getattr(kp, "do_not_specialize", False)}
        # keyword arguments keyed by value: constexprs and launch options (num_warps, ...)
        self.by_value = {n for n, c in zip(self.names, self.constexpr, strict=True) if c}
        self.compiled: dict[tuple, tuple[Any, list[tuple[int, Any]]]] = {}
        self.direct = 0  # launches that took the direct path
        self.slow: list[tuple[float, tuple | None]] = []  # (seconds, key) of each slow call through Triton

    def __getitem__(self, grid: tuple[int, ...]):
        return partial(self.launch, grid)

    def key(self, args: tuple, kwargs: dict, device: int) -> tuple | None:
        """The call's form and specialisation; None when an argument's type is not one this
        module knows how Triton specialises."""
        pos = []
        for i, v in enumerate(args):
            k = ("c", v) if self.constexpr[i] else _arg_key(v, self.names[i] in self.plain)
            if k is _MISSING:
                return None
            pos.append(k)
        named = []
        for n, v in kwargs.items():
            k = ("c", v) if n in self.by_value or n not in self.index else _arg_key(v, n in self.plain)
            if k is _MISSING:
                return None
            named.append((n, k))
        return (device, tuple(pos), tuple(named))

    def plan(self, nargs: int, names: tuple[str, ...]) -> list[tuple[int, Any]]:
        """Where each of the kernel's parameters comes from in a call of this form: a
        position, a name, or the parameter's default."""
        out: list[tuple[int, Any]] = []
        for i, name in enumerate(self.names):
            if i < nargs:
                out.append((_ARG, i))
            elif name in names:
                out.append((_KWARG, name))
            elif self.defaults[i] is not inspect.Parameter.empty:
                out.append((_DEFAULT, self.defaults[i]))
            else:
                raise TypeError(f"{self.names[i]} is missing")
        return out

    def _note(self, seconds: float, key: tuple | None) -> None:
        if seconds < SLOW_LAUNCH_S:
            return
        self.slow.append((seconds, key))
        named = dict(key[2]) if key is not None else {}
        consts = {n: v[1] for n, v in named.items() if isinstance(v, tuple) and v[:1] == ("c",)}
        log.info(
            "%s: a new specialisation took %.0f ms to compile or load (%s)",
            self.fn.fn.__name__,
            1000 * seconds,
            ", ".join(f"{n}={v}" for n, v in consts.items()) or "no constexprs by name",
        )

    @staticmethod
    def values(plan: list[tuple[int, Any]], args: tuple, kwargs: dict) -> list:
        return [args[x] if s == _ARG else kwargs[x] if s == _KWARG else x for s, x in plan]

    def launch(self, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
        device = torch._C._cuda_getDevice()
        key = self.key(args, kwargs, device)
        entry = self.compiled.get(key) if key is not None else None
        runtime = triton.knobs.runtime
        if (
            entry is None
            or _hook_set(runtime.launch_enter_hook)
            or _hook_set(runtime.launch_exit_hook)
            or not direct_path_on(device)
        ):
            self.through_triton(grid, key, args, kwargs)
            return
        self.direct += 1
        self.run_direct(entry, grid, device, args, kwargs)

    def through_triton(self, grid: tuple[int, ...], key: tuple | None, args: tuple, kwargs: dict) -> None:
        """Triton's own launch; the compiled kernel is remembered under key for the direct path."""
        t0 = time.perf_counter()
        kernel = self.fn[grid](*args, **kwargs)
        if key is not None and getattr(kernel, "function", None) is not None:
            self.compiled[key] = (kernel, self.plan(len(args), tuple(kwargs)))
        self._note(time.perf_counter() - t0, key)

    def run_direct(
        self, entry: tuple[Any, list], grid: tuple[int, ...], device: int, args: tuple, kwargs: dict
    ) -> None:
        """The compiled kernel's launcher called with the kernel's arguments in order."""
        kernel, plan = entry
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device)  # the capture stream while a CUDA graph records
        kernel.run(
            grid[0],
            g1,
            g2,
            stream,
            kernel.function,
            kernel.packed_metadata,
            None,
            None,
            None,
            *self.values(plan, args, kwargs),
        )


def direct_path_allowed(triton_version: str, tested: tuple[str, ...] = TESTED_TRITON) -> tuple[bool, str]:
    """Whether the direct path may be tried under this Triton version (its self-test still to
    pass), and why: only a major.minor it was tested with; any other falls back."""
    major_minor = ".".join(triton_version.split("+")[0].split(".")[:2])
    if major_minor in tested:
        return True, f"Triton {triton_version} is a tested version"
    return False, f"Triton {triton_version} was never tested with the direct launcher (tested: {', '.join(tested)})"


def direct_path_on(device: int) -> bool:
    """Whether launches on device take the direct path: decided the first time it is asked, by
    the version table and the self-test, and logged."""
    decided = _DIRECT.get(device)
    if decided is not None:
        return decided
    if torch.cuda.is_current_stream_capturing():
        return False  # no self-test inside a capture: this launch is Triton's own, the next one decides
    allowed, why = direct_path_allowed(triton.__version__, TESTED_TRITON)
    if allowed:
        problem = self_test(device)
        allowed, why = problem is None, problem or f"{why}, and its self-test passed"
    _DIRECT[device] = allowed
    path = "directly (the compiled kernel's run)" if allowed else "through Triton's own dispatch"
    log.info("Triton kernels on cuda:%d launch %s: %s", device, path, why)
    return allowed


@triton.jit(do_not_specialize=["n"])
def _probe_kernel(x_ptr, out_ptr, stride, n, factor, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + row * stride + offs, mask=mask)
    tl.store(out_ptr + row * stride + offs, v * factor + row, mask=mask)


def self_test(device: int) -> str | None:
    """None when direct launches of a probe kernel (by position and by name, on an aligned and
    a misaligned tensor) write exactly what Triton's own launches write; else what went wrong."""
    probe = Launcher(_probe_kernel)
    base = torch.randn(4, 48, device=f"cuda:{device}")
    try:
        for x in (base, base[:, 1:]):
            kwargs = {"stride": x.stride(0), "n": 33, "factor": 1.5, "BLOCK": 64, "num_warps": 1}
            want, got = torch.full_like(base, 7.0), torch.full_like(base, 7.0)
            key = probe.key((x, want), kwargs, device)
            probe.through_triton((4,), key, (x, want), kwargs)
            entry = probe.compiled.get(key)
            if entry is None:
                return "Triton's launch returned no compiled kernel to call directly"
            probe.run_direct(entry, (4,), device, (x, got), kwargs)
            torch.cuda.synchronize(device)
            if not torch.equal(got, want):
                return "a direct launch of the probe kernel wrote other values than Triton's own launch"
    except Exception as e:  # any failure of the private interface means: do not use it
        return f"a direct launch of the probe kernel failed: {type(e).__name__}: {e}"
    return None


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host: triton.cdiv goes through Triton's constexpr machinery (1.4 us a call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1), for the host, as triton.next_power_of_2."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def launcher(fn: Any) -> Any:
    """A fast launcher for a @triton.jit kernel; the kernel itself under the interpreter."""
    if not isinstance(fn, triton.runtime.jit.JITFunction) or not hasattr(triton, "knobs"):
        return fn  # an InterpretedFunction (TRITON_INTERPRET=1), or a Triton without knobs: nothing to bypass
    return Launcher(fn)
