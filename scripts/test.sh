#!/usr/bin/env bash
# Builds with warnings as errors and runs the whole test suite (CTest: unit, data, ckpt, model,
# train, cli, tracking, dist, reference; cuda and gpu where nvcc is present, skipped without a GPU),
# then the same suite in a build without CUDA (MOE_CUDA=OFF), then the safetensors fuzz test under
# sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
# The expert-GEMM tuning benchmark (bench/expert_gemm_variants, off in a user's build) is compiled
# here too, so its CUTLASS configurations keep building as the library changes.
scripts/setup.sh -DMOE_WERROR=ON -DMOE_BENCH_GEMM_VARIANTS=ON
ctest --test-dir build --output-on-failure -j "$(nproc)"

# The configuration of a machine without nvcc (what MOE_CUDA=AUTO becomes there, e.g. a laptop):
# it must build and pass on its own, so a CUDA-only include or symbol cannot creep into the CPU path.
cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_CUDA=OFF -DMOE_WERROR=ON > /dev/null
cmake --build build-cpu -j "$(nproc)"
ctest --test-dir build-cpu --output-on-failure -j "$(nproc)"

# The checkpoint readers (safetensors headers, index.json, train_state.json, chunk checksums)
# against random and hand-broken bytes under AddressSanitizer and UBSan: a corrupt file must be
# refused, never read out of bounds.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_SANITIZE=ON -DMOE_CUDA=OFF > /dev/null
asan_tests=(safetensors_fuzz_test safetensors_test checkpoint_index_fuzz_test checkpoint_index_errors_test
            checkpoint_checksum_test)
cmake --build build-asan -j "$(nproc)" -t "${asan_tests[@]}"
for t in "${asan_tests[@]}"; do
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1 "./$t")
done
