// The SwiGLU kernels that write only FP8, both layouts (moe/ops/fp8_swiglu.h): the forward's output
// (fp8_swiglu_forward_rows_and_columns) and the backward's d(gate/up) (fp8_swiglu_backward), neither
// stored in BF16. The plain path writes the BF16 tensor and the staged quantizer reads it back; here
// the values go from the inputs to shared memory and out as codes.
//
// The hot case (BF16, aligned rows, H % 128 == 0 for the backward, H % 8 == 0 for the forward): a
// resident block loops over tiles of 128 rows x 128 units. It stages the tile's inputs (gate and up,
// and for the backward dout: 32 KiB each) with cp.async, computes the outputs over the staged gate
// (and up) tiles in place, BF16 rounded with swiglu_math.cuh's arithmetic as the plain kernels round
// them, then quantizes each output tile with the staged quantizer's code (one 8-warp group per
// output tile: fp8_rows_and_columns_staged.cuh). One stage per block, two or three blocks per SM:
// while one block computes, another's copies are in flight (a block with two stages had to run
// alone on its SM and was slower, below). The codes and scales are bit for bit those of the plain
// SwiGLU kernel followed by fp8_quantize_rows_and_columns (tests/cuda/test_cuda_fp8_fused.cpp).
//
// Every other case (F32, other widths, unaligned) takes the one-block-per-tile columns kernel of
// fp8_tiles.cuh with a source that computes a run of the output from the inputs.
//
// NOTES (bench-olmoe-4l on one H200, ms per layer for the routed experts' [262144, 1024] units;
// bench/RESULTS.md, 2026-12-03 twelfth session): the backward's first fused form (2026-12-02) was the
// one-block kernel alone, whose gate and up blocks each loaded gate, up and dout (six loads per
// output pair): 2.04 against 1.84 for the plain backward plus the staged quantizer. The staged form
// with two stages per block (192 KiB: one 16-warp block per SM) took 1.54 against 1.61 for the plain
// pair in the same call; with one stage per block and two blocks per SM, 1.28 against 1.55 (0.62 +
// 0.93). The forward: 0.76 staged against 0.87 for the one-block kernel, in the same call.
// Tried and not kept (thirty-fourth session, H200): starting the next tile's read-only inputs (the
// up tile, dout) right after compute, while the outputs are quantized: both kernels 1-3% slower
// (backward 0.98 -> 1.00, forward 0.52 -> 0.53 ms per layer); the resident blocks already overlap
// one block's copies with another's work.
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include "moe/ops/cuda/fp8_rows_and_columns_staged.cuh"
#include "moe/ops/cuda/fp8_swiglu.h"
#include "moe/ops/cuda/swiglu_math.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;

// What a staged kernel computes. A producer stages kInputs tiles of 128 rows x 128 units (gate_up
// [M, 2H] and, for the backward, dout [M, H]), computes kGroups output tiles over the first kGroups
// staged tiles, and names the output features of group g's tile. Output: [M, kGroups H].
//   forward: act = silu(g) u (one output tile, over the gate tile);
//   backward: dgate, dup (two output tiles, over the gate and the up tiles).
struct ForwardProducer {
  static constexpr int kInputs = 2, kGroups = 1, kBlocksPerSm = 3;
  const __nv_bfloat16* gate_up = nullptr;
  int64_t H = 0;
  __device__ __forceinline__ void copy(uint4* stage, TileRows tile, int64_t u0, int thread) const {
    copy_tile_async<kGroups * kThreads>(stage, gate_up, 2 * H, H, tile, u0, thread);
    copy_tile_async<kGroups * kThreads>(stage + kStageWords, gate_up + H, 2 * H, H, tile, u0, thread);
  }
  // Slot i of every staged tile holds the same rows and units; zero-filled slots give 0.
  __device__ __forceinline__ void compute(uint4* stage, int thread) const {
    uint4* gate = stage;
    const uint4* up = stage + kStageWords;
#pragma unroll 1
    for (int i = thread; i < kStageWords; i += kGroups * kThreads) {
      const uint4 g4 = gate[i], u4 = up[i];
      const uint32_t g[4] = {g4.x, g4.y, g4.z, g4.w}, u[4] = {u4.x, u4.y, u4.z, u4.w};
      uint32_t a[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float gf = bf16_half(g[e], h);
          v[h] = swiglu_value(gf, swiglu_sigmoid<__nv_bfloat16>(gf), bf16_half(u[e], h));
        }
        a[e] = bf16_pair(v[0], v[1]);
      }
      gate[i] = make_uint4(a[0], a[1], a[2], a[3]);
    }
  }
  __device__ __forceinline__ int64_t features() const { return H; }
  __device__ __forceinline__ int64_t first_feature(int /*group*/, int64_t u0) const { return u0; }
};

struct BackwardProducer {
  static constexpr int kInputs = 3, kGroups = 2, kBlocksPerSm = 2;
  const __nv_bfloat16* gate_up = nullptr;
  const __nv_bfloat16* dout = nullptr;
  int64_t H = 0;
  __device__ __forceinline__ void copy(uint4* stage, TileRows tile, int64_t u0, int thread) const {
    copy_tile_async<kGroups * kThreads>(stage, gate_up, 2 * H, H, tile, u0, thread);
    copy_tile_async<kGroups * kThreads>(stage + kStageWords, gate_up + H, 2 * H, H, tile, u0, thread);
    copy_tile_async<kGroups * kThreads>(stage + 2 * kStageWords, dout, H, H, tile, u0, thread);
  }
  __device__ __forceinline__ void compute(uint4* stage, int thread) const {
    uint4 *gate = stage, *up = stage + kStageWords;
    const uint4* d_out = stage + 2 * kStageWords;
#pragma unroll 1
    for (int i = thread; i < kStageWords; i += kGroups * kThreads) {
      const uint4 g4 = gate[i], u4 = up[i], d4 = d_out[i];
      const uint32_t g[4] = {g4.x, g4.y, g4.z, g4.w}, u[4] = {u4.x, u4.y, u4.z, u4.w};
      const uint32_t d[4] = {d4.x, d4.y, d4.z, d4.w};
      uint32_t dg[4], du[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float dgv[2], duv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float gf = bf16_half(g[e], h), uf = bf16_half(u[e], h), df = bf16_half(d[e], h);
          const float s = swiglu_sigmoid<__nv_bfloat16>(gf);
          dgv[h] = swiglu_grad_gate(df, gf, s, uf);
          duv[h] = swiglu_grad_up(df, gf, s);
        }
        dg[e] = bf16_pair(dgv[0], dgv[1]);
        du[e] = bf16_pair(duv[0], duv[1]);
      }
      gate[i] = make_uint4(dg[0], dg[1], dg[2], dg[3]);
      up[i] = make_uint4(du[0], du[1], du[2], du[3]);
    }
  }
  __device__ __forceinline__ int64_t features() const { return 2 * H; }
  // Group 0 writes dgate_up's features [u0, u0 + 128) (the gate's), group 1 [H + u0, ..) (the up's).
  __device__ __forceinline__ int64_t first_feature(int group, int64_t u0) const { return group * H + u0; }
};

template <class P>
constexpr size_t staged_bytes() {
  return P::kInputs * kStageWords * sizeof(uint4);
}

// The producer's output [M, features] -> columns codes and scales (out) and Rows tiles (rows_out),
// over the segments of offsets; tile t = (column tile t / unit_tiles, units 128 (t % unit_tiles) ..),
// tiles t = blockIdx.x, blockIdx.x + gridDim.x, ... Dynamic shared memory: staged_bytes<P>(). (The
// name holds "quantize_rows": the step split times the kernel as FP8 quantize, train/step_split.cpp.)
template <class P>
__global__ void __launch_bounds__(P::kGroups * kThreads, P::kBlocksPerSm)
    swiglu_quantize_rows_and_columns_kernel(P producer, const int32_t* offsets, int segments, int64_t M,
                                            int64_t unit_tiles, int64_t tile_count, ColumnsOutput out,
                                            RowsOutput rows_out) {
  extern __shared__ uint4 stage[];  // [P::kInputs][kStageWords]
  int64_t t = blockIdx.x;
  if (t >= tile_count) return;
  const int thread = static_cast<int>(threadIdx.x), warp = thread >> 5, group = warp / (kThreads / 32);
  TileRows tile = find_tile_rows(offsets, segments, M, t / unit_tiles * kTile);
  producer.copy(stage, tile, t % unit_tiles * kTile, thread);
  for (; t < tile_count; t += gridDim.x) {
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    producer.compute(stage, thread);
    __syncthreads();
    const int64_t column_tile = t / unit_tiles, k0 = producer.first_feature(group, t % unit_tiles * kTile);
    const uint4* values = stage + group * kStageWords;
    store_staged_row_tiles(values, tile, k0, producer.features(), rows_out, thread % kThreads);
    store_staged_column_tile(values, tile, column_tile, k0, producer.features(), out, thread % kThreads);
    const int64_t next = t + gridDim.x;
    if (next >= tile_count) break;
    tile = find_tile_rows(offsets, segments, M, next / unit_tiles * kTile);
    __syncthreads();  // every thread is done with the stage before it is refilled
    producer.copy(stage, tile, next % unit_tiles * kTile, thread);
  }
}

// H: the units (gate_up [M, 2H]).
template <class P>
void launch_staged(const P& producer, const Fp8Tensor& rows, const Fp8Tensor& columns, const Tensor& offsets,
                   int64_t M, int64_t H, const char* op, cudaStream_t s) {
  const int64_t Mp = columns.codes.dim(-1);
  const Segments segments = segments_of(offsets);
  const int64_t unit_tiles = tiles(H), tile_count = tiles(Mp) * unit_tiles;
  constexpr auto kKernel = swiglu_quantize_rows_and_columns_kernel<P>;
  constexpr int kBlockThreads = P::kGroups * kThreads;
  const int grid = static_cast<int>(
      std::min<int64_t>(resident_grid<kKernel>(kBlockThreads, staged_bytes<P>(), op), tile_count));
  const RowsOutput rows_out{rows.codes.ptr<uint8_t>(), rows.scales.ptr<float>(), true};
  kKernel<<<grid, kBlockThreads, staged_bytes<P>(), s>>>(producer, segments.offsets, segments.count, M, unit_tiles,
                                                         tile_count, columns_output(columns, Mp), rows_out);
  CUDA_CHECK_LAUNCH();
}

// Whether the staged kernels take gate_up [M, 2H] (and dout): BF16 16-byte chunks aligned in every
// row of both halves, 8-byte aligned Rows codes.
bool staged_fit(const Tensor& gate_up, const Tensor& dout, const Fp8Tensor& rows, int64_t H) {
  return gate_up.dtype == DType::BF16 && H % 8 == 0 && aligned(gate_up.data, 16) &&
         (dout.empty() || aligned(dout.data, 16)) && aligned(rows.codes.data, 8);
}

// Columns sources of the general case (the columns kernel of fp8_tiles.cuh with its Rows output).
// Forward: features kw .. kw + features - 1 of the SwiGLU output row `row`, from its gate and up
// runs, rounded to T as the stored output would be. vector: 16-byte loads of both runs are aligned.
template <typename T>
struct SwigluForwardColumns {
  const T* gate_up = nullptr;
  int64_t H = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    Run16<T> gate, up;
    const T* g = gate_up + row * 2 * H + kw;
    gate.load(g, features, vector);
    up.load(g + H, features, vector);
#pragma unroll
    for (int f = 0; f < kRun; ++f) {
      if (f >= features) continue;
      const float x = gate.get(f);
      run.set(f, swiglu_value(x, swiglu_sigmoid<T>(x), up.get(f)));
    }
  }
};

// Backward: features kw .. kw + features - 1 of dgate_up [R, 2H] row `row` from dout [R, H] and
// gate_up; feature c < H is the gate's gradient of unit c, c >= H the up projection's of unit c - H.
// vector (H % 16 == 0, aligned bases): a warp's 16 features lie in one half, every run is two
// aligned 16-byte loads.
template <typename T>
struct SwigluBackwardColumns {
  const T* gate_up = nullptr;
  const T* dout = nullptr;
  int64_t H = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    const T* gu = gate_up + row * 2 * H;
    if (vector && features == kRun) {
      const bool up_half = kw >= H;
      const int64_t j = up_half ? kw - H : kw;
      Run16<T> g, u, d;
      g.load(gu + j, kRun, true);
      u.load(gu + H + j, kRun, true);
      d.load(dout + row * H + j, kRun, true);
#pragma unroll
      for (int f = 0; f < kRun; ++f) {
        const float gf = g.get(f), uf = u.get(f), df = d.get(f), s = swiglu_sigmoid<T>(gf);
        run.set(f, up_half ? swiglu_grad_up(df, gf, s) : swiglu_grad_gate(df, gf, s, uf));
      }
      return;
    }
    for (int f = 0; f < features; ++f) {
      const int64_t c = kw + f;
      const bool up_half = c >= H;
      const int64_t j = up_half ? c - H : c;
      const float gf = to_f32(gu[j]), uf = to_f32(gu[H + j]), df = to_f32(dout[row * H + j]);
      const float s = swiglu_sigmoid<T>(gf);
      run.set(f, up_half ? swiglu_grad_up(df, gf, s) : swiglu_grad_gate(df, gf, s, uf));
    }
  }
};

template <typename T>
void launch_forward_general(const Fp8Tensor& rows, const Fp8Tensor& columns, const Tensor& gate_up,
                            const Tensor& offsets, cudaStream_t s) {
  const int64_t R = gate_up.dim(0), H = gate_up.dim(1) / 2, Mp = columns.codes.dim(-1);
  const bool vector = H % (16 / sizeof(T)) == 0 && aligned(gate_up.data, 16);
  launch_columns<T>(columns, SwigluForwardColumns<T>{gate_up.ptr<const T>(), H}, offsets, R, H, Mp, vector, &rows,
                    "fp8_swiglu_forward_rows_and_columns", s);
}

template <typename T>
void launch_backward_general(const Fp8Tensor& rows, const Fp8Tensor& columns, const Tensor& dout,
                             const Tensor& gate_up, const Tensor& offsets, cudaStream_t s) {
  const int64_t R = dout.dim(0), H = dout.dim(1), Mp = columns.codes.dim(-1);
  const bool vector = H % kRun == 0 && aligned(gate_up.data, 16) && aligned(dout.data, 16);
  const SwigluBackwardColumns<T> src{gate_up.ptr<const T>(), dout.ptr<const T>(), H};
  launch_columns<T>(columns, src, offsets, R, 2 * H, Mp, vector, &rows, "fp8_swiglu_backward", s);
}

}  // namespace

void fp8_swiglu_forward_rows_and_columns(Fp8Tensor out_rows, Fp8Tensor out_columns, Tensor gate_up, Tensor offsets,
                                         Stream stream) {
  const int64_t M = gate_up.dim(0), H = gate_up.dim(1) / 2;
  if (H == 0 || out_columns.codes.dim(-1) == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (staged_fit(gate_up, Tensor(), out_rows, H))
    launch_staged(ForwardProducer{gate_up.ptr<const __nv_bfloat16>(), H}, out_rows, out_columns, offsets, M, H,
                  "fp8_swiglu_forward_rows_and_columns", s);
  else if (gate_up.dtype == DType::BF16)
    launch_forward_general<__nv_bfloat16>(out_rows, out_columns, gate_up, offsets, s);
  else
    launch_forward_general<float>(out_rows, out_columns, gate_up, offsets, s);
}

void fp8_swiglu_backward(Fp8Tensor rows, Fp8Tensor columns, Tensor dout, Tensor gate_up, Tensor offsets,
                         Stream stream) {
  const int64_t M = dout.dim(0), H = dout.dim(1);
  if (H == 0 || columns.codes.dim(-1) == 0) return;
  const cudaStream_t s = cuda_stream(stream);
  if (H % kTile == 0 && staged_fit(gate_up, dout, rows, H))
    launch_staged(BackwardProducer{gate_up.ptr<const __nv_bfloat16>(), dout.ptr<const __nv_bfloat16>(), H}, rows,
                  columns, offsets, M, H, "fp8_swiglu_backward", s);
  else if (dout.dtype == DType::BF16)
    launch_backward_general<__nv_bfloat16>(rows, columns, dout, gate_up, offsets, s);
  else
    launch_backward_general<float>(rows, columns, dout, gate_up, offsets, s);
}

}  // namespace moe::cuda
