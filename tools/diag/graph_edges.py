"""A captured CUDA graph's kernel nodes and edges, read and rewritten through the driver API.

Stream capture records every dependency between two kernels as a full one: the second starts
after the first has finished and its writes are flushed. A programmatic edge lets the second
start earlier (when every block of the first has started, or has signalled it), and is safe
only where the second kernel waits for the first itself (griddepcontrol.wait) before it
reads what the first wrote. `make_programmatic` rewrites the edges a caller picks.

The driver's functions are looked up at the CUDA 12.8 interface (cuGetProcAddress), where
cuGraphGetEdges and cuGraph{Add,Remove}Dependencies take edge data.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

NODE_KERNEL = 0
DEPENDENCY_PROGRAMMATIC = 1
PORT_PROGRAMMATIC = 1  # the first kernel's blocks have all signalled (or exited)
PORT_LAUNCH_ORDER = 2  # the first kernel's blocks have all started
_API = 12080


class EdgeData(ctypes.Structure):
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte), ("type", ctypes.c_ubyte),
                ("reserved", ctypes.c_ubyte * 5)]  # fmt: skip


class KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), *((n, ctypes.c_uint) for n in
                ("gx", "gy", "gz", "bx", "by", "bz", "smem")), ("params", ctypes.c_void_p),
                ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]  # fmt: skip


class Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._fns: dict[str, Callable] = {}

    def __call__(self, name: str, *args: object) -> None:
        if name not in self._fns:
            fn, status = ctypes.c_void_p(), ctypes.c_int()
            r = self.lib.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), _API, ctypes.c_uint64(0),
                                             ctypes.byref(status))  # fmt: skip
            if r != 0 or not fn.value:
                raise RuntimeError(f"the CUDA driver has no {name} (error {r}, status {status.value})")
            self._fns[name] = ctypes.CFUNCTYPE(ctypes.c_int, *(ctypes.c_void_p for _ in args))(fn.value)
        r = self._fns[name](*(_arg(a) for a in args))
        if r != 0:
            raise RuntimeError(f"{name} failed with CUDA error {r}")


def _arg(a: object) -> ctypes.c_void_p | None:
    """Every argument as one 64-bit word: pointers, handles and size_t alike (x86-64 and aarch64 ABIs)."""
    if a is None or isinstance(a, ctypes.c_void_p):
        return a
    if isinstance(a, int):
        return ctypes.c_void_p(a)
    return ctypes.cast(a, ctypes.c_void_p)  # a ctypes array


def _ptr(x: object) -> ctypes.c_void_p:
    return ctypes.cast(ctypes.byref(x), ctypes.c_void_p)  # type: ignore[arg-type]


class GraphEdges:
    """The kernel nodes of one cudaGraph_t (torch's `CUDAGraph(keep_graph=True).raw_cuda_graph()`)."""

    def __init__(self, graph: int, driver: Driver | None = None) -> None:
        self.cu = driver or Driver()
        self.graph = ctypes.c_void_p(graph)

    def nodes(self) -> list[int]:
        n = ctypes.c_size_t(0)
        self.cu("cuGraphGetNodes", self.graph, None, _ptr(n))
        arr = (ctypes.c_void_p * n.value)()
        self.cu("cuGraphGetNodes", self.graph, arr, _ptr(n))
        return [int(x or 0) for x in arr]

    def kernel_name(self, node: int) -> str | None:
        """The kernel a node launches, or None for another kind of node."""
        kind = ctypes.c_int(-1)
        self.cu("cuGraphNodeGetType", ctypes.c_void_p(node), _ptr(kind))
        if kind.value != NODE_KERNEL:
            return None
        p = KernelParams()
        self.cu("cuGraphKernelNodeGetParams", ctypes.c_void_p(node), _ptr(p))
        name = ctypes.c_char_p()
        if p.func:
            self.cu("cuFuncGetName", _ptr(name), ctypes.c_void_p(p.func))
        else:
            self.cu("cuKernelGetName", _ptr(name), ctypes.c_void_p(p.kern))
        return (name.value or b"?").decode()

    def edges(self) -> list[tuple[int, int, EdgeData]]:
        n = ctypes.c_size_t(0)
        self.cu("cuGraphGetEdges", self.graph, None, None, None, _ptr(n))
        src, dst, data = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)(), (EdgeData * n.value)()
        self.cu("cuGraphGetEdges", self.graph, src, dst, data, _ptr(n))
        return [(int(src[i] or 0), int(dst[i] or 0), data[i]) for i in range(n.value)]

    def make_programmatic(
        self, pick: Callable[[str, str], bool], port: int = PORT_LAUNCH_ORDER
    ) -> list[tuple[str, str]]:
        """Rewrites every kernel-to-kernel edge for which pick(first's name, second's name) holds;
        returns the (first, second) names rewritten, in no particular order."""
        names = {node: self.kernel_name(node) for node in self.nodes()}
        done = []
        for a, b, data in self.edges():
            na, nb = names.get(a), names.get(b)
            if na is None or nb is None or data.type == DEPENDENCY_PROGRAMMATIC or not pick(na, nb):
                continue
            one_a, one_b = (ctypes.c_void_p * 1)(a), (ctypes.c_void_p * 1)(b)
            old = (EdgeData * 1)(data)
            self.cu("cuGraphRemoveDependencies", self.graph, one_a, one_b, old, 1)
            new = (EdgeData * 1)(EdgeData(from_port=port, to_port=0, type=DEPENDENCY_PROGRAMMATIC))
            self.cu("cuGraphAddDependencies", self.graph, one_a, one_b, new, 1)
            done.append((na, nb))
        return done
