#!/usr/bin/env bash
# Install GPyTorch into gpdyn's virtual environment, for `gpdyn bench learners --peer gpytorch` only.
#
# gpytorch is not a dependency of gpdyn (CI never installs it). Its requirements would let
# pip replace the venv's torch (gpdyn keeps the user's own build, e.g. a CUDA one), so the two
# wheels go in with --no-deps and this script checks their small pure-Python requirements
# itself: scipy and mpmath, which gpdyn already installs (scikit-learn, which gpytorch also
# lists, is imported only by parts the benchmark does not use). It fails if torch changed.
#
# Environment: GPDYN_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${GPDYN_VENV:-.venv}
py="$venv/bin/python"
gpytorch_version=1.15.2
linear_operator_version=0.6.1

if [ ! -x "$py" ]; then
    echo "install_peer: no virtual environment at $venv; run scripts/setup.sh first" >&2
    exit 1
fi
torch_before=$("$py" -c 'import torch; print(torch.__version__)')
"$py" -m pip --disable-pip-version-check -q install --no-deps \
    "gpytorch==$gpytorch_version" "linear_operator==$linear_operator_version"
for requirement in "scipy:scipy>=1.6" "mpmath:mpmath>=0.19,<=1.3"; do
    module=${requirement%%:*}
    if ! "$py" -c "import $module" 2>/dev/null; then
        echo "install_peer: installing ${requirement#*:} (a requirement of gpytorch)"
        "$py" -m pip --disable-pip-version-check -q install --no-deps "${requirement#*:}"
    fi
done
torch_after=$("$py" -c 'import torch; print(torch.__version__)')
if [ "$torch_before" != "$torch_after" ]; then
    echo "install_peer: torch changed from $torch_before to $torch_after; reinstall your torch" >&2
    exit 1
fi
"$py" -c 'import gpytorch, linear_operator, torch; print(f"install_peer: gpytorch {gpytorch.__version__}, linear_operator {linear_operator.__version__}, torch {torch.__version__} (unchanged)")'
