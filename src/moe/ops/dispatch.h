// Device dispatch for ops: every public op checks its arguments once (moe/ops/op_checks.h, with
// the device's dtype contract) and forwards to cpu::<op> or cuda::<op> according to the device of
// its tensors; the backends assume valid input. Binaries built without CUDA refuse CUDA tensors
// with a clear error.
#pragma once

#include "moe/core/error.h"
#include "moe/core/tensor.h"

// Each family's dispatch file selects its CUDA implementation like this:
//   #if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/<family>.h")
//   #include "moe/ops/cuda/<family>.h"
//   #define MOE_FAMILY_HAS_CUDA 1
//   #define MOE_CUDA_NAMESPACE cuda
//   #else
//   #define MOE_FAMILY_HAS_CUDA 0
//   #define MOE_CUDA_NAMESPACE cpu
//   #endif
// NOTES: without a CUDA implementation the cuda branch names cpu::fn only so that it compiles;
// `if constexpr (0)` never runs it, and a CUDA tensor is refused with a clear error instead.
#if defined(MOE_HAVE_CUDA)
#define MOE_OP_NO_CUDA_MESSAGE ": this op has no CUDA implementation yet"
#else
#define MOE_OP_NO_CUDA_MESSAGE ": CUDA tensor given, but this binary was built without CUDA (MOE_CUDA=OFF)"
#endif

// Dispatches on `device` (a moe::Device) to cpu::fn or cuda::fn with the same arguments.
#define MOE_OP_DISPATCH(device, fn, ...)                                          \
  do {                                                                            \
    if ((device) == ::moe::Device::CPU) {                                         \
      return ::moe::cpu::fn(__VA_ARGS__);                                         \
    }                                                                             \
    if constexpr (MOE_FAMILY_HAS_CUDA) {                                          \
      return ::moe::MOE_CUDA_NAMESPACE::fn(__VA_ARGS__);                          \
    }                                                                             \
    MOE_FAIL(#fn MOE_OP_NO_CUDA_MESSAGE);                                         \
  } while (0)
