// CUDA optimizer ops over flat FP32 buffers (see moe/ops/optim.h and moe/ops/cuda/optim.h).
//
// sum_squares_accumulate, two kernels on the stream:
//   sum_squares_partial_kernel  G blocks of 256 threads, G = min(1024, ceil(n / 256)) (a function
//                               of n only); each thread sums x^2 over a grid-stride in FP32, the
//                               block reduces with a fixed shared-memory tree and writes
//                               partials[block] into the caller's workspace.
//   sum_squares_final_kernel    one block of 256 threads: adds the G partials in a fixed order (in
//                               double) and does out[0] += total.
//   Deterministic: the partition and the reduction order depend only on n.
// adamw_step: one thread per element, grid-stride, or per 4 elements (float4 loads and stores;
// 8-byte loads and stores of 4 values for BF16 moments) when the buffers' alignments allow, which
// moves the memory-bound update closer to the HBM rate. The moments' dtype is a template parameter:
// BF16 moments are widened on load and rounded to nearest even on store in the same pass (the
// update itself is the FP32 one). With param_bf16 the BF16 copy of the new param is written in the
// same pass. Each thread reads grad_norm_sq[0] first; a non-finite value makes every thread return
// before touching param/m/v (the skipped step). With a schedule, thread 0 of each block computes
// the step's scalars from schedule (lr, step) into shared memory, in double as the host does
// without one: pow and sqrt, then __dmul_rn/__dadd_rn so nothing is fused into a multiply-add that
// the host would round twice. The update loop is the same code either way, so the same lr and step
// give the same bits.
// NOTES: CUDA's double pow and the host's std::pow may differ in the last bit of a double in rare
// cases; the scalars are then rounded to FP32, where such a difference almost never shows
// (tests/cuda/test_cuda_optim.cpp checks steps 1 to 2000 bit for bit).
#include "moe/ops/cuda/optim.h"

#include <algorithm>
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;
constexpr int64_t kMaxBlocks = 1 << 16;

// Blocks of sum_squares_accumulate for n elements (a function of n only: the partition, and so the
// result, does not depend on the GPU).
int sum_squares_blocks(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxPartials));
}

__global__ void __launch_bounds__(kThreads) sum_squares_partial_kernel(float* partials, const float* x, int64_t n) {
  __shared__ float block_sum[kThreads];
  float acc = 0.0f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float v = x[i];
    acc += v * v;
  }
  block_sum[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) block_sum[threadIdx.x] += block_sum[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum[0];
}

__global__ void __launch_bounds__(kThreads)
    sum_squares_final_kernel(float* out, const float* partials, int num_partials) {
  __shared__ double block_sum[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += kThreads) acc += partials[i];
  block_sum[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride) block_sum[threadIdx.x] += block_sum[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(static_cast<double>(out[0]) + block_sum[0]);
}

// The update of one element. Every operation is an explicitly rounded intrinsic, so the compiler
// contracts nothing into an FMA: the float4 and the one-by-one loops give the same bits (with plain
// operators the two loops were contracted differently and differed in the last bit), and the
// operations are the CPU op's, in its order.
struct AdamWScalars {
  float b1, b2, eps, step_size, bias2_sqrt, decay, clip;
};

__device__ __forceinline__ float adamw_update(float p, float grad, float& m, float& v, const AdamWScalars& s) {
  const float g = __fmul_rn(s.clip, grad);
  m = __fadd_rn(__fmul_rn(s.b1, m), __fmul_rn(__fsub_rn(1.0f, s.b1), g));
  v = __fadd_rn(__fmul_rn(s.b2, v), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, s.b2), g), g));
  // Same operation order as torch: (m / (sqrt(v) / sqrt(bias2) + eps)) times the step size.
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias2_sqrt), s.eps);
  return __fsub_rn(__fmul_rn(p, s.decay), __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
}

// Moments stored as FP32 or BF16 (optim.moment_dtype): loads widen exactly, stores round to
// nearest even (__float2bfloat16_rn, the CPU's f32_to_bf16 for every non-NaN value). load4/store4
// move elements [4j, 4j + 4) as one 16-byte float4 (FP32) or one 8-byte uint2 of two bfloat162
// (BF16: the moments, and the param's BF16 copy).
__device__ __forceinline__ float load_moment(const float* m, int64_t i) { return m[i]; }
__device__ __forceinline__ float load_moment(const __nv_bfloat16* m, int64_t i) { return __bfloat162float(m[i]); }
__device__ __forceinline__ void store_moment(float* m, int64_t i, float x) { m[i] = x; }
__device__ __forceinline__ void store_moment(__nv_bfloat16* m, int64_t i, float x) { m[i] = __float2bfloat16_rn(x); }

__device__ __forceinline__ float4 load4(const float* m, int64_t j) {
  return reinterpret_cast<const float4*>(m)[j];
}
__device__ __forceinline__ float4 load4(const __nv_bfloat16* m, int64_t j) {
  const uint2 packed = reinterpret_cast<const uint2*>(m)[j];
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ void store4(float* m, int64_t j, float4 x) { reinterpret_cast<float4*>(m)[j] = x; }
__device__ __forceinline__ void store4(__nv_bfloat16* m, int64_t j, float4 x) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  reinterpret_cast<uint2*>(m)[j] = packed;
}

// schedule == nullptr: step_size, bias2_sqrt and decay are the host's. Otherwise they are computed
// here from lr = schedule[0], step = schedule[1] and the weight decay wd, exactly as on the host.
// kVec: elements [head, head + 4 * vecs) move four at a time (param, grad and FP32 moments 16-byte
// aligned there, BF16 moments and copy 8-byte aligned; the host checked), the head and the tail
// (< 4 elements each) one by one; otherwise every element one by one. copy (BF16) is written when
// not null. Moment: float or __nv_bfloat16 (m and v alike).
template <bool kVec, typename Moment>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* param, const float* grad, Moment* m, Moment* v, __nv_bfloat16* copy,
                 const float* grad_norm_sq, float max_norm, float b1, float b2, float eps, float step_size,
                 float bias2_sqrt, float decay, const float* schedule, float wd, int64_t n, int64_t head) {
  if (schedule != nullptr) {
    __shared__ float scalars[3];
    if (threadIdx.x == 0) {
      const double lr = schedule[0], step = schedule[1];
      const double bias1 = 1.0 - pow(static_cast<double>(b1), step);
      const double bias2 = 1.0 - pow(static_cast<double>(b2), step);
      scalars[0] = static_cast<float>(lr / bias1);
      scalars[1] = static_cast<float>(sqrt(bias2));
      scalars[2] = static_cast<float>(__dadd_rn(1.0, -__dmul_rn(lr, static_cast<double>(wd))));
    }
    __syncthreads();
    step_size = scalars[0];
    bias2_sqrt = scalars[1];
    decay = scalars[2];
  }
  const float norm_sq = grad_norm_sq[0];
  if (!isfinite(norm_sq)) return;  // skip the step: a non-finite gradient changes nothing
  const float clip =
      max_norm > 0.0f ? fminf(1.0f, static_cast<float>(max_norm / (sqrt(static_cast<double>(norm_sq)) + 1e-6)))
                      : 1.0f;
  const AdamWScalars s{b1, b2, eps, step_size, bias2_sqrt, decay, clip};
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  auto one = [&](int64_t i) {
    float mi = load_moment(m, i), vi = load_moment(v, i);
    const float p = adamw_update(param[i], grad[i], mi, vi, s);
    store_moment(m, i, mi);
    store_moment(v, i, vi);
    param[i] = p;
    if (copy != nullptr) copy[i] = __float2bfloat16_rn(p);
  };
  if constexpr (!kVec) {
    for (int64_t i = tid; i < n; i += stride) one(i);
  } else {
    const int64_t vecs = (n - head) / 4, tail = head + 4 * vecs;
    if (tid < head) one(tid);
    if (tail + tid < n) one(tail + tid);
    float4* p4 = reinterpret_cast<float4*>(param + head);
    const float4* g4 = reinterpret_cast<const float4*>(grad + head);
    Moment* mh = m + head;
    Moment* vh = v + head;
    for (int64_t j = tid; j < vecs; j += stride) {
      float4 p = p4[j], mm = load4(mh, j), vv = load4(vh, j);
      const float4 g = g4[j];
      p.x = adamw_update(p.x, g.x, mm.x, vv.x, s);
      p.y = adamw_update(p.y, g.y, mm.y, vv.y, s);
      p.z = adamw_update(p.z, g.z, mm.z, vv.z, s);
      p.w = adamw_update(p.w, g.w, mm.w, vv.w, s);
      p4[j] = p;
      store4(mh, j, mm);
      store4(vh, j, vv);
      if (copy != nullptr) store4(copy + head, j, p);
    }
  }
}

template <typename Moment>
void launch_adamw(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                  const AdamWConfig& cfg, float step_size, float bias2_sqrt, float decay, Stream stream,
                  Tensor schedule, Tensor param_bf16) {
  const int64_t n = param.numel();
  // The vector body when every buffer has the same misalignment (in elements) as param; the elements
  // before the first 16-byte boundary of param are the head. FP32 buffers then start the body on a
  // 16-byte boundary, BF16 ones (moments, copy) on an 8-byte boundary.
  auto misalign = [](const void* p, size_t unit) { return reinterpret_cast<uintptr_t>(p) % unit; };
  constexpr size_t kMomentVecBytes = 4 * sizeof(Moment);
  const int64_t head = static_cast<int64_t>((16 - misalign(param.data, 16)) % 16 / 4);
  const bool vec = n >= 8 && misalign(param.data, 4) == 0 && misalign(param.ptr<float>() + head, 16) == 0 &&
                   misalign(grad.ptr<float>() + head, 16) == 0 &&
                   misalign(m.ptr<Moment>() + head, kMomentVecBytes) == 0 &&
                   misalign(v.ptr<Moment>() + head, kMomentVecBytes) == 0 &&
                   (param_bf16.empty() || misalign(param_bf16.ptr<__nv_bfloat16>() + head, 8) == 0);
  const int64_t items = vec ? (n + 3) / 4 : n;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((items + kThreads - 1) / kThreads, kMaxBlocks));
  const auto kernel = vec ? adamw_kernel<true, Moment> : adamw_kernel<false, Moment>;
  kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(
      param.ptr<float>(), grad.ptr<const float>(), m.ptr<Moment>(), v.ptr<Moment>(),
      param_bf16.empty() ? nullptr : param_bf16.ptr<__nv_bfloat16>(), grad_norm_sq.ptr<const float>(), max_norm,
      cfg.beta1, cfg.beta2, cfg.eps, step_size, bias2_sqrt, decay,
      schedule.empty() ? nullptr : schedule.ptr<const float>(), cfg.weight_decay, n, vec ? head : 0);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t sum_squares_workspace_elems(int64_t n) { return sum_squares_blocks(n); }

void sum_squares_accumulate(Tensor out, Tensor x, Tensor workspace, Stream stream) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int blocks = sum_squares_blocks(n);
  const cudaStream_t s = cuda_stream(stream);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(workspace.f32(), x.ptr<const float>(), n);
  CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kThreads, 0, s>>>(out.ptr<float>(), workspace.ptr<const float>(), blocks);
  CUDA_CHECK_LAUNCH();
}

void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream, Tensor schedule, Tensor param_bf16) {
  if (param.numel() == 0) return;
  // Scalars in double on the host (as torch computes them in Python and the CPU op does); with a
  // schedule the kernel computes them instead, and these are unused.
  float step_size = 0.0f, bias2_sqrt = 0.0f, decay = 0.0f;
  if (schedule.empty()) {
    const double bias1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(step));
    const double bias2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(step));
    step_size = static_cast<float>(cfg.lr / bias1);
    bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    decay = static_cast<float>(1.0 - static_cast<double>(cfg.lr) * cfg.weight_decay);
  }
  if (m.dtype == DType::BF16)
    launch_adamw<__nv_bfloat16>(param, grad, m, v, grad_norm_sq, max_norm, cfg, step_size, bias2_sqrt, decay, stream,
                                schedule, param_bf16);
  else
    launch_adamw<float>(param, grad, m, v, grad_norm_sq, max_norm, cfg, step_size, bias2_sqrt, decay, stream,
                        schedule, param_bf16);
}

}  // namespace moe::cuda
