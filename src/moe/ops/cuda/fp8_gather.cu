// FP8 operands of gathered token rows (moe/ops/fp8_gather.h): each buffer row is its token's row,
// scaled by the route's weight and rounded as combine_rows_backward rounds (__fmul_rn, then to the
// element type); the codes and scales are those of quantizing the stored rows, without the
// scatter's or the combine backward's store of them and the quantizer's read back (two bytes per
// element each). BF16 with aligned rows (the training step): the staged quantizer of
// fp8_rows_and_columns_staged.cuh with StagedGatheredRows (the rows copied by cp.async, weighted in
// the stage). Otherwise: the one-block columns quantizer of fp8_tiles.cuh with GatheredColumns,
// which loads each lane's 16-feature runs from the token rows.
//
// NOTES (bench-olmoe-4l's expert output gradient, both layouts, ms per layer; bench/RESULTS.md):
// the one-block kernel 1.31; the staged form 1.44 when first tried (eleventh session), 1.08 once
// the staged halves spent fewer instructions per element (eighteenth session), 0.875 on the H200
// once the route weights were loaded a tile ahead (StagedGatheredRows, thirty-fourth session). Not kept: the rows
// half moved into the FP8 dispatch's per-token scatter with the route weights (each token row read
// once): weighted columns alone ~0.75 ms plus that scatter 0.55, the same as the one pass (thirteenth
// session): the kernel is bound by its per-element work, not by its reads. Nor did ordering the
// column tiles by token (a sort before each call, so a token row's top_k reads hit L2 instead of
// HBM) help: 1.32 -> 1.35 ms and 0.565 -> 0.56 ms per layer (fourteenth session).
#include "moe/ops/cuda/fp8_gather.h"

#include <type_traits>

#include "moe/ops/cuda/fp8_rows_and_columns_staged.cuh"
#include "moe/ops/cuda/fp8_tiles.cuh"

namespace moe::cuda {
namespace {

using namespace fp8_tiles;

// Columns source: features kw .. kw + features - 1 of buffer row `row`, that is of token row
// route / top_k (times weights[route] unless weights is null). A row no route fills stays zero.
// vector: 16-byte loads of every token row are aligned.
template <typename T>
struct GatheredColumns {
  const T* x = nullptr;
  int64_t K = 0;
  const int32_t* route_of_row = nullptr;
  const float* weights = nullptr;
  int top_k = 1;
  int64_t routes = 0;
  __device__ __forceinline__ void load(Run16<T>& run, int64_t row, int64_t kw, int features, bool vector) const {
    const int32_t route = route_of_row[row];
    if (route < 0 || route >= routes) return;
    const T* p = x + static_cast<int64_t>(route / top_k) * K + kw;
    if (weights == nullptr) {
      run.load(p, features, vector);
      return;
    }
    Run16<T> v;
    v.load(p, features, vector);
    const float w = weights[route];
#pragma unroll
    for (int f = 0; f < kRun; ++f)
      if (f < features) run.set(f, __fmul_rn(w, v.get(f)));
  }
};

// The staged quantizer's source of gathered BF16 rows (fp8_rows_and_columns_staged.cuh): buffer row
// r is token row route / top_k (route = route_of_row[r]; a row no route fills stays zero), copied
// into the stage by cp.async and, with kWeighted, multiplied in place by weights[route], rounded as
// GatheredColumns rounds.
//
// NOTES: the weights are loaded by copy, a tile ahead, into the thread's Pending registers: prepare
// used to read route_of_row and then weights[route] after the copies landed, two dependent loads
// on each tile's critical path, and ran behind a second barrier (1.08 -> 0.875 ms per layer).
template <bool kWeighted>
struct StagedGatheredRows {
  static constexpr bool kPrepares = kWeighted;
  // The weights of the thread's rows (StageChunks::row(j)); 0 where its chunk is zero-filled (a row
  // without a route, or past K), which so stays +0 (a weight never read may be infinite).
  struct Pending {
    float weight[kWeighted ? StageChunks<kThreads>::kSteps : 1];
  };
  const __nv_bfloat16* x = nullptr;
  int64_t K = 0;
  const int32_t* route_of_row = nullptr;
  const float* weights = nullptr;
  FastDivmod top_k;
  int64_t routes = 0;

  // Tile row r's route, or -1 for a row past the tile's or one no route fills.
  __device__ __forceinline__ int32_t route(TileRows tile, int r) const {
    if (r >= tile.rows) return -1;
    const int32_t route = route_of_row[tile.first_row + r];
    return route >= 0 && route < routes ? route : -1;
  }
  __device__ __forceinline__ Pending copy(uint4* stage, TileRows tile, int64_t k0, int thread) const {
    const StageChunks<kThreads> chunks(stage, thread);
    const int64_t k = k0 + 8 * chunks.c;
    const bool inside_k = k < K;  // K % 8 == 0: a chunk is all in or all out
    Pending pending{};
#pragma unroll
    for (int j = 0; j < StageChunks<kThreads>::kSteps; ++j) {
      const int32_t route = this->route(tile, chunks.row(j));
      const bool inside = inside_k && route >= 0;
      const uint32_t token = inside ? top_k.quotient(static_cast<uint32_t>(route)) : 0;
      copy_chunk_async(chunks.slot(j), inside ? x + static_cast<int64_t>(token) * K + k : x, inside);
      if constexpr (kWeighted) pending.weight[j] = inside ? weights[route] : 0.0f;
    }
    return pending;
  }
  // The thread's own chunks (those it copied): w x, rounded to BF16. Chunks past K stay zero.
  __device__ __forceinline__ void prepare(uint4* stage, const Pending& pending, int64_t k0, int thread) const {
    const StageChunks<kThreads> chunks(stage, thread);
    if (k0 + 8 * chunks.c >= K) return;
#pragma unroll
    for (int j = 0; j < StageChunks<kThreads>::kSteps; ++j) {
      const float w = pending.weight[j];
      uint4& q = stage[stage_slot(chunks.row(j), chunks.c)];
      uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        words[e] = bf16_pair(__fmul_rn(w, bf16_low(words[e])), __fmul_rn(w, bf16_high(words[e])));
      q = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
};

template <typename T>
void launch(const Fp8Tensor& columns, const GatheredRows& src, const Tensor& offsets, const Fp8Tensor* rows,
            const char* op, cudaStream_t s) {
  const int64_t M = src.route_of_row.dim(0), K = src.x.dim(1), Mp = columns.codes.dim(-1);
  if (K == 0 || Mp == 0) return;
  const int64_t routes = src.x.dim(0) * src.top_k;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (staged_source_fit(src.x, K, rows)) {
      const auto staged = [&](auto source) {
        source.x = src.x.ptr<const T>();
        source.K = K;
        source.route_of_row = src.route_of_row.ptr<const int32_t>();
        source.top_k = FastDivmod(static_cast<uint32_t>(src.top_k));
        source.routes = routes;
        launch_columns_staged(columns, source, offsets, M, K, Mp, rows, op, s);
      };
      if (src.weights.empty()) {
        staged(StagedGatheredRows<false>{});
      } else {
        StagedGatheredRows<true> source;
        source.weights = src.weights.ptr<const float>();
        staged(source);
      }
      return;
    }
  }
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const bool vector = K % kVec == 0 && aligned(src.x.data, 16);
  const GatheredColumns<T> source{src.x.ptr<const T>(),
                                  K,
                                  src.route_of_row.ptr<const int32_t>(),
                                  src.weights.empty() ? nullptr : src.weights.ptr<const float>(),
                                  src.top_k,
                                  routes};
  launch_columns<T>(columns, source, offsets, M, K, Mp, vector, rows, op, s);
}

void quantize(const Fp8Tensor& columns, const GatheredRows& src, const Tensor& offsets, const Fp8Tensor* rows,
              const char* op, Stream stream) {
  const cudaStream_t s = cuda_stream(stream);
  if (src.x.dtype == DType::BF16)
    launch<__nv_bfloat16>(columns, src, offsets, rows, op, s);
  else
    launch<float>(columns, src, offsets, rows, op, s);
}

}  // namespace

void fp8_quantize_gathered_columns(Fp8Tensor columns, const GatheredRows& src, Tensor offsets, Stream stream) {
  quantize(columns, src, offsets, nullptr, "fp8_quantize_gathered_columns", stream);
}

void fp8_quantize_gathered_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, const GatheredRows& src,
                                            Tensor offsets, Stream stream) {
  quantize(columns, src, offsets, &rows, "fp8_quantize_gathered_rows_and_columns", stream);
}

}  // namespace moe::cuda
