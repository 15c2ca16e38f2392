#!/usr/bin/env bash
# The tables of README.md: svdgp-stream beside the anchor ssgp (and WISKI) under the stream protocol:
# seeds 0-4 on walker50 and SARCOS; five KUKA streams (kuka1 and four collected with --seed 1-4, the
# learners' seed the stream's), with WISKI's walker setting; kuka1 with the rigid-body prior.
# Each run keeps final.csv as RUN.csv here; the seed-0 walker run keeps its report folder.
#   bash docs/results/stream-svdgp-closed-form/run.sh [walker] [sarcos] [kuka]   (default: all three; from the
#   repository root, after scripts/stream_tables.sh made data/walker50.zarr, data/sarcos_test.zarr, data/kuka1.zarr)
set -euo pipefail
cd "$(dirname "$0")/../../.."
gpdyn=${GPDYN:-.venv/bin/gpdyn}
here=docs/results/stream-svdgp-closed-form
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
walker="--size wiski.calibrate_rows=1024 --size wiski.proj_lr=0 --size wiski.pretrain_lr=0.2 --size wiski.pretrain_proj_lr=0.05
        --size wiski.grid_size=7 --size wiski.margin=0 --size wiski.step_every=4 --size wiski.lr=0.3"
run() {  # run NAME REPLAY_OPTIONS...
    local name=$1
    shift
    $gpdyn --threads 1 replay --protocol stream "$@" --out "$tmp/$name" > "$tmp/$name.log" 2>&1
    cp "$tmp/$name/final.csv" "$here/$name.csv"
}
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(walker sarcos kuka)
for group in "${groups[@]}"; do
    case $group in
    walker)
        for s in 0 1 2 3 4; do
            # shellcheck disable=SC2086
            run walker50-seed$s --learners svdgp-stream,ssgp,wiski $walker --store data/walker50.zarr --problem walker-1 --seed $s
        done
        rm -rf "$here/walker50"
        cp -r "$tmp/walker50-seed0" "$here/walker50"
        rm -rf "$here/walker50/checkpoints" "$here/walker50/metrics.jsonl" "$here/walker50/config.json" ;;
    sarcos)
        for s in 0 1 2 3 4; do
            run sarcos-seed$s --learners svdgp-stream,ssgp,wiski --size wiski.calibrate_rows=1024 \
                --store data/sarcos_test.zarr --problem arm --seed $s
        done ;;
    kuka)
        for s in 0 1 2 3 4; do
            store=data/kuka_s$s.zarr
            [ "$s" = 0 ] && store=data/kuka1.zarr
            [ -d "$store" ] || $gpdyn collect kuka --store "$store" --seed "$s" --out "$tmp/collect$s" -q
            # shellcheck disable=SC2086
            run kuka-seed$s --learners svdgp-stream,ssgp,wiski $walker --store "$store" --problem kuka --seed $s
        done
        run kuka-rigid-body-seed0 --learners svdgp-stream,ssgp --prior-mean rigid-body --store data/kuka1.zarr --problem kuka --seed 0 ;;
    *) echo "unknown group $group (walker, sarcos, kuka)" >&2; exit 2 ;;
    esac
done
