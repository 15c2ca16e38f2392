"""`gpdyn doctor`: versions, devices, threads, the outside tools gpdyn uses, and a MuJoCo smoke check.

The outside tools each get one line that starts with ``ok`` or ``missing`` and says what
they affect: the C++ compiler that builds the native prediction kernel, the ffmpeg that
``gpdyn render`` writes MP4 videos with, and the OpenGL backend it draws frames with.

Two depths (:func:`report`). By default nothing heavy is loaded, so that the command takes a
fraction of a CPU second: versions from the installed packages' metadata, torch's CUDA build
from its ``version.py``, GPUs from the NVIDIA driver's ``/proc`` files, the compiler found on
the path (its ``--version``), ffmpeg run (``-version``), the GL backend's library found
(:func:`ctypes.util.find_library`). ``deep`` (``gpdyn doctor --deep``, seconds) loads torch
and MuJoCo to check they work: the devices and default dtypes torch sees, its thread count,
a C++ program compiled, a GL context created in a child process, and a Walker2d-v5 made and
reset.
"""

from __future__ import annotations

import ast
import ctypes.util
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from gpdyn.environment import MUJOCO_GL_VARIABLE, RENDER_BACKENDS, mujoco_gl, native_kernel_wanted
from gpdyn.errors import InputError

# what each backend needs from the system (Debian package names) when it does not load
_GL_LIBRARIES = {"egl": "libegl1 and a GPU driver or Mesa", "osmesa": "libosmesa6", "glfw": "libglfw3 and a display"}
# the shared library each backend loads (ctypes.util.find_library's name; glfw: the glfw package bundles its own)
_GL_SONAMES = {"egl": "EGL", "osmesa": "OSMesa"}
#: the packages whose versions doctor lists: those that shape stored data
#: (gpdyn.data.store.package_versions, which imports zarr), and those videos are made with
PACKAGES = ("gpdyn", "numpy", "torch", "zarr", "mujoco", "mujoco-core", "gymnasium", "stable-baselines3", "sb3-contrib",
            "imageio", "imageio-ffmpeg", "PyOpenGL", "glfw")
# where the NVIDIA kernel driver lists the GPUs it drives, one folder each with an "information" file
_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
# a probe that draws nothing hangs only on a broken driver; don't let doctor hang with it
_PROBE_TIMEOUT_S = 60


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def check_compiler(compile_probe: bool = True) -> str:
    """Whether ``$CXX`` (default ``g++``) compiles C++: the native prediction kernel needs it.
    ``compile_probe=False``: only whether it is on the path and answers ``--version``."""
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
    if not compile_probe:
        try:
            done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S)
        except (OSError, subprocess.SubprocessError) as err:
            return f"missing: {compiler} ({path}) does not run ({type(err).__name__}: {err}); {fallback}"
        if done.returncode != 0:
            return f"missing: {compiler} ({path}) --version exited {done.returncode}; {fallback}"
        return (f"ok ({_first_line(done.stdout)} at {path}; found, not tried on a program: --deep compiles one): "
                f"{affects}")
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


def _gl_missing(setting: str, backend: str, why: str) -> str:
    return (f"missing ({setting}: the {backend} library does not load: {why[:200]}): gpdyn render cannot draw "
            f"frames; install {_GL_LIBRARIES[backend]}, or choose another {MUJOCO_GL_VARIABLE} "
            f"({', '.join(RENDER_BACKENDS)})")


def _gl_found(setting: str, backend: str) -> str:
    """What MuJoCo's ``backend`` module needs, looked up without loading it: its library and Python packages,
    the ``PYOPENGL_PLATFORM`` it accepts, a display for glfw."""
    if backend == "glfw":
        if importlib.util.find_spec("glfw") is None:
            return _gl_missing(setting, backend, "ImportError: the glfw package is not installed")
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            return _gl_missing(setting, backend, "no display (DISPLAY and WAYLAND_DISPLAY unset)")
        return (f"ok ({setting}; the glfw package and a display found, no context created: --deep creates one): "
                f"gpdyn render draws frames with {backend}")
    platform_name = os.environ.get("PYOPENGL_PLATFORM")
    if platform_name and platform_name.lower() != backend:  # MuJoCo's egl and osmesa modules refuse to import
        return _gl_missing(setting, backend, f"ImportError: PYOPENGL_PLATFORM is set to {platform_name!r}, MuJoCo's "
                                             f"{backend} module needs it unset or {backend!r}")
    if importlib.util.find_spec("OpenGL") is None:
        return _gl_missing(setting, backend, "ImportError: PyOpenGL is not installed")
    library = ctypes.util.find_library(_GL_SONAMES[backend])
    if library is None:
        return _gl_missing(setting, backend, f"lib{_GL_SONAMES[backend]} not found")
    return (f"ok ({setting}; {library} found, no context created: --deep creates one): gpdyn render draws frames "
            f"with {backend}")


def check_gl_backend(create_context: bool = True) -> str:
    """Whether the OpenGL backend ``gpdyn render`` would use (``MUJOCO_GL``, egl when unset)
    creates a context: probed in a child process, since a broken GL library can crash the
    process that loads it. ``create_context=False``: only whether its library and packages are found."""
    raw = os.environ.get(MUJOCO_GL_VARIABLE)
    backend = mujoco_gl() or "egl"
    setting = f"{MUJOCO_GL_VARIABLE}={raw!r}" if raw is not None else f"{MUJOCO_GL_VARIABLE} unset, render uses egl"
    if backend not in RENDER_BACKENDS:
        return (f"missing ({setting}): gpdyn render draws with {', '.join(RENDER_BACKENDS)} only and cannot draw "
                f"frames; set {MUJOCO_GL_VARIABLE}=egl for headless rendering")
    if not create_context:
        return _gl_found(setting, backend)
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
        return _gl_missing(setting, backend, failed)
    return f"ok ({setting}): gpdyn render draws frames with {backend}"


def package_versions() -> dict[str, str]:
    """The installed versions of :data:`PACKAGES` (from their metadata, nothing imported) and Python's."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built for (``torch.version.cuda``), read from its ``version.py``
    without importing torch; ``None`` for a CPU build. Raises LookupError when torch is not installed
    or the file does not say."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise LookupError("torch is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError) as err:
        raise LookupError(f"{path}: {type(err).__name__}: {err}") from None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "cuda" and node.value is not None:
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                break
            if value is None or isinstance(value, str):
                return value
    raise LookupError(f"{path}: no 'cuda = ...' line")


def nvidia_gpus(folder: Path = _NVIDIA_GPUS, devices: Path = Path("/dev")) -> list[str]:
    """The GPUs the NVIDIA kernel driver drives: the models its ``folder`` names (``Model:`` lines), or
    where a container shows no such folder, the ``nvidia<N>`` device files in ``devices``."""
    models = []
    for info in sorted(folder.glob("*/information")) if folder.is_dir() else []:
        try:
            lines = info.read_text(errors="replace").splitlines()
        except OSError:
            continue
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model:")), "unknown model")
        models.append(f"{model} ({info.parent.name})")
    if not models and devices.is_dir():
        models = [f"{p} (model unknown)" for p in sorted(devices.glob("nvidia[0-9]*")) if p.name[6:].isdigit()]
    return models


def _quick(info: dict[str, object], threads: int) -> None:
    """The lines of the default report that the deep one gets from torch, read without torch."""
    try:
        cuda = torch_cuda_build()
        build = f"{metadata.version('torch')} (CUDA {cuda or 'none'})"
    except (LookupError, metadata.PackageNotFoundError) as err:
        cuda, build = None, f"unknown: {err}"
    gpus = nvidia_gpus()
    usable = "torch's CUDA checked by --deep" if cuda else "this torch build has no CUDA: it cannot use them"
    info["torch build"] = build
    info["devices"] = ["cpu"] + [f"GPU {g}, seen by the NVIDIA driver ({usable})" for g in gpus]
    info["torch threads"] = f"{threads} (--threads; torch not loaded, --deep reads it back)"


def _deep(info: dict[str, object], threads: int) -> None:
    """The lines that load torch: its build, the devices and default dtypes it sees, its threads."""
    import torch

    from gpdyn.device import DEVICE_TYPES, dtype_name, resolve_dtype, set_threads

    set_threads(threads)  # as every gpdyn command does before its work
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
    info["torch build"] = f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"
    info["devices"] = devices
    info["default dtype"] = ", ".join(f"{d} {dtype_name(resolve_dtype(None, d))}" for d in DEVICE_TYPES)
    info["torch threads"] = torch.get_num_threads()


def walker_smoke() -> str:
    """Make Walker2d-v5 (MuJoCo) and reset it: ``ok (...)`` or ``FAILED: ...``."""
    try:
        import gymnasium as gym

        env = gym.make("Walker2d-v5")
        env.reset(seed=0)
        line = f"ok (nq={env.unwrapped.model.nq}, dt={env.unwrapped.dt})"
        env.close()
        return line
    except Exception as err:  # report, don't crash: doctor exists to diagnose
        return f"FAILED: {type(err).__name__}: {err}"


def report(deep: bool = False, threads: int = 1) -> dict[str, object]:
    """What this installation has: versions, devices, thread settings, outside tools, MuJoCo.

    By default without loading torch or MuJoCo (see the module's docstring); ``deep`` loads
    both, sets torch's threads to ``threads`` as a command would, compiles a C++ program,
    creates a GL context and makes Walker2d-v5.
    """
    info: dict[str, object] = {"platform": platform.platform(), "versions": package_versions()}
    (_deep if deep else _quick)(info, threads)
    info["cpu cores"] = os.cpu_count()
    info["C++ compiler"] = check_compiler(compile_probe=deep)
    info["ffmpeg"] = check_ffmpeg()
    info["GL backend"] = check_gl_backend(create_context=deep)
    info["Walker2d-v5"] = walker_smoke() if deep else "not made (--deep makes and resets it with MuJoCo)"
    return info
