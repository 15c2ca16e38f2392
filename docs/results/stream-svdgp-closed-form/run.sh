#!/usr/bin/env bash
# The tables of README.md: svdgp-stream beside the anchor ssgp (and WISKI) under the stream protocol,
# seeds 0-4 on walker50 and SARCOS, seed 0 on the KUKA stream with and without the rigid-body prior.
# Each run keeps final.csv as RUN.csv here; the seed-0 walker run keeps its report folder.
#   bash docs/results/stream-svdgp-closed-form/run.sh      (from the repository root, after scripts/stream_tables.sh made the stores)
set -euo pipefail
cd "$(dirname "$0")/../../.."
gpdyn=${GPDYN:-.venv/bin/gpdyn}
here=docs/results/stream-svdgp-closed-form
tmp=$(mktemp -d)
walker="--size wiski.calibrate_rows=1024 --size wiski.proj_lr=0 --size wiski.pretrain_lr=0.2 --size wiski.pretrain_proj_lr=0.05
        --size wiski.grid_size=7 --size wiski.margin=0 --size wiski.step_every=4 --size wiski.lr=0.3"
run() {  # run NAME REPLAY_OPTIONS...
    local name=$1
    shift
    $gpdyn --threads 1 replay --protocol stream "$@" --out "$tmp/$name" > "$tmp/$name.log" 2>&1
    cp "$tmp/$name/final.csv" "$here/$name.csv"
}
for s in 0 1 2 3 4; do
    # shellcheck disable=SC2086
    run walker50-seed$s --learners svdgp-stream,ssgp,wiski $walker --store data/walker50.zarr --problem walker-1 --seed $s
    run sarcos-seed$s --learners svdgp-stream,ssgp,wiski --size wiski.calibrate_rows=1024 \
        --store data/sarcos_test.zarr --problem arm --seed $s
done
rm -rf "$here/walker50"
cp -r "$tmp/walker50-seed0" "$here/walker50"
rm -rf "$here/walker50/checkpoints" "$here/walker50/metrics.jsonl" "$here/walker50/config.json"
run kuka-seed0 --learners svdgp-stream,ssgp --store data/kuka1.zarr --problem kuka --seed 0
run kuka-rigid-body-seed0 --learners svdgp-stream,ssgp --prior-mean rigid-body --store data/kuka1.zarr --problem kuka --seed 0
rm -rf "$tmp"
