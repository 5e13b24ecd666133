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

# --- Python packages of the tools in python/ (tokenize_hf.py, moetrain_checkpoint.py) and of their
# tests (tests/python/), pinned, into the ignored .deps/python; CTest puts it on PYTHONPATH. numpy
# stays on 1.x because the BF16 export test also runs Debian's python3-torch 1.13 (/usr/bin/python3,
# built against numpy 1.x) with this folder on its path. --no-deps: exactly these packages
# (tokenizers' optional huggingface_hub is only for downloading tokenizers, which the tools never do;
# pyarrow needs only numpy). zstandard and pyarrow read tokenize_hf.py's .zst and .parquet inputs.
python_packages=(numpy==1.26.4 tokenizers==0.22.2 xxhash==3.5.0 safetensors==0.7.0 packaging==24.2
                 zstandard==0.23.0 pyarrow==17.0.0)
python_missing=0
for spec in "${python_packages[@]}"; do
  [ -d ".deps/python/${spec%%==*}-${spec##*==}.dist-info" ] || python_missing=1
done
if [ "$python_missing" = 1 ]; then
  echo "setup: installing ${python_packages[*]} into .deps/python"
  # --upgrade replaces just these packages, leaving any others in the folder alone.
  python3 -m pip install --quiet --upgrade --no-deps --disable-pip-version-check --target .deps/python \
    "${python_packages[@]}" || {
    echo "setup: installing the Python tools' packages failed; python/tokenize_hf.py, python/moetrain_checkpoint.py" \
         "and the tests in tests/python need them (python3 -m pip must work)" >&2
    exit 1
  }
fi
# --- end of the Python tools' packages

# The experiment-tracking tools' Python packages (tensorboard, wandb, matplotlib and their
# dependencies, every one pinned in python/requirements-tracking.txt) into the ignored
# .deps/python-tracking (a folder of their own: they need numpy 2, the tools below numpy 1):
# the `tracking` tests read moetrain's TensorBoard events with TensorBoard's own reader, run the
# W&B sidecar offline and render plots with them (PYTHONPATH=.deps/python-tracking). Skipped when that set is
# installed already. Without pip those tests skip, saying why; in CI (CI=true) a failed install
# fails the setup, so the tests cannot be skipped unnoticed.
tracking_requirements=python/requirements-tracking.txt
if ! cmp -s "$tracking_requirements" .deps/python-tracking/.requirements-tracking.txt; then
  if python3 -m pip --version > /dev/null 2>&1; then
    echo "setup: installing the tracking tools' Python packages ($tracking_requirements) into .deps/python-tracking"
    rm -rf .deps/python-tracking
    if python3 -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore \
         --target .deps/python-tracking -r "$tracking_requirements"; then
      cp "$tracking_requirements" .deps/python-tracking/.requirements-tracking.txt
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
