#include "moe/core/device.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>
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

}  // namespace moe
