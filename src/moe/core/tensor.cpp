#include "moe/core/tensor.h"

#include <sstream>

namespace moe {

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < ndim; ++i) os << (i ? ", " : "") << dims[i];
  os << "]";
  return os.str();
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  MOE_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= dim(0), "row range [", begin, ", ", end,
            ") outside ", shape.str());
  Shape s = shape;
  s.dims[0] = end - begin;
  const size_t row_bytes = dim(0) == 0 ? 0 : nbytes() / static_cast<size_t>(dim(0));
  return Tensor(static_cast<char*>(data) + static_cast<size_t>(begin) * row_bytes, dtype, s, device);
}

}  // namespace moe
