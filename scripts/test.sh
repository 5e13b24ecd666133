#!/usr/bin/env bash
# Builds with warnings as errors and runs the whole test suite (CTest: unit, data, ckpt, model,
# train, cli, reference labels). CPU-only machines skip nothing: CUDA tests arrive with the CUDA backend.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DMOE_WERROR=ON
ctest --test-dir build --output-on-failure -j "$(nproc)"

# The safetensors reader against random header bytes under AddressSanitizer and UBSan: a
# corrupt file must be refused, never read out of bounds.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMOE_SANITIZE=ON -DMOE_CUDA=OFF > /dev/null
cmake --build build-asan -j "$(nproc)" -t safetensors_fuzz_test safetensors_test
ASAN_OPTIONS=detect_leaks=1 build-asan/safetensors_fuzz_test
ASAN_OPTIONS=detect_leaks=1 build-asan/safetensors_test
