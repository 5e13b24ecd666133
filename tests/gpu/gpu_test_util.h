// Skips for the GPU tests: where this binary or machine cannot run CUDA (or NCCL), the test is
// skipped with the reason printed, so CI without a GPU stays green and says why.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "moe/comm/nccl_communicator.h"
#include "moe/core/device.h"

#define MOE_SKIP_WITHOUT_GPU()                                       \
  do {                                                               \
    std::string moe_why_;                                            \
    if (!::moe::cuda_available(&moe_why_)) GTEST_SKIP() << moe_why_; \
  } while (0)

#define MOE_SKIP_WITHOUT_NCCL()                                      \
  do {                                                               \
    std::string moe_why_;                                            \
    if (!::moe::cuda_available(&moe_why_)) GTEST_SKIP() << moe_why_; \
    if (!::moe::nccl_available(&moe_why_)) GTEST_SKIP() << moe_why_; \
  } while (0)
