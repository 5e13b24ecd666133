#!/usr/bin/env bash
# Issue 16's dispatch payload between GPUs: bench-olmoe-4l with expert parallelism over NP GPUs
# (NP=2 by default; nvidia-h200-x2 and up), each GPU holding 64 / NP experts and its own 8
# sequences per step (the config's global batch times NP), timed in BF16, in FP8 with BF16 rows moved
# (ep.payload = "bf16") and in FP8 with FP8 rows and their scales moved (ep.payload = "fp8"),
# in an order rotated each round, ROUNDS times. Prints tokens/s per rank (GPU), the step, the time
# the step waits on the links, joules per step over the job's GPUs, and FP8 / BF16.
# On the machine, from the repo root, binaries in .devrun (as for device_check.sh):
#   bash bench/fp8_payload_gpus.sh          (about 5 minutes on 2 GPUs)
# Logs and --json reports go to $OUT (default: a new folder under /tmp). On CPU ranks (no GPU, no
# timing; CTest fp8_payload_script_runs_on_cpu_ranks runs this):
#   CPU_RANKS=1 MOETRAIN=build/moetrain CONFIG=configs/tiny.toml GRAPH=false STEPS=3 ROUNDS=1 bash bench/fp8_payload_gpus.sh
set -uo pipefail
if [ "${CPU_RANKS:-0}" = 1 ]; then
  mpi_launch() {
    echo "${MPIEXEC:-mpirun}" -np "$1" --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none
  }
else
  . bench/device_mpi_env.sh
fi
moetrain=${MOETRAIN:-.devrun/bin/moetrain}
np=${NP:-2}
steps=${STEPS:-12}
rounds=${ROUNDS:-2}
out=${OUT:-$(mktemp -d /tmp/fp8-payload-XXXXXX)}
mkdir -p "$out"
echo "reports and logs: $out"
read -ra mpi <<< "$(mpi_launch "$np")"
nvidia-smi --query-gpu=index,name,power.limit --format=csv,noheader 2> /dev/null
config=${CONFIG:-configs/bench-olmoe-4l.toml}
# Each rank keeps the config's global batch: the job's is NP times it.
per_rank=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["train"]["global_batch_size"])' \
           "$config" 2> /dev/null) ||
  { echo "error: $config: cannot read train.global_batch_size (python3 3.11+ reads the TOML)" >&2; exit 2; }
[[ $per_rank =~ ^[1-9][0-9]*$ ]] || { echo "error: $config: train.global_batch_size = $per_rank" >&2; exit 2; }
common=(--config "$config" --steps "$steps" --set train.cuda_graph="${GRAPH:-true}"
        --set parallel.ep="$np" --set train.global_batch_size=$((per_rank * np)))
status=0
runs=(bf16 fp8-payload-bf16 fp8-payload-fp8)
for round in $(seq 1 "$rounds"); do
  shift_by=$(( (round - 1) % 3 ))
  for run in "${runs[@]:shift_by}" "${runs[@]:0:shift_by}"; do
    case $run in
      bf16) sets=(--set train.precision=bf16) ;;
      fp8-payload-bf16) sets=(--set train.precision=fp8 --set ep.payload=bf16) ;;
      fp8-payload-fp8) sets=(--set train.precision=fp8 --set ep.payload=fp8) ;;
    esac
    name="payload-$run-$round"
    rm -f "$out/$name.json" "$out/$name.log"  # a failed run must not leave an older report in the table
    "${mpi[@]}" "$moetrain" bench "${common[@]}" "${sets[@]}" --json "$out/$name.json" \
      > "$out/$name.log" 2>&1 || { status=1; echo "$name failed:"; tail -5 "$out/$name.log"; }
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, os, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(run, r):
    path = os.path.join(out, f"payload-{run}-{r}.json")
    return json.load(open(path)) if os.path.exists(path) else None
print("%-6s %-18s %14s %9s %9s %9s %9s" % ("round", "run", "tok/s per rank", "step ms", "comm ms", "J/step", "/ BF16"))
for r in range(1, rounds + 1):
    base = load("bf16", r)
    for run in ("bf16", "fp8-payload-bf16", "fp8-payload-fp8"):
        j = load(run, r)
        if j is None:
            print("%-6d %-18s failed" % (r, run)); continue
        energy = (j.get("power") or {}).get("energy_j_per_step")
        ratio = j["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        print("%-6d %-18s %14.0f %9.1f %9.1f %9s %8.3fx" % (r, run, j["tokens_per_s_per_gpu"], 1e3 * j["step_s"],
              1e3 * j["comm_s"], "%.1f" % energy if energy is not None else "-", ratio))
PY
[ $? = 0 ] || status=1
exit $status
