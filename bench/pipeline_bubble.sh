#!/usr/bin/env bash
# CPU pipeline bubble: MPI ranks, one pipeline stage each (dp = 1), tiny-x4 dimensions with 8
# layers, for 1F1B and the interleaved schedule. Prints, per run, the measured bubble (each rank's
# idle share of the pipeline phase, mean over ranks and over the steps after the first, from
# metrics.jsonl) next to the schedule's theoretical bubble ((P-1)/(m+P-1) for 1F1B,
# (P-1)/(V m+P-1) interleaved) and the step time. PP2_ONLY=1: only the 2-rank runs (a 2-core machine
# runs the 4-rank ones oversubscribed).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build/moetrain}
steps=${STEPS:-6}
dir=$(mktemp -d /tmp/pp-bubble-XXXXXX)
trap 'rm -rf "$dir"' EXIT
common=(--config configs/tiny-x4.toml --steps "$steps" --set run.device=cpu --set model.num_hidden_layers=8
        --set train.micro_batch_size=2 --set train.eval_batches=0 --set train.eval_every=0 --set run.save_final=false
        --set train.log_every=1)
run() {
  local label=$1 ranks=$2 m=$3; shift 3
  mpirun -np "$ranks" --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none \
    -x OMP_NUM_THREADS=1 "$bin" train "${common[@]}" --set train.global_batch_size=$((2 * m)) \
    --set run.dir="$dir/$label" "$@" > /dev/null
  python3 - "$dir/$label/metrics.jsonl" "$label" "$m" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][1:]  # the first step builds plans
mean = lambda k: sum(r[k] for r in rows) / len(rows)
print(f"{sys.argv[2]:<28} m={sys.argv[3]:<3} bubble measured {100 * mean('pipeline_bubble'):5.1f}%  "
      f"theory {100 * rows[0]['pipeline_bubble_theory']:5.1f}%  step {1000 * mean('step_time_s'):6.0f} ms")
PY
}
run pp2-1f1b-m4 2 4 --set parallel.pp=2
run pp2-1f1b-m8 2 8 --set parallel.pp=2
run pp2-interleaved-v2-m8 2 8 --set parallel.pp=2 --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=2
run pp2-interleaved-v4-m8 2 8 --set parallel.pp=2 --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=4
[ -n "${PP2_ONLY:-}" ] && exit 0
run pp4-1f1b-m8 4 8 --set parallel.pp=4
run pp4-interleaved-v2-m8 4 8 --set parallel.pp=4 --set parallel.pp_schedule=interleaved --set parallel.pp_virtual=2
