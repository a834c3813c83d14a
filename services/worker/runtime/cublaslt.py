"""cuBLASLt called directly, so that a decode graph can record, for each projection, the algorithm
that timed fastest among all that cuBLASLt's heuristic offers rather than only its first choice.

PyTorch's matmul asks cuBLAS (or cuBLASLt) for one algorithm, the heuristic's first, and a
decode step's skinny GEMMs run 10-50 % over their bytes' time with it on an H200.
cuBLASLt's heuristic returns a ranked list of configurations (tile shapes, split-K,
stages, clusters), each a plain 64-byte descriptor that cublasLtMatmul takes as is. This
module binds the few cuBLASLt calls needed with ctypes, against the library PyTorch itself
loaded: no extension to build. A matmul here is ``out = x @ w.t()`` for x [M, K] and w [N, K]
(LightStream's weight layout), in column-major terms D [N, M] = op(W) [N, K] @ X [K, M] with W
transposed, as PyTorch's own call is.

The enum values and struct layouts below are copied from cuBLASLt's headers, unchecked by any
compiler. So a handle is made only for a cuBLASLt whose major.minor is in TESTED_CUBLASLT, and
only once a self-test on the live GPU (a few tiny products, plain and accumulating, by the
heuristic's algorithms) agrees with torch.matmul; CublasLt.checked says which path runs.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# libcublasLt major.minor versions this binding was developed and checked against: the one that
# torch 2.11.0+cu130 loads (cuBLASLt 13.1, CUDA runtime 13.0), on H200s
TESTED_CUBLASLT = ((13, 1),)
SELF_TEST_RTOL = 1e-2  # relative (Frobenius) difference from torch.matmul's bf16 product allowed
_SUCCESS = 0
_COMPUTE_32F = 68  # cublasComputeType_t
_R_32F, _R_16F, _R_16BF = 0, 2, 14  # cudaDataType_t
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
# cublasLtMatmulAlgoConfigAttributes_t: (attribute, its size in bytes), to describe an algorithm
_CONFIG = {"id": (0, 4), "tile": (1, 4), "splitk": (2, 4), "reduction": (3, 4), "swizzle": (4, 4),
           "custom": (5, 4), "stages": (6, 4), "inner": (7, 2), "cluster": (8, 2)}  # fmt: skip
_CAP_SPLITK_SUPPORT, _CAP_TILE_IDS = 0, 6  # cublasLtMatmulAlgoCapAttributes_t
_REDUCTION_COMPUTE_TYPE = 2  # cublasLtReductionScheme_t
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16)  # split-K counts neighbours() tries
CLUSTERS = (0, 2, 3, 4, 5, 6, 7, 8)  # cublasLtClusterShape_t: auto, 1x1, 2x1, 4x1, 1x2, 2x2, 4x2, 1x4
_DTYPES = {torch.bfloat16: _R_16BF, torch.float16: _R_16F, torch.float32: _R_32F}
WORKSPACE_BYTES = 32 << 20  # what PyTorch gives cuBLASLt on Hopper


class _Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _Heuristic(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", _Algo), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]  # fmt: skip


@dataclass(frozen=True)
class Algo:
    """One cuBLASLt algorithm for one GEMM shape: its descriptor and what it says of itself."""

    words: tuple[int, ...]  # the 8 uint64 of cublasLtMatmulAlgo_t
    workspace: int  # bytes it needs
    waves: float  # the heuristic's device-utilisation estimate
    config: dict[str, int]  # tile, split-K, stages, ... (cublasLtMatmulAlgoConfigAttributes_t)
    rank: int  # its place in the heuristic's list (0: what cuBLASLt would run; -1: not from the list)
    shape: tuple[int, int, int, int, int, int]  # the column_major_shape it was found for

    def describe(self) -> str:
        c = self.config
        return (
            f"#{self.rank} id{c['id']} tile{c['tile']} splitk{c['splitk']} red{c['reduction']} "
            f"stages{c['stages']} cluster{c['cluster']} swz{c['swizzle']} custom{c['custom']}"
        )


def column_major_shape(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """out = x @ w.t() as cuBLAS's column-major D = op(A) op(B): -> (m, n, k, lda, ldb, ldd), where
    cuBLAS's m is the weight's N (A = w, transposed), its n the rows of x (B = x), its k their K."""
    if x.dim() != 2 or w.dim() != 2 or out.dim() != 2:
        raise ValueError(f"2-D operands expected, got x {tuple(x.shape)}, w {tuple(w.shape)}, out {tuple(out.shape)}")
    rows, k = x.shape
    n, kw = w.shape
    if kw != k or tuple(out.shape) != (rows, n):
        raise ValueError(f"x {tuple(x.shape)} @ w {tuple(w.shape)}.t() cannot go into out {tuple(out.shape)}")
    for name, t in (("x", x), ("w", w), ("out", out)):
        if t.stride(1) != 1 or t.stride(0) < t.shape[1]:
            raise ValueError(f"{name} must have unit stride along its rows, got strides {t.stride()}")
    return n, rows, k, w.stride(0), x.stride(0), out.stride(0)


def _library() -> ctypes.CDLL:
    """The libcublasLt that this process's PyTorch loaded (found in the process's mappings after a
    matmul has run), else the first that the loader finds."""
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # makes PyTorch load cuBLAS(Lt)
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcublasLt.so" in line}
    for path in sorted(paths):
        if os.path.exists(path):
            return ctypes.CDLL(path)
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libcublasLt could not be found in this process or by the loader")


def _declare(lib: ctypes.CDLL) -> None:
    """The argument types of the calls used (so that sizes and 64-bit integers pass as C expects)."""
    p, i32, u64, i64, size = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
    signatures = {
        "cublasLtCreate": [p],
        "cublasLtDestroy": [p],
        "cublasLtMatmulDescCreate": [p, i32, i32],
        "cublasLtMatmulDescSetAttribute": [p, i32, p, size],
        "cublasLtMatrixLayoutCreate": [p, i32, u64, u64, i64],
        "cublasLtMatmulPreferenceCreate": [p],
        "cublasLtMatmulPreferenceSetAttribute": [p, i32, p, size],
        "cublasLtMatmulPreferenceDestroy": [p],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i32, p, p],
        "cublasLtMatmulAlgoConfigGetAttribute": [p, i32, p, size, p],
        "cublasLtMatmulAlgoConfigSetAttribute": [p, i32, p, size],
        "cublasLtMatmulAlgoCapGetAttribute": [p, i32, p, size, p],
        "cublasLtMatmulAlgoCheck": [p, p, p, p, p, p, p, p],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, size, p],
    }
    for name, args in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, ctypes.c_int
    for name in ("cublasLtGetVersion", "cublasLtGetCudartVersion"):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [], ctypes.c_size_t


def major_minor(version: int) -> tuple[int, int]:
    """cuBLAS's version number (major * 10000 + minor * 100 + patch) -> (major, minor)."""
    return version // 10000, version // 100 % 100


def binding_allowed(lt_version: int, tested: tuple[tuple[int, int], ...] = TESTED_CUBLASLT) -> tuple[bool, str]:
    """Whether this binding may be used with the cuBLASLt of this version number (its self-test
    still to pass), and why: only a major.minor it was tested with; any other falls back."""
    major, minor = major_minor(lt_version)
    if (major, minor) in tested:
        return True, f"cuBLASLt {major}.{minor} is a tested version"
    listed = ", ".join(f"{a}.{b}" for a, b in tested)
    return False, f"cuBLASLt {major}.{minor} was never tested with this binding (tested: {listed})"


def _check(status: int, what: str) -> None:
    if status != _SUCCESS:
        raise RuntimeError(f"{what} failed: cublasStatus_t {status}")


class CublasLt:
    """A cuBLASLt handle, a workspace, and the descriptors of each GEMM shape seen. Made only for
    a tested cuBLASLt version that passes the self-test: else the constructor raises
    RuntimeError (OSError where no cuBLASLt can be found)."""

    def __init__(self, device: torch.device) -> None:
        self.lib = _library()
        _declare(self.lib)
        self.version = int(self.lib.cublasLtGetVersion())
        allowed, why = binding_allowed(self.version, TESTED_CUBLASLT)
        if not allowed:
            raise RuntimeError(why)
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._plans: dict[tuple, tuple[ctypes.c_void_p, ...]] = {}
        # alpha and beta of D = alpha A B + beta C (C is D): beta 1 adds the product into out
        self._one, self._zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        problem = self.self_test(self.workspace.device)
        if problem is not None:
            self.lib.cublasLtDestroy(self.handle)
            raise RuntimeError(f"{why}, but its self-test failed: {problem}")

    @classmethod
    def checked(cls, device: torch.device) -> CublasLt | None:
        """A handle, or None where this cuBLASLt cannot be bound, was never tested, or fails its
        self-test (the caller then runs PyTorch's matmul); a log line says which."""
        try:
            lt = cls(device)
        except (OSError, RuntimeError, AttributeError) as e:
            log.warning("cuBLASLt is not called directly, PyTorch's matmul runs instead: %s", e)
            return None
        cudart = int(lt.lib.cublasLtGetCudartVersion())
        major, minor = major_minor(lt.version)
        log.info(
            "cuBLASLt %d.%d (CUDA runtime %d.%d) passed its self-test: its algorithms are called directly",
            major,
            minor,
            cudart // 1000,
            cudart // 10 % 100,
        )
        return lt

    def self_test(self, device: torch.device) -> str | None:
        """None when the heuristic's first and last candidates for a tiny bf16 product, and the
        first adding into its output, compute torch.matmul's result within SELF_TEST_RTOL;
        else what differed."""
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(4, 512, dtype=torch.bfloat16, device=device, generator=g)  # [M, K]
        w = torch.randn(384, 512, dtype=torch.bfloat16, device=device, generator=g) * 512**-0.5  # [N, K]
        base = torch.randn(4, 384, dtype=torch.bfloat16, device=device, generator=g)
        offered = self.candidates(x, w, torch.empty_like(base))
        if not offered:
            return "the heuristic offered no algorithm for a 4 x 512 x 384 bf16 product"
        checks = [(offered[0], False), (offered[-1], False), (offered[0], True)]
        for algo, accumulate in checks:
            out = base.clone()
            want = base.float() + torch.matmul(x, w.t()).float() if accumulate else torch.matmul(x, w.t()).float()
            self.matmul(x, w, out, algo, accumulate)
            rel = ((out.float() - want).norm() / want.norm()).item()
            if not rel < SELF_TEST_RTOL:
                kind = "adding into its output" if accumulate else "plain"
                return f"algorithm {algo.describe()} ({kind}) differs from torch.matmul by {rel:.3g}"
        return None

    def _plan(self, dtype: torch.dtype, shape: tuple[int, int, int, int, int, int]) -> tuple[ctypes.c_void_p, ...]:
        """(matmul descriptor, A, B, D layouts) for a dtype and column_major_shape's result."""
        key = (dtype, shape)
        if key in self._plans:
            return self._plans[key]
        m, n, k, lda, ldb, ldd = shape
        lib, t = self.lib, _DTYPES[dtype]
        desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _R_32F), "cublasLtMatmulDescCreate")
        for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            v = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "cublasLtMatmulDescSetAttribute")
        layouts = []
        for rows, cols, ld in ((k, m, lda), (k, n, ldb), (m, n, ldd)):
            lay = ctypes.c_void_p()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), t, rows, cols, ld), "cublasLtMatrixLayoutCreate")
            layouts.append(lay)
        self._plans[key] = plan = (desc, *layouts)
        return plan

    def algos(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, count: int = 64) -> list[Algo]:
        """The heuristic's algorithms for out = x @ w.t() at these shapes and strides, best guess
        first, those needing more workspace than ours left out."""
        shape = column_major_shape(x, w, out)
        desc, a, b, d = self._plan(x.dtype, shape)
        lib = self.lib
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            ws = ctypes.c_uint64(WORKSPACE_BYTES)
            _check(
                lib.cublasLtMatmulPreferenceSetAttribute(pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8),
                "cublasLtMatmulPreferenceSetAttribute",
            )
            results = (_Heuristic * count)()
            found = ctypes.c_int(0)
            status = lib.cublasLtMatmulAlgoGetHeuristic(
                self.handle, desc, a, b, d, d, pref, count, results, ctypes.byref(found)
            )
            _check(status, "cublasLtMatmulAlgoGetHeuristic")
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        out_algos = []
        for i in range(found.value):
            r = results[i]
            if r.state != _SUCCESS or r.workspace > WORKSPACE_BYTES:
                continue
            out_algos.append(Algo(tuple(r.algo.data), int(r.workspace), float(r.waves), self._config(r.algo), i, shape))
        return out_algos

    def candidates(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> list[Algo]:
        """What a decode graph's projection chooses from: the heuristic's algorithms, and each of
        those that splits K also without the split. At a decode step's few rows, the split's
        separate reduce often costs more than the split gains on an H200."""
        offered = self.algos(x, w, out)
        unsplit = [self.variant(x, w, out, a, {"splitk": 1, "reduction": 0}) for a in offered if a.config["splitk"] > 1]
        known = {a.words for a in offered}
        return offered + [a for a in unsplit if a is not None and a.words not in known]

    def neighbours(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, seed: Algo) -> list[Algo]:
        """Algorithms one setting away from seed (its split-K count, its tile, or its cluster shape)
        that cuBLASLt accepts for out = x @ w.t(), each once."""
        base = self._raw(seed.words)
        changes: list[dict[str, int]] = []
        if self._cap_words(base, _CAP_SPLITK_SUPPORT, 4)[0] != 0:
            reduction = seed.config["reduction"] or _REDUCTION_COMPUTE_TYPE
            changes += [{"splitk": n, "reduction": reduction if n > 1 else 0} for n in SPLITS]
        changes += [{"tile": t} for t in self._tiles(base)]
        changes += [{"cluster": c} for c in CLUSTERS]
        found: dict[tuple[int, ...], Algo] = {}
        for change in changes:
            a = self.variant(x, w, out, seed, change)
            if a is not None and a.words != seed.words:
                found.setdefault(a.words, a)
        return list(found.values())

    def variant(
        self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, seed: Algo, change: dict[str, int]
    ) -> Algo | None:
        """seed with some settings changed (names as in Algo.config), if cuBLASLt accepts it for
        out = x @ w.t() within our workspace; rank -1."""
        shape = column_major_shape(x, w, out)
        desc, a, b, d = self._plan(x.dtype, shape)
        raw = self._raw(seed.words)
        if not all(self._set(raw, name, value) for name, value in change.items()):
            return None
        result = _Heuristic()
        if self.lib.cublasLtMatmulAlgoCheck(self.handle, desc, a, b, d, d, ctypes.byref(raw), ctypes.byref(result)):
            return None
        if result.workspace > WORKSPACE_BYTES:
            return None
        return Algo(tuple(raw.data), int(result.workspace), float(result.waves), self._config(raw), -1, shape)

    @staticmethod
    def _raw(words: tuple[int, ...]) -> _Algo:
        raw = _Algo()
        raw.data[:] = words
        return raw

    def _set(self, raw: _Algo, name: str, value: int) -> bool:
        attr, size = _CONFIG[name]
        buf = (ctypes.c_uint8 * size)(*value.to_bytes(size, "little"))
        return self.lib.cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(raw), attr, buf, size) == _SUCCESS

    def _cap_words(self, raw: _Algo, attr: int, size: int) -> list[int]:
        """A capability of raw's algorithm as uint32/int32 words (size bytes; 0: as many as it has)."""
        written = ctypes.c_size_t(0)
        if size == 0:
            if self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(raw), attr, None, 0, ctypes.byref(written)):
                return []
            size = written.value
        buf = (ctypes.c_uint32 * max(1, size // 4))()
        if self.lib.cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(raw), attr, buf, size, ctypes.byref(written)):
            return [0]
        return list(buf)[: written.value // 4]

    def _tiles(self, raw: _Algo) -> list[int]:
        return [t for t in self._cap_words(raw, _CAP_TILE_IDS, 0) if t != 0]

    def _config(self, algo: _Algo) -> dict[str, int]:
        config = {}
        for name, (attr, size) in _CONFIG.items():
            buf = (ctypes.c_uint8 * size)()
            written = ctypes.c_size_t(0)
            ok = self.lib.cublasLtMatmulAlgoConfigGetAttribute(
                ctypes.byref(algo), attr, buf, size, ctypes.byref(written)
            )
            config[name] = (
                int.from_bytes(bytes(buf), "little", signed=size == 4 and name == "splitk") if ok == 0 else -1
            )
        return config

    def matmul(
        self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, algo: Algo, accumulate: bool = False
    ) -> torch.Tensor:
        """out = x @ w.t() with this algorithm (accumulate: out += x @ w.t()), on the current
        stream (capturable in a CUDA graph)."""
        if x.dtype != w.dtype or out.dtype != x.dtype:
            raise ValueError(f"one dtype expected, got x {x.dtype}, w {w.dtype}, out {out.dtype}")
        shape = column_major_shape(x, w, out)
        if shape != algo.shape:
            raise ValueError(f"an algorithm found for {algo.shape} (m, n, k, lda, ldb, ldd) cannot run {shape}")
        desc, a, b, d = self._plan(x.dtype, shape)
        raw = self._raw(algo.words)
        stream = torch.cuda.current_stream(x.device).cuda_stream
        _check(
            self.lib.cublasLtMatmul(
                self.handle,
                desc,
                ctypes.byref(self._one),
                w.data_ptr(),
                a,
                x.data_ptr(),
                b,
                ctypes.byref(self._one if accumulate else self._zero),
                out.data_ptr(),
                d,
                out.data_ptr(),
                d,
                ctypes.byref(raw),
                self.workspace.data_ptr(),
                WORKSPACE_BYTES,
                stream,
            ),
            "cublasLtMatmul",
        )
        return out
