#!/usr/bin/env bash
# Install a peer library into gpdyn's virtual environment, for a benchmark only:
#   bash scripts/install_peer.sh [gpytorch|pytorch-mppi|all]     (default gpytorch)
#
# - gpytorch: `gpdyn bench learners --peer gpytorch` (GPyTorch's SVGP beside gpdyn's learners).
# - pytorch-mppi: `gpdyn bench mpc --peer pytorch-mppi` (its MPPI beside gpdyn's own planner).
#
# Neither is a dependency of gpdyn (CI never installs them; their tests skip without them).
# Their requirements would let pip replace the venv's torch (gpdyn keeps the user's own
# build, e.g. a CUDA one), so the wheels go in with --no-deps and this script checks their
# small pure-Python requirements itself, installing a missing one with --no-deps too:
# - gpytorch 1.15.2 + linear_operator 0.6.1: scipy and mpmath, which gpdyn already installs
#   (scikit-learn, which gpytorch also lists, is imported only by parts the benchmark does
#   not use);
# - pytorch-mppi 0.9.1: numpy and arm-pytorch-utilities (0.5.0, pure Python), whose own
#   imports need pytorch-seed (0.2.0, pure Python), scipy, numpy and matplotlib (the last
#   three gpdyn already installs).
# It fails if torch changed.
#
# Environment: GPDYN_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${GPDYN_VENV:-.venv}
py="$venv/bin/python"
peer=${1:-gpytorch}
gpytorch_version=1.15.2
linear_operator_version=0.6.1
pytorch_mppi_version=0.9.1
arm_utilities_version=0.5.0
pytorch_seed_version=0.2.0

case "$peer" in
    gpytorch|pytorch-mppi|all) ;;
    *) echo "install_peer: unknown peer '$peer'; choose gpytorch, pytorch-mppi or all" >&2; exit 2 ;;
esac
if [ ! -x "$py" ]; then
    echo "install_peer: no virtual environment at $venv; run scripts/setup.sh first" >&2
    exit 1
fi

pip_no_deps() {
    "$py" -m pip --disable-pip-version-check -q install --no-deps "$@"
}

# "module:requirement" pairs: the requirement is installed (--no-deps) when the module does not import
ensure() {
    local owner=$1; shift
    for requirement in "$@"; do
        module=${requirement%%:*}
        if ! "$py" -c "import $module" 2>/dev/null; then
            echo "install_peer: installing ${requirement#*:} (a requirement of $owner)"
            pip_no_deps "${requirement#*:}"
        fi
    done
}

torch_before=$("$py" -c 'import torch; print(torch.__version__)')
if [ "$peer" = gpytorch ] || [ "$peer" = all ]; then
    pip_no_deps "gpytorch==$gpytorch_version" "linear_operator==$linear_operator_version"
    ensure gpytorch "scipy:scipy>=1.6" "mpmath:mpmath>=0.19,<=1.3"
fi
if [ "$peer" = pytorch-mppi ] || [ "$peer" = all ]; then
    pip_no_deps "pytorch-mppi==$pytorch_mppi_version"
    ensure pytorch-mppi "numpy:numpy" "scipy:scipy" "matplotlib:matplotlib" \
        "pytorch_seed:pytorch-seed==$pytorch_seed_version" "arm_pytorch_utilities:arm-pytorch-utilities==$arm_utilities_version"
fi
torch_after=$("$py" -c 'import torch; print(torch.__version__)')
if [ "$torch_before" != "$torch_after" ]; then
    echo "install_peer: torch changed from $torch_before to $torch_after; reinstall your torch" >&2
    exit 1
fi
if [ "$peer" = gpytorch ] || [ "$peer" = all ]; then
    "$py" -c 'import gpytorch, linear_operator, torch; print(f"install_peer: gpytorch {gpytorch.__version__}, linear_operator {linear_operator.__version__}, torch {torch.__version__} (unchanged)")'
fi
if [ "$peer" = pytorch-mppi ] || [ "$peer" = all ]; then
    "$py" -c 'import importlib.metadata as m, pytorch_mppi, torch; names = ("pytorch-mppi", "arm-pytorch-utilities", "pytorch-seed"); print("install_peer: " + ", ".join(n + " " + m.version(n) for n in names) + f", torch {torch.__version__} (unchanged)")'
fi
