#include "moe/ops/elementwise.h"

#include "moe/ops/cpu/elementwise.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/elementwise.h")
#include "moe/ops/cuda/elementwise.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

// src has the dtype and shape of dst.
void check_like(const OpCheck& check, const char* src_name, const Tensor& src, const char* dst_name,
                const Tensor& dst) {
  check.same_dtype(src_name, src, dst_name, dst);
  check.same_shape(src_name, src, dst_name, dst);
}

}  // namespace

void add_inplace(Tensor y, Tensor x, Stream stream) {
  const OpCheck check("add_inplace", y.device);
  check.compute_dtype("y", y);
  check_like(check, "x", x, "y", y);
  MOE_OP_DISPATCH(y.device, add_inplace, y, x, stream);
}

void fill_zero(Tensor y, Stream stream) {
  OpCheck("fill_zero", y.device).on_device("y", y);
  MOE_OP_DISPATCH(y.device, fill_zero, y, stream);
}

void copy(Tensor dst, Tensor src, Stream stream) {
  const OpCheck check("copy", dst.device);
  check.on_device("dst", dst);
  check_like(check, "src", src, "dst", dst);
  MOE_OP_DISPATCH(dst.device, copy, dst, src, stream);
}

void cast_copy(Tensor dst, Tensor src, Stream stream) {
  const OpCheck check("cast_copy", dst.device);
  check.on_device("dst", dst);
  check.on_device("src", src);
  check.same_shape("src", src, "dst", dst);
  const bool f32_to_bf16 = dst.dtype == DType::BF16 && src.dtype == DType::F32;
  const bool bf16_to_f32 = dst.dtype == DType::F32 && src.dtype == DType::BF16;
  MOE_CHECK(dst.dtype == src.dtype || f32_to_bf16 || bf16_to_f32,
            "cast_copy: converts only between F32 and BF16 (or copies equal dtypes), got dst ", dtype_name(dst.dtype),
            " and src ", dtype_name(src.dtype));
  MOE_OP_DISPATCH(dst.device, cast_copy, dst, src, stream);
}

// Checked in full before the first add, so a bad term leaves stats untouched.
void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream stream) {
  const OpCheck check("accumulate_scalars", stats.device);
  const char* op = check.op();
  check.tensor("stats", stats, DType::F32);
  for (size_t i = 0; i < terms.size(); ++i) {
    const ScalarTerm& term = terms[i];
    MOE_CHECK(term.src.device == stats.device, op, ": terms[", i, "].src is on ", device_name(term.src.device),
              ", expected ", device_name(stats.device), " (where stats is)");
    MOE_CHECK(term.src.dtype == DType::F32 || term.src.dtype == DType::I32, op, ": terms[", i,
              "].src must be F32 or I32, got ", dtype_name(term.src.dtype));
    MOE_CHECK(term.index >= 0 && term.index < term.src.numel() && term.src.data != nullptr, op, ": terms[", i,
              "].index = ", term.index, " is outside src ", term.src.shape.str());
    MOE_CHECK(term.slot >= 0 && term.slot < stats.numel(), op, ": terms[", i, "].slot = ", term.slot,
              " is outside stats ", stats.shape.str());
  }
  MOE_OP_DISPATCH(stats.device, accumulate_scalars, stats, terms, stream);
}

}  // namespace moe
