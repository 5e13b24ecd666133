#include "moe/ops/op_checks.h"

#include "moe/core/error.h"

namespace moe {

void OpCheck::on_device(const char* name, const Tensor& t) const {
  MOE_CHECK(t.device == device_, op_, ": ", name, " is on ", device_name(t.device), ", expected ",
            device_name(device_), " (the device of the call)");
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op_, ": ", name, " ", t.shape.str(), " has no data");
}

void OpCheck::tensor(const char* name, const Tensor& t, DType dtype, const char* why) const {
  on_device(name, t);
  MOE_CHECK(t.dtype == dtype, op_, ": ", name, " must be ", dtype_name(dtype), why ? " (" : "", why ? why : "",
            why ? ")" : "", ", got ", dtype_name(t.dtype));
}

void OpCheck::tensor(const char* name, const Tensor& t, DType dtype, int ndim_want) const {
  tensor(name, t, dtype);
  ndim(name, t, ndim_want);
}

DType OpCheck::compute_dtype(const char* name, const Tensor& t) const {
  on_device(name, t);
  if (device_ == Device::CPU) {
    MOE_CHECK(t.dtype == DType::F32, op_, ": ", name, " must be F32 (the CPU computes in F32), got ",
              dtype_name(t.dtype));
  } else {
    MOE_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, op_, ": ", name, " must be F32 or BF16 on ",
              device_name(device_), ", got ", dtype_name(t.dtype));
  }
  return t.dtype;
}

void OpCheck::same_dtype(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const {
  on_device(name, t);
  MOE_CHECK(t.dtype == ref.dtype, op_, ": ", name, " has dtype ", dtype_name(t.dtype), " but ", ref_name, " has ",
            dtype_name(ref.dtype), "; the compute tensors of one call share one dtype");
}

void OpCheck::output_dtype(const char* name, const Tensor& t, DType T) const {
  on_device(name, t);
  MOE_CHECK(t.dtype == T || t.dtype == DType::F32, op_, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected ",
            dtype_name(T), T == DType::F32 ? "" : " (the call's dtype) or F32");
}

void OpCheck::ndim(const char* name, const Tensor& t, int ndim_want) const {
  MOE_CHECK(t.ndim() == ndim_want, op_, ": ", name, " must be ", ndim_want, "-D, got ", t.shape.str());
}

void OpCheck::shape(const char* name, const Tensor& t, const Shape& want) const {
  MOE_CHECK(t.shape == want, op_, ": ", name, " has shape ", t.shape.str(), ", expected ", want.str());
}

void OpCheck::numel(const char* name, const Tensor& t, int64_t n, const char* what) const {
  MOE_CHECK(t.numel() == n, op_, ": ", name, " ", t.shape.str(), " has ", t.numel(), " elements, expected ", n,
            what ? " (" : "", what ? what : "", what ? ")" : "");
}

void OpCheck::same_shape(const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) const {
  MOE_CHECK(t.shape == ref.shape, op_, ": ", name, " ", t.shape.str(), " must match ", ref_name, " ",
            ref.shape.str());
}

void OpCheck::workspace(const char* name, const Tensor& t, int64_t need, const char* sized_by) const {
  if (need == 0) return;
  tensor(name, t, DType::F32);
  MOE_CHECK(t.numel() >= need, op_, ": ", name, " has ", t.numel(), " elements but ", need, " are needed on ",
            device_name(device_), " (size it with ", sized_by, ")");
}

void OpCheck::values_in(const char* name, const Tensor& t, int64_t lo, int64_t hi, const char* what) const {
  MOE_CHECK(host_data(), op_, ": ", name, " is not readable on the host (values are checked on the CPU only)");
  t.check_dtype(DType::I32);
  const int32_t* v = static_cast<const int32_t*>(t.data);
  const int64_t n = t.numel(), cols = t.ndim() == 2 ? t.dim(1) : 0;
  for (int64_t i = 0; i < n; ++i) {
    if (v[i] >= lo && v[i] < hi) continue;
    if (cols > 0)
      MOE_FAIL(op_, ": ", name, "[", i / cols, ", ", i % cols, "] = ", v[i], " outside [", lo, ", ", hi, ")",
               what ? " (" : "", what ? what : "", what ? ")" : "");
    MOE_FAIL(op_, ": ", name, "[", i, "] = ", v[i], " outside [", lo, ", ", hi, ")", what ? " (" : "",
             what ? what : "", what ? ")" : "");
  }
}

void OpCheck::expert_offsets(const Tensor& expert_offsets, int64_t E, int64_t rows) const {
  tensor("expert_offsets", expert_offsets, DType::I32);
  MOE_CHECK(expert_offsets.ndim() == 1 && expert_offsets.dim(0) == E + 1, op_, ": expert_offsets has shape ",
            expert_offsets.shape.str(), ", expected [", E + 1, "] (experts + 1)");
  if (!host_data()) return;
  const int32_t* o = expert_offsets.i32();
  MOE_CHECK(o[0] >= 0, op_, ": expert_offsets[0] = ", o[0], " is negative");
  for (int64_t e = 0; e < E; ++e)
    MOE_CHECK(o[e] <= o[e + 1], op_, ": expert_offsets decrease at expert ", e, " (", o[e], " > ", o[e + 1], ")");
  MOE_CHECK(o[E] <= rows, op_, ": expert_offsets[", E, "] = ", o[E], " exceeds the ", rows, " buffer rows");
}

}  // namespace moe
