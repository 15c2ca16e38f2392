"""`gpdyn doctor`: versions, devices, threads, the outside tools gpdyn uses, and a MuJoCo smoke check.

The outside tools each get one line that starts with ``ok`` or ``missing`` and says what
they affect: the C++ compiler that builds the native prediction kernel, the ffmpeg that
``gpdyn render`` writes MP4 videos with, and the OpenGL backend it draws frames with.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpdyn.data.store import package_versions
from gpdyn.environment import MUJOCO_GL_VARIABLE, RENDER_BACKENDS, mujoco_gl, native_kernel_wanted
from gpdyn.errors import InputError

# what each backend needs from the system (Debian package names) when it does not load
_GL_LIBRARIES = {"egl": "libegl1 and a GPU driver or Mesa", "osmesa": "libosmesa6", "glfw": "libglfw3 and a display"}
# a probe that draws nothing hangs only on a broken driver; don't let doctor hang with it
_PROBE_TIMEOUT_S = 60


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def check_compiler() -> str:
    """Whether ``$CXX`` (default ``g++``) compiles C++: the native prediction kernel needs it."""
    compiler = os.environ.get("CXX", "g++")
    try:
        wanted = native_kernel_wanted()
    except InputError as err:
        return f"missing: {err}"
    affects = "builds the native GP prediction kernel on first use"
    if not wanted:
        affects = "GPDYN_NATIVE is off: predictions use the torch path whatever the compiler"
    fallback = "GP predictions fall back to the slower torch path (set CXX to a C++ compiler, e.g. apt install g++)"
    path = shutil.which(compiler)
    if path is None:
        return f"missing: CXX={compiler!r} not found; {fallback}"
    with tempfile.TemporaryDirectory(prefix="gpdyn-doctor-") as folder:
        source = Path(folder) / "probe.cpp"
        source.write_text("#include <cmath>\nint main() { return std::exp(0.0) == 1.0 ? 0 : 1; }\n")
        try:
            done = subprocess.run([path, str(source), "-o", str(Path(folder) / "probe")], capture_output=True,
                                  text=True, timeout=_PROBE_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as err:
            return f"missing: {compiler} ({path}) does not run ({type(err).__name__}: {err}); {fallback}"
        if done.returncode != 0:
            return f"missing: {compiler} ({path}) cannot compile C++ ({_first_line(done.stderr)[:200]}); {fallback}"
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S).stdout
    return f"ok ({_first_line(version)} at {path}): {affects}"


def check_ffmpeg() -> str:
    """Whether the ffmpeg that imageio uses runs: ``gpdyn render`` writes MP4 videos with it."""
    fallback = "gpdyn render cannot write .mp4 videos (.gif still works; pip install 'gpdyn[video]'; IMAGEIO_FFMPEG_EXE picks another ffmpeg)"
    try:
        import imageio_ffmpeg

        exe = imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as err:
        return f"missing: {type(err).__name__}: {err}; {fallback}"
    try:
        done = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as err:
        return f"missing: {exe} does not run ({type(err).__name__}: {err}); {fallback}"
    if done.returncode != 0:
        return f"missing: {exe} -version exited {done.returncode}; {fallback}"
    version = _first_line(done.stdout).split(" Copyright")[0]
    return f"ok ({version}): gpdyn render writes .mp4 videos"


def check_gl_backend() -> str:
    """Whether the OpenGL backend ``gpdyn render`` would use (``MUJOCO_GL``, egl when unset)
    creates a context: probed in a child process, since a broken GL library can crash the
    process that loads it."""
    raw = os.environ.get(MUJOCO_GL_VARIABLE)
    backend = mujoco_gl() or "egl"
    setting = f"{MUJOCO_GL_VARIABLE}={raw!r}" if raw is not None else f"{MUJOCO_GL_VARIABLE} unset, render uses egl"
    if backend not in RENDER_BACKENDS:
        return (f"missing ({setting}): gpdyn render draws with {', '.join(RENDER_BACKENDS)} only and cannot draw "
                f"frames; set {MUJOCO_GL_VARIABLE}=egl for headless rendering")
    probe = (f"from mujoco.{backend} import GLContext\n"
             "context = GLContext(8, 8)\ncontext.make_current()\ncontext.free()\n")
    env = {**os.environ, MUJOCO_GL_VARIABLE: backend}
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                              timeout=_PROBE_TIMEOUT_S)
        failed = None if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except subprocess.TimeoutExpired:
        failed = f"no context after {_PROBE_TIMEOUT_S} s"
    if failed is not None:
        return (f"missing ({setting}: the {backend} library does not load: {failed[:200]}): gpdyn render cannot draw "
                f"frames; install {_GL_LIBRARIES[backend]}, or choose another {MUJOCO_GL_VARIABLE} "
                f"({', '.join(RENDER_BACKENDS)})")
    return f"ok ({setting}): gpdyn render draws frames with {backend}"


def report() -> dict[str, object]:
    """What this installation has: versions, devices, thread settings, outside tools, MuJoCo."""
    import torch

    from gpdyn.device import DEVICE_TYPES, dtype_name, resolve_dtype

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    info: dict[str, object] = {
        "platform": platform.platform(),
        "versions": package_versions(),
        "torch build": f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})",
        "devices": devices,
        "default dtype": ", ".join(f"{d} {dtype_name(resolve_dtype(None, d))}" for d in DEVICE_TYPES),
        "torch threads": torch.get_num_threads(),
        "cpu cores": os.cpu_count(),
        "C++ compiler": check_compiler(),
        "ffmpeg": check_ffmpeg(),
        "GL backend": check_gl_backend(),
    }
    try:
        import gymnasium as gym

        env = gym.make("Walker2d-v5")
        env.reset(seed=0)
        info["Walker2d-v5"] = f"ok (nq={env.unwrapped.model.nq}, dt={env.unwrapped.dt})"
        env.close()
    except Exception as err:  # report, don't crash: doctor exists to diagnose
        info["Walker2d-v5"] = f"FAILED: {type(err).__name__}: {err}"
    return info
