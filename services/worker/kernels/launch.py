"""Launching a compiled Triton kernel without Triton's per-call dispatch.

``kernel[grid](...)`` binds the arguments, works out how each one specialises the kernel
and looks the compiled kernel up, every call: about 50 µs of Python on the H200's host
(r10), longer than most of our kernels run. An eager step launches about six per layer,
so a lone prompt's prefill was bound by the host (18 ms for 209 tokens, the device
needing a third of that).

``launcher(kernel)[grid](...)`` takes the same arguments. It keys the compiled kernel by
everything Triton specialises a compiled kernel on, more finely than Triton does:
  - a tensor by its dtype and whether its address is 16-byte aligned;
  - an integer by whether it is 1, whether it divides by 16, and its width (32 or 64 bit);
  - a float by its type only (passed as fp32, never specialised);
  - a constexpr, or a launch option such as num_warps, by its value.
A key seen before calls the compiled kernel's launcher directly; a new key goes through
Triton, which compiles (or finds) and launches the kernel, and is remembered. Under
TRITON_INTERPRET=1 (the CPU tests), with a launch hook installed (a profiler), or for an
argument of any other type, it is Triton's own call.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import triton

_MISSING = object()
_INT32 = (-(2**31), 2**31)


def _arg_key(value: Any, constexpr: bool) -> Any:
    """What of one argument the compiled kernel depends on; _MISSING when unknown."""
    if constexpr:
        return ("c", value)
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if value is None:
        return None
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int):
        width = 32 if _INT32[0] <= value < _INT32[1] else (64 if value < 2**63 else 65)
        return (value == 1, value % 16 == 0, width)
    if isinstance(value, float):
        return "f"
    return _MISSING


def _hooks_installed() -> bool:
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    return runtime is None or runtime.launch_enter_hook is not None or runtime.launch_exit_hook is not None


class Launcher:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        params = list(inspect.signature(fn.fn).parameters.values())
        self.names = [p.name for p in params]
        self.index = {p.name: i for i, p in enumerate(params)}
        self.defaults = [p.default for p in params]
        self.constexpr = [bool(kp.is_constexpr) for kp in fn.params]
        self.compiled: dict[tuple, Any] = {}

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def bind(self, args: tuple, kwargs: dict) -> tuple[list, dict]:
        """-> every parameter's value in order (defaults filled in), and the launch options."""
        values = list(args) + [_MISSING] * (len(self.names) - len(args))
        options = {}
        for name, v in kwargs.items():
            i = self.index.get(name)
            if i is None:
                options[name] = v
            else:
                values[i] = v
        for i, v in enumerate(values):
            if v is _MISSING:
                if self.defaults[i] is inspect.Parameter.empty:
                    raise TypeError(f"{self.names[i]} is missing")
                values[i] = self.defaults[i]
        return values, options

    def key(self, values: list, options: dict, device: int) -> tuple | None:
        """None when an argument's type is not one this module knows how Triton specialises."""
        parts = [_arg_key(v, c) for v, c in zip(values, self.constexpr, strict=True)]
        if any(p is _MISSING for p in parts):
            return None
        return (device, tuple(parts), tuple(sorted(options.items())))

    def launch(self, grid: tuple[int, ...], args: tuple, kwargs: dict) -> None:
        values, options = self.bind(args, kwargs)
        device = torch.cuda.current_device()
        key = self.key(values, options, device)
        kernel = self.compiled.get(key) if key is not None else None
        if kernel is None or _hooks_installed():
            kernel = self.fn[grid](*args, **kwargs)
            if key is not None and getattr(kernel, "function", None) is not None:
                self.compiled[key] = kernel
            return
        g0 = grid[0]
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        stream = torch._C._cuda_getCurrentRawStream(device)  # the capture stream while a CUDA graph records
        kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *values)


def launcher(fn: Any) -> Any:
    """A fast launcher for a @triton.jit kernel; the kernel itself under the interpreter."""
    if not isinstance(fn, triton.runtime.jit.JITFunction):
        return fn  # an InterpretedFunction (TRITON_INTERPRET=1): nothing to bypass
    return Launcher(fn)
