#!/usr/bin/env bash
# Runs on the H200 machine from the repo root (binaries in .devrun, as for device_check.sh): the
# expert-count sweep of issue 6 at fixed active size: bench-olmoe-4l with top-4 and
# N = 8, 16, 32, 64, 128 experts (same dimensions), CUDA graph on. One summary line per N.
set -uo pipefail
. bench/device_env.sh
out=${OUT:-/tmp}
steps=${STEPS:-6}
status=0
for n in ${EXPERTS:-8 16 32 64 128}; do
  log="$out/sweep-n$n.log"
  .devrun/bin/moetrain bench --config configs/bench-olmoe-4l.toml --steps "$steps" --set model.num_experts="$n" \
    --set model.num_experts_per_tok=4 --set train.cuda_graph=true "$@" > "$log" 2>&1 || status=1
  printf 'N=%-4s %s | %s\n' "$n" "$(grep -E '^  throughput' "$log" | sed 's/^ *//')" \
    "$(grep -E 'GPU high-water' "$log" | sed 's/.*GPU high-water \([^ ]* [^ ]*\).*/GPU high-water \1/')"
done
exit $status
