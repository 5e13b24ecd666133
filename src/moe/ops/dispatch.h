// Device dispatch for ops: every public op forwards to cpu::<op> or cuda::<op> according to
// the device of its tensors. Binaries built without CUDA refuse CUDA tensors with a clear error.
#pragma once

#include "moe/core/error.h"
#include "moe/core/tensor.h"

#if defined(MOE_HAVE_CUDA)
#define MOE_OP_CUDA_CALL(fn, ...) return ::moe::cuda::fn(__VA_ARGS__)
#else
#define MOE_OP_CUDA_CALL(fn, ...) MOE_FAIL(#fn ": CUDA tensor given, but this binary was built without CUDA (MOE_CUDA=OFF)")
#endif

// Dispatches on `device` (a moe::Device) to cpu::fn or cuda::fn with the same arguments.
#define MOE_OP_DISPATCH(device, fn, ...)           \
  do {                                             \
    if ((device) == ::moe::Device::CPU) {          \
      return ::moe::cpu::fn(__VA_ARGS__);          \
    }                                              \
    MOE_OP_CUDA_CALL(fn, __VA_ARGS__);             \
  } while (0)
