#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment in .venv: idempotent, and fast
# when nothing changed.
#
# torch: a torch the venv already has is kept. On first creation, if the chosen
# Python already has torch (e.g. your CUDA build), the venv sees it through
# --system-site-packages and nothing replaces it; otherwise torch==2.13.0 is installed
# before the project, so that no requirement pulls another torch build.
#
# Environment: GPDYN_PYTHON (interpreter, default python3), GPDYN_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${GPDYN_PYTHON:-python3}
venv=${GPDYN_VENV:-.venv}
torch_version=2.13.0

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "setup: gpdyn needs Python >= 3.11; '$python' is $("$python" --version 2>&1). Set GPDYN_PYTHON." >&2
    exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
    if "$python" -c 'import torch' 2>/dev/null; then
        echo "setup: using the torch of $python ($("$python" -c 'import torch; print(torch.__version__)'))"
        "$python" -m venv --system-site-packages "$venv"
    else
        "$python" -m venv "$venv"
    fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    echo "setup: installing torch==$torch_version"
    "${pip[@]}" install "torch==$torch_version"
fi

# Reinstall the project only when its requirements changed.
stamp="$venv/.gpdyn-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$venv/bin/python" -c 'import gpdyn' 2>/dev/null; then
    echo "setup: installing gpdyn and its requirements"
    torch_before=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
    "${pip[@]}" install -e ".[test]"
    torch_after=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
    if [ "$torch_before" != "$torch_after" ]; then
        echo "setup: a requirement replaced torch $torch_before with $torch_after; pin it back" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
