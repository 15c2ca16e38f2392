#!/usr/bin/env bash
# Produce the GPU figures of this folder's README in one go, on a CUDA machine.
#
#   bash docs/results/gpu/run.sh [OUT_DIR]     (default docs/results/gpu)
#
# Each stage has its own time limit (GPDYN_GPU_LIMIT_<STAGE>, seconds) so that one slow or
# failing stage never costs the others their figures; each stage's log goes beside its run
# folder. The race budget (GPDYN_GPU_RACE_S, default 60 as in the README) and the planning
# repeats (GPDYN_GPU_MPC_REPEATS, default 10) shrink the run for a short lease;
# GPDYN_GPU_STAGES (default every stage: doctor,host-syncs,collect-kuka,bench-learners,
# bench-wiski,bench-mpc) picks stages, and GPDYN_GPU_MPC_PRESET (default paper) the
# planning models' size.
#
# Environment: GPDYN_PY (the Python holding a CUDA torch and gpdyn's requirements; default
# .venv/bin/python when it exists, else python3).
set -uo pipefail
cd "$(dirname "$0")/../../.."

out=${1:-docs/results/gpu}
mkdir -p "$out"
py=${GPDYN_PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
race_s=${GPDYN_GPU_RACE_S:-60}
mpc_repeats=${GPDYN_GPU_MPC_REPEATS:-10}
mpc_preset=${GPDYN_GPU_MPC_PRESET:-paper}
stages=${GPDYN_GPU_STAGES:-doctor,host-syncs,collect-kuka,bench-learners,bench-wiski,bench-mpc}
export PYTHONUNBUFFERED=1

stage() {  # stage NAME LIMIT_S COMMAND...: run with a limit, log to OUT/NAME.log, never abort the rest
    local name=$1 limit=$2
    shift 2
    case ",$stages," in *",$name,"*) ;; *) echo "== $name: skipped (GPDYN_GPU_STAGES)"; return ;; esac
    echo "== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0))s"
    tail -n 25 "$out/$name.log"
}

nvidia-smi -L >"$out/device.txt" || echo "no nvidia-smi" >"$out/device.txt"
cat "$out/device.txt"
stage doctor 60 "$py" -m gpdyn doctor
stage host-syncs "${GPDYN_GPU_LIMIT_SYNCS:-120}" \
    "$py" -m pytest -q -p no:cacheprovider tests/test_cuda_sync.py tests/test_device.py -m gpu
stage collect-kuka 60 "$py" -m gpdyn collect kuka --store data/kuka1.zarr --out "$out/collect-kuka-run"
stage bench-learners "${GPDYN_GPU_LIMIT_LEARNERS:-900}" \
    "$py" -m gpdyn bench learners --device cuda --peer gpytorch \
    --only svdgp-4096,svdgp-16384,svi-1024,orthnat-3500-1500,gpytorch-svgp-1024 --repeats 20 \
    --store data/kuka1.zarr --problem kuka --budget "$race_s" --out "$out/bench-learners"
stage bench-wiski "${GPDYN_GPU_LIMIT_WISKI:-600}" \
    "$py" -m gpdyn bench wiski --device cuda --out "$out/bench-wiski"
stage bench-mpc "${GPDYN_GPU_LIMIT_MPC:-600}" \
    "$py" -m gpdyn bench mpc --device cuda --samples 1000 --horizon 30 --repeats "$mpc_repeats" \
    --preset "$mpc_preset" --out "$out/bench-mpc"
