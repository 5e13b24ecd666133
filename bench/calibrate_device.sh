#!/usr/bin/env bash
# Runs on the H200 machine from the repo root (binaries in .devrun, as for device_check.sh): the
# performance model's calibration and its validation.
#   1. `moetrain bench --calibrate`: this GPU's efficiencies (GEMMs by shape, attention, memory-bound
#      kernels, each alone), then 8 profiled steps of the built-in bench-olmoe-4l in BF16 and in FP8
#      whose step split sets each curve's in-step factor (src/moe/perf/step_fit.h; the split and the
#      fitted factors are in $OUT/calibrate.log), into $OUT/h200-calibrated.json; with NP >= 2
#      (nvidia-h200-x2 and up) under mpirun, so the NCCL collectives and the rowwise dispatch between
#      the GPUs are measured too;
#   2. `moetrain bench --json` of every case in bench/model_cases.json that fits on NP GPUs
#      (bench/validate_model.py run; reports and logs in $OUT/measured);
#   3. the table predicted (plan, with the new profile) vs measured (step 2), and the same with the
#      shipped profile (hardware/h200.json), into $OUT/validation-*.md.
# Then copy $OUT/h200-calibrated.json over hardware/h200.json (keeping its "source") and paste the
# tables into bench/RESULTS.md. NP=1 by default; STEPS=6 bench steps per case; CASES=FILE runs the
# cases of another list (e.g. a subset of bench/model_cases.json that fits one device call).
set -uo pipefail
np=${NP:-1}
if [ "$np" -gt 1 ]; then . bench/device_mpi_env.sh; read -ra mpi <<< "$(mpi_launch "$np")"; else . bench/device_env.sh; mpi=(); fi
out=${OUT:-/tmp}
status=0
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
profile="$out/h200-calibrated.json"
if [ ! -e "$profile" ]; then
  "${mpi[@]}" .devrun/bin/moetrain bench --calibrate "$profile" --hardware h200 2>&1 | tee "$out/calibrate.log" || status=1
fi
cases=(--cases "${CASES:-bench/model_cases.json}")
python3 bench/validate_model.py --moetrain .devrun/bin/moetrain "${cases[@]}" run --out "$out/measured" --np "$np" \
  --steps "${STEPS:-6}" || status=1
for hw in "$profile" h200; do
  name=$(basename "$hw" .json)
  python3 bench/validate_model.py --moetrain .devrun/bin/moetrain "${cases[@]}" table --measured-dir "$out/measured" \
    --hardware "$hw" --markdown > "$out/validation-$name.md" || status=1
  echo "== predicted with $hw"; cat "$out/validation-$name.md"
done
exit $status
