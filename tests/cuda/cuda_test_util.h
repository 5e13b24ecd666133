// Helpers for CUDA op tests: skip with a printed reason where no GPU is usable, device buffers,
// host<->device copies (F32, BF16, I32, raw bytes), byte-for-byte comparison and the normalized
// error ||out - ref|| / ||ref||.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "moe/core/device.h"
#include "moe/core/dtype.h"
#include "moe/core/tensor.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"
#endif

// Skips the test (with the reason printed) when this binary or machine cannot run CUDA.
#define MOE_SKIP_WITHOUT_GPU()                                  \
  do {                                                          \
    std::string moe_why_;                                       \
    if (!::moe::cuda_available(&moe_why_)) GTEST_SKIP() << moe_why_; \
  } while (0)

// Skips a measurement (timing or energy) unless MOE_BENCH=1: it checks nothing, so CI skips it.
#define MOE_SKIP_UNLESS_BENCH(what)                                        \
  do {                                                                   \
    const char* moe_bench_ = std::getenv("MOE_BENCH");                   \
    if (moe_bench_ == nullptr || std::string(moe_bench_) != "1")         \
      GTEST_SKIP() << what " runs with MOE_BENCH=1";                     \
  } while (0)

namespace moe::testing {

#if defined(MOE_HAVE_CUDA)
// A device allocation owned by the test (tests may allocate; the library may not, inside a step).
class DeviceBuffer {
 public:
  DeviceBuffer(DType dtype, Shape shape) : dtype_(dtype), shape_(shape) {
    bytes_ = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    CUDA_CHECK(cudaMalloc(&ptr_, bytes_ == 0 ? 1 : bytes_));
    CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes_ == 0 ? 1 : bytes_));  // poison: every output must be written
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  Tensor tensor() const { return Tensor(ptr_, dtype_, shape_, Device::CUDA); }
  operator Tensor() const { return tensor(); }
  size_t bytes() const { return bytes_; }

  // Uploads FP32 values, converting to this buffer's dtype (F32 or BF16), or I32 values.
  void upload(const std::vector<float>& v) {
    EXPECT_EQ(v.size(), static_cast<size_t>(shape_.numel()));
    if (dtype_ == DType::BF16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      CUDA_CHECK(cudaMemcpy(ptr_, h.data(), bytes_, cudaMemcpyHostToDevice));
    } else {
      EXPECT_EQ(dtype_, DType::F32);
      CUDA_CHECK(cudaMemcpy(ptr_, v.data(), bytes_, cudaMemcpyHostToDevice));
    }
  }
  void upload_i32(const std::vector<int32_t>& v) {
    EXPECT_EQ(dtype_, DType::I32);
    EXPECT_EQ(v.size(), static_cast<size_t>(shape_.numel()));
    CUDA_CHECK(cudaMemcpy(ptr_, v.data(), bytes_, cudaMemcpyHostToDevice));
  }
  // Downloads as FP32 (BF16 widened exactly).
  std::vector<float> download() const {
    std::vector<float> out(static_cast<size_t>(shape_.numel()));
    CUDA_CHECK(cudaDeviceSynchronize());
    if (dtype_ == DType::BF16) {
      std::vector<uint16_t> h(out.size());
      CUDA_CHECK(cudaMemcpy(h.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
    } else {
      CUDA_CHECK(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    }
    return out;
  }
  std::vector<int32_t> download_i32() const {
    std::vector<int32_t> out(static_cast<size_t>(shape_.numel()));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* ptr_ = nullptr;
  DType dtype_;
  Shape shape_;
  size_t bytes_ = 0;
};

// The front of a device buffer as a tensor of another (not larger) shape and dtype: one buffer
// sized for the largest case serves every shape a benchmark sweeps.
inline Tensor front(const DeviceBuffer& b, DType dtype, Shape shape) {
  EXPECT_LE(static_cast<size_t>(shape.numel()) * dtype_size(dtype), b.bytes());
  return Tensor(b.tensor().data, dtype, shape, Device::CUDA);
}

// Mean milliseconds of fn over `iters` calls on `stream` after `warmup` calls (CUDA events).
inline double time_ms(const std::function<void()>& fn, cudaStream_t stream, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) fn();
  CUDA_CHECK(cudaEventRecord(stop, stream));
  CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return ms / iters;
}

// FP32 values uploaded as a device tensor of `shape` that starts `lead` elements into its allocation
// (cudaMalloc's, 256-byte aligned): with lead * element size not a multiple of 16 the kernels reading
// it lose their 16-byte paths and take their fallbacks.
class OffsetInput {
 public:
  OffsetInput(DType dtype, Shape shape, int64_t lead, const std::vector<float>& values)
      : buffer_(dtype, {shape.numel() + lead}) {
    std::vector<float> padded(static_cast<size_t>(lead), 0.0f);
    padded.insert(padded.end(), values.begin(), values.end());
    buffer_.upload(padded);
    tensor_ = Tensor(static_cast<char*>(buffer_.tensor().data) + lead * dtype_size(dtype), dtype, shape, Device::CUDA);
  }
  Tensor tensor() const { return tensor_; }

 private:
  DeviceBuffer buffer_;
  Tensor tensor_;
};

// The first `count` bytes of a device tensor (all of them when count < 0), after the device is idle.
inline std::vector<uint8_t> bytes_of(const Tensor& t, int64_t count = -1) {
  std::vector<uint8_t> out(count < 0 ? t.nbytes() : static_cast<size_t>(count));
  CUDA_CHECK(cudaDeviceSynchronize());
  if (!out.empty()) CUDA_CHECK(cudaMemcpy(out.data(), t.data, out.size(), cudaMemcpyDeviceToHost));
  return out;
}
#endif

// Every byte of got equals want's; names the first few that differ and counts them.
inline void expect_same_bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5)
      ADD_FAILURE() << what << ": byte " << i << " is " << int(got[i]) << ", the reference's " << int(want[i]);
  EXPECT_EQ(bad, 0) << what << ": bytes differing from the reference";
}

// ||out - ref||_2 / ||ref||_2 (NaN in out never passes: returns +inf).
inline double normalized_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// Rounds every value to BF16 and back (the CPU reference sees the same inputs as the GPU).
inline std::vector<float> round_bf16(std::vector<float> v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

}  // namespace moe::testing
