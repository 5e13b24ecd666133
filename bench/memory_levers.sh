#!/usr/bin/env bash
# Runs on the H200 machine from the repo root (binaries in .devrun, as for device_check.sh): the
# memory levers measured on one GPU.
#   1. bench-olmoe-4l as one CUDA graph under each train.recompute mode: step time, tokens/s, the
#      activation plan and the GPU high-water.
#   2. OLMoE-1B-7B (configs/olmoe-1b-7b.toml, synthetic tokens) at seq_len 4096 under each
#      setting of OLMOE_SETTINGS ("name:--set a=b --set c=d" entries, separated by ';').
# Logs go to $OUT; a summary line per run is printed.
set -uo pipefail
. bench/device_env.sh
out=${OUT:-/tmp}
steps=${STEPS:-6}
summary() {  # summary NAME LOG
  printf '%-28s %s | %s | %s\n' "$1" "$(grep -o 'throughput: .*' "$2" | head -1)" \
    "$(grep -o 'memory plan (cuda[^;]*; activations [^(]*' "$2" | head -1 | sed 's/.*activations/activations/')" \
    "$(grep -o 'GPU high-water [0-9.]* [KMG]iB' "$2" | head -1)"
  grep -m1 '^error' "$2" || true
}
for r in ${RECOMPUTE_MODES:-none experts attention block}; do
  log="$out/recompute-$r.log"
  .devrun/bin/moetrain bench --config configs/bench-olmoe-4l.toml --steps "$steps" --set train.cuda_graph=true \
    --set train.recompute="$r" > "$log" 2>&1
  summary "bench-olmoe-4l $r" "$log"
done
IFS=';' read -ra settings <<< "${OLMOE_SETTINGS:-}"
for entry in "${settings[@]}"; do
  name=${entry%%:*}
  read -ra extra <<< "${entry#*:}"
  log="$out/olmoe-$name.log"
  .devrun/bin/moetrain bench --config configs/olmoe-1b-7b.toml --steps "${OLMOE_STEPS:-4}" --set data.path=synthetic \
    --set data.synthetic_tokens=4194304 --set train.global_batch_size=4 "${extra[@]}" > "$log" 2>&1
  summary "olmoe-1b-7b $name" "$log"
done
