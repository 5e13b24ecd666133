#!/usr/bin/env bash
# Runs on a machine with 2 or more H200s (nvidia-h200-x2 and up), from the repo root, binaries in
# .devrun (as for device_check.sh). The multi-GPU checks of issues 5 and 7 at small scale: the
# same 20 training steps of a small model on 1 GPU, on NP GPUs (NP=2 by default, or 4, 8) data
# parallel, with expert parallelism over all NP (rowwise through NCCL symmetric windows), that
# as a replayed CUDA graph, the FSDP baseline over NP GPUs (BF16 gathers, no EP), and (NP >= 4)
# EP 2 x data parallel NP/2; prints each run's losses
# and the largest relative difference from the 1-GPU run. Microbatches of 4 sequences (the
# auxiliary losses are per microbatch, so every run uses the same size), 16 per step.
set -uo pipefail
. bench/device_mpi_env.sh
out=${OUT:-/tmp}
steps=${STEPS:-20}
np=${NP:-2}
common=(--steps "$steps" --set model.hidden_size=256 --set model.intermediate_size=256 --set train.seq_len=256
        --set train.micro_batch_size=4 --set train.global_batch_size=16 --set train.log_every=1
        --set run.device='"cuda"')
read -ra mpi <<< "$(mpi_launch "$np")"
nvidia-smi --query-gpu=index,name --format=csv,noheader
status=0
run() {  # run NAME CMD...
  local name="$1"; shift
  echo "== $name: $*"
  "$@" > "$out/$name.log" 2>&1 || { status=1; tail -5 "$out/$name.log"; }
  grep -E "^  (device|parallel)|throughput" "$out/$name.log"
}
run gpu1 .devrun/bin/moetrain bench "${common[@]}"
runs=("gpu${np}_dp${np}" "gpu${np}_ep${np}" "gpu${np}_ep${np}_graph" "gpu${np}_fsdp")
run "${runs[0]}" "${mpi[@]}" .devrun/bin/moetrain bench "${common[@]}" --set parallel.ep=1
run "${runs[1]}" "${mpi[@]}" .devrun/bin/moetrain bench "${common[@]}" --set parallel.ep="$np"
run "${runs[2]}" "${mpi[@]}" .devrun/bin/moetrain bench "${common[@]}" --set parallel.ep="$np" --set train.cuda_graph=true
run "${runs[3]}" "${mpi[@]}" .devrun/bin/moetrain bench "${common[@]}" --set parallel.mode='"fsdp"'
if [ "$np" -ge 4 ]; then
  runs+=("gpu${np}_ep2_dp$((np / 2))")
  run "${runs[4]}" "${mpi[@]}" .devrun/bin/moetrain bench "${common[@]}" --set parallel.ep=2
fi
python3 - "$out" "${runs[@]}" <<'PY'
import re, sys
out, names = sys.argv[1], sys.argv[2:]
def losses(name):
    try:
        return [float(m.group(1)) for m in re.finditer(r"^step +\d+/\d+ \| loss ([0-9.]+)", open(f"{out}/{name}.log").read(), re.M)]
    except OSError:
        return []
ref = losses("gpu1")
print("1 GPU losses:", " ".join(f"{x:.4f}" for x in ref))
for name in names:
    got = losses(name)
    if not ref or len(got) != len(ref):
        print(f"{name}: FAIL ({len(got)} steps logged, 1-GPU run {len(ref)})"); continue
    worst = max(abs(a - b) / b for a, b in zip(got, ref))
    print(f"{name}: max relative loss difference from 1 GPU {worst:.2e} -> {'PASS' if worst <= 2e-2 else 'FAIL'} (bar 2e-2)")
PY
exit $status
