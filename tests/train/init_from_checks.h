// Shared check of `--init-from` tests (tests/train and tests/dist): a trainer holds exactly a
// checkpoint's weights and fresh (zero) AdamW moments.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/core/device.h"
#include "moe/core/tensor.h"
#include "moe/train/trainer.h"

namespace moe::testing {

// Every weight slice this rank saves equals the checkpoint's logical tensor over the same range
// bit for bit, and every moment slice it saves is zero (on the GPU: read back to the host).
inline void expect_weights_of(Trainer& t, const CheckpointReader& ckpt) {
  int weights = 0, moments = 0;
  std::vector<float> host;
  for (const CheckpointSlice& s : t.store().checkpoint_slices()) {
    ASSERT_EQ(s.dtype, DType::F32) << s.key;
    const int64_t n = s.end - s.begin;
    host.resize(static_cast<size_t>(n));
    copy_from_tensor(host.data(), Tensor(const_cast<void*>(s.data), DType::F32, {n}, t.device()));
    const float* mine = host.data();
    if (s.key.find(".exp_avg") != std::string::npos) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(mine[i], 0.0f) << s.key << " element " << s.begin + i;
      ++moments;
      continue;
    }
    std::vector<float> theirs(static_cast<size_t>(n));
    ckpt.read(s.key, DType::F32, s.begin, s.end, theirs.data());
    ASSERT_EQ(std::memcmp(mine, theirs.data(), static_cast<size_t>(n) * 4), 0)
        << s.key << " [" << s.begin << ", " << s.end << ") differs from " << ckpt.dir();
    ++weights;
  }
  EXPECT_GT(moments, 0) << "this rank saves no moments: nothing checked";
  if (t.rank() == 0) {
    EXPECT_GT(weights, 0) << "rank 0 saves no weights: nothing checked";
  }
}

}  // namespace moe::testing
