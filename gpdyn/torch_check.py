"""The torch that may read checkpoints: ``weights_only=True`` is only safe from torch 2.6 on.

Before torch 2.6 a crafted checkpoint could run code through the weights-only loader
(CVE-2025-32434), so gpdyn refuses to read policy files and learner checkpoints with an
older torch. The range here is the one pyproject.toml declares and scripts/setup.sh
enforces at install time; this check covers a torch downgraded after the install.
"""

from __future__ import annotations

import re

from gpdyn.errors import InputError

# the lowest torch whose weights-only loader is safe, and the first major release not tested
MIN_TORCH = (2, 6)
FIRST_UNTESTED_MAJOR = 3
TORCH_REQUIREMENT = f"torch>={MIN_TORCH[0]}.{MIN_TORCH[1]},<{FIRST_UNTESTED_MAJOR}"


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as ``2.13.0+cpu`` or ``2.6.0a0+git1234``."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    if match is None:
        raise InputError(f"torch version {version!r} is not of the form MAJOR.MINOR[...]")
    return int(match[1]), int(match[2])


def require_safe_torch_load(version: str | None = None) -> None:
    """Raise :class:`InputError` naming the installed torch (or ``version``) when it is older than 2.6.

    Called right before each checkpoint load, so the message names the file's reader, not a
    traceback from inside torch.
    """
    if version is None:
        import torch

        version = str(torch.__version__)
    if torch_release(version) < MIN_TORCH:
        raise InputError(
            f"torch {version} cannot load checkpoints safely: its weights_only loader can run code from a "
            f"crafted file (CVE-2025-32434); gpdyn needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}. "
            f"Upgrade it: pip install --upgrade '{TORCH_REQUIREMENT}' (for the CPU-only build add "
            "--index-url https://download.pytorch.org/whl/cpu)"
        )
