#!/usr/bin/env bash
# Issue 7's Figure-4 experiment, on one host with NP GPUs (NP=8: nvidia-h200-x8), from the repo
# root, binaries in .devrun (as for device_check.sh). configs/fig4.toml (8 layers, layer 0 dense,
# d_model 4096, top-4 of N experts of hidden 4096 + a shared expert, capacity 1.25, random
# routing, seq 8192, 2 sequences per rank) for N = 8, 16, 32, 64, 128, each in both designs:
#   ep   DDP + expert parallelism over all NP GPUs, rowwise dispatch (NCCL symmetric windows);
#   fsdp the FSDP baseline: no EP, every block's weights all-gathered (BF16) and its gradients
#        reduce-scattered per block (full reshard);
# plus the dense model of the same active size (every layer's MLP 4 x 4096 + 4096) in both.
# Same steps for every run. Each run writes $OUT/fig4/<design>-n<N>.json (moetrain bench --json)
# and its log; python/plot_figure4.py tables them (tokens/s per GPU, MFU, ratio) and plots.
set -uo pipefail
. bench/device_mpi_env.sh
np=${NP:-8}
steps=${STEPS:-6}
out=${OUT:-/tmp}/fig4
mkdir -p "$out"
read -ra mpi <<< "$(mpi_launch "$np")"
common=(--config configs/fig4.toml --steps "$steps" --set run.device='"cuda"'
        --set train.global_batch_size=$((2 * np)))
status=0
run() {  # run NAME ARGS...
  local name="$1"; shift
  echo "== $name"
  "${mpi[@]}" .devrun/bin/moetrain bench "${common[@]}" --json "$out/$name.json" "$@" > "$out/$name.log" 2>&1 ||
    { status=1; echo "$name failed:"; grep -m3 -E "error|Error|what\(\)" "$out/$name.log" || tail -4 "$out/$name.log"; }
  grep -E "^  throughput" "$out/$name.log"
}
for n in ${EXPERTS:-8 16 32 64 128}; do
  run "ep-n$n" --set model.num_experts="$n" --set parallel.ep="$np" --set ep.backend='"rowwise"'
  run "fsdp-n$n" --set model.num_experts="$n" --set parallel.mode='"fsdp"'
done
dense=(--set model.first_k_dense_replace=8)
run dense-ddp "${dense[@]}"
run dense-fsdp "${dense[@]}" --set parallel.mode='"fsdp"'
python3 python/plot_figure4.py "$out"/*.json ${PLOT:+--out "$PLOT"} || status=1
exit $status
