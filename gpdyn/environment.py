"""The environment variables gpdyn reads, checked before any work starts.

- ``MUJOCO_GL``: the OpenGL backend MuJoCo renders with. MuJoCo reads it when it is first
  imported and raises a bare ``RuntimeError`` for a value it does not know, in every
  command that imports it; :func:`check_mujoco_gl` refuses such a value first, with an
  :class:`~gpdyn.errors.InputError` naming the variable and the values it takes.
- ``GPDYN_NATIVE``: whether predictions use the fused native kernel
  (:mod:`gpdyn.gp.native`). :func:`native_kernel_wanted` reads it: ``1``, ``on``,
  ``true``, ``yes`` or unset/empty (the default) turn it on, ``0``, ``off``, ``false``,
  ``no`` turn it off (any case, surrounding spaces ignored); anything else is an
  InputError rather than a silent choice.

The command line calls :func:`check` before it runs any command, so a wrong value exits
2 with its message; this module imports neither torch nor MuJoCo.
"""

from __future__ import annotations

import os
import platform

from gpdyn.errors import InputError

NATIVE_VARIABLE = "GPDYN_NATIVE"
NATIVE_ON = ("1", "on", "true", "yes")
NATIVE_OFF = ("0", "off", "false", "no")

MUJOCO_GL_VARIABLE = "MUJOCO_GL"
#: the backends gpdyn renders with (``gpdyn render``); unset or empty means egl there
RENDER_BACKENDS = ("egl", "osmesa", "glfw")
#: MuJoCo's own spellings of "its default backend (glfw)" and of "no rendering"
MUJOCO_GL_DEFAULT = ("enable", "enabled", "on", "true", "1")
MUJOCO_GL_OFF = ("disable", "disabled", "off", "false", "0")


def mujoco_gl_values(system: str | None = None) -> tuple[str, ...]:
    """Every value MuJoCo accepts for ``MUJOCO_GL`` on ``system`` (default: this one), as
    its ``gl_context`` module checks them, lower case; ``""`` is unset."""
    system = system or platform.system()
    values = ("", "glfw", *MUJOCO_GL_DEFAULT, *MUJOCO_GL_OFF)
    extra = {"Linux": ("egl", "osmesa", "glx"), "Windows": ("wgl",), "Darwin": ("cgl",)}
    return values + extra.get(system, ())


def mujoco_gl() -> str:
    """``MUJOCO_GL`` as MuJoCo reads it: lower case, spaces stripped, ``""`` when unset."""
    return os.environ.get(MUJOCO_GL_VARIABLE, "").strip().lower()


def check_mujoco_gl() -> str:
    """The value of ``MUJOCO_GL`` (see :func:`mujoco_gl`), or an InputError naming the
    variable and the values MuJoCo accepts here."""
    value = mujoco_gl()
    accepted = mujoco_gl_values()
    if value not in accepted:
        raw = os.environ.get(MUJOCO_GL_VARIABLE, "")
        backends = ", ".join(b for b in (*RENDER_BACKENDS, "glx", "wgl", "cgl") if b in accepted)
        raise InputError(
            f"environment variable {MUJOCO_GL_VARIABLE}={raw!r} is not a rendering backend MuJoCo accepts: "
            f"use one of {backends} (egl renders headless), or leave it unset; MuJoCo also takes "
            f"{'/'.join(MUJOCO_GL_DEFAULT)} (its default backend) and {'/'.join(MUJOCO_GL_OFF)} (no rendering)"
        )
    return value


def native_kernel_wanted() -> bool:
    """Whether ``GPDYN_NATIVE`` asks for the native kernel (unset or empty: yes), or an
    InputError naming the variable and its values."""
    raw = os.environ.get(NATIVE_VARIABLE, "")
    value = raw.strip().lower()
    if value in ("", *NATIVE_ON):
        return True
    if value in NATIVE_OFF:
        return False
    raise InputError(
        f"environment variable {NATIVE_VARIABLE}={raw!r}: use one of {', '.join(NATIVE_ON)} (the native "
        f"prediction kernel on, the default) or {', '.join(NATIVE_OFF)} (off), in any case"
    )


def check() -> None:
    """Every environment variable gpdyn reads, checked once at the start of a command."""
    check_mujoco_gl()
    native_kernel_wanted()
