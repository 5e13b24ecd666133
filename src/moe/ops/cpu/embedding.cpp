// CPU embedding lookup/accumulation and element-wise helpers.
#include "moe/ops/cpu/embedding.h"

#include <cstring>

namespace moe::cpu {
namespace {

void check_cpu(const char* op, const char* name, const Tensor& t) {
  MOE_CHECK(t.device == Device::CPU, op, ": tensor ", name, " is not on the CPU");
}

void check_f32(const char* op, const char* name, const Tensor& t) {
  check_cpu(op, name, t);
  MOE_CHECK(t.dtype == DType::F32, op, ": tensor ", name, " must be F32, got ", dtype_name(t.dtype));
}

// Shared checks of the lookup and its gradient: dtypes, [R, D] rows, [V, D] table, ids in range.
void check_embedding(const char* op, const Tensor& rows, const char* rows_name, const Tensor& table,
                     const char* table_name, const Tensor& tokens) {
  check_f32(op, rows_name, rows);
  check_f32(op, table_name, table);
  check_cpu(op, "tokens", tokens);
  MOE_CHECK(tokens.dtype == DType::I32, op, ": tokens must be I32, got ", dtype_name(tokens.dtype));
  MOE_CHECK(table.ndim() == 2, op, ": ", table_name, " must be 2-D [V, D], got ", table.shape.str());
  MOE_CHECK(rows.ndim() == 2 && rows.dim(0) == tokens.numel() && rows.dim(1) == table.dim(1), op, ": ",
            rows_name, " ", rows.shape.str(), " must be [R, D] = [", tokens.numel(), ", ", table.dim(1), "]");
  // The data loader validates ids; this O(R) pass only turns a bad id into an error instead of a
  // wild memory access.
  const int32_t* tok = tokens.i32();
  const int64_t V = table.dim(0);
  for (int64_t r = 0; r < tokens.numel(); ++r)
    MOE_CHECK(tok[r] >= 0 && tok[r] < V, op, ": tokens[", r, "] = ", tok[r], " outside [0, ", V, ")");
}

// stats is F32 on `device`; every term's src is F32 or I32 on that device, its index inside src and
// its slot inside stats.
void check_scalar_terms(const char* op, const Tensor& stats, const std::vector<ScalarTerm>& terms) {
  check_f32(op, "stats", stats);
  MOE_CHECK(stats.data != nullptr || stats.numel() == 0, op, ": stats has no data");
  for (size_t i = 0; i < terms.size(); ++i) {
    const ScalarTerm& term = terms[i];
    MOE_CHECK(term.src.device == Device::CPU, op, ": terms[", i, "].src is not on the CPU (stats is)");
    MOE_CHECK(term.src.dtype == DType::F32 || term.src.dtype == DType::I32, op, ": terms[", i,
              "].src must be F32 or I32, got ", dtype_name(term.src.dtype));
    MOE_CHECK(term.index >= 0 && term.index < term.src.numel() && term.src.data != nullptr, op, ": terms[", i,
              "].index = ", term.index, " is outside src ", term.src.shape.str());
    MOE_CHECK(term.slot >= 0 && term.slot < stats.numel(), op, ": terms[", i, "].slot = ", term.slot,
              " is outside stats ", stats.shape.str());
  }
}

// Columns per task in embedding_backward.
constexpr int64_t kColumnBlock = 256;

}  // namespace

void embedding_forward(Tensor out, Tensor table, Tensor tokens, Stream /*stream*/) {
  check_embedding("embedding_forward", out, "out", table, "table", tokens);
  const int64_t R = out.dim(0), D = out.dim(1);
  const int32_t* tok = tokens.i32();
  const float* tp = table.f32();
  float* op_ = out.f32();
#pragma omp parallel for schedule(static) if (R * D > (1 << 15))
  for (int64_t r = 0; r < R; ++r) std::memcpy(op_ + r * D, tp + tok[r] * D, static_cast<size_t>(D) * sizeof(float));
}

// Each task owns a block of columns and walks the rows in order, so repeated tokens add up
// without races and the result is the same for any thread count.
void embedding_backward(Tensor dtable, Tensor dout, Tensor tokens, Stream /*stream*/) {
  check_embedding("embedding_backward", dout, "dout", dtable, "dtable", tokens);
  const int64_t R = dout.dim(0), D = dout.dim(1);
  const int32_t* tok = tokens.i32();
  const float* gp = dout.f32();
  float* dtp = dtable.f32();
  const int64_t n_blocks = (D + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (R * D > (1 << 15))
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t c1 = c0 + kColumnBlock < D ? c0 + kColumnBlock : D;
    for (int64_t r = 0; r < R; ++r) {
      const float* g = gp + r * D;
      float* dt = dtp + static_cast<int64_t>(tok[r]) * D;
      for (int64_t c = c0; c < c1; ++c) dt[c] += g[c];
    }
  }
}

void add_inplace(Tensor y, Tensor x, Stream /*stream*/) {
  check_f32("add_inplace", "y", y);
  check_f32("add_inplace", "x", x);
  MOE_CHECK(y.shape == x.shape, "add_inplace: y ", y.shape.str(), " and x ", x.shape.str(), " differ in shape");
  const int64_t n = y.numel();
  float* yp = y.f32();
  const float* xp = x.f32();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) yp[i] += xp[i];
}

void fill_zero(Tensor y, Stream /*stream*/) {
  check_cpu("fill_zero", "y", y);
  if (y.nbytes() > 0) std::memset(y.data, 0, y.nbytes());
}

void copy(Tensor dst, Tensor src, Stream /*stream*/) {
  check_cpu("copy", "dst", dst);
  check_cpu("copy", "src", src);
  MOE_CHECK(dst.shape == src.shape && dst.dtype == src.dtype, "copy: dst ", dst.shape.str(), " ",
            dtype_name(dst.dtype), " and src ", src.shape.str(), " ", dtype_name(src.dtype), " differ");
  if (dst.nbytes() > 0 && dst.data != src.data) std::memcpy(dst.data, src.data, dst.nbytes());
}

void cast_copy(Tensor dst, Tensor src, Stream stream) {
  const char* op = "cast_copy";
  check_cpu(op, "dst", dst);
  check_cpu(op, "src", src);
  MOE_CHECK(dst.shape == src.shape, op, ": dst ", dst.shape.str(), " and src ", src.shape.str(), " differ in shape");
  if (dst.dtype == src.dtype) return cpu::copy(dst, src, stream);  // qualified: moe::copy is visible too
  const bool f32_to_bf16_cast = dst.dtype == DType::BF16 && src.dtype == DType::F32;
  const bool bf16_to_f32_cast = dst.dtype == DType::F32 && src.dtype == DType::BF16;
  MOE_CHECK(f32_to_bf16_cast || bf16_to_f32_cast, op, ": converts only between F32 and BF16, got dst ",
            dtype_name(dst.dtype), " and src ", dtype_name(src.dtype));
  const int64_t n = dst.numel();
  if (f32_to_bf16_cast) {
    const float* s = src.f32();
    uint16_t* d = dst.ptr<uint16_t>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
  } else {
    const uint16_t* s = src.ptr<const uint16_t>();
    float* d = dst.f32();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  }
}

// Checked in full before the first add, so a bad term leaves stats untouched.
void accumulate_scalars(Tensor stats, const std::vector<ScalarTerm>& terms, Stream /*stream*/) {
  check_scalar_terms("accumulate_scalars", stats, terms);
  float* s = static_cast<float*>(stats.data);
  for (const ScalarTerm& term : terms) {
    const float value = term.src.dtype == DType::I32 ? static_cast<float>(term.src.ptr<const int32_t>()[term.index])
                                                     : term.src.ptr<const float>()[term.index];
    s[term.slot] += term.scale * value;
  }
}

}  // namespace moe::cpu
