// run.device and train.cuda_graph: bad values and impossible combinations fail with the key
// named; auto falls back to the CPU where no GPU is usable, and an explicit "cuda" there fails
// before any work with the reason.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "moe/core/device.h"
#include "moe/train/trainer.h"
#include "train_test_util.h"
#include "../error_of.h"

namespace moe {
namespace {

using testing::local_world;
using testing::small_config;
using testing::TempDir;

using moe::testing::error_of;

TrainOptions quiet() {
  TrainOptions o;
  o.bench = true;
  o.quiet = true;
  return o;
}

TEST(DeviceConfig, UnknownDeviceIsNamed) {
  TempDir dir;
  const std::string e = error_of([&] { small_config(dir.path, {"run.device=\"tpu\""}); });
  EXPECT_NE(e.find("run.device = \"tpu\" is not one of: auto, cpu, cuda"), std::string::npos) << e;
}

TEST(DeviceConfig, CudaGraphOnTheCpuIsRefused) {
  TempDir dir;
  const std::string e =
      error_of([&] { small_config(dir.path, {"run.device=\"cpu\"", "train.cuda_graph=true"}); });
  EXPECT_NE(e.find("train.cuda_graph = true needs the GPU"), std::string::npos) << e;
}

TEST(DeviceConfig, WithoutAGpuAutoRunsOnTheCpuAndCudaFailsWithTheReason) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is usable here; tests/gpu covers this machine";
  TempDir dir;
  Trainer t(small_config(dir.path), quiet(), local_world());
  EXPECT_EQ(t.device(), Device::CPU);
  const std::string e = error_of([&] { Trainer g(small_config(dir.path, {"run.device=\"cuda\""}), quiet(), local_world()); });
  EXPECT_NE(e.find("run.device = \"cuda\", but " + why), std::string::npos) << e;
  const std::string g = error_of([&] { Trainer x(small_config(dir.path, {"train.cuda_graph=true"}), quiet(), local_world()); });
  EXPECT_NE(g.find("train.cuda_graph = true needs the GPU"), std::string::npos) << g;
}

}  // namespace
}  // namespace moe
