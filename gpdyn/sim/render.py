"""Videos of stored episodes of a legged task (Walker2d, Hopper, ...), replayed from their states (``gpdyn render``).

Nothing is re-simulated: each frame is the stored ``qpos``/``qvel`` put back with
``set_state`` and drawn offscreen into one OpenGL context kept for the whole video, and
piped to ffmpeg (x264 at its ``veryfast`` preset) as it comes. Rendering is headless
through EGL (``MUJOCO_GL=egl``, set here when the user left it unset or empty).

Where OpenGL is drawn by the CPU (Mesa's llvmpipe or softpipe: a machine without a GPU
driver), shadows, reflections and multisampling cost nearly all of a frame's time, so
``quality="auto"`` turns them off there and says so; ``"full"`` keeps them, ``"fast"``
turns them off on any renderer. Progress goes through :func:`gpdyn.progress.progress_bar`.

MuJoCo loads the backend's library when it is first imported and fails with a bare
``RuntimeError`` (a value it does not know) or ``AttributeError`` (``osmesa`` without
libOSMesa); here both are an :class:`~gpdyn.errors.InputError` naming ``MUJOCO_GL``, what
to install and which value to use, before MuJoCo is imported, and so is a backend that
cannot make an OpenGL context (``glfw`` without a display).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np

from gpdyn.environment import MUJOCO_GL_OFF, MUJOCO_GL_VARIABLE, RENDER_BACKENDS, check_mujoco_gl
from gpdyn.errors import InputError
from gpdyn.progress import progress_bar

log = logging.getLogger(__name__)

#: the library each headless backend loads (through PyOpenGL), and what provides it
GL_LIBRARIES = {
    "egl": ("EGL", "libEGL (Debian/Ubuntu: apt install libegl1; with an NVIDIA GPU its driver provides it)"),
    "osmesa": ("OSMesa", "libOSMesa (Debian/Ubuntu: apt install libosmesa6)"),
}
_OTHER_BACKENDS = "MUJOCO_GL=egl (headless: a GPU driver or Mesa), osmesa (headless, software) or glfw (a display)"


def render_backend() -> str:
    """The backend ``MUJOCO_GL`` names for rendering (egl when unset or empty); an
    InputError for a value MuJoCo refuses, one that turns rendering off, and MuJoCo's
    other spellings (glx, enable, ...), which gpdyn does not draw with."""
    value = check_mujoco_gl() or "egl"
    if value in MUJOCO_GL_OFF:
        raise InputError(f"render: {MUJOCO_GL_VARIABLE}={value} turns MuJoCo's rendering off; use "
                         f"{', '.join(RENDER_BACKENDS)}")
    if value not in RENDER_BACKENDS:
        raise InputError(f"render: {MUJOCO_GL_VARIABLE}={value} is not a backend gpdyn renders with; use "
                         f"{', '.join(RENDER_BACKENDS)}")
    return value


def check_gl_library(backend: str) -> None:
    """An InputError naming ``MUJOCO_GL`` when ``backend``'s library cannot be loaded, by
    the names PyOpenGL tries (``libX.so``, then ``libX.so.9`` down to ``.0``)."""
    if backend not in GL_LIBRARIES:
        return
    name, provider = GL_LIBRARIES[backend]
    errors = []
    for filename in [f"lib{name}.so", *(f"lib{name}.so.{i}" for i in range(9, -1, -1))]:
        try:
            ctypes.CDLL(filename, mode=ctypes.RTLD_GLOBAL)
            return
        except OSError as err:
            errors.append(str(err))
    raise InputError(f"render: {MUJOCO_GL_VARIABLE}={backend} needs lib{name}.so, which cannot be loaded "
                     f"({errors[0]}); install {provider}, or choose another backend: {_OTHER_BACKENDS}")


# Headless unless the user chose: read by MuJoCo when it is first imported (below) and by
# gymnasium's offscreen renderer when it creates its GL context.
if not os.environ.get(MUJOCO_GL_VARIABLE, "").strip():
    os.environ[MUJOCO_GL_VARIABLE] = "egl"
check_gl_library(render_backend())

import mujoco  # noqa: E402

from gpdyn.data.store import EpisodeStore  # noqa: E402

VIDEO_SUFFIXES = (".mp4", ".gif")
#: ``full``: the model's own look; ``fast``: no shadows, reflections or multisampling;
#: ``auto``: fast where OpenGL is drawn in software, full elsewhere
QUALITIES = ("auto", "full", "fast")
#: what Mesa's CPU renderers call themselves (``GL_RENDERER``)
SOFTWARE_RENDERERS = ("llvmpipe", "softpipe", "swrast", "software rasterizer")
#: x264 at this preset takes about half the CPU of its default for the same quality setting
MP4_PRESET = "veryfast"


def episode_states(store: EpisodeStore, index: int) -> tuple[np.ndarray, np.ndarray]:
    """``qpos``/``qvel`` of episode ``index`` from its first state to its last (T+1 states)."""
    if not -store.n_episodes <= index < store.n_episodes:
        raise InputError(f"{store.path}: episode {index} out of range (store has {store.n_episodes})")
    ep = store.episode(index, ["qpos", "qvel", "next_qpos", "next_qvel"])
    qpos = np.concatenate([ep["qpos"], ep["next_qpos"][-1:]])
    qvel = np.concatenate([ep["qvel"], ep["next_qvel"][-1:]])
    return qpos, qvel


class _Offscreen:
    """An offscreen MuJoCo frame buffer on the backend named by ``MUJOCO_GL`` now.

    ``mujoco.Renderer`` fixes its GL backend when ``mujoco`` is first imported, which
    may be before this module set ``MUJOCO_GL``; this context reads it when created.
    """

    def __init__(self, model: mujoco.MjModel, width: int, height: int, quality: str = "auto") -> None:
        backend = render_backend()
        check_gl_library(backend)
        self.model = model
        self.viewport = mujoco.MjrRect(0, 0, width, height)
        self.gl = None
        try:
            if backend == "egl":
                from mujoco.egl import GLContext
            elif backend == "osmesa":
                from mujoco.osmesa import GLContext
            else:
                from mujoco.glfw import GLContext
            self.gl = GLContext(width, height)
            self.gl.make_current()
            self.renderer = _gl_renderer()
            self.fast = quality == "fast" or (quality == "auto" and self.renderer.lower().startswith(SOFTWARE_RENDERERS))
            if self.fast:
                model.vis.quality.offsamples = 0  # read when the context below makes its offscreen buffer
            self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        except (ImportError, AttributeError, OSError, RuntimeError, mujoco.FatalError) as err:
            if self.gl is not None:
                self.gl.free()
            hint = ("glfw opens a window: it needs a display (DISPLAY or WAYLAND_DISPLAY)" if backend == "glfw"
                    else f"check that {GL_LIBRARIES[backend][1]} works here")
            raise InputError(f"render: {MUJOCO_GL_VARIABLE}={backend} cannot make an OpenGL context "
                             f"({type(err).__name__}: {str(err).strip()[:300]}); {hint}, or choose another backend: "
                             f"{_OTHER_BACKENDS}") from err
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.scene = mujoco.MjvScene(model, maxgeom=1000)
        if self.fast:
            self.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            self.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self.option = mujoco.MjvOption()
        self.rgb = np.empty((height, width, 3), dtype=np.uint8)

    def render(self, data: mujoco.MjData, camera: mujoco.MjvCamera) -> np.ndarray:
        """One RGB frame of ``data`` seen from ``camera`` (top row first)."""
        self.gl.make_current()
        mujoco.mjv_updateScene(self.model, data, self.option, None, camera, mujoco.mjtCatBit.mjCAT_ALL, self.scene)
        mujoco.mjr_render(self.viewport, self.scene, self.context)
        mujoco.mjr_readPixels(self.rgb, None, self.viewport, self.context)
        return np.flipud(self.rgb).copy()

    def close(self) -> None:
        self.context.free()
        self.gl.free()


def _gl_renderer() -> str:
    """``GL_RENDERER`` of the current OpenGL context (e.g. ``llvmpipe (LLVM 15.0.6, 256 bits)``),
    empty when it cannot be read."""
    try:
        from OpenGL import GL

        name = GL.glGetString(GL.GL_RENDERER)
    except Exception:  # noqa: BLE001 -- PyOpenGL missing or a context without the query: assume hardware
        return ""
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name or "")


def render_episode(
    store: EpisodeStore, index: int, out: str | Path, *, width: int = 480, height: int = 360, every: int | None = None,
    quality: str = "auto",
) -> Path:
    """Write an MP4 or GIF of episode ``index`` at the store's frame rate (``1/dt / every``).

    ``every`` defaults to 1 for an MP4 and 4 for a GIF: a GIF at 125 frames/s is huge and
    most viewers cap the rate. ``quality``: one of :data:`QUALITIES` (module notes).
    """
    import imageio.v2 as imageio

    from gpdyn.robots.task import task_for_env

    out = Path(out)
    if out.suffix.lower() not in VIDEO_SUFFIXES:
        raise InputError(f"{out}: the video file must end in {' or '.join(VIDEO_SUFFIXES)}")
    if out.suffix.lower() == ".mp4":
        try:
            import imageio_ffmpeg  # noqa: F401  (imageio writes MP4 through it)
        except ImportError as err:  # the optional extra 'video'
            raise InputError(f"{out}: writing MP4 needs imageio-ffmpeg: pip install 'gpdyn[video]' (or write a .gif)") from err
    if every is None:
        every = 4 if out.suffix.lower() == ".gif" else 1
    if every < 1:
        raise InputError(f"render: every must be >= 1, got {every}")
    if quality not in QUALITIES:
        raise InputError(f"render: quality must be one of {', '.join(QUALITIES)}, got {quality!r}")
    for field in ("qpos", "qvel", "next_qpos", "next_qvel"):
        store.columns(field)  # StoreError naming the field for a store that is not a legged task's
    qpos, qvel = episode_states(store, index)
    fps = 1.0 / (float(store.attrs["dt"]) * every)
    out.parent.mkdir(parents=True, exist_ok=True)
    env_id = str(store.attrs.get("env_id"))
    task = task_for_env(env_id, where=f"{store.path}: attribute env_id")
    if (qpos.shape[1], qvel.shape[1]) != (task.layout.nq, task.layout.nv):
        raise InputError(f"{store.path}: attribute env_id {env_id!r}: the store's qpos/qvel have {qpos.shape[1]}/"
                         f"{qvel.shape[1]} columns, the {task.name}'s model {task.layout.nq}/{task.layout.nv}")
    env = task.make_env()
    sim = env.unwrapped
    vis = sim.model.vis.global_
    if width > vis.offwidth or height > vis.offheight:
        raise InputError(f"render: {width}x{height} exceeds the model's offscreen buffer {vis.offwidth}x{vis.offheight}")
    # gymnasium's rgb_array camera is a free camera that stays at the origin; a
    # tracking camera on the torso keeps a walking robot in the frame
    camera = mujoco.MjvCamera()
    camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
    camera.trackbodyid = max(mujoco.mj_name2id(sim.model, mujoco.mjtObj.mjOBJ_BODY, "torso"), 0)
    camera.distance, camera.elevation, camera.azimuth = 4.0, -20.0, 90.0
    kwargs = ({"fps": fps, "macro_block_size": 8, "ffmpeg_params": ["-preset", MP4_PRESET]} if out.suffix.lower() == ".mp4"
              else {"duration": 1000.0 / fps, "loop": 0})
    frames = _Offscreen(sim.model, width, height, quality)
    if frames.fast and quality == "auto":
        log.info(f"render: OpenGL is drawn in software ({frames.renderer}): no shadows, reflections or "
                 "anti-aliasing, to keep it fast (quality 'full' keeps them)")
    try:
        env.reset(seed=0)
        with imageio.get_writer(out, **kwargs) as writer:
            for t in progress_bar(range(0, qpos.shape[0], every), desc=f"render {out.name}", unit="frame"):
                sim.set_state(qpos[t], qvel[t])
                writer.append_data(frames.render(sim.data, camera))
    finally:
        frames.close()
        env.close()
    return out
