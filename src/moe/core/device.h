// Which devices this process can use.
#pragma once

#include <cstddef>
#include <string>

#include "moe/core/tensor.h"

namespace moe {

// True when this binary has the CUDA backend and a CUDA device is usable; otherwise false with
// the reason in *why (no CUDA in this build, no driver, no device).
bool cuda_available(std::string* why = nullptr);

// The CUDA devices this process sees (0 where cuda_available is false).
int cuda_device_count();

// With several ranks per host: makes GPU (local rank mod GPU count) current, the local rank read
// from the launcher (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK; 0 without one).
void select_local_gpu();

// Copies between host memory and a tensor on either device: dst.nbytes() / src.nbytes() bytes,
// ordered after the work already queued on the compute stream and finished on return. For use
// between steps (batch upload, metrics, checkpoints), never inside one.
void copy_to_tensor(const Tensor& dst, const void* host);
void copy_from_tensor(void* host, const Tensor& src);
// out <- in's bytes (same size, same device; out == in does nothing). Queued on the compute
// stream for CUDA tensors (capturable), a memmove on the CPU.
void copy_bytes(const Tensor& out, const Tensor& in);
// Waits until the compute stream is idle (nothing to do on the CPU).
void device_synchronize();
// A buffer on either device outside any arena, for diagnostics outside steps (e.g. eval's
// logits dump); zero-filled.
class DeviceAllocation {
 public:
  DeviceAllocation(size_t bytes, Device device);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  Device device_;
};

// The current GPU's name and compute capability.
struct GpuInfo {
  std::string name;
  int major = 0, minor = 0;
};
GpuInfo current_gpu();

// Free and total memory of the current GPU.
struct DeviceMemory {
  size_t free_bytes = 0, total_bytes = 0;
};
DeviceMemory device_memory();

}  // namespace moe
