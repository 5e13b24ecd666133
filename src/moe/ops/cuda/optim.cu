// CUDA optimizer ops over flat FP32 buffers (see moe/ops/optim.h and moe/ops/cuda/optim.h).
//
// sum_squares_accumulate, two kernels on the stream:
//   sum_squares_partial_kernel  G blocks of 256 threads, G = min(1024, ceil(n / 256)) (a function
//                               of n only); each thread sums x^2 over a grid-stride in FP32, the
//                               block reduces with a fixed shared-memory tree and writes
//                               partials[block].
//   sum_squares_final_kernel    one block of 256 threads: adds the G partials in a fixed order (in
//                               double) and does out[0] += total.
//   Deterministic: the partition and the reduction order depend only on n.
// adamw_step: one thread per element, grid-stride. Each thread reads grad_norm_sq[0] first; a
// non-finite value makes every thread return before touching param/m/v (the skipped step). With a
// schedule, thread 0 of each block computes the step's scalars from schedule (lr, step) into shared
// memory, in double as the host does without one: pow and sqrt, then __dmul_rn/__dadd_rn so nothing
// is fused into a multiply-add that the host would round twice. The update loop is the same code
// either way, so the same lr and step give the same bits.
// NOTES: CUDA's double pow and the host's std::pow may differ in the last bit of a double in rare
// cases; the scalars are then rounded to FP32, where such a difference almost never shows
// (tests/cuda/test_cuda_optim.cpp checks steps 1 to 2000 bit for bit).
#include "moe/ops/cuda/optim.h"

#include <algorithm>
#include <cmath>

#include <cuda_runtime.h>

#include "moe/core/cuda_check.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;
constexpr int64_t kMaxBlocks = 1 << 16;

// Per-block partial sums of sum_squares_accumulate. NOTES: one fixed array for the process (the
// ops may not allocate); calls on different streams must not overlap in time.
__device__ float g_sum_squares_partials[kMaxPartials];

__global__ void __launch_bounds__(kThreads) sum_squares_partial_kernel(const float* x, int64_t n) {
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
  if (threadIdx.x == 0) g_sum_squares_partials[blockIdx.x] = block_sum[0];
}

__global__ void __launch_bounds__(kThreads) sum_squares_final_kernel(float* out, int num_partials) {
  __shared__ double block_sum[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < num_partials; i += kThreads) acc += g_sum_squares_partials[i];
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
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* param, const float* grad, float* m, float* v, const float* grad_norm_sq, float max_norm,
                 float b1, float b2, float eps, float step_size, float bias2_sqrt, float decay, const float* schedule,
                 float wd, int64_t n) {
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
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float g = clip * grad[i];
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    // Same operation order as torch: (m / (sqrt(v) / sqrt(bias2) + eps)) times the step size.
    param[i] = param[i] * decay - step_size * (mi / (sqrtf(vi) / bias2_sqrt + eps));
  }
}

void check_f32(const Tensor& t, const char* op, const char* name) {
  MOE_CHECK(t.data != nullptr || t.numel() == 0, op, ": ", name, " has no data");
  MOE_CHECK(t.device == Device::CUDA, op, ": ", name, " is on ", device_name(t.device), ", expected cuda");
  MOE_CHECK(t.dtype == DType::F32, op, ": ", name, " has dtype ", dtype_name(t.dtype), ", expected F32");
}

}  // namespace

void sum_squares_accumulate(Tensor out, Tensor x, Stream stream) {
  constexpr const char* op = "sum_squares_accumulate";
  check_f32(out, op, "out");
  check_f32(x, op, "x");
  MOE_CHECK(out.numel() == 1, op, ": out must hold one value, got shape ", out.shape.str());
  const int64_t n = x.numel();
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxPartials));
  const cudaStream_t s = cuda_stream(stream);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, s>>>(x.ptr<const float>(), n);
  CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kThreads, 0, s>>>(out.ptr<float>(), blocks);
  CUDA_CHECK_LAUNCH();
}

void adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor grad_norm_sq, float max_norm,
                const AdamWConfig& cfg, int64_t step, Stream stream, Tensor schedule) {
  constexpr const char* op = "adamw_step";
  check_f32(param, op, "param");
  check_f32(grad, op, "grad");
  check_f32(m, op, "m");
  check_f32(v, op, "v");
  check_f32(grad_norm_sq, op, "grad_norm_sq");
  MOE_CHECK(grad.shape == param.shape, op, ": grad ", grad.shape.str(), " does not match param ", param.shape.str());
  MOE_CHECK(m.shape == param.shape, op, ": m ", m.shape.str(), " does not match param ", param.shape.str());
  MOE_CHECK(v.shape == param.shape, op, ": v ", v.shape.str(), " does not match param ", param.shape.str());
  MOE_CHECK(grad_norm_sq.numel() == 1, op, ": grad_norm_sq must hold one value, got shape ", grad_norm_sq.shape.str());
  const bool has_schedule = !schedule.empty();
  if (has_schedule) {
    check_f32(schedule, op, "schedule");
    MOE_CHECK(schedule.numel() == 2, op, ": schedule must be [2] (lr, step), got shape ", schedule.shape.str());
  } else {
    MOE_CHECK(step >= 1, op, ": step = ", step, " must count from 1");
  }
  const int64_t n = param.numel();
  if (n == 0) return;
  // Scalars in double on the host (as torch computes them in Python and the CPU op does); with a
  // schedule the kernel computes them instead, and these are unused.
  float step_size = 0.0f, bias2_sqrt = 0.0f, decay = 0.0f;
  if (!has_schedule) {
    const double bias1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), static_cast<double>(step));
    const double bias2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), static_cast<double>(step));
    step_size = static_cast<float>(cfg.lr / bias1);
    bias2_sqrt = static_cast<float>(std::sqrt(bias2));
    decay = static_cast<float>(1.0 - static_cast<double>(cfg.lr) * cfg.weight_decay);
  }
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  adamw_kernel<<<blocks, kThreads, 0, cuda_stream(stream)>>>(
      param.ptr<float>(), grad.ptr<const float>(), m.ptr<float>(), v.ptr<float>(), grad_norm_sq.ptr<const float>(),
      max_norm, cfg.beta1, cfg.beta2, cfg.eps, step_size, bias2_sqrt, decay,
      has_schedule ? schedule.ptr<const float>() : nullptr, cfg.weight_decay, n);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe::cuda
