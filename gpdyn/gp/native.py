"""The native CPU kernel of prediction: ``exp2(U V^T) a`` fused in one pass (native_exp2.cpp).

:func:`gpdyn.gp.kernels.exp2_matvec` (every learner's mean: SVDGP, ORTHDGP, exact)
calls :func:`exp2_matvec` for float32 and float64 tensors on the CPU. The kernel is C++
(GCC vector extensions, no torch headers), compiled on first use with ``$CXX`` (default ``g++``) at
``-O3 -march=native`` into ``$XDG_CACHE_HOME/gpdyn/native`` (default ``~/.cache``), under a
name keyed by the source, the flags, the compiler and this CPU, and loaded with ctypes
(which releases the GIL, so ``torch.get_num_threads()`` threads share the test points).
It is the torch operator ``torch.ops.gpdyn.exp2_matvec`` with a fake implementation, so
``torch.compile`` keeps it in its graph; the outputs are a loop inside the kernel.

It exists because the torch path writes every kernel block to memory and raises it to
``exp2`` in a separate pass (2.4-3.5 G/s in float32), about as long as the feature matmul
itself; fused, the exp2 overlaps the matmul's FMAs (the source's header has the numbers).

``GPDYN_NATIVE=0`` turns it off. Without a working compiler it warns once, naming the
compiler and its error, and the torch path runs: the same values to rounding.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("native_exp2.cpp")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC", "-std=c++17")
LANES = 16  # test points are padded to a multiple of the kernel's lanes (16 floats, 8 doubles)
KERNELS = {torch.float32: "gpdyn_exp2_matvec_f32", torch.float64: "gpdyn_exp2_matvec_f64"}
MAX_VECTORS = 64  # vectors per call with one kernel (its P limit)

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failed: str | None = None  # why the build failed, once
_enabled = os.environ.get("GPDYN_NATIVE", "1") != "0"
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpdyn" / "native"


def _cpu_identity() -> str:
    """This CPU's model and feature flags (``-march=native`` builds for exactly them)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
    return "\n".join(dict.fromkeys(keep)) + platform.machine()


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CXX", "g++")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise RuntimeError(f"compiler '{compiler}' ({err})") from err
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version.encode(), _cpu_identity().encode()]))
    target = cache_dir() / f"exp2-{key.hexdigest()[:20]}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"{compiler} {' '.join(FLAGS)} {SOURCE.name} failed: {done.stderr.strip()[-2000:]}")
            os.replace(tmp, target)  # atomic: a concurrent process sees the old state or the whole library
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(target))
    ptr, long = ctypes.c_void_p, ctypes.c_long
    for fn in KERNELS.values():
        getattr(lib, fn).restype = ctypes.c_int
        getattr(lib, fn).argtypes = [ptr, long, long, long, ptr, long, long, ptr, long, ctypes.c_int, ptr, long, long]
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel, built on first use; None when turned off or when the build failed
    (warned once)."""
    global _library, _failed
    if not _enabled or _failed is not None:
        return None
    if _library is None:
        with _lock:
            if _library is None and _failed is None:
                try:
                    _library = _build()
                except (RuntimeError, OSError, subprocess.SubprocessError) as err:
                    _failed = str(err)
                    warnings.warn(f"gpdyn's native prediction kernel ({SOURCE.name}) is not available: {err}; "
                                  "predictions run on the torch path (set GPDYN_NATIVE=0 to skip the build)",
                                  RuntimeWarning, stacklevel=3)
    return _library


@contextlib.contextmanager
def enabled(on: bool) -> Iterator[None]:
    """Within the block, the native kernel is used (``on``, where it builds) or not: the
    benchmarks time both paths in one run."""
    global _enabled
    before, _enabled = _enabled, bool(on)
    try:
        yield
    finally:
        _enabled = before


def usable(*tensors: Tensor) -> bool:
    """Whether :func:`exp2_matvec` takes these: CPU tensors of one dtype, float32 or float64,
    no autograd, and the kernel built."""
    return (all(t.device.type == "cpu" and t.dtype == tensors[0].dtype and not t.requires_grad for t in tensors)
            and tensors[0].dtype in KERNELS and library() is not None)


def _transposed(u: Tensor, padded: int) -> Tensor:
    """``u [..., N, R]`` as ``[..., R, padded]``, zero-padded: the kernel's test-point layout."""
    ut = u.new_zeros(*u.shape[:-2], u.shape[-1], padded)
    ut[..., : u.shape[-2]] = u.transpose(-1, -2)
    return ut


def _forget_pool() -> None:
    """A forked child has the pool object but none of its threads: it makes its own."""
    global _pool, _pool_size
    _pool, _pool_size = None, 0


os.register_at_fork(after_in_child=_forget_pool)


def _run(ut: Tensor, v: Tensor, a: Tensor, out: Tensor, shared: bool) -> None:
    """The kernel on ``ut [(P,) R, Np]``, ``v [(P,) M, R]``, ``a [P, M]`` into ``out [P, Np]``
    (``shared``: one kernel for all P vectors), its test points split over torch's threads."""
    global _pool, _pool_size
    lib = library()
    assert lib is not None
    kernel = getattr(lib, KERNELS[ut.dtype])
    r, np_ = ut.shape[-2:]
    per_output = lambda t: t.stride(0) if t.dim() == 3 else 0  # noqa: E731
    args = (ut.data_ptr(), per_output(ut), r, np_, v.data_ptr(), per_output(v), v.shape[-2], a.data_ptr(), a.shape[0],
            int(shared), out.data_ptr())
    threads = min(torch.get_num_threads(), np_ // LANES)
    edges = [LANES * round(i * (np_ // LANES) / max(threads, 1)) for i in range(max(threads, 1) + 1)]
    spans = [(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi > lo]
    if len(spans) == 1:
        codes = [kernel(*args, *spans[0])]
    else:  # ctypes releases the GIL: the spans run in parallel
        if _pool is None or _pool_size < len(spans):
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool, _pool_size = ThreadPoolExecutor(max_workers=len(spans), thread_name_prefix="gpdyn-native"), len(spans)
        codes = list(_pool.map(lambda span: kernel(*args, *span), spans))
    if any(codes):
        raise RuntimeError(f"gpdyn_exp2_matvec refused its arguments (R {r}, Np {np_}, P {a.shape[0]})")


@torch.library.custom_op("gpdyn::exp2_matvec", mutates_args=())
def _exp2_matvec(u: Tensor, v: Tensor, vec: Tensor) -> Tensor:
    p, n = vec.shape[0], u.shape[-2]
    padded = -(-n // LANES) * LANES
    out = vec.new_empty(p, padded)
    vec, v = vec.contiguous(), v.contiguous()
    ut = _transposed(u, padded)  # every output's at once
    if u.dim() == 2 and v.dim() == 2:  # one kernel: up to MAX_VECTORS vectors per pass
        for lo in range(0, p, MAX_VECTORS):
            _run(ut, v, vec[lo : lo + MAX_VECTORS], out[lo : lo + MAX_VECTORS], shared=True)
    else:
        _run(ut, v, vec, out, shared=False)
    return out[:, :n].contiguous()  # as the fake implementation says: no padded storage kept


@_exp2_matvec.register_fake
def _(u: Tensor, v: Tensor, vec: Tensor) -> Tensor:
    return vec.new_empty(vec.shape[0], u.shape[-2])


def exp2_matvec(u: Tensor, v: Tensor, vec: Tensor) -> Tensor:
    """``exp2(U V^T) vec`` per output, ``[P, N]``, with the shapes of
    :func:`gpdyn.gp.kernels.exp2_matvec` (``u [P, N, R]`` or ``[N, R]``, ``v [P, M, R]`` or
    ``[M, R]``, ``vec [P, M]``; an output axis of size 1 is shared by every output);
    float32 or float64 CPU tensors (:func:`usable`). A torch operator
    (``torch.ops.gpdyn.exp2_matvec``), so that ``torch.compile`` keeps it in its graph.
    Shapes that do not fit each other are a ValueError naming them: the kernel reads raw
    memory, so nothing unchecked reaches it."""
    p, m = vec.shape if vec.dim() == 2 else (-1, -1)
    sides = {"u": u, "v": v}
    if (vec.dim() != 2 or any(t.dim() not in (2, 3) or (t.dim() == 3 and t.shape[0] not in (1, p)) for t in sides.values())
            or u.shape[-1] != v.shape[-1] or v.shape[-2] != m):
        shapes = ", ".join(f"{name} {list(t.shape)}" for name, t in (*sides.items(), ("vec", vec)))
        raise ValueError(f"exp2_matvec: {shapes} do not fit u [P, N, R] or [N, R], v [P, M, R] or [M, R], vec [P, M]")
    u, v = (t[0] if t.dim() == 3 and t.shape[0] == 1 else t for t in (u, v))
    if p == 0 or m == 0 or u.shape[-2] == 0:  # an empty sum, no points or no outputs
        return vec.new_zeros(p, u.shape[-2])
    return _exp2_matvec(u, v, vec)
