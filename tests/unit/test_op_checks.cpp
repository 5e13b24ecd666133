// The shared argument checks of the ops (moe/ops/op_checks.h): each message names the op, the
// tensor and what was expected; the dtype contract follows the call's device. No check reads the
// data of a non-CPU tensor, so CUDA-device views with a dummy address are safe to check here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "moe/ops/elementwise.h"
#include "moe/ops/op_checks.h"
#include "moe/ops/optim.h"
#include "moe/ops/router.h"

namespace moe {
namespace {

// The message of the moe::Error that fn throws ("" when it throws none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& message, const std::vector<std::string>& parts) {
  ASSERT_FALSE(message.empty()) << "no error";
  for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
}

// A view of a (never dereferenced) device buffer: only its metadata is checked.
float g_dummy[4];
Tensor cuda_view(DType dtype, Shape shape) { return Tensor(g_dummy, dtype, shape, Device::CUDA); }

TEST(OpChecks, compute_dtype_is_f32_on_the_cpu_and_f32_or_bf16_on_cuda) {
  uint16_t bf16[4] = {};
  const Tensor cpu_bf16(bf16, DType::BF16, {4});
  expect_contains(error_of([&] { OpCheck("my_op", Device::CPU).compute_dtype("x", cpu_bf16); }),
                  {"my_op", "x", "must be F32", "BF16"});
  EXPECT_EQ(OpCheck("my_op", Device::CUDA).compute_dtype("x", cuda_view(DType::BF16, {4})), DType::BF16);
  EXPECT_EQ(OpCheck("my_op", Device::CUDA).compute_dtype("x", cuda_view(DType::F32, {4})), DType::F32);
  expect_contains(error_of([&] { OpCheck("my_op", Device::CUDA).compute_dtype("x", cuda_view(DType::I32, {4})); }),
                  {"my_op", "x", "F32 or BF16", "I32"});
}

TEST(OpChecks, a_public_op_names_itself_the_tensor_and_the_expected_dtype) {
  std::vector<float> y(4);
  std::vector<int32_t> x(4);
  expect_contains(error_of([&] { add_inplace(f32_tensor(y.data(), {4}), i32_tensor(x.data(), {4})); }),
                  {"add_inplace", "x", "I32", "F32", "share one dtype"});
}

TEST(OpChecks, a_tensor_on_another_device_than_the_call_is_named) {
  std::vector<float> y(4);
  expect_contains(error_of([&] { add_inplace(f32_tensor(y.data(), {4}), cuda_view(DType::F32, {4})); }),
                  {"add_inplace", "x", "is on cuda, expected cpu"});
}

TEST(OpChecks, a_tensor_without_data_is_refused_unless_it_has_no_elements) {
  const OpCheck check("my_op", Device::CPU);
  expect_contains(error_of([&] { check.on_device("w", Tensor(nullptr, DType::F32, {3})); }),
                  {"my_op", "w", "has no data"});
  EXPECT_NO_THROW(check.on_device("w", Tensor(nullptr, DType::F32, {0})));
}

TEST(OpChecks, output_dtype_allows_the_call_dtype_or_f32) {
  const OpCheck check("my_op", Device::CUDA);
  EXPECT_NO_THROW(check.output_dtype("c", cuda_view(DType::BF16, {4}), DType::BF16));
  EXPECT_NO_THROW(check.output_dtype("c", cuda_view(DType::F32, {4}), DType::BF16));
  expect_contains(error_of([&] { check.output_dtype("c", cuda_view(DType::BF16, {4}), DType::F32); }),
                  {"my_op", "c", "BF16", "expected F32"});
}

TEST(OpChecks, values_in_names_the_entry_by_its_index_in_the_tensor_shape) {
  std::vector<int32_t> idx = {0, 1, 2, 7, 3, 0};
  const OpCheck check("my_op", Device::CPU);
  expect_contains(error_of([&] { check.values_in("topk_idx", i32_tensor(idx.data(), {3, 2}), 0, 4, "an expert"); }),
                  {"my_op", "topk_idx[1, 1] = 7", "outside [0, 4)", "an expert"});
  expect_contains(error_of([&] { check.values_in("tokens", i32_tensor(idx.data(), {6}), 0, 4); }),
                  {"tokens[3] = 7"});
  EXPECT_NO_THROW(check.values_in("tokens", i32_tensor(idx.data(), {6}), 0, 8));
}

TEST(OpChecks, a_workspace_needed_on_the_device_must_be_large_enough) {
  const OpCheck cuda("my_op", Device::CUDA);
  EXPECT_NO_THROW(cuda.workspace("workspace", Tensor(), 0, "my_op_workspace_elems"));  // none needed
  EXPECT_NO_THROW(cuda.workspace("workspace", cuda_view(DType::F32, {10}), 10, "my_op_workspace_elems"));
  const Tensor small = cuda_view(DType::F32, {9});
  expect_contains(error_of([&] { cuda.workspace("workspace", small, 10, "my_op_workspace_elems"); }),
                  {"my_op", "workspace", "9 elements", "10", "my_op_workspace_elems"});
  expect_contains(error_of([&] { cuda.workspace("workspace", cuda_view(DType::I32, {10}), 10, "sizer"); }),
                  {"my_op", "workspace", "must be F32"});
}

// The CPU reductions keep their partial sums in host memory: no workspace, and none is read.
TEST(OpChecks, cpu_reductions_need_no_workspace) {
  EXPECT_EQ(sum_squares_workspace_elems(Device::CPU, 1 << 20), 0);
  EXPECT_EQ(router_losses_workspace_elems(Device::CPU, 4096, 64), 0);
  float out = 0.0f;
  std::vector<float> x = {1.0f, 2.0f};
  sum_squares_accumulate(f32_tensor(&out, {1}), f32_tensor(x.data(), {2}), Tensor());
  EXPECT_EQ(out, 5.0f);
}

}  // namespace
}  // namespace moe
