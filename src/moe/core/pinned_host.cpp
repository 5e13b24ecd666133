#include "moe/core/pinned_host.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace moe {

bool pin_host_memory(void* host, size_t bytes) {
#if defined(MOE_HAVE_CUDA)
  if (host == nullptr || bytes == 0) return false;
  if (cudaHostRegister(host, bytes, cudaHostRegisterDefault) == cudaSuccess) return true;
  (void)cudaGetLastError();  // a refusal is not sticky: clear it so no later check reports it
  return false;
#else
  (void)host, (void)bytes;
  return false;
#endif
}

void unpin_host_memory(void* host) {
#if defined(MOE_HAVE_CUDA)
  (void)cudaHostUnregister(host);
  (void)cudaGetLastError();
#else
  (void)host;
#endif
}

}  // namespace moe
