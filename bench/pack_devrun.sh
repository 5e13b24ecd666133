#!/usr/bin/env bash
# Runs on the build machine: packs what the H200 scripts run (bench/device_check.sh,
# bench/gpu_bench.sh, ...) into .devrun/devrun.tar.xz, small enough to carry to the device machine:
# the moetrain binary, every CUDA/GPU test and the GPU benches from ./build, and the shared
# libraries they need that the H200 machine lacks (OpenBLAS, toml++, xxHash, ISA-L, OpenMPI, ...;
# not the CUDA, cuDNN and NCCL libraries, which device_env.sh finds there). On the device machine:
#   tar xJf .devrun/devrun.tar.xz    (from the repo root; gives .devrun/bin and .devrun/lib)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
stage=$(mktemp -d)
mkdir -p "$stage/.devrun/bin" "$stage/.devrun/lib"
bins=("$build/moetrain")
for b in "$build"/test_cuda_* "$build"/test_gpu_* "$build/gpu_pipeline_test" "$build/gpu_overlap_grad_reduce_test" "$build/moe_layer_bench" "$build/dispatch_bench" "$build/expert_gemm_variants_bench"; do
  [ -x "$b" ] && bins+=("$b")
done
cp "${bins[@]}" "$stage/.devrun/bin/"
strip --strip-unneeded "$stage"/.devrun/bin/* 2> /dev/null || true
# Libraries from the build machine's system that the device machine does not provide itself.
ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libstdc++*|libgcc_s*) ;;
    libcuda.so*|libcudart*|libcublas*|libcudnn*|libnccl*|libnvrtc*|libcupti*) ;;
    *) cp -L "$lib" "$stage/.devrun/lib/" ;;
  esac
done
mkdir -p .devrun
tar -C "$stage" -cJf .devrun/devrun.tar.xz .devrun
rm -rf "$stage"
ls -la .devrun/devrun.tar.xz
