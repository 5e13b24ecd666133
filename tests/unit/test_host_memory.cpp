// The host memory train.async_save checks its host copy against (core/arena.h): MemAvailable,
// bounded by the memory cgroup's headroom. A parse that failed would give 0 (every save would
// then run in the foreground); one that read the wrong field or unit could pass the machine's size.
#include <gtest/gtest.h>

#include "moe/core/arena.h"

namespace moe {
namespace {

TEST(HostMemory, AvailableIsPositiveAndAtMostPhysical) {
  const size_t physical = physical_memory_bytes(), available = available_memory_bytes();
  EXPECT_GT(available, size_t{16} << 20);
  EXPECT_LE(available, physical);
}

}  // namespace
}  // namespace moe
