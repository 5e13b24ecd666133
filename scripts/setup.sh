#!/usr/bin/env bash
# Installs what is missing (Debian packages), then configures and builds moetrain in ./build.
# Idempotent: packages already present are not touched. Extra CMake flags can be passed as
# arguments, e.g. scripts/setup.sh -DMOE_WERROR=ON.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  g++ cmake ninja-build pkg-config
  libopenblas-openmp-dev   # OpenBLAS on OpenMP: matrix products share our thread pool
  libtomlplusplus-dev      # configs
  nlohmann-json3-dev       # checkpoint indexes, metrics
  libxxhash-dev            # checkpoint checksums (XXH3-64)
  libisal-dev              # CRC-32C of TensorBoard event files (ISA-L; Debian 12 has no libcrc32c-dev)
  libcli11-dev             # command line
  libgtest-dev             # tests
  libopenmpi-dev openmpi-bin   # multi-rank training on CPUs
  python3 python3-numpy python3-torch  # the PyTorch reference (tests/fixtures are made with it)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# cuDNN frontend (header-only C++ API for cuDNN's fused attention), pinned, into the ignored .deps/:
# CMakeLists.txt finds its include/ there and builds the CUDA attention op on it. 1.18 works with the
# cuDNN 9.19 runtime of the build and H200 machines. Skipped when present; without pip it is left
# out and attention stays CPU-only (CMake says so).
cudnn_fe_version=1.18.0
if [ ! -f .deps/cudnn-frontend/include/cudnn_frontend.h ] ||
   [ ! -d ".deps/cudnn-frontend/nvidia_cudnn_frontend-${cudnn_fe_version}.dist-info" ]; then
  if python3 -m pip --version > /dev/null 2>&1; then
    echo "setup: installing nvidia-cudnn-frontend ${cudnn_fe_version} into .deps/cudnn-frontend"
    rm -rf .deps/cudnn-frontend
    python3 -m pip install --quiet --no-deps --disable-pip-version-check --target .deps/cudnn-frontend \
      "nvidia-cudnn-frontend==${cudnn_fe_version}" ||
      echo "setup: installing nvidia-cudnn-frontend failed; CUDA attention stays off"
  else
    echo "setup: python3 -m pip not available; skipping the cuDNN frontend (CUDA attention stays off)"
  fi
fi

# CUTLASS headers (header-only C++ templates; the PyPI package ships the include tree under
# cutlass_library/source/include), pinned, into the ignored .deps/: CMakeLists.txt finds them there
# and builds the expert GEMMs on CUTLASS's Hopper ptr-array grouped GEMM. Skipped when present;
# without pip they are left out and the expert GEMMs use the plain tiled kernels (CMake says so).
cutlass_version=4.2.0.0
if [ ! -f .deps/cutlass/cutlass_library/source/include/cutlass/cutlass.h ] ||
   [ ! -d ".deps/cutlass/nvidia_cutlass-${cutlass_version}.dist-info" ]; then
  if python3 -m pip --version > /dev/null 2>&1; then
    echo "setup: installing nvidia-cutlass ${cutlass_version} (headers) into .deps/cutlass"
    rm -rf .deps/cutlass
    python3 -m pip install --quiet --no-deps --disable-pip-version-check --target .deps/cutlass \
      "nvidia-cutlass==${cutlass_version}" ||
      echo "setup: installing nvidia-cutlass failed; the expert GEMMs stay on the plain CUDA kernels"
  else
    echo "setup: python3 -m pip not available; skipping CUTLASS (the expert GEMMs stay on the plain CUDA kernels)"
  fi
fi

# The experiment-tracking tools' Python packages (tensorboard, wandb, matplotlib and their
# dependencies, every one pinned in python/requirements-tracking.txt) into the ignored .deps/python:
# the `tracking` tests read moetrain's TensorBoard events with TensorBoard's own reader, run the
# W&B sidecar offline and render plots with them (PYTHONPATH=.deps/python). Skipped when that set is
# installed already. Without pip those tests skip, saying why; in CI (CI=true) a failed install
# fails the setup, so the tests cannot be skipped unnoticed.
tracking_requirements=python/requirements-tracking.txt
if ! cmp -s "$tracking_requirements" .deps/python/.requirements-tracking.txt; then
  if python3 -m pip --version > /dev/null 2>&1; then
    echo "setup: installing the tracking tools' Python packages ($tracking_requirements) into .deps/python"
    rm -rf .deps/python
    if python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore \
         --target .deps/python -r "$tracking_requirements"; then
      cp "$tracking_requirements" .deps/python/.requirements-tracking.txt
    else
      echo "setup: installing the tracking tools' Python packages failed; the tracking tests will skip"
      if [ "${CI:-}" = true ]; then exit 1; fi
    fi
  else
    echo "setup: python3 -m pip not available; the tracking tests will skip (no tensorboard, wandb, matplotlib)"
    if [ "${CI:-}" = true ]; then exit 1; fi
  fi
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$(nproc)"
