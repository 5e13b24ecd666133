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
#include "moe/ops/cuda/adamw_math.cuh"

namespace moe::cuda {
namespace {

using namespace adamw_math;

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
  AdamWScalars s;
  if (!step_scalars(grad_norm_sq, max_norm, b1, b2, eps, step_size, bias2_sqrt, decay, schedule, wd, s)) return;
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
      adamw_update4(p, g, mm, vv, s);
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
  // With a schedule the kernel computes the scalars instead, and these are unused.
  const HostScalars h = schedule.empty() ? host_scalars(cfg, step) : HostScalars{};
  if (m.dtype == DType::BF16)
    launch_adamw<__nv_bfloat16>(param, grad, m, v, grad_norm_sq, max_norm, cfg, h.step_size, h.bias2_sqrt, h.decay,
                                stream, schedule, param_bf16);
  else
    launch_adamw<float>(param, grad, m, v, grad_norm_sq, max_norm, cfg, h.step_size, h.bias2_sqrt, h.decay, stream,
                        schedule, param_bf16);
}

}  // namespace moe::cuda
