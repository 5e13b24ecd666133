// Argument checks of the public ops. Each ops/<family>.cpp checks a call once with these, before it
// hands the call to a backend (ops/cpu or ops/cuda), which then assumes valid input and checks only
// the limits of its own implementation (grid sizes, alignment a library needs, graph capture).
//
// The dtype contract depends on the device, and is written here once:
//   - compute tensors (activations, weights, their gradients): F32 on the CPU; on CUDA one dtype T
//     per call, F32 or BF16 (arithmetic in FP32);
//   - outputs that may accumulate in FP32 (products, weight gradients): T or F32;
//   - statistics, router tensors and optimizer state: F32 (the AdamW moments F32 or BF16, a storage
//     choice: the update computes in FP32); integer metadata: I32 (both devices).
// Values inside tensors (index ranges, offsets) are checked only where the host can read them (CPU
// tensors); the CUDA kernels' behaviour on such values is documented in ops/cuda/<family>.h.
// Every message starts with the op's name, names the tensor and says what was expected.
#pragma once

#include <cstdint>

#include "moe/core/tensor.h"

namespace moe {

// The checks of one call of `op`, whose tensors all live on `device`.
class OpCheck {
 public:
  OpCheck(const char* op, Device device) : op_(op), device_(device) {}

  const char* op() const { return op_; }
  Device device() const { return device_; }
  // True when tensor values can be read here (CPU), so value checks can be made.
  bool host_data() const { return device_ == Device::CPU; }

  // t lives on the call's device and has data (a tensor without elements may have none).
  void on_device(const char* name, const Tensor& t) const;
  // on_device, and t has dtype `dtype`; `why`, when given, says why ("cuDNN takes BF16").
  void tensor(const char* name, const Tensor& t, DType dtype, const char* why = nullptr) const;
  // on_device, dtype and rank.
  void tensor(const char* name, const Tensor& t, DType dtype, int ndim) const;

  // on_device, and returns t's dtype after checking it is one this device computes in: F32 on the
  // CPU, F32 or BF16 on CUDA. The call's other compute tensors then take this T (same_dtype).
  DType compute_dtype(const char* name, const Tensor& t) const;
  // on_device, and t has the dtype of ref (one dtype per call).
  void same_dtype(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const;
  // on_device, and t is T or F32 (an output that may be kept, or accumulated, in FP32).
  void output_dtype(const char* name, const Tensor& t, DType T) const;

  void ndim(const char* name, const Tensor& t, int ndim) const;
  void shape(const char* name, const Tensor& t, const Shape& want) const;
  // t has n elements; `what`, when given, says what they are ("one per row").
  void numel(const char* name, const Tensor& t, int64_t n, const char* what = nullptr) const;
  void same_shape(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const;

  // A workspace of at least `need` F32 elements, sized by the function `sized_by` names. need = 0
  // (the backend of this device uses none): t is ignored and may be empty.
  void workspace(const char* name, const Tensor& t, int64_t need, const char* sized_by) const;

  // Every entry of the I32 tensor t lies in [lo, hi); `what`, when given, says what an entry must
  // be ("an expert"). Reads the data: only where host_data().
  // expert_offsets [E + 1] I32 of an expert-major row buffer; where the host can read it,
  // non-decreasing from offsets[0] >= 0 up to offsets[E] <= rows (the GPU clamps bad offsets
  // instead, see ops/cuda/grouped_gemm.h).
  void expert_offsets(const Tensor& expert_offsets, int64_t E, int64_t rows) const;
  void values_in(const char* name, const Tensor& t, int64_t lo, int64_t hi, const char* what = nullptr) const;

 private:
  const char* op_;
  Device device_;
};

}  // namespace moe
