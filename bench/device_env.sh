# Sourced by the scripts that run on the H200 machines (from the repo root, binaries in .devrun):
# the run-time libraries they need, first on LD_LIBRARY_PATH, and NVLink multicast off.
#   cuDNN 9.19 and NCCL 2.28.9 from PyTorch's environment: the versions built against (the
#   machine's own NCCL 2.28.3 is refused by the NCCL device API check).
cudnn=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib
nccl=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$PWD/${MOE_DEVRUN_LIB:-.devrun/lib}:$nccl:$cudnn:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
