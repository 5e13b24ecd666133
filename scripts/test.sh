#!/usr/bin/env bash
# Builds with warnings as errors and runs the whole test suite (CTest: unit, data, ckpt, model,
# train, cli, reference labels). CPU-only machines skip nothing: CUDA tests arrive with the CUDA backend.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DMOE_WERROR=ON
ctest --test-dir build --output-on-failure -j "$(nproc)"
