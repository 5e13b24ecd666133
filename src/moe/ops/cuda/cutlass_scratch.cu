#include "moe/ops/cuda/cutlass_scratch.h"

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "moe/core/cuda_check.h"

namespace moe::cuda {
namespace {

void check_not_capturing(cudaStream_t stream, const char* op, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  MOE_CHECK(status == cudaStreamCaptureStatusNone, op, ": ", what,
            " during CUDA graph capture; run one eager call on this stream (e.g. an eager first step) before "
            "capturing");
}

class CutlassScratchPool {
 public:
  static CutlassScratchPool& get() {
    static CutlassScratchPool* pool = new CutlassScratchPool();  // never destroyed (see the header)
    return *pool;
  }

  bool supported(const char* op) {
    std::lock_guard<std::mutex> lock(mutex_);
    return supported_locked(op);
  }

  const cutlass_grouped::Scratch* scratch(cudaStream_t stream, const char* op, void (*prepare)()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!supported_locked(op)) return nullptr;
    if (prepared_.count(prepare) == 0) {
      check_not_capturing(stream, op, "the CUTLASS kernels' shared-memory limits would be set");
      prepare();
      prepared_.insert(prepare);
    }
    auto it = scratch_.find(stream);
    if (it != scratch_.end()) return &it->second;
    check_not_capturing(stream, op, "the grouped GEMM scratch would be created (it allocates device memory)");
    cutlass_grouped::Scratch s;
    CUDA_CHECK(cudaMalloc(&s.base, cutlass_grouped::kScratchBytes));
    s.device = device_;
    s.sm_count = sm_count_;
    return &scratch_.emplace(stream, s).first->second;
  }

 private:
  bool supported_locked(const char* op) {
    int device = -1;
    CUDA_CHECK(cudaGetDevice(&device));
    if (device_ < 0) {
      int major = 0, minor = 0, sms = 0;
      CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
      CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
      CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      device_ = device;
      sm_count_ = sms;
      supported_ = major == 9 && minor == 0;
    }
    MOE_CHECK(device == device_, op, ": the grouped GEMM state belongs to device ", device_, " but device ", device,
              " is current (one GPU per process)");
    return supported_;
  }

  std::mutex mutex_;
  int device_ = -1;
  int sm_count_ = 0;
  bool supported_ = false;
  std::unordered_set<void (*)()> prepared_;
  std::unordered_map<cudaStream_t, cutlass_grouped::Scratch> scratch_;
};

}  // namespace

bool cutlass_supported(const char* op) { return CutlassScratchPool::get().supported(op); }

const cutlass_grouped::Scratch* cutlass_scratch(cudaStream_t stream, const char* op, void (*prepare)()) {
  return CutlassScratchPool::get().scratch(stream, op, prepare);
}

}  // namespace moe::cuda
