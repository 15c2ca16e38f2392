"""The one device and dtype policy of gpdyn: every entry point resolves ``--device``,
``--dtype`` and ``--threads`` here, before any work starts.

- device: ``cpu`` or ``cuda[:i]``; a CUDA device on a machine (or torch build) without
  CUDA, an index past the last GPU, and any other device type are refused with an
  :class:`~gpdyn.errors.InputError` naming the option.
- dtype: float64 on the CPU (numerical identities, small problems) and float32 on CUDA
  (throughput), unless one is named.
- threads: torch CPU threads, 1 by default: on small machines a second thread gains
  little and collapses when another process is busy.
- memory: :func:`check_memory` refuses sizes that would need more than :func:`memory_limit`
  (half the device's memory) before any work starts.
- :func:`sync`: waits for a device's queued work, for timing only (never in hot paths);
  :func:`seconds` times a call the way every benchmark does, :func:`device_name` names
  the hardware a benchmark ran on.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpdyn.errors import InputError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
DEVICE_TYPES = ("cpu", "cuda")
MAX_THREADS = 4 * (os.cpu_count() or 1)  # far past any gain; larger counts crash some BLAS builds
MAX_SEED = 2**32 - 1  # the largest seed numpy's legacy generators and gymnasium's reset accept


def resolve_device(name: str | torch.device, option: str = "--device") -> torch.device:
    """The torch device named ``name``, checked to exist on this machine."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise InputError(f"{option} '{name}': not a torch device ({err})") from err
    if device.type not in DEVICE_TYPES:
        raise InputError(f"{option} '{name}': gpdyn runs on {' or '.join(DEVICE_TYPES)}, not '{device.type}'")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}"
            raise InputError(f"{option} {name}: CUDA is not available on this machine ({build}); use --device cpu")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # pin it: checks compare exact devices
        elif device.index >= torch.cuda.device_count():
            raise InputError(f"{option} {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_dtype(name: str | torch.dtype | None, device: str | torch.device = "cpu", option: str = "--dtype") -> torch.dtype:
    """``name`` as a torch dtype; ``None``: float32 on CUDA, float64 on the CPU."""
    if isinstance(name, torch.dtype):
        if name not in DTYPES.values():
            raise InputError(f"{option} {name}: choose one of {', '.join(DTYPES)}")
        return name
    if name is None:
        return torch.float32 if torch.device(device).type == "cuda" else torch.float64
    if name not in DTYPES:
        raise InputError(f"{option} '{name}': choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """The key of ``dtype`` in :data:`DTYPES` (``torch.float32`` -> ``"float32"``), as configs record it."""
    return str(dtype).removeprefix("torch.")


def set_threads(threads: int, option: str = "--threads") -> None:
    """Set torch's CPU thread count, refusing counts that cannot help (or crash the BLAS)."""
    if not 1 <= int(threads) <= MAX_THREADS:
        raise InputError(f"{option} {threads}: must be between 1 and {MAX_THREADS} on this machine")
    torch.set_num_threads(int(threads))


#: the share of a device's memory one array set of a job may ask for: sizes past it are
#: refused up front, not left to the allocator (a traceback) or the OOM killer (a hang, then a kill)
MEMORY_SHARE = 0.5


def memory_limit(device: str | torch.device = "cpu") -> int:
    """Bytes a job may allocate on ``device``: :data:`MEMORY_SHARE` of its physical memory."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(device.index or 0).total_memory
    else:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(MEMORY_SHARE * total)


def check_memory(nbytes: float, what: str, device: str | torch.device = "cpu") -> None:
    """Raise InputError when ``what`` (the options that size it, e.g. "--samples 10^7 x --horizon 30")
    needs more than :func:`memory_limit` bytes on ``device``."""
    limit = memory_limit(device)
    if nbytes > limit:
        raise InputError(f"{what} needs about {nbytes / 2**30:.3g} GiB, more than the {limit / 2**30:.3g} GiB "
                         f"({MEMORY_SHARE:.0%} of {torch.device(device).type} memory) gpdyn allows; choose smaller sizes")


def sync(device: str | torch.device) -> None:
    """Wait for the work queued on ``device`` (CUDA); nothing on the CPU. For timing only."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn: Callable[[], Any], device: str | torch.device, repeats: int = 1, warmup: int = 0) -> float:
    """Seconds per call of ``fn`` over ``repeats`` calls, after ``warmup`` untimed ones: process
    CPU time on the CPU (other processes on a shared machine do not count), wall time between
    two device syncs on a GPU (its work is asynchronous, the host's CPU time would miss it)."""
    for _ in range(warmup):
        fn()
    if torch.device(device).type == "cpu":
        t0 = time.process_time()
        for _ in range(repeats):
            fn()
        return (time.process_time() - t0) / repeats
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats


def device_name(device: str | torch.device) -> str:
    """The hardware behind ``device``: the GPU's name, or the CPU's model from /proc/cpuinfo."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


__all__ = ["DTYPES", "MAX_SEED", "MEMORY_SHARE", "check_memory", "device_name", "dtype_name", "memory_limit",
           "resolve_device", "resolve_dtype", "seconds", "set_threads", "sync"]
