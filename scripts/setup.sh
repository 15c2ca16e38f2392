#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment in .venv: idempotent, and fast
# when nothing changed.
#
# torch: gpdyn needs torch >= 2.6 (the first whose weights_only checkpoint loader is safe,
# CVE-2025-32434) and below 3 (untested), the range pyproject.toml declares. A torch the
# venv already has is kept when it is in that range. On first creation, if the chosen
# Python already has torch in that range (e.g. your CUDA build), the venv sees it through
# --system-site-packages and nothing replaces it; otherwise torch==2.13.0 is installed
# before the project, so that no requirement pulls another torch build. A torch outside
# the range is refused with the command that upgrades it: it is never replaced silently.
#
# Environment: GPDYN_PYTHON (interpreter, default python3), GPDYN_VENV (default .venv).
#
# Sourcing this file (`source scripts/setup.sh`) defines its functions and runs nothing.
set -euo pipefail

torch_version=2.13.0
# the torch range gpdyn is tested with: >= torch_min, below torch_first_untested_major
torch_min_major=2
torch_min_minor=6
torch_first_untested_major=3

# The torch version that Python "$1" imports, or nothing when it has no torch.
torch_version_of() {
    "$1" -c 'import torch; print(torch.__version__)' 2>/dev/null || true
}

# Succeed when torch version "$1" (e.g. 2.13.0+cpu) is in the tested range.
torch_in_range() {
    local major minor
    [[ $1 =~ ^([0-9]+)\.([0-9]+) ]] || return 1
    major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
    if ((major < torch_min_major || (major == torch_min_major && minor < torch_min_minor))); then
        return 1
    fi
    ((major < torch_first_untested_major))
}

# Exit with the fix when the torch of Python "$1" (version "$2") is outside the range;
# "$3", when given, is a further way out.
require_torch_in_range() {
    local python=$1 found=$2 other_way=${3:-}
    torch_in_range "$found" && return 0
    local range="torch>=$torch_min_major.$torch_min_minor,<$torch_first_untested_major"
    {
        echo "setup: '$python' has torch $found; gpdyn needs $range."
        if [[ $found =~ ^([0-9]+) ]] && ((BASH_REMATCH[1] >= torch_first_untested_major)); then
            echo "  gpdyn is not tested with torch $torch_first_untested_major or later. Install a 2.x torch:"
            echo "  $python -m pip install '$range'"
        else
            echo "  Before 2.6, torch.load(weights_only=True) can run code from a crafted checkpoint (CVE-2025-32434). Upgrade it:"
            echo "  $python -m pip install --upgrade '$range'"
        fi
        echo "  (for the CPU-only build add --index-url https://download.pytorch.org/whl/cpu)${other_way:+, $other_way}"
    } >&2
    exit 1
}

main() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    local python=${GPDYN_PYTHON:-python3}
    local venv=${GPDYN_VENV:-.venv}
    local found

    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "setup: gpdyn needs Python >= 3.11; '$python' is $("$python" --version 2>&1). Set GPDYN_PYTHON." >&2
        exit 1
    fi

    if [ ! -x "$venv/bin/python" ]; then
        found=$(torch_version_of "$python")
        if [ -n "$found" ]; then
            require_torch_in_range "$python" "$found" "or set GPDYN_PYTHON to a Python without torch"  # before the venv exists: nothing is left half made
            echo "setup: using the torch of $python ($found)"
            "$python" -m venv --system-site-packages "$venv"
        else
            "$python" -m venv "$venv"
        fi
    fi
    local pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

    found=$(torch_version_of "$venv/bin/python")
    if [ -z "$found" ]; then
        echo "setup: installing torch==$torch_version"
        "${pip[@]}" install "torch==$torch_version"
    else
        require_torch_in_range "$venv/bin/python" "$found"
    fi

    # Reinstall the project only when its requirements or its version changed.
    local stamp="$venv/.gpdyn-installed" want torch_before torch_after
    want=$(cat pyproject.toml gpdyn/__init__.py | sha256sum | cut -d' ' -f1)
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! "$venv/bin/python" -c 'import gpdyn' 2>/dev/null; then
        echo "setup: installing gpdyn and its requirements"
        torch_before=$(torch_version_of "$venv/bin/python")
        "${pip[@]}" install -e ".[test,video,sarcos]"  # every extra the test suite uses
        torch_after=$(torch_version_of "$venv/bin/python")
        if [ "$torch_before" != "$torch_after" ]; then
            echo "setup: a requirement replaced torch $torch_before with $torch_after; pin it back" >&2
            exit 1
        fi
        echo "$want" > "$stamp"
    fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
