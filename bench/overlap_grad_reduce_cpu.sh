#!/usr/bin/env bash
# CPU ranks: the gradient reduction after the backward against the reduction overlapped with it
# (parallel.overlap_grad_reduce), with 2 ranks (dp 2) and 4 ranks (dp 4, and dp 2 x ep 2). A
# model larger than tiny-x4 in its dense part (d_model 256, 4 layers, 2 of them dense with an MLP
# of 1024), 2 microbatches per rank, 1 MiB gradient buckets (the 16 MiB default makes one bucket
# per group of a model this small, which is complete only at the end of the backward).
# Prints per run: step time, time in collectives (all of them, as the trainer counts it), the
# optimizer step, and of it the gradient reduction after the backward (the exposed reduction:
# everything without overlap, the wait for the outstanding buckets with it).
# Usage: bench/overlap_grad_reduce_cpu.sh  (STEPS, BUCKET, REPEATS from the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build-cpu/moetrain}
steps=${STEPS:-12}
bucket=${BUCKET:-1048576}
repeats=${REPEATS:-2}
common=(--config configs/tiny-x4.toml --steps "$steps" --set run.device='"cpu"' --set model.hidden_size=256
        --set model.num_hidden_layers=4 --set model.first_k_dense_replace=2 --set model.dense_intermediate_size=1024
        --set train.micro_batch_size=2 --set train.seq_len=64 --set parallel.grad_bucket_bytes="$bucket")
run() {  # run NP LABEL ARGS...
  local np=$1 label=$2; shift 2
  local json out
  json=$(mktemp -d /tmp/overlap-bench-XXXXXX)/report.json  # a new name: bench --json overwrites nothing
  out=$(mpirun -np "$np" --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none \
          -x OMP_NUM_THREADS=1 "$bin" bench "${common[@]}" --set train.global_batch_size=$((4 * np)) \
          --json "$json" "$@" 2>&1) || { echo "$label failed:"; tail -5 <<<"$out"; rm -f "$json"; return 1; }
  python3 - "$label" "$json" <<'EOF'
import json, sys
label, path = sys.argv[1], sys.argv[2]
j = json.load(open(path))
print(f"{label:<34} step {j['step_s']:.4f} s | in collectives {j['comm_s']:.4f} s | "
      f"reduction after backward {j['reduction_wait_s']:.4f} s")
EOF
  grep -o 'optimizer step [0-9.]* s' <<<"$out" | sed 's/^/  /'
  rm -rf "$(dirname "$json")"
}
for r in $(seq "$repeats"); do
  echo "== repeat $r"
  for overlap in false true; do
    run 2 "np 2 dp 2 overlap=$overlap" --set parallel.overlap_grad_reduce=$overlap
  done
  for overlap in false true; do
    run 4 "np 4 dp 4 overlap=$overlap" --set parallel.overlap_grad_reduce=$overlap
    run 4 "np 4 dp 2 x ep 2 overlap=$overlap" --set parallel.ep=2 --set parallel.overlap_grad_reduce=$overlap
  done
done
