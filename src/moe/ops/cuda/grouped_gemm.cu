// CUDA grouped GEMM: the dispatcher and the portable tiled kernels.
//
// BF16 products go to CUTLASS's Hopper ptr-array grouped GEMM (grouped_gemm_cutlass.h) when it
// was built in (MOE_HAVE_CUTLASS) and the host-visible conditions hold (BF16 in, BF16 out for
// grouped_matmul / F32 out for the wgrad; n_out and k_in multiples of 8 and 16-byte aligned base
// pointers, for TMA; at most kMaxGroups experts). Everything else, F32 included, runs the tiled
// CUDA-core kernels below.
//
// Tiled kernels: per-expert row ranges are read on the device from expert_offsets.
// grouped_matmul tiles the whole row buffer (64 rows x 64 output columns per block) and each block
// computes, for every expert whose rows meet its tile, that expert's part of the tile; so the grid
// is sized from the buffer, never from per-expert counts the host cannot see.
// grouped_matmul_wgrad gives each (expert, 64x64 tile of db[e]) one block that walks the expert's
// rows in order, so the sum order is fixed and the result deterministic.
#include "moe/ops/cuda/grouped_gemm.h"
#include "moe/ops/kernel_choice.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "moe/core/cuda_check.h"
#include "moe/ops/cuda/cutlass_scratch.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/grouped_gemm_cutlass.h"

namespace moe::cuda {
namespace {

constexpr int kTile = 64;     // output tile edge
constexpr int kDepth = 16;    // inner-dimension slice staged in shared memory per step
constexpr int kThreads = 256; // 16 x 16 threads, each owning 4 x 4 outputs strided by 16
constexpr int kSub = kTile / 16;
constexpr int64_t kMaxGridY = 65535;

// expert_offsets[e] clamped into [0, rows]: bad offsets give wrong ranges, never out-of-bounds rows.
__device__ inline int64_t row_offset(const int32_t* offsets, int64_t e, int64_t rows) {
  const int64_t v = offsets[e];
  return v < 0 ? 0 : (v > rows ? rows : v);
}

// c [rows, n_out] (= or +=) per expert e: a[o_e:o_e+1] [., k_in] * (trans_b ? b[e]^T : b[e]).
// Block (x, y): buffer rows [64x, 64x + 64), output columns [64y, 64y + 64).
template <typename T, typename TC>
__global__ void __launch_bounds__(kThreads)
    grouped_matmul_kernel(TC* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b,
                          const int32_t* __restrict__ offsets, int num_experts, int64_t rows, int64_t n_out,
                          int64_t k_in, bool trans_b, bool accumulate) {
  __shared__ float a_tile[kDepth][kTile + 1];  // [k][tile row]
  __shared__ float b_tile[kDepth][kTile + 1];  // [k][tile column]
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  if (t0 >= row_offset(offsets, num_experts, rows) || t0 + kTile <= row_offset(offsets, 0, rows)) return;

  // First expert whose range ends after t0 (offsets non-decreasing; offsets[E] > t0 here).
  int lo = 0, hi = num_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (row_offset(offsets, mid + 1, rows) > t0) hi = mid;
    else lo = mid + 1;
  }
  // Every branch below depends only on (e, t0): uniform across the block, so the barriers are safe.
  for (int e = lo; e < num_experts; ++e) {
    const int64_t e_begin = row_offset(offsets, e, rows), e_end = row_offset(offsets, e + 1, rows);
    if (e_begin >= t0 + kTile) break;
    const int64_t r_lo = e_begin > t0 ? e_begin : t0;
    const int64_t r_hi = e_end < t0 + kTile ? e_end : t0 + kTile;
    if (r_lo >= r_hi) continue;
    const T* be = b + static_cast<int64_t>(e) * n_out * k_in;
    float acc[kSub][kSub] = {};
    for (int64_t k0 = 0; k0 < k_in; k0 += kDepth) {
      for (int i = tid; i < kTile * kDepth; i += kThreads) {  // a rows outside [r_lo, r_hi) are never read
        const int m = i / kDepth, k = i % kDepth;
        const int64_t row = t0 + m, kk = k0 + k;
        a_tile[k][m] = (row >= r_lo && row < r_hi && kk < k_in) ? to_f32(a[row * k_in + kk]) : 0.0f;
      }
      for (int i = tid; i < kTile * kDepth; i += kThreads) {
        int n, k;
        if (trans_b) {  // b[e] is [n_out, k_in]: consecutive threads walk k
          n = i / kDepth;
          k = i % kDepth;
        } else {  // b[e] is [k_in, n_out]: consecutive threads walk n
          k = i / kTile;
          n = i % kTile;
        }
        const int64_t col = n0 + n, kk = k0 + k;
        float v = 0.0f;
        if (col < n_out && kk < k_in) v = to_f32(trans_b ? be[col * k_in + kk] : be[kk * n_out + col]);
        b_tile[k][n] = v;
      }
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        float av[kSub], bv[kSub];
#pragma unroll
        for (int i = 0; i < kSub; ++i) av[i] = a_tile[k][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < kSub; ++j) bv[j] = b_tile[k][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < kSub; ++i)
#pragma unroll
          for (int j = 0; j < kSub; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kSub; ++i) {
      const int64_t row = t0 + ty + 16 * i;
      if (row < r_lo || row >= r_hi) continue;
#pragma unroll
      for (int j = 0; j < kSub; ++j) {
        const int64_t col = n0 + tx + 16 * j;
        if (col >= n_out) continue;
        TC* out = c + row * n_out + col;
        *out = from_f32<TC>(accumulate ? to_f32(*out) + acc[i][j] : acc[i][j]);
      }
    }
  }
}

// db[e] [n_out, k_in] += dc[o_e:o_e+1]^T a[o_e:o_e+1]. Block (x, y, e): db[e] rows [64y, 64y + 64),
// columns [64x, 64x + 64); it walks the expert's rows from first to last.
template <typename T, typename TD>
__global__ void __launch_bounds__(kThreads)
    grouped_matmul_wgrad_kernel(TD* __restrict__ db, const T* __restrict__ dc, const T* __restrict__ a,
                                const int32_t* __restrict__ offsets, int64_t rows, int64_t n_out, int64_t k_in) {
  __shared__ float dc_tile[kDepth][kTile + 1];  // [row][n]
  __shared__ float a_tile[kDepth][kTile + 1];   // [row][k]
  const int64_t e = blockIdx.z;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t r_begin = row_offset(offsets, e, rows), r_end = row_offset(offsets, e + 1, rows);
  if (r_begin >= r_end) return;  // no rows: db[e] untouched, as on the CPU
  float acc[kSub][kSub] = {};
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kDepth) {
    for (int i = tid; i < kTile * kDepth; i += kThreads) {
      const int r = i / kTile, x = i % kTile;
      const int64_t row = r0 + r;
      const bool in_rows = row < r_end;
      dc_tile[r][x] = (in_rows && n0 + x < n_out) ? to_f32(dc[row * n_out + n0 + x]) : 0.0f;
      a_tile[r][x] = (in_rows && k0 + x < k_in) ? to_f32(a[row * k_in + k0 + x]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kDepth; ++r) {
      float dv[kSub], av[kSub];
#pragma unroll
      for (int i = 0; i < kSub; ++i) dv[i] = dc_tile[r][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < kSub; ++j) av[j] = a_tile[r][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < kSub; ++i)
#pragma unroll
        for (int j = 0; j < kSub; ++j) acc[i][j] = fmaf(dv[i], av[j], acc[i][j]);
    }
    __syncthreads();
  }
  TD* db_e = db + e * n_out * k_in;
#pragma unroll
  for (int i = 0; i < kSub; ++i) {
    const int64_t n = n0 + ty + 16 * i;
    if (n >= n_out) continue;
#pragma unroll
    for (int j = 0; j < kSub; ++j) {
      const int64_t k = k0 + tx + 16 * j;
      if (k >= k_in) continue;
      TD* out = db_e + n * k_in + k;
      *out = from_f32<TD>(to_f32(*out) + acc[i][j]);
    }
  }
}

template <typename T, typename TC>
void launch_grouped_matmul(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& offsets, int64_t E,
                           int64_t rows, int64_t n_out, int64_t k_in, bool trans_b, bool accumulate,
                           cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((rows + kTile - 1) / kTile),
                  static_cast<unsigned>((n_out + kTile - 1) / kTile));
  grouped_matmul_kernel<T, TC><<<grid, kThreads, 0, stream>>>(
      static_cast<TC*>(c.data), static_cast<const T*>(a.data), static_cast<const T*>(b.data),
      static_cast<const int32_t*>(offsets.data), static_cast<int>(E), rows, n_out, k_in, trans_b, accumulate);
  CUDA_CHECK_LAUNCH();
}

template <typename T, typename TD>
void launch_grouped_matmul_wgrad(const Tensor& db, const Tensor& dc, const Tensor& a, const Tensor& offsets, int64_t E,
                                 int64_t rows, int64_t n_out, int64_t k_in, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((k_in + kTile - 1) / kTile), static_cast<unsigned>((n_out + kTile - 1) / kTile),
                  static_cast<unsigned>(E));
  grouped_matmul_wgrad_kernel<T, TD><<<grid, kThreads, 0, stream>>>(
      static_cast<TD*>(db.data), static_cast<const T*>(dc.data), static_cast<const T*>(a.data),
      static_cast<const int32_t*>(offsets.data), rows, n_out, k_in);
  CUDA_CHECK_LAUNCH();
}

// The dimensions of one call (ops/grouped_gemm.cpp checked the call), after the limits of the tiled
// kernels: at most 65535 experts (grid z of the wgrad) and kMaxGridY output tiles.
struct Dims {
  int64_t E, rows, n_out, k_in;
};

Dims check_tiled_limits(const char* op, int64_t E, int64_t rows, int64_t n_out, int64_t k_in) {
  MOE_CHECK(E <= 65535, op, ": ", E, " experts exceed the 65535 this kernel's grid allows");
  MOE_CHECK((n_out + kTile - 1) / kTile <= kMaxGridY, op, ": n_out = ", n_out, " needs more than ", kMaxGridY,
            " tiles of ", kTile, " (the kernel's grid)");
  return {E, rows, n_out, k_in};
}

Dims grouped_matmul_dims(const Tensor& c, const Tensor& a, const Tensor& b, bool trans_b) {
  return check_tiled_limits("grouped_matmul", b.dim(0), a.dim(0) < c.dim(0) ? a.dim(0) : c.dim(0),
                            trans_b ? b.dim(1) : b.dim(2), a.dim(1));
}

Dims grouped_matmul_wgrad_dims(const Tensor& db, const Tensor& dc, const Tensor& a) {
  return check_tiled_limits("grouped_matmul_wgrad", db.dim(0), a.dim(0) < dc.dim(0) ? a.dim(0) : dc.dim(0), db.dim(1),
                            db.dim(2));
}

#if defined(MOE_HAVE_CUTLASS)
// Kernel attributes of the three BF16 products: once per process, before their first scratch.
void prepare_bf16_kernels() {
  cutlass_grouped::prepare_nt_bf16();
  cutlass_grouped::prepare_nn_bf16();
  cutlass_grouped::prepare_wgrad_bf16_f32();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// What the host can check for the CUTLASS path (see grouped_gemm_cutlass.h); false: tiled kernels.
bool cutlass_fits(const void* x, const void* y, const void* out, int64_t E, int64_t rows, int64_t n_out,
                  int64_t k_in) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  return E <= cutlass_grouped::kMaxGroups && rows <= kIntMax && n_out <= kIntMax && k_in <= kIntMax &&
         n_out % 8 == 0 && k_in % 8 == 0 && aligned16(x) && aligned16(y) && aligned16(out);
}
#endif

}  // namespace

void grouped_matmul_tiled(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                          Stream stream) {
  const Dims d = grouped_matmul_dims(c, a, b, trans_b);
  if (d.rows == 0 || d.E == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (a.dtype == DType::F32) {
    launch_grouped_matmul<float, float>(c, a, b, expert_offsets, d.E, d.rows, d.n_out, d.k_in, trans_b, accumulate, s);
  } else if (c.dtype == DType::BF16) {
    launch_grouped_matmul<__nv_bfloat16, __nv_bfloat16>(c, a, b, expert_offsets, d.E, d.rows, d.n_out, d.k_in,
                                                        trans_b, accumulate, s);
  } else {
    launch_grouped_matmul<__nv_bfloat16, float>(c, a, b, expert_offsets, d.E, d.rows, d.n_out, d.k_in, trans_b,
                                                accumulate, s);
  }
}

void grouped_matmul_wgrad_tiled(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream,
                                bool accumulate) {
  const Dims d = grouped_matmul_wgrad_dims(db, dc, a);
  const cudaStream_t s = cuda_stream(stream);
  // Not accumulating: the reference kernels accumulate into zeros.
  if (!accumulate && db.nbytes() > 0) CUDA_CHECK(cudaMemsetAsync(db.data, 0, db.nbytes(), s));
  if (d.rows == 0 || d.E == 0) return;
  if (a.dtype == DType::F32) {
    launch_grouped_matmul_wgrad<float, float>(db, dc, a, expert_offsets, d.E, d.rows, d.n_out, d.k_in, s);
  } else if (db.dtype == DType::BF16) {
    launch_grouped_matmul_wgrad<__nv_bfloat16, __nv_bfloat16>(db, dc, a, expert_offsets, d.E, d.rows, d.n_out, d.k_in,
                                                              s);
  } else {
    launch_grouped_matmul_wgrad<__nv_bfloat16, float>(db, dc, a, expert_offsets, d.E, d.rows, d.n_out, d.k_in, s);
  }
}

bool grouped_gemm_uses_cutlass() {
#if defined(MOE_HAVE_CUTLASS)
  return cutlass_supported("grouped_gemm_uses_cutlass");
#else
  return false;
#endif
}

void grouped_matmul(Tensor c, Tensor a, Tensor b, Tensor expert_offsets, bool trans_b, bool accumulate,
                    Stream stream) {
#if defined(MOE_HAVE_CUTLASS)
  const Dims d = grouped_matmul_dims(c, a, b, trans_b);
  if (d.rows == 0 || d.E == 0) return;
  if (kernel_choice() == KernelChoice::Fast && a.dtype == DType::BF16 && c.dtype == DType::BF16 &&
      cutlass_fits(a.data, b.data, c.data, d.E, d.rows, d.n_out, d.k_in)) {
    const cudaStream_t s = cuda_stream(stream);
    if (const cutlass_grouped::Scratch* scratch = cutlass_scratch(s, "grouped_matmul", prepare_bf16_kernels)) {
      const auto product = trans_b ? cutlass_grouped::matmul_nt_bf16 : cutlass_grouped::matmul_nn_bf16;
      product(c.data, a.data, b.data, static_cast<const int32_t*>(expert_offsets.data), static_cast<int>(d.E), d.rows,
              static_cast<int>(d.n_out), static_cast<int>(d.k_in), accumulate, *scratch, s);
      return;
    }
  }
#endif
  grouped_matmul_tiled(c, a, b, expert_offsets, trans_b, accumulate, stream);
}

void grouped_matmul_wgrad(Tensor db, Tensor dc, Tensor a, Tensor expert_offsets, Stream stream, bool accumulate) {
#if defined(MOE_HAVE_CUTLASS)
  const Dims d = grouped_matmul_wgrad_dims(db, dc, a);
  if (d.rows == 0 || d.E == 0) return grouped_matmul_wgrad_tiled(db, dc, a, expert_offsets, stream, accumulate);
  if (kernel_choice() == KernelChoice::Fast && a.dtype == DType::BF16 && db.dtype == DType::F32 &&
      cutlass_fits(dc.data, a.data, db.data, d.E, d.rows, d.n_out, d.k_in)) {
    const cudaStream_t s = cuda_stream(stream);
    if (const cutlass_grouped::Scratch* scratch = cutlass_scratch(s, "grouped_matmul_wgrad", prepare_bf16_kernels)) {
      cutlass_grouped::wgrad_bf16_f32(db.data, dc.data, a.data, static_cast<const int32_t*>(expert_offsets.data),
                                      static_cast<int>(d.E), d.rows, static_cast<int>(d.n_out),
                                      static_cast<int>(d.k_in), accumulate, *scratch, s);
      return;
    }
  }
#endif
  grouped_matmul_wgrad_tiled(db, dc, a, expert_offsets, stream, accumulate);
}

}  // namespace moe::cuda
