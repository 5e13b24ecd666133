#!/usr/bin/env bash
# Runs on the H200 machine from the repo root, with binaries built on the build machine in
# .devrun/bin and their non-system shared libraries in .devrun/lib (see bench/RESULTS.md):
# every CUDA op test and GPU training test, then the Hugging Face round trip (python/hf_check.py). Logs go to $OUT.
set -uo pipefail
. bench/device_env.sh
out=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0
for t in .devrun/bin/test_cuda_* .devrun/bin/test_gpu_*; do
  name=$(basename "$t")
  if "$t" > "$out/$name.log" 2>&1; then r=PASS; else r=FAIL; status=1; fi
  printf '%-24s %s  %s\n' "$name" "$r" "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
done
python3 python/hf_check.py --moetrain .devrun/bin/moetrain --workdir /tmp/hf-check > "$out/hf_check.log" 2>&1 || status=1
grep -E "torch |PASS|FAIL" "$out/hf_check.log"
exit $status
