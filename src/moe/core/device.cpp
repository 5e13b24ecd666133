#include "moe/core/device.h"

#include <cstring>

#include "moe/core/arena.h"

#if defined(MOE_HAVE_CUDA)
#include "moe/core/cuda_check.h"
#include "moe/core/local_rank.h"
#endif

namespace moe {

bool cuda_available(std::string* why) {
#if defined(MOE_HAVE_CUDA)
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why) *why = std::string("no usable CUDA device: ") + cudaGetErrorString(rc);
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device present";
    return false;
  }
  return true;
#else
  if (why) *why = "this binary was built without the CUDA backend (MOE_CUDA=OFF or no nvcc)";
  return false;
#endif
}

int cuda_device_count() {
#if defined(MOE_HAVE_CUDA)
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
#else
  return 0;
#endif
}

#if defined(MOE_HAVE_CUDA)
cudaStream_t compute_stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamDefault));
    return s;
  }();
  return stream;
}
#endif

void select_local_gpu() {
#if defined(MOE_HAVE_CUDA)
  const int local = local_rank();
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  MOE_CHECK(count > 0, "select_local_gpu: no CUDA device");
  CUDA_CHECK(cudaSetDevice(local % count));
#endif
}

void copy_to_tensor(const Tensor& dst, const void* host) {
  if (dst.nbytes() == 0) return;
  if (dst.device == Device::CPU) {
    std::memcpy(dst.data, host, dst.nbytes());
    return;
  }
#if defined(MOE_HAVE_CUDA)
  CUDA_CHECK(cudaMemcpyAsync(dst.data, host, dst.nbytes(), cudaMemcpyHostToDevice, compute_stream()));
  CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
#else
  MOE_FAIL("copy_to_tensor: a CUDA tensor in a build without the CUDA backend");
#endif
}

void copy_from_tensor(void* host, const Tensor& src) {
  if (src.nbytes() == 0) return;
  if (src.device == Device::CPU) {
    std::memcpy(host, src.data, src.nbytes());
    return;
  }
#if defined(MOE_HAVE_CUDA)
  CUDA_CHECK(cudaMemcpyAsync(host, src.data, src.nbytes(), cudaMemcpyDeviceToHost, compute_stream()));
  CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
#else
  MOE_FAIL("copy_from_tensor: a CUDA tensor in a build without the CUDA backend");
#endif
}

void copy_bytes(const Tensor& out, const Tensor& in) {
  MOE_CHECK(out.nbytes() == in.nbytes() && out.device == in.device, "copy_bytes: ", out.nbytes(), " bytes on ",
            device_name(out.device), " from ", in.nbytes(), " bytes on ", device_name(in.device));
  if (in.nbytes() == 0 || out.data == in.data) return;
  if (in.device == Device::CPU) {
    std::memmove(out.data, in.data, in.nbytes());
    return;
  }
#if defined(MOE_HAVE_CUDA)
  CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, in.nbytes(), cudaMemcpyDeviceToDevice, compute_stream()));
#else
  MOE_FAIL("copy_bytes: a CUDA tensor in a build without the CUDA backend");
#endif
}

void device_synchronize() {
#if defined(MOE_HAVE_CUDA)
  std::string why;
  if (cuda_available(&why)) CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
#endif
}

DeviceAllocation::DeviceAllocation(size_t bytes, Device device) : device_(device) {
  if (bytes == 0) return;
  if (device == Device::CPU) {
    data_ = std::calloc(bytes, 1);
    MOE_CHECK(data_ != nullptr, "cannot allocate ", format_bytes(static_cast<double>(bytes)), " of host memory");
    return;
  }
#if defined(MOE_HAVE_CUDA)
  CUDA_CHECK(cudaMalloc(&data_, bytes));
  CUDA_CHECK(cudaMemset(data_, 0, bytes));
#else
  MOE_FAIL("DeviceAllocation: a CUDA buffer in a build without the CUDA backend");
#endif
}

DeviceAllocation::~DeviceAllocation() {
  if (device_ == Device::CPU) {
    std::free(data_);
    return;
  }
#if defined(MOE_HAVE_CUDA)
  if (data_) cudaFree(data_);  // no throwing from a destructor
#endif
}

GpuInfo current_gpu() {
  GpuInfo g;
#if defined(MOE_HAVE_CUDA)
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  g.name = p.name;
  g.major = p.major;
  g.minor = p.minor;
#else
  MOE_FAIL("current_gpu: this binary was built without the CUDA backend");
#endif
  return g;
}

DeviceMemory device_memory() {
  DeviceMemory m;
#if defined(MOE_HAVE_CUDA)
  CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
#else
  MOE_FAIL("device_memory: this binary was built without the CUDA backend");
#endif
  return m;
}

}  // namespace moe
