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

``GPDYN_NATIVE`` turns it off (``0``, ``off``, ``false``, ``no``) or on (``1``, ``on``,
``true``, ``yes``, unset or empty; any case); any other value is an InputError naming the
variable, raised when the kernel is first wanted (the command line checks it at start,
:mod:`gpdyn.environment`). Without a working compiler it warns once, naming the compiler
and its error, and the torch path runs: the same values to rounding.

The cache holds code this process will run, so nothing in it is trusted by its name:

- ``XDG_CACHE_HOME`` counts only when it is an absolute path (the XDG base directory
  specification: a relative one is ignored), else ``~/.cache``.
- ``gpdyn/`` and ``gpdyn/native/`` are created mode 0700 and must be directories owned by
  this user and not writable by group or others; the cache root above them must be owned
  by this user or root and, when others can write it, sticky (``/tmp``). Otherwise nothing
  is built or loaded there: a warning names the directory and predictions take the torch
  path.
- Each library has a digest file beside it, ``<name>.sha256``, written at build time.
  Before a library is loaded, both must be regular files owned by this user and not
  writable by group or others, and the library's sha256 must equal the recorded one. A
  library that fails (truncated, damaged, replaced) is never loaded: it is deleted and
  rebuilt, with a warning naming it and the reason (quietly when only its digest file is
  missing: a library built before digests). One that passes but lacks the kernel's
  symbols (a build gone wrong) is deleted and rebuilt the same way.
- Builds take a lock file in the cache directory, so that concurrent processes build
  once and never check a library another one is replacing. A build compiles into a
  temporary ``tmp*.so`` that is removed whatever happens; one left by a build that was
  killed is removed by the next build once it is older than :data:`STALE_BUILD_SECONDS`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import platform
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

from gpdyn.environment import native_kernel_wanted

SOURCE = Path(__file__).with_name("native_exp2.cpp")
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC", "-std=c++17")
LANES = 16  # test points are padded to a multiple of the kernel's lanes (16 floats, 8 doubles)
KERNELS = {torch.float32: "gpdyn_exp2_matvec_f32", torch.float64: "gpdyn_exp2_matvec_f64"}
MAX_VECTORS = 64  # vectors per call with one kernel (its P limit)
BUILD_TIMEOUT_SECONDS = 300
#: a temporary file of a build older than this has no build behind it (twice the compile's limit)
STALE_BUILD_SECONDS = 2 * BUILD_TIMEOUT_SECONDS
DIGEST_SUFFIX = ".sha256"
BUILD_LOCK = "build.lock"
_ABSENT, _NO_DIGEST = "absent", "no digest file"

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failed: str | None = None  # why the build failed, once
_enabled: bool | None = None  # None: GPDYN_NATIVE not read yet (read when the kernel is first wanted)
_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/gpdyn/native``; ``~/.cache`` when it is unset, empty or relative."""
    root = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(root) if os.path.isabs(root) else Path.home() / ".cache") / "gpdyn" / "native"


def wanted() -> bool:
    """Whether the kernel is on: :func:`enabled`'s setting, else ``GPDYN_NATIVE`` (an
    InputError naming it when it is not one of its values)."""
    global _enabled
    if _enabled is None:
        _enabled = native_kernel_wanted()
    return _enabled


def _unsafe(path: Path, st: os.stat_result, *, root: bool = False) -> str | None:
    """Why ``path`` (a directory of the cache) could hold files planted by someone else, or None."""
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != me and not (root and st.st_uid == 0):
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {me})"
    if st.st_mode & 0o022 and not (root and st.st_mode & stat.S_ISVTX):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _private_cache_dir() -> Path:
    """:func:`cache_dir`, created mode 0700 where absent, or a RuntimeError naming the
    directory that another user could write into."""
    directory = cache_dir()
    base = directory.parent.parent
    base.mkdir(parents=True, exist_ok=True)
    for path in (directory.parent, directory):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    for path, root in ((base, True), (directory.parent, False), (directory, False)):
        problem = _unsafe(path, path.stat(), root=root)
        if problem:
            raise RuntimeError(
                f"the kernel's cache is not private: {problem}, so a library there may not be this user's and none "
                f"is built or loaded from it (make it private: chmod 700 {path}, or set XDG_CACHE_HOME to a "
                "directory of your own)"
            )
    return directory


def _library_problem(target: Path, digest_file: Path) -> str | None:
    """Why ``target`` must not be loaded (:data:`_ABSENT`, :data:`_NO_DIGEST` or a reason), or None: both
    files are regular, this user's, not writable by group or others, and the library's
    sha256 is the recorded one."""
    contents: list[bytes] = []
    for path in (target, digest_file):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return _ABSENT if path == target else _NO_DIGEST
        except OSError as err:
            return f"{path.name} cannot be opened ({'a symbolic link' if err.errno == errno.ELOOP else err.strerror})"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return f"{path.name} is not a regular file"
            if st.st_uid != os.geteuid():
                return f"{path.name} is owned by uid {st.st_uid}, not by this user"
            if st.st_mode & 0o022:
                return f"{path.name} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
            os.set_blocking(fd, True)
            with os.fdopen(os.dup(fd), "rb") as file:
                contents.append(file.read())
        finally:
            os.close(fd)
    library_bytes, recorded = contents
    if hashlib.sha256(library_bytes).hexdigest() != recorded.decode("ascii", "replace").strip():
        return f"its sha256 is not the one recorded in {digest_file.name} (damaged, truncated or replaced)"
    return None


def _discard(*paths: Path) -> None:
    """Remove what is at ``paths`` (a link itself, never its target); a directory stays, as an error."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            raise RuntimeError(f"{path} cannot be removed ({err.strerror}); remove it by hand") from err


def _remove_stale_temporaries(directory: Path) -> None:
    """Temporary files of builds that were killed before they could remove them."""
    now = time.time()
    for path in [*directory.glob("tmp*.so"), *directory.glob(f"tmp*{DIGEST_SUFFIX}")]:
        with contextlib.suppress(OSError):
            st = path.lstat()
            if not stat.S_ISDIR(st.st_mode) and now - st.st_mtime > STALE_BUILD_SECONDS:
                path.unlink()


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Held while a library is checked, built and loaded: one builder at a time across
    processes. A file system without ``flock`` goes without it (a race then costs a second
    build, never a load of a half-written file: a library is renamed into place whole)."""
    fd = os.open(directory / BUILD_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RuntimeError(f"{directory / BUILD_LOCK} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        yield
    finally:
        os.close(fd)  # drops the lock


def _cpu_identity() -> str:
    """This CPU's model and feature flags (``-march=native`` builds for exactly them)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features", "CPU part")]
    return "\n".join(dict.fromkeys(keep)) + platform.machine()


class _MissingSymbol(RuntimeError):
    """A library that loaded but lacks a kernel."""


def _load(path: Path) -> ctypes.CDLL:
    """The library at ``path`` with the kernels' signatures; a RuntimeError when it lacks them."""
    lib = ctypes.CDLL(str(path))
    ptr, long = ctypes.c_void_p, ctypes.c_long
    for fn in KERNELS.values():
        try:
            kernel = getattr(lib, fn)
        except AttributeError:
            raise _MissingSymbol(f"{path.name} has no symbol {fn}") from None
        kernel.restype = ctypes.c_int
        kernel.argtypes = [ptr, long, long, long, ptr, long, long, ptr, long, ctypes.c_int, ptr, long, long]
    return lib


def _compile(compiler: str, directory: Path, target: Path, digest_file: Path, *, load: bool) -> ctypes.CDLL | None:
    """Build ``target`` and its digest file, each renamed into place whole. ``load``: load
    the new library under its temporary name (a library of the target's name is already
    loaded in this process, and loading that name again would give the old one back)."""
    fd, tmp = tempfile.mkstemp(prefix="tmp", suffix=".so", dir=directory)
    os.close(fd)
    fd, tmp_digest = tempfile.mkstemp(prefix="tmp", suffix=DIGEST_SUFFIX, dir=directory)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True,
                              timeout=BUILD_TIMEOUT_SECONDS)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} {' '.join(FLAGS)} {SOURCE.name} failed: {done.stderr.strip()[-2000:]}")
        os.chmod(tmp, 0o700)  # the linker creates its output with the umask's mode, maybe group-writable
        Path(tmp_digest).write_text(hashlib.sha256(Path(tmp).read_bytes()).hexdigest() + "\n")
        lib = _load(Path(tmp)) if load else None
        os.replace(tmp_digest, digest_file)
        os.replace(tmp, target)  # atomic: a reader sees the old state or the whole library
        return lib
    finally:
        for path in (tmp, tmp_digest):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CXX", "g++")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as err:
        raise RuntimeError(f"compiler '{compiler}' ({err})") from err
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version.encode(), _cpu_identity().encode()]))
    directory = _private_cache_dir()
    target = directory / f"exp2-{key.hexdigest()[:20]}.so"
    digest_file = target.with_name(target.name + DIGEST_SUFFIX)
    with _build_lock(directory):
        _remove_stale_temporaries(directory)
        problem = _library_problem(target, digest_file)
        loaded = False
        if problem is None:
            try:
                return _load(target)
            except _MissingSymbol as err:
                problem, loaded = str(err), True
        if problem not in (_ABSENT, _NO_DIGEST):  # without a digest: a library built before digests, quietly
            warnings.warn(f"gpdyn's native kernel {target}: {problem}; it is removed and rebuilt", RuntimeWarning,
                          stacklevel=4)
        _discard(target, digest_file)
        lib = _compile(compiler, directory, target, digest_file, load=loaded)
        return lib if lib is not None else _load(target)


def library() -> ctypes.CDLL | None:
    """The loaded kernel, built on first use; None when turned off or when the build failed
    (warned once)."""
    global _library, _failed
    if not (_enabled if _enabled is not None else wanted()) or _failed is not None:
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
    if threads <= 1:  # one span of every point: no split to compute (a planner's per-step call on one thread)
        if kernel(*args, 0, np_):
            raise RuntimeError(f"gpdyn_exp2_matvec refused its arguments (R {r}, Np {np_}, P {a.shape[0]})")
        return
    edges = [LANES * round(i * (np_ // LANES) / threads) for i in range(threads + 1)]
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


def _run_outputs(ut: Tensor, v: Tensor, vec: Tensor, out: Tensor) -> None:
    """:func:`_run` for every output: one kernel shared by all (``ut`` and ``v`` without an output
    axis) takes up to :data:`MAX_VECTORS` vectors per pass, per-output kernels take them all at once."""
    if ut.dim() == 2 and v.dim() == 2:
        for lo in range(0, vec.shape[0], MAX_VECTORS):
            _run(ut, v, vec[lo : lo + MAX_VECTORS], out[lo : lo + MAX_VECTORS], shared=True)
    else:
        _run(ut, v, vec, out, shared=False)


@torch.library.custom_op("gpdyn::exp2_matvec", mutates_args=())
def _exp2_matvec(u: Tensor, v: Tensor, vec: Tensor) -> Tensor:
    p, n = vec.shape[0], u.shape[-2]
    padded = -(-n // LANES) * LANES
    out = vec.new_empty(p, padded)
    vec, v = vec.contiguous(), v.contiguous()
    _run_outputs(_transposed(u, padded), v, vec, out)  # every output's test points laid out at once
    return out[:, :n].contiguous()  # as the fake implementation says: no padded storage kept


@_exp2_matvec.register_fake
def _(u: Tensor, v: Tensor, vec: Tensor) -> Tensor:
    return vec.new_empty(vec.shape[0], u.shape[-2])


def exp2_matvec_laid_out(ut: Tensor, v: Tensor, vec: Tensor) -> Tensor:
    """:func:`exp2_matvec` on test-point features already in the kernel's layout, ``ut [P, R, Np]``
    or ``[R, Np]`` (one set for every output), ``Np`` a multiple of :data:`LANES` (the padding
    columns' results are junk for the caller to drop); ``v [P, M, R]`` or ``[M, R]``, ``vec [P, M]``,
    all contiguous: returns ``[P, Np]``. It calls the kernel directly, without the operator's
    dispatch, the checks of :func:`usable` (the caller made sure) and the copy into the padded
    layout: for a caller that builds ``ut`` itself on the hot path (a planner's model step).
    Eager only: under ``torch.compile`` use :func:`exp2_matvec`. Shapes that do not fit are a
    ValueError naming them, as there."""
    p, m = vec.shape if vec.dim() == 2 else (-1, -1)
    if (vec.dim() != 2 or any(t.dim() not in (2, 3) or (t.dim() == 3 and t.shape[0] != p) for t in (ut, v))
            or ut.shape[-2] != v.shape[-1] or v.shape[-2] != m or ut.shape[-1] % LANES
            or not all(t.is_contiguous() for t in (ut, v, vec))):
        shapes = ", ".join(f"{name} {list(t.shape)}" for name, t in (("ut", ut), ("v", v), ("vec", vec)))
        raise ValueError(f"exp2_matvec_laid_out: {shapes} do not fit contiguous ut [P, R, Np] or [R, Np] "
                         f"(Np a multiple of {LANES}), v [P, M, R] or [M, R], vec [P, M]")
    out = vec.new_empty(p, ut.shape[-1])
    if p == 0 or ut.shape[-1] == 0:
        return out
    if m == 0:
        return out.zero_()
    _run_outputs(ut, v, vec, out)
    return out


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
