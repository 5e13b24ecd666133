#!/usr/bin/env bash
# Runs on the H200 machine from the repo root (binaries in .devrun, as for device_check.sh): the
# FP8 path (train.precision = "fp8") checked and measured on one GPU.
#   1. the FP8 op tests (quantize, dense and grouped products) and the FP8 training tests, and the
#      BF16 tests whose code the FP8 work touched (grouped GEMMs, the training step);
#   2. `moetrain bench --check` (the FP8 kernels against dequantized BF16 products), then
#      bench-olmoe-4l and fig4 (N = 8) as one CUDA graph in BF16 and in FP8, same process order.
# Logs go to $OUT; a summary line per run is printed. TESTS=0 skips 1, BENCH=0 skips 2, GRAPH=false
# runs the benches eagerly (fig4's random routing cannot be captured).
set -uo pipefail
. bench/device_env.sh
out=${OUT:-/tmp}
steps=${STEPS:-8}
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  for t in ${FP8_TESTS:-test_cuda_fp8 test_cuda_fp8_grouped test_gpu_fp8 test_cuda_grouped_gemm test_gpu_train_step}; do
    if timeout 600 ".devrun/bin/$t" > "$out/$t.log" 2>&1; then r=PASS; else r=FAIL; status=1; fi
    printf '%-24s %s  %s\n' "$t" "$r" "$(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]' "$out/$t.log" | head -20
  done
fi
summary() {  # summary NAME LOG
  printf '%-36s %s | %s | %s\n' "$1" "$(grep -o 'throughput: .*' "$2" | head -1)" \
    "$(grep -o 'activations [0-9.]* [KMG]iB' "$2" | head -1)" "$(grep -o 'GPU high-water [0-9.]* [KMG]iB' "$2" | head -1)"
  grep -E '^check:|^error' "$2" | head -3
}
if [ "${BENCH:-1}" = 1 ]; then
  for config in ${CONFIGS:-bench-olmoe-4l fig4}; do
    for precision in ${PRECISIONS:-bf16 fp8}; do
      log="$out/bench-$config-$precision.log"
      check=()
      [ "$precision" = fp8 ] && check=(--check)
      .devrun/bin/moetrain bench --config "configs/$config.toml" --steps "$steps" --set train.cuda_graph="${GRAPH:-true}" \
        --set train.precision="$precision" "${check[@]}" --json "$out/bench-$config-$precision.json" > "$log" 2>&1 ||
        status=1
      summary "$config $precision" "$log"
    done
  done
fi
exit $status
