#!/usr/bin/env bash
# Runs on the H200 machine from the repo root (binaries in .devrun, as for device_check.sh):
# `moetrain bench` on bench-olmoe-4l, eager and with the step captured as one CUDA graph, each
# printing tokens/s, MFU, the step-time split, memory and the top kernels. Logs go to $OUT.
set -uo pipefail
. bench/device_env.sh
out=${OUT:-/tmp}
steps=${STEPS:-8}
config=${CONFIG:-configs/bench-olmoe-4l.toml}
status=0
for mode in ${MODES:-eager graph}; do
  extra=()
  [ "$mode" = graph ] && extra=(--set train.cuda_graph=true)
  echo "== moetrain bench --config $config --steps $steps ${extra[*]}"
  .devrun/bin/moetrain bench --config "$config" --steps "$steps" "${extra[@]}" "$@" > "$out/bench-$mode.log" 2>&1 || status=1
  cat "$out/bench-$mode.log"
done
exit $status
