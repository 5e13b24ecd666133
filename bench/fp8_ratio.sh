#!/usr/bin/env bash
# FP8 against BF16 as a training run sees it: on a GPU at its power limit a step's time follows its
# energy, which depends on the values multiplied, and on the H200 initial weights flattered FP8 by
# ~3% (bench/RESULTS.md, 2026-12-05). Trains TRAIN_STEPS steps in BF16 and saves them, then times
# `moetrain bench` from the initial and from the trained weights (--init-from) in both precisions,
# alternated ROUNDS times, and prints tokens/s, joules per step and FP8 / BF16 for each.
# On the H200 machine from the repo root (binaries in .devrun, as for device_check.sh):
#   bash bench/fp8_ratio.sh        (about 6 minutes for bench-olmoe-4l)
# Anywhere else: MOETRAIN=build/moetrain CONFIG=tiny TRAIN_STEPS=20 BENCH_STEPS=4 bash bench/fp8_ratio.sh
# Logs and --json reports go to $OUT; the checkpoint to a new folder under $WORK (deleted at the end).
set -euo pipefail
[ -f bench/device_env.sh ] && [ -z "${MOETRAIN:-}" ] && . bench/device_env.sh
moetrain=${MOETRAIN:-.devrun/bin/moetrain}
config=${CONFIG:-configs/bench-olmoe-4l.toml}
train_steps=${TRAIN_STEPS:-400}
bench_steps=${BENCH_STEPS:-12}
rounds=${ROUNDS:-2}
out=${OUT:-/tmp}
mkdir -p "$out"
graph=${GRAPH:-true}
[ "$config" = tiny ] && graph=false  # a CPU run has no graph
work=$(mktemp -d "${WORK:-/tmp}/fp8-ratio-XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--config "$config" --set train.cuda_graph="$graph")

echo "== training $train_steps BF16 steps of $config"
"$moetrain" train "${common[@]}" --steps "$train_steps" --set train.precision=bf16 --set train.eval_every=0 \
  --set train.log_every=50 --set run.save_final=true --set run.dir="$work/run" > "$out/fp8_ratio_train.log" 2>&1 ||
  { tail -5 "$out/fp8_ratio_train.log"; exit 1; }
grep -E 'throughput:' "$out/fp8_ratio_train.log"

# bench_one WEIGHTS PRECISION ROUND: one bench into fp8_ratio_<WEIGHTS>-<PRECISION>-<ROUND>.{log,json}.
bench_one() {
  local from=() name="$1-$2-$3"
  [ "$1" = trained ] && from=(--init-from "$work/run")
  "$moetrain" bench "${common[@]}" --steps "$bench_steps" --set train.precision="$2" "${from[@]}" \
    --json "$out/fp8_ratio_$name.json" > "$out/fp8_ratio_$name.log" 2>&1 || { tail -5 "$out/fp8_ratio_$name.log"; exit 1; }
}
printf '%-8s %-5s %-16s %-16s %s\n' weights round "FP8 tok/s, J" "BF16 tok/s, J" "FP8/BF16"
for round in $(seq 1 "$rounds"); do
  for weights in initial trained; do
    bench_one "$weights" fp8 "$round"
    bench_one "$weights" bf16 "$round"
    python3 - "$out/fp8_ratio_$weights-fp8-$round.json" "$out/fp8_ratio_$weights-bf16-$round.json" "$weights" "$round" <<'PY'
import json, sys
f8, b16 = (json.load(open(p)) for p in sys.argv[1:3])
def cell(r):
    e = (r.get("power") or {}).get("energy_j_per_step")
    return "%.1fK, %s" % (r["tokens_per_s"] / 1e3, "%.1f" % e if e else "-")
print("%-8s %-5s %-16s %-16s %.3fx" % (sys.argv[3], sys.argv[4], cell(f8), cell(b16), f8["tokens_per_s"] / b16["tokens_per_s"]))
PY
  done
done
