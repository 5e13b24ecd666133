// Tensor: a non-owning view {data, dtype, shape, device}, contiguous row-major.
// Ops that need a transpose take a flag; there are no general strides.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "moe/core/dtype.h"
#include "moe/core/error.h"

namespace moe {

struct Shape {
  static constexpr int kMaxDims = 4;
  std::array<int64_t, kMaxDims> dims{};
  int ndim = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    MOE_CHECK(d.size() <= kMaxDims, "tensor rank ", d.size(), " exceeds ", kMaxDims);
    for (int64_t v : d) dims[ndim++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const;
};

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  Tensor() = default;
  Tensor(void* d, DType t, Shape s, Device dev = Device::CPU) : data(d), dtype(t), shape(s), device(dev) {}

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int ndim() const { return shape.ndim; }
  int64_t dim(int i) const { return shape[i < 0 ? shape.ndim + i : i]; }
  bool empty() const { return data == nullptr; }

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
  float* f32() const { check_dtype(DType::F32); return static_cast<float*>(data); }
  int32_t* i32() const { check_dtype(DType::I32); return static_cast<int32_t*>(data); }

  // Same bytes, another shape with the same element count.
  Tensor view(Shape s) const {
    MOE_CHECK(s.numel() == numel(), "view ", s.str(), " does not match ", shape.str());
    return Tensor(data, dtype, s, device);
  }
  // Rows [begin, end) along dim 0.
  Tensor rows(int64_t begin, int64_t end) const;

  void check_dtype(DType t) const {
    MOE_CHECK(dtype == t, "expected dtype ", dtype_name(t), ", got ", dtype_name(dtype));
  }
};

// Convenience constructors for CPU views.
inline Tensor f32_tensor(float* p, Shape s) { return Tensor(p, DType::F32, s); }
inline Tensor i32_tensor(int32_t* p, Shape s) { return Tensor(p, DType::I32, s); }

}  // namespace moe
