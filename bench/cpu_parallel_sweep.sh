#!/usr/bin/env bash
# CPU sweep of the parallel designs (issue 3's benchmark): 4 MPI ranks on this machine, a small
# model (tiny-x4 dimensions), n_experts 8 and 64 at fixed top-2 and expert size, for
# DDP+EP with ep in {1, 2, 4} (rowwise and alltoall dispatch) and the FSDP baseline.
# Prints one line per run: tokens/s, step time, time in collectives, optimizer time.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/moetrain
steps=${STEPS:-12}
mpi=(mpirun -np 4 --oversubscribe --allow-run-as-root --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS=1)
common=(--config configs/tiny-x4.toml --steps "$steps" --set train.micro_batch_size=4 --set model.dropless=true)
run() {
  local label=$1; shift
  local out
  out=$("${mpi[@]}" "$bin" bench "${common[@]}" "$@" 2>&1)
  printf '%-34s %s | %s\n' "$label" "$(grep -o 'throughput: [^(]*' <<<"$out")" \
    "$(grep -o 'in collectives [0-9.]* s, optimizer step [0-9.]* s' <<<"$out")"
}
for n in 8 64; do
  for ep in 1 2 4; do
    run "N=$n ddp ep=$ep rowwise" --set model.num_experts=$n --set parallel.ep=$ep --set ep.backend=rowwise
    [ "$ep" -gt 1 ] && run "N=$n ddp ep=$ep alltoall" --set model.num_experts=$n --set parallel.ep=$ep --set ep.backend=alltoall
  done
  run "N=$n fsdp" --set model.num_experts=$n --set parallel.mode=fsdp
done
